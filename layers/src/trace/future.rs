use std::{
    future::Future,
    pin::Pin,
    task::{Context, Poll},
};

use pin_project_lite::pin_project;
use tokio::time::Instant;
use tracing::Span;

pin_project! {
    /// Response future of [`Trace`](super::Trace).
    #[derive(Debug)]
    pub struct ResponseFuture<F> {
        #[pin]
        inner: F,
        span: Span,
        started: Instant,
    }
}

impl<F> ResponseFuture<F> {
    pub(crate) fn new(inner: F, span: Span) -> Self {
        Self {
            inner,
            span,
            started: Instant::now(),
        }
    }
}

impl<F, T, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<T, E>>,
    E: std::fmt::Display,
{
    type Output = Result<T, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let _entered = this.span.enter();
        let result = std::task::ready!(this.inner.poll(cx));
        let duration = this.started.elapsed();
        this.span
            .record("outcome", if result.is_ok() { "ok" } else { "error" })
            .record("duration_ms", duration.as_secs_f64() * 1000.0);
        match &result {
            Ok(_) => tracing::debug!(?duration, "reconciled"),
            Err(error) => tracing::debug!(?duration, %error, "reconcile failed"),
        }
        Poll::Ready(result)
    }
}
