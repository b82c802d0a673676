//! The HTTP endpoints: `/healthz`, `/readyz` and `/metrics`, on hyper.

use std::{convert::Infallible, sync::Arc};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode, body::Incoming, header, service::service_fn};
use hyper_util::rt::TokioIo;
use prometheus_client::{encoding::text::encode, registry::Registry};
use tokio::{net::TcpListener, task::JoinSet};

use crate::readiness::Readiness;

/// What the endpoints read.
#[derive(Debug)]
pub(crate) struct Endpoints {
    pub(crate) readiness: Readiness,
    pub(crate) registry: Registry,
}

const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Serves the endpoints on `listener` until dropped; each connection in a
/// task of its own, ended with the server.
pub(crate) async fn serve(listener: TcpListener, endpoints: Arc<Endpoints>) -> std::io::Error {
    let mut connections = JoinSet::new();
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                // A connection that failed as it was accepted (reset, or too
                // many open files for a moment) ends only itself.
                Err(error) if is_transient(&error) => {
                    tracing::debug!(%error, "accepting a connection");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
                Err(error) => return error,
            },
            Some(_) = connections.join_next() => continue,
        };
        let endpoints = endpoints.clone();
        connections.spawn(async move {
            let service = service_fn(move |request| {
                let endpoints = endpoints.clone();
                async move { Ok::<_, Infallible>(answer(&endpoints, &request)) }
            });
            let connection = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service);
            if let Err(error) = connection.await {
                tracing::debug!(%error, "an endpoint connection");
            }
        });
    }
}

fn is_transient(error: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        error.kind(),
        ConnectionAborted | ConnectionReset | Interrupted | WouldBlock
    ) || error.raw_os_error() == Some(24) // EMFILE
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
