use std::{sync::Arc, time::Duration};

use tower::{ServiceBuilder, retry::RetryLayer, timeout::TimeoutLayer};
use tower_layer::Layer;

use super::{Refresh, RefreshLayer};
use crate::{
    catch_panic::{CatchPanic, CatchPanicLayer},
    metrics::{Metrics, MetricsLayer, ReconcileMetrics},
    retry::TransientErrors,
    trace::{Trace, TraceLayer},
};

/// The service [`RecommendedLayer`] builds around a reconciler `S`.
pub type RecommendedService<S> = Trace<
    Metrics<CatchPanic<tower::timeout::Timeout<tower::retry::Retry<TransientErrors, Refresh<S>>>>>,
>;

/// The recommended stack; see the [module docs](super).
#[derive(Debug, Clone)]
pub struct RecommendedLayer {
    controller: Option<Arc<str>>,
    metrics: ReconcileMetrics,
    timeout: Duration,
    retries: u32,
}

impl Default for RecommendedLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl RecommendedLayer {
    /// The stack with a 60 s timeout, 3 retries of transient errors, and no
    /// metrics recorded until [`metrics`](Self::metrics) gives the ones to
    /// export. Spans and metrics name the controller that each request
    /// names.
    pub fn new() -> Self {
        Self {
            controller: None,
            metrics: ReconcileMetrics::unregistered(),
            timeout: Duration::from_secs(60),
            retries: 3,
        }
    }

    /// Records into these metrics (registered in the registry you export;
    /// give them the fleet with [`ReconcileMetrics::follow`] so that the
    /// series of departed clusters go).
    #[must_use]
    pub fn metrics(mut self, metrics: ReconcileMetrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// The longest a reconcile may take, retries included.
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Names the controller in spans and metrics whatever the requests say:
    /// for a stack of plain `McRequest`s, which name none.
    #[must_use]
    pub fn controller(mut self, name: impl Into<Arc<str>>) -> Self {
        self.controller = Some(name.into());
        self
    }

    /// How many times a transient error is retried within one reconcile.
    #[must_use]
    pub fn retries(mut self, retries: u32) -> Self {
        self.retries = retries;
        self
    }
}

impl<S> Layer<S> for RecommendedLayer {
    type Service = RecommendedService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        let (mut trace, mut metrics) = (TraceLayer::new(), MetricsLayer::new(self.metrics.clone()));
        if let Some(name) = &self.controller {
            trace = trace.controller(name.clone());
            metrics = metrics.controller(name.clone());
        }
        ServiceBuilder::new()
            .layer(trace)
            .layer(metrics)
            .layer(CatchPanicLayer::new())
            .layer(TimeoutLayer::new(self.timeout))
            .layer(RetryLayer::new(TransientErrors::new(self.retries)))
            .layer(RefreshLayer)
            .service(inner)
    }
}
