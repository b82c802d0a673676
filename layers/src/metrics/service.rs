use std::{
    sync::Arc,
    task::{Context, Poll},
};

use tower::{BoxError, Service};

use super::{ReconcileMetrics, ResponseFuture, registry::ClusterLabels};
use crate::AsMcRequest;

/// Counts and times each reconcile; see the [module docs](super).
#[derive(Debug, Clone)]
pub struct Metrics<S> {
    inner: S,
    metrics: ReconcileMetrics,
    controller: Option<Arc<str>>,
}

impl<S> Metrics<S> {
    /// Wraps `inner`, recording into `metrics` under `controller`, or else
    /// under the controller each request names.
    pub fn new(inner: S, metrics: ReconcileMetrics, controller: Option<Arc<str>>) -> Self {
        Self {
            inner,
            metrics,
            controller,
        }
    }
}

inner_accessors!(Metrics);

impl<S, R> Service<R> for Metrics<S>
where
    S: Service<R>,
    S::Response: 'static,
    S::Error: Into<BoxError>,
    R: AsMcRequest,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: R) -> Self::Future {
        let labels = ClusterLabels {
            controller: self
                .controller
                .as_deref()
                .or(request.controller())
                .unwrap_or_default()
                .to_owned(),
            cluster: request.mc_request().cluster.to_string(),
        };
        ResponseFuture::new(self.inner.call(request), self.metrics.clone(), labels)
    }
}
