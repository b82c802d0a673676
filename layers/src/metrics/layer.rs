use std::sync::Arc;

use tower_layer::Layer;

use super::{Metrics, ReconcileMetrics};

/// Wraps a service in [`Metrics`] for one controller.
#[derive(Debug, Clone)]
pub struct MetricsLayer {
    metrics: ReconcileMetrics,
    controller: Option<Arc<str>>,
}

impl MetricsLayer {
    /// Counts and times reconciles in `metrics`, labelled with the
    /// controller each request names (an `ObjectRequest` from
    /// `Controller::run` does; a plain `McRequest` does not, and its label
    /// is empty unless [`controller`](Self::controller) names one).
    pub fn new(metrics: ReconcileMetrics) -> Self {
        Self {
            metrics,
            controller: None,
        }
    }

    /// Labels every reconcile with `controller`, whatever the request says.
    #[must_use]
    pub fn controller(mut self, controller: impl Into<Arc<str>>) -> Self {
        self.controller = Some(controller.into());
        self
    }
}

impl<S> Layer<S> for MetricsLayer {
    type Service = Metrics<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Metrics::new(inner, self.metrics.clone(), self.controller.clone())
    }
}
