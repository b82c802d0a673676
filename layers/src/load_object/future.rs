use std::{
    future::Future,
    pin::Pin,
    task::{Context, Poll},
};

use futures::future::BoxFuture;
use kube_fleet::Action;
use pin_project_lite::pin_project;
use tower::BoxError;

pin_project! {
    /// Response future of [`LoadObject`](super::LoadObject).
    pub struct ResponseFuture<F> {
        #[pin]
        kind: Kind<F>,
    }
}

pin_project! {
    #[project = Projected]
    enum Kind<F> {
        // The object came from a synced cache; the inner service runs.
        Called { #[pin] inner: F },
        // The object is still being loaded (rare: no synced cache yet).
        Loading { future: BoxFuture<'static, Result<Action, BoxError>> },
    }
}

impl<F> ResponseFuture<F> {
    pub(crate) fn called(inner: F) -> Self {
        Self {
            kind: Kind::Called { inner },
        }
    }

    pub(crate) fn loading(
        future: impl Future<Output = Result<Action, BoxError>> + Send + 'static,
    ) -> Self {
        Self {
            kind: Kind::Loading {
                future: Box::pin(future),
            },
        }
    }
}

impl<F> std::fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match self.kind {
            Kind::Called { .. } => "called",
            Kind::Loading { .. } => "loading",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish()
    }
}

impl<F, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<Action, E>>,
    E: Into<BoxError>,
{
    type Output = Result<Action, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            Projected::Called { inner } => inner.poll(cx).map_err(Into::into),
            Projected::Loading { future } => future.as_mut().poll(cx),
        }
    }
}
