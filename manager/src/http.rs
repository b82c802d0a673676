//! The HTTP endpoints: `/healthz`, `/readyz` and `/metrics`, on hyper.

use std::{convert::Infallible, sync::Arc};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode, body::Incoming, header, service::service_fn};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::{encoding::text::encode, registry::Registry};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::readiness::Readiness;

/// What the endpoints read.
#[derive(Debug)]
pub(crate) struct Endpoints {
    pub(crate) readiness: Readiness,
    pub(crate) registry: Registry,
}

/// Connections served at once; more wait to be accepted.
const MAX_CONNECTIONS: usize = 64;
/// How long a client may take to send a request's head.
const HEAD_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Serves the endpoints on `listener`, each connection in a task of its
/// own, until `stop` is cancelled. Then it closes the
/// listener and ends every connection before it returns. Dropped, it ends
/// them too, as their tasks are next polled.
pub(crate) async fn serve(
    listener: TcpListener,
    endpoints: Arc<Endpoints>,
    stop: CancellationToken,
) {
    let mut open = kube_multicluster::serve(
        listener,
        MAX_CONNECTIONS,
        &stop,
        "the endpoints",
        |stream| {
            let endpoints = endpoints.clone();
            async move {
                let service = service_fn(move |request| {
                    let endpoints = endpoints.clone();
                    async move { Ok::<_, Infallible>(answer(&endpoints, &request)) }
                });
                let connection = hyper::server::conn::http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(HEAD_TIMEOUT)
                    .serve_connection(TokioIo::new(stream), service);
                if let Err(error) = connection.await {
                    tracing::debug!(%error, "an endpoint connection");
                }
            }
        },
    )
    .await;
    open.shutdown().await;
}

fn answer(endpoints: &Endpoints, request: &Request<Incoming>) -> Response<Full<Bytes>> {
    if request.method() != Method::GET && request.method() != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "GET only\n".into());
    }
    match request.uri().path() {
        "/healthz" | "/livez" => text(StatusCode::OK, "ok\n".into()),
        "/readyz" => {
            let (ready, body) = endpoints.readiness.check();
            let status = if ready {
                StatusCode::OK
            } else {
                StatusCode::SERVICE_UNAVAILABLE
            };
            text(status, body)
        }
        "/metrics" => {
            let mut body = String::new();
            match encode(&mut body, &endpoints.registry) {
                Ok(()) => Response::builder()
                    .header(header::CONTENT_TYPE, OPENMETRICS)
                    .body(Full::new(Bytes::from(body)))
                    .expect("a valid response"),
                Err(error) => text(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("encoding the metrics: {error}\n"),
                ),
            }
        }
        _ => text(
            StatusCode::NOT_FOUND,
            "not found: try /healthz, /readyz or /metrics\n".into(),
        ),
    }
}

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
        .body(Full::new(Bytes::from(body)))
        .expect("a valid response")
}
