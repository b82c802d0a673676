use kube_fleet::Fleet;
use tower_layer::Layer;

use super::ResolveCluster;

/// Wraps a service in [`ResolveCluster`], looking clusters up in `fleet`.
#[derive(Debug, Clone)]
pub struct ResolveClusterLayer {
    fleet: Fleet,
}

impl ResolveClusterLayer {
    /// Resolves cluster names against `fleet`.
    pub const fn new(fleet: Fleet) -> Self {
        Self { fleet }
    }
}

impl<S> Layer<S> for ResolveClusterLayer {
    type Service = ResolveCluster<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ResolveCluster::new(inner, self.fleet.clone())
    }
}
