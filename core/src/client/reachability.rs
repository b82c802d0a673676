//! Whether a cluster answers: what its client's requests find, told once
//! per change rather than once per request.
//!
//! A cluster that stops answering (its API server is down, cut off or
//! hung) is a normal condition in a fleet. Its client's requests all fail
//! until it is back; each engaged cluster's [`Reachability`] turns those
//! failures into two transitions, logged once each at `WARN` with the
//! cause: the cluster stops answering, and it answers again. While it is
//! down, one request at a time asks it whether it is ready (`GET /readyz`),
//! every [`PROBE_INTERVAL`] for the first [`PROBE_FAST_FOR`] and every
//! [`PROBE_SLOW_INTERVAL`] after, so that its return is noticed even where
//! nothing else asks (watches and keys waiting out their backoff): watches
//! retry and controllers run the keys that failed for want of an answer as
//! soon as it answers ([`recoveries`](Reachability::recoveries)).
//!
//! What is heard from the cluster (an answer, data on a watch) is noted;
//! a cluster silent for its [`KeepAlive`]'s interval is asked too, and one
//! that does not answer that is down since it was last heard from.
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

use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use kube::client::Body;
use tokio::{runtime::Handle, sync::watch, time::Instant};
use tower::BoxError;

use super::{
    asked,
    cluster_client::ClusterClient,
    error::{error_chain, is_gateway_failure, is_unanswered},
    inner::{AnyBody, Around, Below},
    keep_alive::KeepAlive,
};
use crate::{cluster_name::ClusterName, panic::lock};

/// How often a cluster that does not answer is asked whether it is back,
/// for the first [`PROBE_FAST_FOR`] of an outage.
pub(crate) const PROBE_INTERVAL: Duration = Duration::from_millis(250);

/// How long a cluster is asked every [`PROBE_INTERVAL`].
pub(crate) const PROBE_FAST_FOR: Duration = Duration::from_secs(30);

/// How often a cluster that has not answered for longer is asked: a
/// cluster back from a long outage is noticed, and its watches resumed,
/// within about this long.
pub(crate) const PROBE_SLOW_INTERVAL: Duration = Duration::from_secs(1);

/// How long one probe may wait for its answer (a hung server gives none).
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// An outage under way.
#[derive(Debug)]
struct Down {
    /// The last thing heard from the cluster before it.
    since: Instant,
    cause: String,
    /// When it was noticed.
    noticed: Instant,
}

/// Whether one engaged cluster answers, as its client's requests find it.
pub(crate) struct Reachability {
    cluster: ClusterName,
    /// Read on every answer, so a flag rather than the lock.
    down: AtomicBool,
    /// A probe runs (at most one at a time).
    probing: AtomicBool,
    /// The outage under way, if any. `down` flips under this lock, so the
    /// two always agree.
    outage: Mutex<Option<Down>>,
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
    /// When this was made: what `heard` and `asked` count from.
    born: Instant,
    /// When the cluster last answered anything or sent data on a watch, in
    /// milliseconds after `born`: on every answer, so an atomic.
    heard: AtomicU64,
    /// When it was last asked because it was silent, in milliseconds after
    /// `born`.
    asked: AtomicU64,
    /// Its own terms for finding it silent, over the fleet's.
    keep_alive: Option<KeepAlive>,
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

    /// For the cluster `cluster`, probed through `client` (its own, not
    /// one that reports here).
    pub(crate) fn new(cluster: ClusterName, client: ClusterClient) -> Self {
        Self {
            keep_alive: client.keep_alive(),
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
            asked: AtomicU64::new(0),
            apart: false,
        }
    }

    /// The client probes ask through: the one the cluster was engaged
    /// with.
    pub(crate) fn client(&self) -> &ClusterClient {
        &self.client
    }

