//! One part of a host, as a cluster of its own.

use std::{fmt, sync::Arc};

use http::Request;
use kube::{Client, client::Body};
use tower::BoxError;

use super::HostCache;
use crate::client::Writes;

/// One part of a [`HostCache`] (a namespace, or a logical cluster for a
/// host split by annotation), to be engaged as a cluster of its own
/// ([`Fleet::engage_view`](crate::Fleet::engage_view),
/// [`ClusterEvent::EngageView`](crate::provider::ClusterEvent::EngageView)).
#[derive(Clone)]
pub struct HostView {
    host: HostCache,
    part: String,
    client: Client,
    /// What reconciles wrote through its client and the host's watches
    /// have not shown yet: the host's, split by namespace (a write's
    /// namespace tells its part); its own otherwise.
    writes: Arc<Writes>,
}

impl fmt::Debug for HostView {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostView")
            .field("host", self.host.name())
            .field("part", &self.part)
            .finish()
    }
}

impl HostView {
    /// A view whose client is the host's, with `part` as its default
    /// namespace.
    pub(super) fn through_host(host: HostCache, part: String) -> Self {
        let through = host.inner.cache.client.clone();
        let send = tower::service_fn(move |request: Request<Body>| {
            let through = through.clone();
            async move { through.send(request).await.map_err(BoxError::from) }
        });
        let client = Client::new(send, part.clone());
        Self::with_client(host, part, client)
    }

    /// A view whose requests go through `client`.
    pub(super) fn with_client(host: HostCache, part: String, client: Client) -> Self {
        let writes = if host.by_namespace() {
            host.cache().writes().clone()
        } else {
            Arc::default()
        };
        Self {
            host,
            part,
            client,
            writes,
        }
    }

    /// The part of the host this view is: its namespace, split by
    /// namespace; the annotation's value, split by annotation.
    pub fn part(&self) -> &str {
        &self.part
    }

    /// The namespace this view is, for a host split by namespace: the same
    /// as [`part`](Self::part).
    pub fn namespace(&self) -> &str {
        &self.part
    }

    /// The client its cluster's requests go through: split by namespace,
    /// a client of the host whose default namespace is this one, which
    /// sends its requests through the host's client (one connection for
    /// all).
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    pub(crate) fn host(&self) -> &HostCache {
        &self.host
    }

    /// What its cluster's reconciles wrote and its watches have not shown.
    pub(crate) fn writes(&self) -> &Arc<Writes> {
        &self.writes
    }
}
