use std::{
    any::Any,
    future::Future,
    pin::Pin,
    task::{Context, Poll},
};

use pin_project_lite::pin_project;
use tokio::time::Instant;
use tower::BoxError;

use kube_multicluster::Action;

use super::{
    ReconcileMetrics,
    registry::{ClusterLabels, Outcome},
};
use crate::catch_panic::Panicked;

pin_project! {
    /// Response future of [`Metrics`](super::Metrics).
    #[derive(Debug)]
    pub struct ResponseFuture<F> {
        #[pin]
        inner: F,
        metrics: ReconcileMetrics,
        labels: ClusterLabels,
        started: Instant,
    }
}

impl<F> ResponseFuture<F> {
    pub(crate) fn new(inner: F, metrics: ReconcileMetrics, labels: ClusterLabels) -> Self {
        Self {
            inner,
            metrics,
            labels,
            started: Instant::now(),
        }
    }
}

impl<F, T, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<T, E>>,
    T: 'static,
    E: Into<BoxError>,
{
    type Output = Result<T, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let result = std::task::ready!(this.inner.poll(cx)).map_err(Into::into);
        let outcome = match &result {
            Ok(done) => match (done as &dyn Any)
                .downcast_ref::<Action>()
                .and_then(Action::requeue_after)
            {
                Some(delay) if delay.is_zero() => Outcome::Requeue,
                Some(_) => Outcome::RequeueAfter,
                None => Outcome::Success,
            },
            Err(error) if error.is::<Panicked>() => Outcome::Panic,
            Err(_) => Outcome::Error,
        };
        this.metrics
            .record(this.labels, outcome, this.started.elapsed().as_secs_f64());
        Poll::Ready(result)
    }
}
