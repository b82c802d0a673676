use std::{
    panic::{AssertUnwindSafe, catch_unwind},
    task::{Context, Poll},
};

use tower::{BoxError, Service};

use super::{Panicked, ResponseFuture};

/// Turns panics of the inner service into [`Panicked`] errors; see the
/// [module docs](super).
#[derive(Debug, Clone)]
pub struct CatchPanic<S> {
    inner: S,
}

impl<S> CatchPanic<S> {
    /// Wraps `inner`.
    pub const fn new(inner: S) -> Self {
        Self { inner }
    }
}

inner_accessors!(CatchPanic);

impl<S, R> Service<R> for CatchPanic<S>
where
    S: Service<R>,
    S::Error: Into<BoxError>,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: R) -> Self::Future {
        // The service is left as the panic found it; the same holds for any
        // panic that unwinds through a task, and the next call goes on.
        match catch_unwind(AssertUnwindSafe(|| self.inner.call(request))) {
            Ok(future) => ResponseFuture::running(future),
            Err(payload) => ResponseFuture::panicked(Panicked::from_payload(payload)),
        }
    }
}
