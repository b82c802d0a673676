use std::{
    future::Future,
    pin::Pin,
    task::{Context, Poll},
};

use kube_fleet::Action;
use pin_project_lite::pin_project;

pin_project! {
    /// Response future of [`ResolveCluster`](super::ResolveCluster).
    #[derive(Debug)]
    pub struct ResponseFuture<F> {
        #[pin]
        inner: Option<F>,
    }
}

impl<F> ResponseFuture<F> {
    pub(crate) fn called(inner: F) -> Self {
        Self { inner: Some(inner) }
    }

    /// The cluster has left: done, nothing to retry.
    pub(crate) fn gone() -> Self {
        Self { inner: None }
    }
}

impl<F, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<Action, E>>,
{
    type Output = Result<Action, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().inner.as_pin_mut() {
            Some(inner) => inner.poll(cx),
            None => Poll::Ready(Ok(Action::await_change())),
        }
    }
}
