//! The one etcd that every API server of a fleet stores its data in.

use std::{
    path::Path,
    time::{Duration, Instant},
};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::{
    Error, Result,
    process::{Deadline, Process, free_port},
};

/// A running etcd, listening on 127.0.0.1 only.
#[derive(Debug)]
pub(crate) struct Etcd {
    process: Process,
    port: u16,
}

impl Etcd {
    /// Starts etcd with its data in `dir`, and waits until it is healthy.
    pub(crate) async fn start(binary: &Path, dir: &Path, timeout: Duration) -> Result<Self> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let (port, peer_port) = (free_port()?, free_port()?);
            let client_url = format!("http://127.0.0.1:{port}");
            let peer_url = format!("http://127.0.0.1:{peer_port}");
            let args = vec![
                "--name=envtest".to_owned(),
                format!("--data-dir={}", dir.join("etcd").display()),
                format!("--listen-client-urls={client_url}"),
                format!("--advertise-client-urls={client_url}"),
                format!("--listen-peer-urls={peer_url}"),
                format!("--initial-advertise-peer-urls={peer_url}"),
                format!("--initial-cluster=envtest={peer_url}"),
                "--unsafe-no-fsync=true".to_owned(),
                "--log-level=warn".to_owned(),
            ];
            let process = Process::spawn("etcd".to_owned(), binary, &args, dir.join("etcd.log"))?;
            let mut etcd = Self { process, port };
            match etcd.wait_healthy(timeout).await {
                Err(Error::Exited { .. }) if attempt < 3 && etcd.process.lost_port_race() => {}
                other => return other.map(|()| etcd),
            }
        }
    }

    /// The URL API servers reach it at.
    pub(crate) fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub(crate) fn pid(&self) -> u32 {
        self.process.pid()
    }

    async fn wait_healthy(&mut self, timeout: Duration) -> Result<()> {
        let interval = Duration::from_millis(50);
        let deadline = Deadline::new("etcd", Instant::now(), timeout, interval);
        loop {
            if let Some(exited) = self.process.exit_error() {
                return Err(exited);
            }
            let why = match health(self.port).await {
                Ok(true) => return Ok(()),
                Ok(false) => "/health did not report healthy".to_owned(),
                Err(e) => e.to_string(),
            };
            deadline.not_yet(Some(why)).await?;
        }
    }
}

/// Asks etcd's `/health` endpoint, which answers plain HTTP/1.0 on the client port.
async fn health(port: u16) -> std::io::Result<bool> {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    stream
        .write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    Ok(response.starts_with("HTTP/1.0 200") && response.contains(r#""health":"true""#))
}