    /// Milliseconds after `born`, now.
    fn stamp(&self) -> u64 {
        u64::try_from(self.born.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// The cluster answered something, or sent data on a watch, now.
    fn heard(&self) {
        self.heard.store(self.stamp(), Ordering::Relaxed);
    }

    /// When something was last heard from the cluster (when this was made,
    /// if nothing ever was).
    fn last_heard(&self) -> Instant {
        self.born + Duration::from_millis(self.heard.load(Ordering::Relaxed))
    }

    /// For how long, at `now`, nothing has been heard from the cluster (or
    /// since this was made, if nothing ever was).
    pub(crate) fn silent_for(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.last_heard())
    }

    /// Asks the cluster whether it is ready if it answers (as far as is
    /// known) but nothing has been heard from it for `keep_alive`'s
    /// interval (its own terms, else the fleet's `keep_alive`; `None`:
    /// never): the light probe that finds a cluster gone silent where
    /// nothing else asks it (no request, and watches that hear nothing),
    /// or that hangs. An answer counts as heard; none within the timeout
    /// marks the cluster down since it was last heard from, and the probe
    /// then goes on as for any outage.
    pub(crate) fn probe_if_silent(self: &Arc<Self>, keep_alive: Option<KeepAlive>, now: Instant) {
        let Some(keep_alive) = self.keep_alive.or(keep_alive) else {
            return;
        };
        let asked = self.born + Duration::from_millis(self.asked.load(Ordering::Relaxed));
        let due = keep_alive.asked_after();
        if self.is_answering()
            && !self.is_closed()
            && self.silent_for(now) >= due
            // A probe that learns nothing (no credentials to ask with) is
            // not made again before the interval.
            && now.saturating_duration_since(asked) >= due
            && !self.probing.load(Ordering::SeqCst)
        {
            self.asked.store(self.stamp(), Ordering::Relaxed);
            // At once; no answer in the keep-alive's time marks it down (it
            // is silent: the wait cannot be for a request of its own).
            self.start_probe(true, Some(keep_alive.timeout()));
        }
    }

    /// Whether the cluster answered its client's last request (or has not
    /// been asked yet).
    pub(crate) fn is_answering(&self) -> bool {
        !self.down.load(Ordering::SeqCst)
    }

    /// For how long, and why, the cluster has not answered; `None` while
    /// it answers.
    pub(crate) fn down(&self) -> Option<(Duration, String)> {
        if self.is_answering() {
            return None;
        }
        let outage = lock(&self.outage);
        let down = outage.as_ref()?;
        Some((down.since.elapsed(), down.cause.clone()))
    }

    /// For how long the cluster has been known not to answer: since the
    /// outage was noticed, not since it was last heard from (what setting
    /// a cluster aside waits out). `None` while it answers.
    pub(crate) fn known_down_for(&self) -> Option<Duration> {
        if self.is_answering() {
            return None;
        }
        Some(lock(&self.outage).as_ref()?.noticed.elapsed())
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

    /// Asks the cluster once, now, whether it is ready, and takes in what
    /// it finds: no answer within `timeout`, or a `5xx`, marks it down (a
    /// probe then asks until it answers again), as the probe's own asks do.
    /// True if it answered; an ask that learnt nothing (its credentials
    /// could not be had) is not an answer.
    pub(crate) async fn check(self: Arc<Self>, timeout: Duration) -> bool {
        match ask(&self.client, timeout).await {
            Probed::Answered => {
                self.heard();
                self.answered();
                true
            }
            Probed::NoAnswer(cause) | Probed::TimedOut(cause) => {
                if self.went_down(|| cause) {
                    self.probe(false);
                }
                false
            }
            Probed::Unknown => false,
        }
    }

    /// Data came on a watch: the cluster answers.
    pub(crate) fn sent_data(&self) {
        self.heard();
        self.answered();
    }

    /// A request got no answer, for `error` (the connection failed, was
    /// refused or reset, or timed out): a probe asks until it answers.
    pub(crate) fn unanswered(self: &Arc<Self>, error: &(dyn std::error::Error + 'static)) {
        if self.went_down(|| error_chain(error)) {
            self.probe(false);
        }
    }

    /// A response's body broke off for `error`: its connection failed, or
    /// only that stream did (one API server of several behind a load
    /// balancer restarted, say). The cluster is asked at once, and is down
    /// if it does not answer that within its own keep-alive timeout, if it
    /// has one, or [`PROBE_TIMEOUT`], either.
    pub(crate) fn broke_off(self: &Arc<Self>, error: &(dyn std::error::Error + 'static)) {
        if self.is_answering() {
            tracing::debug!(cluster = %self.cluster, error = %error_chain(error), "a watch broke off; asking the cluster whether it answers");
            let timeout = self.keep_alive.map_or(PROBE_TIMEOUT, |keep_alive| {
                keep_alive.timeout().min(PROBE_TIMEOUT)
            });
            self.start_probe(true, Some(timeout));
        }
    }

    fn answered(&self) {
        if !self.down.load(Ordering::SeqCst) {
            return;
        }
        let since = {
            let mut outage = lock(&self.outage);
            if !self.down.swap(false, Ordering::SeqCst) {
                return;
            }
            outage.take().map(|down| down.since)
        };
        if self.is_closed() {
            return;
        }
        let after = since.map(|since| since.elapsed()).unwrap_or_default();
        tracing::warn!(cluster = %self.cluster, silent_for = ?after, "the cluster answers again");
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
            let mut outage = lock(&self.outage);
            if self.down.swap(true, Ordering::SeqCst) {
                return false;
            }
            // Down since it was last heard from, not since that was noticed.
            *outage = Some(Down {
                since: self.last_heard(),
                cause: cause.clone(),
                noticed: Instant::now(),
            });
        }
        let silent_for = self.silent_for(Instant::now());
        tracing::warn!(cluster = %self.cluster, cause = %cause, ?silent_for, "the cluster does not answer; its requests fail until it is back");
        true
    }

    /// Starts the probe, unless one runs: asking at once if `now`, else
    /// after the interval.
    fn probe(self: &Arc<Self>, now: bool) {
        self.start_probe(now, None);
    }

    /// Starts the probe (see [`probe`](Self::probe)); one of a silent
    /// cluster waits `silent` for its first answer, and marks the cluster
    /// down without one.
    fn start_probe(self: &Arc<Self>, now: bool, silent: Option<Duration>) {
        if self.is_closed() || self.probing.swap(true, Ordering::SeqCst) {
            return;
        }
        let probing = Probing {
            reachability: Arc::downgrade(self),
            finished: false,
        };
        let probe = probe(probing, self.client.clone(), now, silent);
        match &self.runtime {
            Some(runtime) => drop(runtime.spawn(probe)),
            None => drop(tokio::spawn(probe)),
        }
    }

    /// How long the probe waits before it asks again.
    fn interval(&self) -> Duration {
        let noticed = lock(&self.outage).as_ref().map(|down| down.noticed);
        match noticed {
            Some(noticed) if noticed.elapsed() >= PROBE_FAST_FOR => PROBE_SLOW_INTERVAL,
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
/// confirm a gateway's failure, or ask a silent cluster, within `silent`);
/// while it does not answer, again after each interval, until it does, its
/// engagement ends, or no one holds it any more.
async fn probe(mut probing: Probing, client: ClusterClient, now: bool, silent: Option<Duration>) {
    asking(&probing.reachability, &client, now, silent).await;
    probing.finished = true;
}

async fn asking(
    reachability: &Weak<Reachability>,
    client: &ClusterClient,
    mut now: bool,
    mut silent: Option<Duration>,
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
        let timeout = silent.unwrap_or(PROBE_TIMEOUT);
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
            // unless the probe asks a silent cluster.
            Probed::TimedOut(_) if reachability.is_answering() && silent.is_none() => {}
            Probed::TimedOut(cause) => {
                reachability.went_down(|| cause);
            }
            Probed::Unknown => {}
        }
        if reachability.is_answering() {
            return;
        }
        silent = None;
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

/// A watch's response body, whose data tells the cluster's reachability
/// that the cluster answers, and whose failure (its connection closed,
/// reset, or found dead by its `PING`s) has the cluster asked at once
/// whether it answers ([`Reachability::broke_off`]): a watch broken off
/// finds the cluster down within a probe's time, not when its retry's
/// connection times out.
pub(crate) struct Watched<B> {
    body: B,
    reachability: Arc<Reachability>,
}

impl<B> Watched<B> {
    pub(crate) fn new(body: B, reachability: Arc<Reachability>) -> Self {
        Self { body, reachability }
    }
}

impl<B> http_body::Body for Watched<B>
where
    B: http_body::Body<Error = tower::BoxError> + Unpin,
{
    type Data = B::Data;
    type Error = tower::BoxError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let polled = std::pin::Pin::new(&mut self.body).poll_frame(cx);
        match &polled {
            std::task::Poll::Ready(Some(Ok(_))) => self.reachability.sent_data(),
            std::task::Poll::Ready(Some(Err(error))) => self.reachability.broke_off(&**error),
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// Tells the cluster's reachability whether each request was answered, and
/// lets a watch's data tell it as it comes; the task that started a watch
/// is told it runs (see `asked`).
#[derive(Clone)]
pub(super) struct Reached(pub(super) Arc<Reachability>);

impl Around for Reached {
    async fn around<S: Below>(
        self,
        request: Request<Body>,
        mut inner: S,
    ) -> Result<Response<AnyBody>, BoxError> {
        let Self(reachability) = self;
        let watch = asked::is_watch(&request);
        let result = inner.call(request).await;
        match &result {
            Ok(response) => reachability.answered_with(response.status()),
            Err(error) if is_unanswered(&**error) => reachability.unanswered(&**error),
            // Answered, with an error of the server's or the client's own.
            Err(_) => {}
        }
        // A watch under way: its data is heard from the cluster, and its
        // failure is the cluster's; the task that asked knows it runs.
        match result {
            Ok(response) if watch && response.status().is_success() => {
                asked::watch_started();
                Ok(response.map(|body| Watched::new(body, reachability).boxed_unsync()))
            }
            result => result,
        }
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use http_body_util::{BodyExt, Full};
    use tower::{Layer, ServiceExt};

    use super::*;
    use crate::client::inner::AroundLayer;

    fn get(path: &str) -> Request<Body> {
        Request::get(path).body(Body::empty()).unwrap()
    }

    fn body(bytes: &'static [u8]) -> AnyBody {
        Full::new(Bytes::from_static(bytes))
            .map_err(|never| match never {})
            .boxed_unsync()
    }

    #[tokio::test]
    async fn the_layer_tells_whether_each_request_was_answered() {
        // Probes ask an address where nothing answers.
        let config = kube::Config::new("https://127.0.0.1:1".parse().unwrap());
        let client = ClusterClient::from(kube::Client::try_from(config).unwrap());
        let reachability = Arc::new(Reachability::new("east".into(), client));
        let (below, mut handle) = tower_test::mock::pair::<Request<Body>, Response<AnyBody>>();
        let service = AroundLayer(Reached(reachability.clone())).layer(below);

        let refused = tokio::spawn(service.clone().oneshot(get("/api/v1/pods")));
        let (_, send) = handle.next_request().await.unwrap();
        let cause = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        send.send_error(kube::Error::Service(Box::new(cause)));
        assert!(refused.await.unwrap().is_err());
        assert!(
            !reachability.is_answering(),
            "a refused connection is no answer"
        );

        let watch = tokio::spawn(service.oneshot(get("/api/v1/pods?watch=true")));
        let (_, send) = handle.next_request().await.unwrap();
        send.send_response(Response::new(body(b"{\"type\":\"ADDED\"}\n")));
        let response = watch.await.unwrap().unwrap();
        assert!(reachability.is_answering(), "an answer, whatever it says");
        let data = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(
            data,
            b"{\"type\":\"ADDED\"}\n".as_slice(),
            "the watch's data passes"
        );
    }
}
