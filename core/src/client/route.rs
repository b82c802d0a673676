//! Which connection a request takes: the cluster's HTTP/2 connection, or
//! an HTTP/1.1 one where HTTP/2 cannot carry it.

use std::{
    pin::Pin,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    task::{Context, Poll},
    time::{Duration, Instant},
};

use futures::future::BoxFuture;
use http::{Request, Response, Uri};
use http_body::{Body as HttpBody, Frame, SizeHint};
use hyper::body::{Bytes, Incoming};
use hyper_util::client::legacy::{self, connect::Connection};
use kube::client::Body;
use tower::{BoxError, Service, ServiceExt};

use crate::{error::causes, panic::lock};

/// How long a client speaks HTTP/1.1 only after a connection to its server
/// did not agree to HTTP/2.
const HTTP2_OFF_FOR: Duration = Duration::from_secs(300);

/// How many times a request the server refused unprocessed is sent again.
const UNPROCESSED_RETRIES: usize = 3;

/// What the router of one client knows.
#[derive(Debug, Default)]
struct State {
    /// Requests and watches on the HTTP/2 connection now.
    streams: AtomicUsize,
    /// Until when to speak HTTP/1.1 only.
    http2_off_until: Mutex<Option<Instant>>,
}

impl State {
    fn http2_on(&self) -> bool {
        let mut off = lock(&self.http2_off_until);
        match *off {
            Some(until) if Instant::now() < until => false,
            Some(_) => {
                *off = None;
                true
            }
            None => true,
        }
    }

    fn http2_off(&self) {
        *lock(&self.http2_off_until) = Some(Instant::now() + HTTP2_OFF_FOR);
    }
}

/// One stream of the HTTP/2 connection, counted while its response lives.
#[derive(Debug)]
struct Stream(Arc<State>);

