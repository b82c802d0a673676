//! Whether a cluster answers: what its client's requests find, told once
//! per change rather than once per request.
//!
//! A cluster that stops answering (its API server is down, cut off, or
//! answers through a gateway with `502`-`504`) is a normal condition in a
//! fleet. Its client's requests all fail until it is back; each engaged
//! cluster's [`Reachability`] turns those failures into two transitions,
//! logged once each at `WARN` with the cause: the cluster stops answering,
//! and it answers again. While it is down, one request at a time asks it
//! every [`PROBE_INTERVAL`] whether it is back, so that its return is
//! noticed within that interval even where nothing else asks (watches and
//! keys waiting out their backoff): controllers then run at once the keys
//! that failed for want of an answer.

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use http::{Request, StatusCode};
use kube::{Client, client::Body};
use tokio::{sync::watch, time::Instant};

use super::error::is_gateway_failure;
use crate::ClusterName;

/// How often a cluster that does not answer is asked whether it is back.
pub(crate) const PROBE_INTERVAL: Duration = Duration::from_millis(250);

/// How long one probe may wait for its answer (a hung server gives none).
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// Whether one engaged cluster answers, as its client's requests find it.
#[derive(Debug)]
pub(crate) struct Reachability {
    cluster: ClusterName,
    /// Read on every answer, so a flag rather than the lock.
    down: AtomicBool,
    since: Mutex<Option<Instant>>,
    /// How many times the cluster answered again after it did not.
    recoveries: watch::Sender<u64>,
    /// The engagement has ended: no more probes.
    closed: AtomicBool,
}

impl Reachability {
    pub(crate) fn new(cluster: ClusterName) -> Self {
        Self {
            cluster,
            down: AtomicBool::new(false),
            since: Mutex::new(None),
            recoveries: watch::Sender::new(0),
            closed: AtomicBool::new(false),
        }
    }

    /// Whether the cluster answered its client's last request (or has not
    /// been asked yet).
    pub(crate) fn is_answering(&self) -> bool {
        !self.down.load(Ordering::Acquire)
    }

    /// Changes each time the cluster answers again after it did not.
    pub(crate) fn recoveries(&self) -> watch::Receiver<u64> {
        self.recoveries.subscribe()
    }

    /// The engagement has ended: probes stop, and nothing more is told.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
    }

    /// A request got an answer: `status`, or `None` for none at all (the
    /// connection failed, or timed out) with `cause` saying why.
    /// `client` is the cluster's own client, below the counting, which a
    /// probe asks while the cluster does not answer.
    pub(crate) fn heard(
        self: &Arc<Self>,
        status: Option<StatusCode>,
        cause: impl FnOnce() -> String,
        client: &Client,
    ) {
        match status {
            Some(status) if !is_gateway_failure(status) => self.answered(),
            Some(status) => {
                self.failed(&format!("it answers {status} (a gateway failure)"), client)
            }
            None => self.failed(&cause(), client),
        }
    }

    fn answered(&self) {
        if !self.down.load(Ordering::Acquire) || !self.down.swap(false, Ordering::AcqRel) {
            return;
        }
        let since = self.since.lock().unwrap_or_else(|e| e.into_inner()).take();
        if self.closed.load(Ordering::Acquire) {
            return;
        }
        let after = since.map(|since| since.elapsed()).unwrap_or_default();
        tracing::warn!(cluster = %self.cluster, down_for = ?after, "the cluster answers again");
        self.recoveries.send_modify(|n| *n += 1);
    }

    fn failed(self: &Arc<Self>, cause: &str, client: &Client) {
        if self.closed.load(Ordering::Acquire) {
            return;
        }
        if self.down.swap(true, Ordering::AcqRel) {
            tracing::debug!(cluster = %self.cluster, %cause, "the cluster still does not answer");
            return;
        }
        *self.since.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
        tracing::warn!(cluster = %self.cluster, %cause, "the cluster does not answer; its requests fail until it is back");
        tokio::spawn(probe(Arc::downgrade(self), client.clone()));
    }
}

/// Asks the cluster every [`PROBE_INTERVAL`] until it answers, its
/// engagement ends, or no one holds its client any more.
async fn probe(reachability: std::sync::Weak<Reachability>, client: Client) {
    loop {
        tokio::time::sleep(PROBE_INTERVAL).await;
        let Some(reachability) = reachability.upgrade() else {
            return;
        };
        if reachability.closed.load(Ordering::Acquire) || reachability.is_answering() {
            return;
        }
        let request = Request::get("/version")
            .body(Body::empty())
            .expect("a static request is valid");
        match tokio::time::timeout(PROBE_TIMEOUT, client.send(request)).await {
            Ok(Ok(response)) if !is_gateway_failure(response.status()) => {
                reachability.answered();
                return;
            }
            // Still no answer: asked again after the interval.
            _ => {}
        }
    }
}
