use std::sync::Arc;

use tower_layer::Layer;

use super::{Metrics, ReconcileMetrics};

/// Wraps a service in [`Metrics`] for one controller.
#[derive(Debug, Clone)]
pub struct MetricsLayer {
    metrics: ReconcileMetrics,
    controller: Arc<str>,
}

impl MetricsLayer {
    /// Counts and times reconciles of `controller` in `metrics`.
    pub fn new(metrics: ReconcileMetrics, controller: impl Into<Arc<str>>) -> Self {
        Self {
            metrics,
            controller: controller.into(),
        }
    }
}

impl<S> Layer<S> for MetricsLayer {
    type Service = Metrics<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Metrics::new(inner, self.metrics.clone(), self.controller.clone())
    }
}
