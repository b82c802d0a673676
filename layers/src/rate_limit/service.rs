use std::task::{Context, Poll};

use tower::Service;

use super::{ResponseFuture, layer::Buckets};
use crate::AsMcRequest;

/// Delays each request until its bucket has a token; see the
/// [module docs](super).
#[derive(Debug, Clone)]
pub struct RateLimit<S> {
    inner: S,
    buckets: Buckets,
}

impl<S> RateLimit<S> {
    pub(crate) fn new(inner: S, buckets: Buckets) -> Self {
        Self { inner, buckets }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, R> Service<R> for RateLimit<S>
where
    S: Service<R> + Clone,
    R: AsMcRequest,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = ResponseFuture<S, R>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: R) -> Self::Future {
        let bucket = self.buckets.for_cluster(&request.mc_request().cluster);
        let wait = bucket.reserve();
        if wait.is_zero() {
            return ResponseFuture::called(self.inner.call(request));
        }
        // The ready service stays here for the next request; the waiting one
        // gets a clone of its own and readies it once its token is due.
        ResponseFuture::waiting(self.inner.clone(), request, wait, bucket)
    }
}
