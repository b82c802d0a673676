//! One part of a host, as a cluster of its own.

use std::{fmt, sync::Arc};

use kube::Client;

use super::HostCache;
use crate::client::{ClusterClient, Writes};

/// One part of a [`HostCache`] (a namespace, or a logical cluster for a
/// host split by annotation), to be engaged as a cluster of its own
/// ([`Fleet::engage_view`](crate::Fleet::engage_view),
/// [`ClusterEvent::EngageView`](crate::provider::ClusterEvent::EngageView)).
#[derive(Clone)]
pub struct HostView {
    host: HostCache,
    part: String,
    client: ClusterClient,
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
        let client = host.inner.raw.clone().with_default_namespace(part.clone());
        Self::with_client(host, part, client)
    }

    /// A view whose requests go through `client`.
    pub(super) fn with_client(host: HostCache, part: String, client: ClusterClient) -> Self {
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

    /// A client to where its cluster's requests go (split by namespace,
    /// the host's server with this namespace as its default), over the same
    /// connection. Its requests are not its cluster's: not counted, not
    /// budgeted, not checked, not read back; the engaged cluster's client
    /// is [`Cluster::client`](crate::Cluster::client). Each call makes a
    /// client with a request queue of its own: call it inside a Tokio
    /// runtime, where that queue runs a task.
    pub fn client(&self) -> Client {
        self.client.clone().into_client()
    }

    /// What its cluster's client sends its requests through.
    pub(crate) fn cluster_client(&self) -> &ClusterClient {
        &self.client
    }

    pub(crate) fn host(&self) -> &HostCache {
        &self.host
    }

    /// What its cluster's reconciles wrote and its watches have not shown.
    pub(crate) fn writes(&self) -> &Arc<Writes> {
        &self.writes
    }
}
