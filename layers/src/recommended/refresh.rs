use std::task::{Context, Poll};

use tower::Service;
use tower_layer::Layer;

use crate::AsMcRequest;

/// Reads each request's object again just before the inner service is
/// called ([`AsMcRequest::refresh`]): beneath a retry, each attempt then
/// works on the object as the controller's watch holds it at that moment,
/// so a retry after a conflict sees the newer version.
#[derive(Debug, Clone)]
pub struct Refresh<S> {
    inner: S,
}

impl<S, R: AsMcRequest> Service<R> for Refresh<S>
where
    S: Service<R>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: R) -> Self::Future {
        request.refresh();
        self.inner.call(request)
    }
}

/// Wraps a service in [`Refresh`].
#[derive(Debug, Clone, Copy, Default)]
pub struct RefreshLayer;

impl<S> Layer<S> for RefreshLayer {
    type Service = Refresh<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Refresh { inner }
    }
}
