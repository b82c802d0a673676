use std::{
    pin::Pin,
    task::{Context, Poll},
};

use futures::Stream;

use super::ClusterEvent;
use crate::{client::ClusterClient, cluster_name::ClusterName};

/// The process's own cluster, engaged once under [`ClusterName::local`].
///
/// ```no_run
/// # async fn example() -> Result<(), kube::Error> {
/// use kube_multicluster::{Fleet, provider::LocalProvider};
///
/// let fleet = Fleet::new();
/// let local = LocalProvider::try_default().await?;
/// tokio::spawn(async move { fleet.run(local).await });
/// # Ok(())
/// # }
/// ```
pub struct LocalProvider {
    client: Option<ClusterClient>,
}

impl std::fmt::Debug for LocalProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalProvider")
            .field("engaged", &self.client.is_none())
            .finish()
    }
}

impl LocalProvider {
    /// The local cluster reached through `client`.
    pub fn new(client: impl Into<ClusterClient>) -> Self {
        Self {
            client: Some(client.into()),
        }
    }

    /// The local cluster from the in-cluster configuration or the default
    /// kubeconfig, as [`kube::Config::infer`] finds it, reached over one
    /// HTTP/2 connection ([`crate::client::cluster_client`]).
    pub async fn try_default() -> Result<Self, kube::Error> {
        let config = kube::Config::infer()
            .await
            .map_err(kube::Error::InferConfig)?;
        Ok(Self::new(crate::client::cluster_client(config)?))
    }
}

impl Stream for LocalProvider {
    type Item = ClusterEvent;

    /// Yields one engage event, then stays pending: the local cluster never leaves.
    fn poll_next(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Option<ClusterEvent>> {
        match self.client.take() {
            Some(client) => Poll::Ready(Some(ClusterEvent::Engage {
                name: ClusterName::local(),
                client,
            })),
            None => Poll::Pending,
        }
    }
}
