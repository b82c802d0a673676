use std::{
    sync::Arc,
    task::{Context, Poll},
};

use tower::Service;
use tracing::field;

use super::ResponseFuture;
use crate::AsMcRequest;

/// Opens a span per reconcile; see the [module docs](super).
#[derive(Debug, Clone)]
pub struct Trace<S> {
    inner: S,
    controller: Option<Arc<str>>,
}

impl<S> Trace<S> {
    /// Wraps `inner`, naming `controller` in the spans if given.
    pub const fn new(inner: S, controller: Option<Arc<str>>) -> Self {
        Self { inner, controller }
    }
}

inner_accessors!(Trace);

impl<S, R> Service<R> for Trace<S>
where
    S: Service<R>,
    S::Error: std::fmt::Display,
    R: AsMcRequest,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: R) -> Self::Future {
        let r = request.mc_request();
        let span = tracing::info_span!(
            "reconcile",
            controller = field::Empty,
            cluster = %r.cluster,
            namespace = r.namespace.as_deref().unwrap_or_default(),
            name = %r.name,
            reason = field::Empty,
            outcome = field::Empty,
            duration_ms = field::Empty,
        );
        if let Some(controller) = self.controller.as_deref().or(request.controller()) {
            span.record("controller", controller);
        }
        if let Some(reason) = request.reason() {
            span.record("reason", field::display(reason));
        }
        let future = span.in_scope(|| self.inner.call(request));
        ResponseFuture::new(future, span)
    }
}
