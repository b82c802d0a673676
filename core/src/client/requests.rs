//! The layers of each cluster's client that count its requests: once per
//! request from when it is sent ([`CountLayer`]), and once per attempt in
//! this crate's connection stack below (`CountAttemptsLayer`), the
//! attempts standing for the request where there are any.

use std::{
    future::Future,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
};

#[cfg(feature = "rustls-tls")]
use std::task::{Context, Poll};

#[cfg(feature = "rustls-tls")]
use futures::future::BoxFuture;
use http::{Method, Request, Response, StatusCode};
use kube::client::Body;
use tokio::time::Instant;
use tower::BoxError;
#[cfg(feature = "rustls-tls")]
use tower::Service;

use super::{
    budget::Budget,
    cluster_client::AnyBody,
    inner::{Around, Below},
    stats::RequestStats,
};

/// Carried in a request's extensions from the cluster's client down to
/// this crate's client stack, which counts each attempt itself.
#[derive(Debug, Clone)]
pub(super) struct Counted {
    stats: Arc<RequestStats>,
    /// Some attempt was counted inside the stack.
    inside: Arc<AtomicBool>,
    /// The cluster's request budget, which a `429` holds back.
    #[cfg_attr(not(feature = "rustls-tls"), allow(dead_code))]
    budget: Option<Arc<Budget>>,
}

/// One request or attempt on its way: counted once it ends, and counted
/// as answerless (`code` `None`) if it is given up before, as a request cut
/// short by a timeout or a cancelled reconcile is.
struct Pending {
    counted: Counted,
    method: Method,
    host: Option<String>,
    started: Instant,
    /// Counted below the cluster's client, inside kube-multicluster's stack.
    inside: bool,
    ended: bool,
}

impl Pending {
    fn new(counted: Counted, method: Method, host: Option<String>, inside: bool) -> Self {
        Self {
            counted,
            method,
            host,
            started: Instant::now(),
            inside,
            ended: false,
        }
    }

    fn done(&mut self, code: Option<StatusCode>) {
        self.ended = true;
        // The cluster's side counts only what the stack below did not.
        if self.inside || !self.counted.inside.load(Ordering::Acquire) {
            let took = self.started.elapsed();
            self.counted
                .stats
                .record(&self.method, code, took, self.host.as_deref());
        }
        if self.inside {
            self.counted.inside.store(true, Ordering::Release);
        }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if !self.ended {
            self.done(None);
        }
    }
}

/// What a client stacked over another marks its requests with, as if it
/// had counted them.
#[cfg(test)]
pub(super) fn counted_elsewhere() -> Counted {
    Counted {
        stats: Arc::default(),
        inside: Arc::default(),
        budget: None,
    }
}

/// Whether a client stacked over this one has counted `request` already.
pub(super) fn is_counted<B>(request: &Request<B>) -> bool {
    request.extensions().get::<Counted>().is_some()
}

/// Counts and times each request from when it is sent, and marks it, so
/// that the attempts below it (`CountAttemptsLayer`) count for it and a
/// client stacked below this one does not count it again.
#[derive(Clone)]
pub(super) struct Counting {
    pub(super) stats: Arc<RequestStats>,
    /// The budget each attempt's `429` is told to.
    pub(super) budget: Option<Arc<Budget>>,
}

impl Around for Counting {
    fn around<S: Below>(
        self,
        mut request: Request<Body>,
        mut inner: S,
    ) -> impl Future<Output = Result<Response<AnyBody>, BoxError>> + Send + 'static {
        let counted = Counted {
            stats: self.stats,
            inside: Arc::default(),
            budget: self.budget,
        };
        request.extensions_mut().insert(counted.clone());
        async move {
            let mut pending = Pending::new(counted, request.method().clone(), None, false);
            let result = inner.call(request).await;
            pending.done(result.as_ref().ok().map(Response::status));
            result
        }
    }
}

#[cfg(feature = "rustls-tls")]
/// Counts each attempt of a request marked by its cluster's client: placed
/// below the retries of this crate's client stack.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct CountAttemptsLayer;

#[cfg(feature = "rustls-tls")]
impl<S> tower::Layer<S> for CountAttemptsLayer {
    type Service = Count<S>;

    fn layer(&self, inner: S) -> Count<S> {
        Count { inner }
    }
}

#[cfg(feature = "rustls-tls")]
#[derive(Debug, Clone)]
pub(crate) struct Count<S> {
    inner: S,
}

#[cfg(feature = "rustls-tls")]
impl<S, B, R> Service<Request<B>> for Count<S>
where
    S: Service<Request<B>, Response = Response<R>>,
    S::Future: Send + 'static,
{
    type Response = Response<R>;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Response<R>, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let mut pending = request
            .extensions()
            .get::<Counted>()
            .cloned()
            .map(|counted| {
                let host = request.uri().authority().map(|a| a.as_str().to_owned());
                Pending::new(counted, request.method().clone(), host, true)
            });
        let response = self.inner.call(request);
        Box::pin(async move {
            let result = response.await;
            if let Some(pending) = &mut pending {
                pending.done(result.as_ref().ok().map(Response::status));
                // Each attempt's 429, before the retries send it again.
                if let (Some(budget), Ok(response)) = (&pending.counted.budget, &result) {
                    budget.answered(&pending.method, response.status(), response.headers());
                }
            }
            result
        })
    }
}
