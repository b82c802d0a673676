use std::{
    future::Future,
    pin::Pin,
    task::{Context, Poll},
    time::Duration,
};

use pin_project_lite::pin_project;
use tokio::time::Sleep;
use tower::Service;

use super::TokenBucket;

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
        // Waits for the token; dropped before it is used, the token goes back.
        Waiting { #[pin] sleep: Sleep, service: S, request: R, token: Token },
        // Has its token; waits for its own clone of the service to be ready.
        Readying { service: S, request: R },
        Called { #[pin] future: S::Future },
        Taken,
    }
}

/// A reserved token, returned to its bucket unless it was used.
pub(crate) struct Token(Option<TokenBucket>);

impl Token {
    fn used(&mut self) {
        self.0 = None;
    }
}

impl Drop for Token {
    fn drop(&mut self) {
        if let Some(bucket) = self.0.take() {
            bucket.give_back();
        }
    }
}

impl<S: Service<R>, R> ResponseFuture<S, R> {
    pub(crate) fn called(future: S::Future) -> Self {
        Self {
            kind: Kind::Called { future },
        }
    }

    /// `service` is a fresh clone, not the one that said it was ready: a
    /// waiting request must not hold what readiness reserved (a concurrency
    /// slot, say) while it waits.
    pub(crate) fn waiting(service: S, request: R, wait: Duration, bucket: TokenBucket) -> Self {
        Self {
            kind: Kind::Waiting {
                sleep: tokio::time::sleep(wait),
                service,
                request,
                token: Token(Some(bucket)),
            },
        }
    }
}

impl<S: Service<R>, R> std::fmt::Debug for ResponseFuture<S, R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match self.kind {
            Kind::Waiting { .. } => "waiting for a token",
            Kind::Readying { .. } => "waiting for the service",
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
                        service,
                        request,
                        mut token,
                        ..
                    } = kind.as_mut().project_replace(Kind::Taken)
                    else {
                        unreachable!("just matched Waiting");
                    };
                    token.used();
                    kind.set(Kind::Readying { service, request });
                }
                Projected::Readying { service, .. } => {
                    if let Err(error) = std::task::ready!(service.poll_ready(cx)) {
                        kind.set(Kind::Taken);
                        return Poll::Ready(Err(error));
                    }
                    let Replaced::Readying {
                        mut service,
                        request,
                    } = kind.as_mut().project_replace(Kind::Taken)
                    else {
                        unreachable!("just matched Readying");
                    };
                    let future = service.call(request);
                    kind.set(Kind::Called { future });
                }
                Projected::Taken => unreachable!("polled after completion"),
            }
        }
    }
}
