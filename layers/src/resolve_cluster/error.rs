use kube_fleet::ClusterName;

/// A request names a cluster that is joining the fleet but whose caches have
/// not synced yet; the controller retries the request after its backoff.
#[derive(Debug, Clone, thiserror::Error)]
#[error("cluster {cluster:?} is still being engaged")]
pub struct NotYetEngaged {
    /// The cluster the request names.
    pub cluster: ClusterName,
}
