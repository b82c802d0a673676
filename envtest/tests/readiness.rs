//! What a test that installs a tracing subscriber sees while a fleet starts.
//!
//! A test binary of its own: the subscriber is the process-wide default, so it
//! also sees events from tasks and threads the harness does not own.

use std::{
    io::Write,
    sync::{Arc, Mutex},
};

use kube_multicluster_envtest::Envtest;
use tracing_subscriber::{filter::LevelFilter, util::SubscriberInitExt};

/// Collects formatted events in memory.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn waiting_for_readiness_logs_no_warnings_or_errors() {
    let captured = Captured::default();
    let writer = captured.clone();
    tracing_subscriber::fmt()
        .with_max_level(LevelFilter::WARN)
        .with_writer(move || writer.clone())
        .finish()
        .init();

    let fleet = Envtest::start(1).await.expect("fleet starts");
    let cluster = &fleet.clusters()[0];
    cluster.stop();
    cluster.restart().await.expect("restarts");

    let logged = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    assert!(logged.is_empty(), "starting a fleet logged:\n{logged}");
}
