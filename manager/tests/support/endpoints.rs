//! The manager's endpoints, read with a real HTTP client.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::StatusCode;
use hyper_util::{
    client::legacy::{Client as HttpClient, connect::HttpConnector},
    rt::TokioExecutor,
};
use tower::BoxError;

use super::PATIENCE;

/// The endpoints of a manager serving on a port of the loopback address.
pub struct Endpoints {
    base: String,
    http: HttpClient<HttpConnector, Empty<Bytes>>,
}

impl Endpoints {
    pub fn new(port: u16) -> Self {
        Self {
            base: format!("http://127.0.0.1:{port}"),
            http: HttpClient::builder(TokioExecutor::new()).build_http(),
        }
    }

    pub async fn get(&self, path: &str) -> Result<(StatusCode, String), BoxError> {
        let uri: hyper::Uri = format!("{}{path}", self.base).parse()?;
        let response = self.http.get(uri).await?;
        let status = response.status();
        let body = response.into_body().collect().await?.to_bytes();
        Ok((status, String::from_utf8(body.to_vec())?))
    }

    /// Polls `/readyz` until `done` holds for its answer, and returns it.
    pub async fn readyz_until(
        &self,
        done: impl Fn(StatusCode, &str) -> bool,
    ) -> (StatusCode, String) {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            let (status, body) = self.get("/readyz").await.expect("/readyz answers");
            if done(status, &body) {
                return (status, body);
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "/readyz stayed {status}: {body}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

pub fn listener() -> (std::net::TcpListener, u16) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
    let port = listener.local_addr().expect("its address").port();
    (listener, port)
}