impl Stream {
    /// A stream, unless `max` are open already.
    fn take(state: &Arc<State>, max: usize) -> Option<Self> {
        state
            .streams
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()
            .map(|_| Self(state.clone()))
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        self.0.streams.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A response body that holds its HTTP/2 stream's place until it is read
/// to the end or dropped.
#[derive(Debug)]
pub(super) struct Counted {
    body: Incoming,
    stream: Option<Stream>,
}

impl HttpBody for Counted {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        if let Poll::Ready(None | Some(Err(_))) = polled {
            // The stream is closed: its place is free.
            self.stream = None;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// Sends each request over the cluster's HTTP/2 connection, except:
/// - upgrades (exec, attach, port-forward), which HTTP/2 cannot carry, go
///   over HTTP/1.1;
/// - when `max_streams` requests and watches are open on it already, the
///   next goes over HTTP/1.1 rather than wait for one of them to end (a
///   watch may never end);
/// - when a connection to the server did not agree to HTTP/2 in the TLS
///   handshake, every request goes over HTTP/1.1 for a while. Other
///   connection errors (a cluster that cannot be reached) are returned as
///   they are, with no second attempt.
///
/// A request that the server refused unprocessed as it closed the
/// connection (`GOAWAY`, `REFUSED_STREAM`) is sent again, up to three times.
#[derive(Debug, Clone)]
pub(super) struct Route<H2, H1> {
    http2: H2,
    http1: H1,
    max_streams: usize,
    state: Arc<State>,
}

impl<H2, H1> Route<H2, H1> {
    pub(super) fn new(http2: H2, http1: H1, max_streams: usize) -> Self {
        Self {
            http2,
            http1,
            max_streams,
            state: Arc::default(),
        }
    }
}

type Sent = Result<Response<Incoming>, legacy::Error>;

impl<H2, H1> Service<Request<Body>> for Route<H2, H1>
where
    H2: Service<Request<Body>, Response = Response<Incoming>, Error = legacy::Error>
        + Clone
        + Send
        + 'static,
    H2::Future: Send + 'static,
    H1: Service<Request<Body>, Response = Response<Incoming>, Error = legacy::Error>
        + Clone
        + Send
        + 'static,
    H1::Future: Send + 'static,
{
    type Response = Response<Counted>;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<Response<Counted>, BoxError>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        // Each request readies its own clone of the client it takes.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let (http2, http1) = (self.http2.clone(), self.http1.clone());
        let (state, max_streams) = (self.state.clone(), self.max_streams);
        Box::pin(async move {
            let upgrade = request.headers().contains_key(http::header::UPGRADE);
            let stream = (!upgrade && state.http2_on())
                .then(|| Stream::take(&state, max_streams))
                .flatten();
            let Some(stream) = stream else {
                return counted(http1.oneshot(request).await, None);
            };
            let (mut request, mut retries) = (request, 0);
            loop {
                let spare = try_clone(&request);
                let error = match http2.clone().oneshot(request).await {
                    Ok(response) => return counted(Ok(response), Some(stream)),
                    Err(error) => error,
                };
                let Some(spare) = spare else {
                    return Err(error.into());
                };
                if unprocessed(&error) && retries < UNPROCESSED_RETRIES {
                    // The connection is going away; the next request opens
                    // another, which may go away in turn.
                    (request, retries) = (spare, retries + 1);
                    continue;
                }
                if error.is_connect() && (refuses_http2(&error) || !state.http2_on()) {
                    // The server (or what is in between) did not agree to
                    // HTTP/2, as this request or another found meanwhile.
                    drop(stream);
                    if state.http2_on() {
                        tracing::debug!(
                            error = %crate::client::error_chain(&error),
                            "no HTTP/2 from the server; speaking HTTP/1.1 for a while"
                        );
                        state.http2_off();
                    }
                    return counted(http1.oneshot(spare).await, None);
                }
                return Err(error.into());
            }
        })
    }
}

fn counted(sent: Sent, stream: Option<Stream>) -> Result<Response<Counted>, BoxError> {
    Ok(sent?.map(|body| Counted { body, stream }))
}

/// A copy of `request` to send again, if its body is not a stream.
fn try_clone(request: &Request<Body>) -> Option<Request<Body>> {
    let body = request.body().try_clone()?;
    let mut copy = Request::new(body);
    *copy.method_mut() = request.method().clone();
    *copy.uri_mut() = request.uri().clone();
    *copy.version_mut() = request.version();
    *copy.headers_mut() = request.headers().clone();
    *copy.extensions_mut() = request.extensions().clone();
    Some(copy)
}

/// Whether the server refused the request without processing it: its
/// stream came after the last one the server took before it closed the
/// connection, or the stream was refused.
fn unprocessed(error: &legacy::Error) -> bool {
    causes(error)
        .find_map(|cause| cause.downcast_ref::<h2::Error>())
        .is_some_and(|h2| {
            let going_away = h2.is_go_away() && h2.is_remote();
            (going_away && h2.reason() == Some(h2::Reason::NO_ERROR))
                || h2.reason() == Some(h2::Reason::REFUSED_STREAM)
        })
}

/// Whether `error` is a connection that did not agree to HTTP/2.
fn refuses_http2(error: &legacy::Error) -> bool {
    causes(error).any(|cause| cause.is::<NoHttp2>())
}

/// A connector whose connections must have agreed on HTTP/2 in the TLS
/// handshake; any other fails to connect, so that the request can go over
/// HTTP/1.1 instead of speaking HTTP/2 to a server that does not.
#[derive(Debug, Clone)]
pub(super) struct RequireHttp2<C>(pub(super) C);

/// The server did not agree to HTTP/2 in the TLS handshake.
#[derive(Debug, thiserror::Error)]
#[error("the server did not agree to HTTP/2 in the TLS handshake")]
struct NoHttp2;

impl<C> Service<Uri> for RequireHttp2<C>
where
    C: Service<Uri>,
    C::Response: Connection + Send + 'static,
    C::Error: Into<BoxError>,
    C::Future: Send + 'static,
{
    type Response = C::Response;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<C::Response, BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.0.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let connecting = self.0.call(uri);
        Box::pin(async move {
            let io = connecting.await.map_err(Into::into)?;
            if io.connected().is_negotiated_h2() {
                Ok(io)
            } else {
                Err(NoHttp2.into())
            }
        })
    }
}
