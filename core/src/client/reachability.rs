//! Whether a cluster answers: what its client's requests find, told once
//! per change rather than once per request.
//!
//! A cluster that stops answering (its API server is down or cut off) is a
//! normal condition in a fleet. Its client's requests all fail until it is
//! back; each engaged cluster's [`Reachability`] turns those failures into
//! two transitions, logged once each at `WARN` with the cause: the cluster
//! stops answering, and it answers again. While it is down, one request at
//! a time asks it whether it is ready (`GET /readyz`), every
//! [`PROBE_INTERVAL`] for the first [`PROBE_FAST_FOR`] and every
//! [`PROBE_SLOW_INTERVAL`] after, so that its return is noticed even where
//! nothing else asks (watches and keys waiting out their backoff):
//! controllers then run at once the keys that failed for want of an answer.
//!
//! A gateway's `502`-`504` may be one API's trouble (an aggregated API that
//! is down) rather than the cluster's: it marks the cluster down only if the
//! cluster's own readiness does not answer either.

use std::{
    sync::{
        Arc, Mutex, Weak,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use http::{Request, StatusCode};
use kube::client::Body;
use tokio::{runtime::Handle, sync::watch, time::Instant};

use super::{
    cluster_client::ClusterClient,
    error::{error_chain, is_gateway_failure},
};
use crate::cluster_name::ClusterName;

/// How often a cluster that does not answer is asked whether it is back,
/// for the first [`PROBE_FAST_FOR`] of an outage.
pub(crate) const PROBE_INTERVAL: Duration = Duration::from_millis(250);

/// How long a cluster is asked every [`PROBE_INTERVAL`].
pub(crate) const PROBE_FAST_FOR: Duration = Duration::from_secs(30);

/// How often a cluster that has not answered for longer is asked.
pub(crate) const PROBE_SLOW_INTERVAL: Duration = Duration::from_secs(5);

/// How long one probe may wait for its answer (a hung server gives none).
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a probe of a quiet cluster may wait for its answer: as long,
/// plus the time a credential plugin may take to renew the token first.
const IDLE_PROBE_TIMEOUT: Duration = PROBE_TIMEOUT.saturating_add(super::PLUGIN_TIMEOUT);

/// A cluster's outages, as its reachability knows them.
#[derive(Debug, Default)]
struct Outage {
    /// Since when and why it does not answer, while it does not.
    current: Option<(Instant, String)>,
    /// When it last answered again after it did not.
    recovered_at: Option<Instant>,
}

/// Whether one engaged cluster answers, as its client's requests find it.
pub(crate) struct Reachability {
    cluster: ClusterName,
    /// Read on every answer, so a flag rather than the lock.
    down: AtomicBool,
    /// A probe runs (at most one at a time).
    probing: AtomicBool,
    /// The outage: since when and why the cluster does not answer, and
    /// when it last answered again after one. `down` flips under this
    /// lock, so the two always agree.
    outage: Mutex<Outage>,
    /// How many times the cluster answered again after it did not.
    recoveries: watch::Sender<u64>,
    /// The clusters that share it are each collected apart (the logical
    /// clusters of a host split by annotation): no object of one is found
    /// by the garbage collector of another.
    apart: bool,
    /// The engagement has ended: no more probes.
    closed: AtomicBool,
    /// Where probes run: the runtime the cluster was engaged in.
    runtime: Option<Handle>,
    /// What probes ask through: the cluster's client below the counting
    /// (which holds this), so that no probe keeps this alive.
    client: ClusterClient,
    /// When this was made: what `heard` counts from.
    born: Instant,
    /// When the cluster last answered anything, in milliseconds after
    /// `born`: on every answer, so an atomic.
    heard: AtomicU64,
}

impl std::fmt::Debug for Reachability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reachability")
            .field("cluster", &self.cluster)
            .field("answering", &self.is_answering())
            .finish_non_exhaustive()
    }
}

impl Reachability {
    /// For the cluster `cluster`, probed through `client` (its own, not
    /// one that reports here).
    /// The same, for clusters that share it but are each collected apart
    /// (`apart`), or not.
    pub(crate) fn collected_apart(mut self, apart: bool) -> Self {
        self.apart = apart;
        self
    }

    /// Whether the clusters that share it are each collected apart.
    pub(crate) fn is_collected_apart(&self) -> bool {
        self.apart
    }

    pub(crate) fn new(cluster: ClusterName, client: ClusterClient) -> Self {
        Self {
            client,
            cluster,
            down: AtomicBool::new(false),
            probing: AtomicBool::new(false),
            outage: Mutex::default(),
            recoveries: watch::Sender::new(0),
            closed: AtomicBool::new(false),
            runtime: Handle::try_current().ok(),
            born: Instant::now(),
            heard: AtomicU64::new(0),
            apart: false,
        }
    }

