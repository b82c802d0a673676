//! What every layer of a cluster's client stack shares: the service below
//! it taken to call from the future it returns, and the `Layer` and
//! `Service` that wrap what each layer does around that call.

use std::{
    future::Future,
    task::{Context, Poll},
};

use futures::future::BoxFuture;
use http::{Request, Response};
use http_body_util::combinators::UnsyncBoxBody;
use hyper::body::Bytes;
use kube::client::Body;
use tower::{BoxError, Layer, Service};

/// A response body of any kind, as the stack below a cluster's client
/// gives it.
pub(crate) type AnyBody = UnsyncBoxBody<Bytes, BoxError>;

/// The service below a layer of the stack, to call from the future the
/// layer returns: the one that was made ready, with a clone left in its
/// place.
pub(super) fn take<S: Clone>(inner: &mut S) -> S {
    let fresh = inner.clone();
    std::mem::replace(inner, fresh)
}

/// The service below a layer of the stack: it takes the stack's requests
/// and gives its responses, and its futures may move between tasks.
pub(super) trait Below:
    Service<Request<Body>, Response = Response<AnyBody>, Error = BoxError, Future: Send + 'static>
    + Send
    + 'static
{
}

impl<S> Below for S where
    S: Service<
            Request<Body>,
            Response = Response<AnyBody>,
            Error = BoxError,
            Future: Send + 'static,
        > + Send
        + 'static
{
}

/// What one layer of the stack does around the service below it. The
/// future it returns is polled by the task that made the request, so what
/// it reads of the reconcile under way (a task-local) is that task's.
pub(super) trait Around: Clone + Send + Sync + 'static {
    /// Sends `request` on through `inner`, with the layer's work before
    /// and after.
    fn around<S: Below>(
        self,
        request: Request<Body>,
        inner: S,
    ) -> impl Future<Output = Result<Response<AnyBody>, BoxError>> + Send + 'static;
}

/// The layer of an [`Around`].
#[derive(Clone)]
pub(super) struct AroundLayer<A>(pub(super) A);

impl<A: Clone, S> Layer<S> for AroundLayer<A> {
    type Service = Arounded<A, S>;

    fn layer(&self, inner: S) -> Arounded<A, S> {
        Arounded {
            around: self.0.clone(),
            inner,
        }
    }
}

/// The service of an [`Around`] over `S`.
#[derive(Clone)]
pub(super) struct Arounded<A, S> {
    around: A,
    inner: S,
}

impl<A, S> Service<Request<Body>> for Arounded<A, S>
where
    A: Around,
    S: Service<Request<Body>, Response = Response<AnyBody>, Error = BoxError>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = Response<AnyBody>;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<Response<AnyBody>, BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let inner = take(&mut self.inner);
        Box::pin(self.around.clone().around(request, inner))
    }
}
