use std::{
    future::Future,
    pin::Pin,
    task::{Context, Poll},
};

use kube_fleet::Action;
use pin_project_lite::pin_project;
use tower::BoxError;

pin_project! {
    /// Response future of [`ResolveCluster`](super::ResolveCluster).
    #[derive(Debug)]
    pub struct ResponseFuture<F> {
        #[pin]
        kind: Kind<F>,
    }
}

pin_project! {
    #[project = Projected]
    #[derive(Debug)]
    enum Kind<F> {
        Called { #[pin] inner: F },
        // The cluster is not in the fleet: done, nothing to retry.
        Gone,
    }
}

impl<F> ResponseFuture<F> {
    pub(crate) fn called(inner: F) -> Self {
        Self {
            kind: Kind::Called { inner },
        }
    }

    pub(crate) fn gone() -> Self {
        Self { kind: Kind::Gone }
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
            Projected::Gone => Poll::Ready(Ok(Action::await_change())),
        }
    }
}
