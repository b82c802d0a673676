use std::{
    future::Future,
    panic::{AssertUnwindSafe, catch_unwind},
    pin::Pin,
    task::{Context, Poll},
};

use pin_project_lite::pin_project;
use tower::BoxError;

use super::Panicked;

pin_project! {
    /// Response future of [`CatchPanic`](super::CatchPanic).
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
        Running { #[pin] inner: F },
        Panicked { error: Option<Panicked> },
    }
}

impl<F> ResponseFuture<F> {
    pub(crate) fn running(inner: F) -> Self {
        Self {
            kind: Kind::Running { inner },
        }
    }

    pub(crate) fn panicked(error: Panicked) -> Self {
        Self {
            kind: Kind::Panicked { error: Some(error) },
        }
    }
}

impl<F, T, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<T, E>>,
    E: Into<BoxError>,
{
    type Output = Result<T, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            Projected::Running { inner } => {
                match catch_unwind(AssertUnwindSafe(|| inner.poll(cx))) {
                    Ok(poll) => poll.map_err(Into::into),
                    Err(payload) => Poll::Ready(Err(Panicked::from_payload(payload).into())),
                }
            }
            Projected::Panicked { error } => {
                Poll::Ready(Err(error.take().expect("polled after completion").into()))
            }
        }
    }
}
