use std::{
    future::Future,
    pin::Pin,
    task::{Context, Poll},
    time::Duration,
};

use pin_project_lite::pin_project;
use tokio::time::Sleep;
use tower::Service;

pin_project! {
    /// Response future of [`RateLimit`](super::RateLimit).
    pub struct ResponseFuture<S: Service<R>, R> {
        #[pin]
        kind: Kind<S, R>,
    }
}

pin_project! {
    #[project = Projected]
    #[project_replace = Replaced]
    enum Kind<S: Service<R>, R> {
        Waiting { #[pin] sleep: Sleep, service: S, request: R },
        Called { #[pin] future: S::Future },
        Taken,
    }
}

impl<S: Service<R>, R> ResponseFuture<S, R> {
    pub(crate) fn called(future: S::Future) -> Self {
        Self {
            kind: Kind::Called { future },
        }
    }

    pub(crate) fn waiting(service: S, request: R, wait: Duration) -> Self {
        Self {
            kind: Kind::Waiting {
                sleep: tokio::time::sleep(wait),
                service,
                request,
            },
        }
    }
}

impl<S: Service<R>, R> std::fmt::Debug for ResponseFuture<S, R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match self.kind {
            Kind::Waiting { .. } => "waiting for a token",
            Kind::Called { .. } => "called",
            Kind::Taken => "done",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish()
    }
}

impl<S: Service<R>, R> Future for ResponseFuture<S, R> {
    type Output = Result<S::Response, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut kind = self.project().kind;
        loop {
            match kind.as_mut().project() {
                Projected::Called { future } => return future.poll(cx),
                Projected::Waiting { sleep, .. } => {
                    std::task::ready!(sleep.poll(cx));
                    let Replaced::Waiting {
                        mut service,
                        request,
                        ..
                    } = kind.as_mut().project_replace(Kind::Taken)
                    else {
                        unreachable!("just matched Waiting");
                    };
                    let future = service.call(request);
                    kind.set(Kind::Called { future });
                }
                Projected::Taken => unreachable!("polled after completion"),
            }
        }
    }
}