    /// The client probes ask through: the one the cluster was engaged
    /// with.
    pub(crate) fn client(&self) -> &ClusterClient {
        &self.client
    }

    /// The cluster answered something now.
    fn heard(&self) {
        let millis = self.born.elapsed().as_millis();
        self.heard
            .store(u64::try_from(millis).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// For how long, at `now`, nothing has been heard from the cluster (or
    /// since this was made, if nothing ever was).
    pub(crate) fn silent_for(&self, now: Instant) -> Duration {
        let heard = self.born + Duration::from_millis(self.heard.load(Ordering::Relaxed));
        now.saturating_duration_since(heard)
    }

    /// Asks the cluster whether it is ready if it answers (as far as is
    /// known) but nothing has been heard from it for `after`: the light
    /// probe that finds a cluster gone quiet where nothing else asks it
    /// (no request, and watches that hear nothing). An answer counts as
    /// heard; none marks the cluster down, and the probe then goes on as
    /// for any outage.
    pub(crate) fn probe_if_silent(self: &Arc<Self>, after: Duration, now: Instant) {
        if self.is_answering()
            && !self.is_closed()
            && self.silent_for(now) >= after
            && !self.probing.load(Ordering::SeqCst)
        {
            // Asked counts as heard: a probe that learns nothing (no
            // credentials to ask with) is not made again before `after`.
            self.heard();
            // At once; no answer in the idle probe's time marks it down (it
            // is quiet: the wait cannot be for a request of its own).
            self.start_probe(true, true);
        }
    }

    /// Whether the cluster answered its client's last request (or has not
    /// been asked yet).
    pub(crate) fn is_answering(&self) -> bool {
        !self.down.load(Ordering::SeqCst)
    }

    fn outage(&self) -> std::sync::MutexGuard<'_, Outage> {
        self.outage.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// For how long, and why, the cluster has not answered; `None` while
    /// it answers.
    pub(crate) fn down(&self) -> Option<(Duration, String)> {
        if self.is_answering() {
            return None;
        }
        let outage = self.outage();
        let (since, cause) = outage.current.as_ref()?;
        Some((since.elapsed(), cause.clone()))
    }

    /// When the cluster last answered again after it did not.
    pub(crate) fn recovered_at(&self) -> Option<Instant> {
        self.outage().recovered_at
    }

    /// Changes each time the cluster answers again after it did not.
    pub(crate) fn recoveries(&self) -> watch::Receiver<u64> {
        self.recoveries.subscribe()
    }

    /// The engagement has ended: probes stop, and nothing more is told.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
    }

    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// A request was answered with `status`.
    pub(crate) fn answered_with(self: &Arc<Self>, status: StatusCode) {
        if is_gateway_failure(status) {
            // Asks the cluster itself whether it is there.
            if self.is_answering() {
                self.probe(true);
            }
        } else {
            self.heard();
            self.answered();
        }
    }

    /// A request got no answer, for `error` (the connection failed, was
    /// refused or reset, or timed out): a probe asks until it answers.
    pub(crate) fn unanswered(self: &Arc<Self>, error: &(dyn std::error::Error + 'static)) {
        if self.went_down(|| error_chain(error)) {
            self.probe(false);
        }
    }

    fn answered(&self) {
        if !self.down.load(Ordering::SeqCst) {
            return;
        }
        let since = {
            let mut outage = self.outage();
            if !self.down.swap(false, Ordering::SeqCst) {
                return;
            }
            outage.recovered_at = Some(Instant::now());
            outage.current.take().map(|(since, _)| since)
        };
        if self.is_closed() {
            return;
        }
        let after = since.map(|since| since.elapsed()).unwrap_or_default();
        tracing::warn!(cluster = %self.cluster, down_for = ?after, "the cluster answers again");
        self.recoveries.send_modify(|n| *n += 1);
    }

    /// Marks the cluster down; whether that is news.
    fn went_down(&self, cause: impl FnOnce() -> String) -> bool {
        if self.is_closed() {
            return false;
        }
        if self.down.load(Ordering::SeqCst) {
            tracing::debug!(cluster = %self.cluster, "the cluster still does not answer");
            return false;
        }
        let cause = cause();
        {
            let mut outage = self.outage();
            if self.down.swap(true, Ordering::SeqCst) {
                return false;
            }
            outage.current = Some((Instant::now(), cause.clone()));
        }
        tracing::warn!(cluster = %self.cluster, cause = %cause, "the cluster does not answer; its requests fail until it is back");
        true
    }

    /// Starts the probe, unless one runs: asking at once if `now`, else
    /// after the interval.
    fn probe(self: &Arc<Self>, now: bool) {
        self.start_probe(now, false);
    }

    fn start_probe(self: &Arc<Self>, now: bool, idle: bool) {
        if self.is_closed() || self.probing.swap(true, Ordering::SeqCst) {
            return;
        }
        let probing = Probing {
            reachability: Arc::downgrade(self),
            finished: false,
        };
        let probe = probe(probing, self.client.clone(), now, idle);
        match &self.runtime {
            Some(runtime) => drop(runtime.spawn(probe)),
            None => drop(tokio::spawn(probe)),
        }
    }

    /// How long the probe waits before it asks again.
    fn interval(&self) -> Duration {
        let since = self.outage().current.as_ref().map(|(since, _)| *since);
        match since {
            Some(since) if since.elapsed() >= PROBE_FAST_FOR => PROBE_SLOW_INTERVAL,
            _ => PROBE_INTERVAL,
        }
    }
}

/// What one probe found.
enum Probed {
    /// The cluster says it is ready, or answers in a way that says nothing
    /// of its readiness (its readiness may not be read, say).
    Answered,
    /// No answer, a gateway's, or not ready: why.
    NoAnswer(String),
    /// No answer within the probe's time.
    TimedOut(String),
    /// No request could be made (the credentials could not be obtained):
    /// nothing learnt of the cluster.
    Unknown,
}

/// The running probe of a cluster: when it ends, another may start; if it
/// ended by itself and the cluster went down meanwhile (a failure that came
/// as it was ending), one does. One dropped unfinished (with its runtime)
/// starts none.
struct Probing {
    reachability: Weak<Reachability>,
    finished: bool,
}

impl Drop for Probing {
    fn drop(&mut self) {
        let Some(reachability) = self.reachability.upgrade() else {
            return;
        };
        reachability.probing.store(false, Ordering::SeqCst);
        if self.finished && !reachability.is_answering() {
            reachability.probe(false);
        }
    }
}

/// Asks the cluster whether it is ready: once, at once, if `now` (to
/// confirm a gateway's failure); while it does not answer, again after each
/// interval, until it does, its engagement ends, or no one holds it any
/// more.
async fn probe(mut probing: Probing, client: ClusterClient, now: bool, idle: bool) {
    asking(&probing.reachability, &client, now, idle).await;
    probing.finished = true;
}

async fn asking(
    reachability: &Weak<Reachability>,
    client: &ClusterClient,
    mut now: bool,
    mut idle: bool,
) {
    loop {
        if !now {
            let Some(interval) = reachability.upgrade().map(|r| r.interval()) else {
                return;
            };
            tokio::time::sleep(interval).await;
        }
        now = false;
        let Some(reachability) = reachability.upgrade() else {
            return;
        };
        if reachability.is_closed() {
            return;
        }
        let timeout = if idle {
            IDLE_PROBE_TIMEOUT
        } else {
            PROBE_TIMEOUT
        };
        match ask(client, timeout).await {
            Probed::Answered => {
                reachability.heard();
                reachability.answered();
            }
            Probed::NoAnswer(cause) => {
                reachability.went_down(|| cause);
            }
            // A cluster that answers is not marked down for a probe that
            // waited too long: the wait may have been for its credentials,
            // unless the probe asks a quiet cluster.
            Probed::TimedOut(_) if reachability.is_answering() && !idle => {}
            Probed::TimedOut(cause) => {
                reachability.went_down(|| cause);
            }
            Probed::Unknown => {}
        }
        if reachability.is_answering() {
            return;
        }
        idle = false;
    }
}

async fn ask(client: &ClusterClient, timeout: Duration) -> Probed {
    let request = Request::get("/readyz")
        .body(Body::empty())
        .expect("a static request is valid");
    let sent = client.repr().send(request);
    match tokio::time::timeout(timeout, sent).await {
        Ok(Ok(response)) if response.status().is_server_error() => {
            Probed::NoAnswer(format!("its readiness check answers {}", response.status()))
        }
        Ok(Ok(_)) => Probed::Answered,
        Ok(Err(error)) if super::error::credentials_unavailable(&error) => Probed::Unknown,
        Ok(Err(error)) if super::error::is_unanswered(&error) => {
            Probed::NoAnswer(error_chain(&error))
        }
        // An answer of another kind (a refused TLS handshake, say): the
        // cluster is there.
        Ok(Err(_)) => Probed::Answered,
        Err(_) => Probed::TimedOut(format!("its readiness check gave no answer in {timeout:?}")),
    }
}
