//! The HTTPS server: TLS from the loaded certificate, HTTP/1.1 from hyper,
//! and a route per webhook under each cluster's token.
//!
//! A path is `/fleet/<cluster>/<token>/<webhook>`: the cluster's name as
//! one segment (`~` for the local cluster), the token the registration
//! carries, and the webhook's name. A request whose token is not its
//! cluster's, or whose cluster is not engaged here, is denied without its
//! handler seeing it, whatever the webhook's failure policy.

use std::{
    collections::HashMap,
    convert::Infallible,
    sync::Arc,
    time::{Duration, Instant},
};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::{Method, Request, Response, StatusCode, body::Incoming, header, service::service_fn};
use hyper_util::rt::{TokioIo, TokioTimer};
use kube_multicluster::{ClusterName, Fleet};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use crate::{
    handler::{Handler, refuse},
    metrics::{Metrics, Refusal},
    token::{Tokens, cluster_of},
};

/// The largest review body read: an object and its old version, each up
/// to the API server's own limit of about 3 MiB, with room to spare.
const MAX_BODY: usize = 16 * 1024 * 1024;
/// The largest body read from a request whose token is not valid, for its
/// uid: enough for a review of an ordinary object.
const REFUSED_BODY: usize = 256 * 1024;
/// How long a request's body may take to arrive once its head has.
const BODY_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections served at once; more wait to be accepted.
const MAX_CONNECTIONS: usize = 4096;
/// How long a TLS handshake, or a request's head, may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// What every connection reads.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) handlers: HashMap<Arc<str>, Handler>,
    pub(crate) tokens: Tokens,
    pub(crate) fleet: Fleet,
    pub(crate) metrics: Metrics,
}

/// Serves on `listener` until `stop` is cancelled, then
/// closes the listener and lets the requests in flight finish (for at most
/// `drain`).
pub(crate) async fn serve(
    listener: TcpListener,
    tls: TlsAcceptor,
    shared: Arc<Shared>,
    stop: CancellationToken,
    drain: Duration,
) {
    let mut connections = kube_multicluster::serve(
        listener,
        MAX_CONNECTIONS,
        &stop,
        "the webhook server",
        |stream| {
            let tls = tls.clone();
            let shared = shared.clone();
            let stop = stop.clone();
            async move {
                let stream = match tokio::time::timeout(HANDSHAKE_TIMEOUT, tls.accept(stream)).await
                {
                    Ok(Ok(stream)) => stream,
                    Ok(Err(error)) => {
                        tracing::debug!(%error, "a TLS handshake with the webhook server");
                        return;
                    }
                    Err(_) => return,
                };
                let service = service_fn(move |request| {
                    let shared = shared.clone();
                    async move { Ok::<_, Infallible>(route(&shared, request).await) }
                });
                let connection = hyper::server::conn::http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(HANDSHAKE_TIMEOUT)
                    .serve_connection(TokioIo::new(stream), service);
                let mut connection = std::pin::pin!(connection);
                tokio::select! {
                    result = connection.as_mut() => {
                        if let Err(error) = result {
                            tracing::debug!(%error, "a webhook connection");
                        }
                    }
                    () = stop.cancelled() => {
                        // Finish the request in flight, then close.
                        connection.as_mut().graceful_shutdown();
                        let _ = connection.await;
                    }
                }
            }
        },
    )
    .await;
    let _ = tokio::time::timeout(drain, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    connections.shutdown().await;
}

async fn route(shared: &Shared, request: Request<Incoming>) -> Response<Full<Bytes>> {
    let path = request.uri().path().to_owned();
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let ["fleet", segment, token, name] = parts[..] else {
        shared.metrics.refused(None, Refusal::Unknown);
        return text(
            StatusCode::NOT_FOUND,
            "not found: webhooks are served at /fleet/<cluster>/<token>/<webhook>\n",
        );
    };
    let Some(handler) = shared.handlers.get(name) else {
        shared.metrics.refused(None, Refusal::Unknown);
        return text(
            StatusCode::NOT_FOUND,
            &format!("no webhook named {name:?} here\n"),
        );
    };
    if request.method() != Method::POST {
        shared.metrics.refused(Some(name), Refusal::BadRequest);
        return text(StatusCode::METHOD_NOT_ALLOWED, "POST only\n");
    }
    // The token is checked before the body is read: a caller without one
    // is given little room and little time.
    let cluster = cluster_of(segment);
    let valid = cluster
        .as_ref()
        .is_some_and(|cluster| shared.tokens.verify(cluster, token));
    let limit = if valid { MAX_BODY } else { REFUSED_BODY };
    let read = Limited::new(request.into_body(), limit).collect();
    let body = match tokio::time::timeout(BODY_TIMEOUT, read).await {
        Ok(Ok(body)) => body.to_bytes(),
        Ok(Err(error)) if valid => {
            shared.metrics.refused(Some(name), Refusal::BadRequest);
            return text(
                StatusCode::BAD_REQUEST,
                &format!("reading the request: {error}\n"),
            );
        }
        // Refused below all the same, without the request's uid.
        Ok(Err(_)) => Bytes::new(),
        Err(_) => {
            shared.metrics.refused(Some(name), Refusal::BadRequest);
            return text(
                StatusCode::REQUEST_TIMEOUT,
                &format!("the request's body did not arrive within {BODY_TIMEOUT:?}\n"),
            );
        }
    };
    let Some(cluster) = cluster.filter(|_| valid) else {
        shared.metrics.refused(Some(name), Refusal::Token);
        tracing::warn!(
            webhook = name,
            cluster = segment,
            "a webhook request with a token that is not its cluster's"
        );
        let message = format!(
            "webhook {name:?}: the request's URL carries no valid token for cluster {segment:?}"
        );
        return review(refuse(handler.kind, &body, &message));
    };
    let Some(asking) = shared.fleet.get(&cluster) else {
        shared.metrics.refused(Some(name), Refusal::NotEngaged);
        let message = format!(
            "webhook {name:?}: cluster {:?} is not engaged in this operator's fleet",
            cluster.as_str()
        );
        return review(refuse(handler.kind, &body, &message));
    };
    let began = Instant::now();
    let _flight = shared.metrics.in_flight(name);
    let reply = (handler.call)(body, asking.clone()).await;
    shared
        .metrics
        .answered(name, &asking, 200, reply.outcome, began.elapsed());
    review(reply.body)
}

fn review(body: Vec<u8>) -> Response<Full<Bytes>> {
    Response::builder()
        .header(header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body)))
        .expect("a valid response")
}

fn text(status: StatusCode, body: &str) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
        .body(Full::new(Bytes::from(body.to_owned())))
        .expect("a valid response")
}

/// The path of `webhook` for `cluster`, with its token.
pub(crate) fn path_of(tokens: &Tokens, cluster: &ClusterName, webhook: &str) -> String {
    format!(
        "/fleet/{}/{}/{webhook}",
        crate::token::segment(cluster),
        tokens.token(cluster)
    )
}
