//! How many requests a second one cluster's client may send: a budget for
//! reads and one for writes, as client-go's client-side flow control.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use http::{HeaderMap, Method, Request, Response, StatusCode};
use kube::client::Body;
use tower::BoxError;

use super::{
    inner::{AnyBody, Around, Below},
    stats::RequestStats,
};
use tokio::time::Instant;

use crate::panic::lock;

/// How many requests a second one cluster's client may send, and how many
/// at once after a quiet while: one budget for reads (gets, lists and
/// watches, counted as they start) and one for writes (creates, updates,
/// patches and deletes), each a token bucket as client-go's `QPS` and
/// `Burst` are.
///
/// A request over budget waits for it in the cluster's client before it is
/// sent (a request given up meanwhile gives its token back); the wait is
/// counted per cluster
/// ([`RequestStats::budget_waits`](super::RequestStats::budget_waits),
/// reported as client-go's `rest_client_rate_limiter_duration_seconds`).
/// A `429 Too Many Requests` with a `Retry-After` holds back every request
/// of its kind (reads or writes) to that cluster, and none to another,
/// until the time it names (at most a minute), then lets them through at
/// the budget's rate, not in a burst. A runaway reconciler so cannot flood
/// one cluster's API server, while other clusters go on as before.
///
/// The budget is spent once per request: the retries of this crate's
/// client (of a `429`, `503` or `504`) are not charged again, and each
/// attempt's `429` holds the budget back. A finished `kube::Client` retries
/// a `429` by itself, so for a cluster engaged with one the hold comes only
/// when its retries give up. A cluster engaged again starts with a full
/// budget.
///
/// The default ([`RequestBudget::DEFAULT`]) never slowed a healthy
/// controller in this crate's benchmarks: reads not limited, 1,000 writes a
/// second after 4,000 at once, where the fastest run here wrote about 1,800
/// objects a second for under three seconds to one API server. Set another
/// for a whole fleet ([`FleetConfig::request_budget`](crate::FleetConfig::request_budget)),
/// for a provider's clusters ([`with_request_budget`](crate::provider::with_request_budget)),
/// or for one cluster ([`ClusterClient::with_budget`](super::ClusterClient::with_budget)).
/// The namespaces of one host engaged as clusters
/// ([`Fleet::engage_view`](crate::Fleet::engage_view)) each have the
/// fleet's, of their own.
///
/// ```
/// use kube_multicluster::client::RequestBudget;
///
/// // Writes held to 20 a second after 40 at once; reads as by default.
/// let budget = RequestBudget::DEFAULT.writes(20.0, 40);
/// assert_eq!(budget.write_rate(), Some((20.0, 40)));
/// assert_eq!(budget.read_rate(), None);
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RequestBudget {
    reads: Option<Rate>,
    writes: Option<Rate>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
struct Rate {
    per_second: f64,
    burst: u32,
}

impl RequestBudget {
    /// Reads not limited (see [`reads`](Self::reads)); 1,000 writes a
    /// second, 4,000 at once.
    pub const DEFAULT: Self = Self {
        reads: None,
        writes: Some(Rate {
            per_second: 1_000.0,
            burst: 4_000,
        }),
    };

    /// No limit on either: requests are never held back, not even after a
    /// `429`.
    pub const UNLIMITED: Self = Self {
        reads: None,
        writes: None,
    };

    /// Reads limited to `per_second`, `burst` at once after a quiet while.
    ///
    /// Reads include the lists and watches that keep the cluster's cache:
    /// a read budget too low for them delays its sync, and a list waiting
    /// for the budget holds one of the fleet's initial-list permits
    /// ([`FleetConfig::initial_lists`](crate::FleetConfig::initial_lists))
    /// meanwhile. Reads are not limited by default, since reconcilers read
    /// from caches.
    ///
    /// # Panics
    ///
    /// If `per_second` is not a positive number, or `burst` is zero.
    pub fn reads(mut self, per_second: f64, burst: u32) -> Self {
        self.reads = Some(Rate::new(per_second, burst));
        self
    }

    /// Writes limited to `per_second`, `burst` at once after a quiet
    /// while.
    ///
    /// # Panics
    ///
    /// As [`reads`](Self::reads).
    pub fn writes(mut self, per_second: f64, burst: u32) -> Self {
        self.writes = Some(Rate::new(per_second, burst));
        self
    }

    /// Reads not limited.
    pub fn unlimited_reads(mut self) -> Self {
        self.reads = None;
        self
    }

    /// Writes not limited.
    pub fn unlimited_writes(mut self) -> Self {
        self.writes = None;
        self
    }

    /// Reads a second and at once, if limited.
    pub fn read_rate(&self) -> Option<(f64, u32)> {
        self.reads.map(|rate| (rate.per_second, rate.burst))
    }

    /// Writes a second and at once, if limited.
    pub fn write_rate(&self) -> Option<(f64, u32)> {
        self.writes.map(|rate| (rate.per_second, rate.burst))
    }
}

impl Default for RequestBudget {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl Rate {
    fn new(per_second: f64, burst: u32) -> Self {
        assert!(
            per_second.is_finite() && per_second > 0.0,
            "a request budget of {per_second} a second"
        );
        assert!(burst > 0, "a request budget of zero at once");
        Self { per_second, burst }
    }
}

/// The longest a `Retry-After` holds a cluster's requests back.
const MAX_PAUSE: Duration = Duration::from_secs(60);

/// The longest one request waits for its token, however low the rate.
const MAX_DUE: Duration = Duration::from_secs(3600);

/// One cluster's budget as its client spends it.
#[derive(Debug)]
pub(crate) struct Budget {
    reads: Option<Bucket>,
    writes: Option<Bucket>,
}

#[derive(Debug)]
struct Bucket {
    rate: Rate,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    /// Tokens left (below zero: owed by requests waiting), as of `since`.
    tokens: f64,
    since: Instant,
    /// Until when a `429`'s `Retry-After` holds every request back.
    paused_until: Option<Instant>,
}

impl Bucket {
    fn new(rate: Rate) -> Self {
        Self {
            rate,
            state: Mutex::new(State {
                tokens: f64::from(rate.burst),
                since: Instant::now(),
                paused_until: None,
            }),
        }
    }

    /// Until when requests are held back, if they are now.
    fn paused(&self, now: Instant) -> Option<Instant> {
        lock(&self.state).paused_until.filter(|until| *until > now)
    }

    /// Takes a token now, and says how long to wait before it is due.
    fn reserve(&self, now: Instant) -> Duration {
        let mut state = lock(&self.state);
        let refilled = (state.tokens
            + now.saturating_duration_since(state.since).as_secs_f64() * self.rate.per_second)
            .min(f64::from(self.rate.burst));
        state.tokens = refilled - 1.0;
        state.since = now.max(state.since);
        if state.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::try_from_secs_f64(-state.tokens / self.rate.per_second)
                .unwrap_or(MAX_DUE)
                .min(MAX_DUE)
        }
    }

    /// Gives back a token taken by a request that was given up before it
    /// was due.
    fn refund(&self) {
        let mut state = lock(&self.state);
        state.tokens = (state.tokens + 1.0).min(f64::from(self.rate.burst));
    }

    /// Holds every request back until `until`, and lets one through at
    /// once after, no burst: the bucket refills from `until` on.
    fn pause(&self, until: Instant) {
        let mut state = lock(&self.state);
        if state.paused_until.is_none_or(|paused| paused < until) {
            state.paused_until = Some(until);
        }
        state.tokens = state.tokens.min(1.0);
        state.since = state.since.max(until);
    }
}

/// A token taken and not yet due: given back if the request is given up.
struct Reserved<'a> {
    bucket: &'a Bucket,
    due: bool,
}

impl Drop for Reserved<'_> {
    fn drop(&mut self) {
        if !self.due {
            self.bucket.refund();
        }
    }
}

impl Budget {
    /// The budget `budget` sets out; `None` if it limits nothing.
    pub(crate) fn new(budget: RequestBudget) -> Option<Self> {
        if budget == RequestBudget::UNLIMITED {
            return None;
        }
        Some(Self {
            reads: budget.reads.map(Bucket::new),
            writes: budget.writes.map(Bucket::new),
        })
    }

    fn bucket(&self, method: &Method) -> Option<&Bucket> {
        match *method {
            Method::GET | Method::HEAD | Method::OPTIONS => self.reads.as_ref(),
            _ => self.writes.as_ref(),
        }
    }

    /// Waits until a request with `method` may be sent; how long it waited.
    pub(crate) async fn wait(&self, method: &Method) -> Duration {
        let started = Instant::now();
        let Some(bucket) = self.bucket(method) else {
            return Duration::ZERO;
        };
        while let Some(until) = bucket.paused(Instant::now()) {
            tokio::time::sleep_until(until).await;
        }
        let due = bucket.reserve(Instant::now());
        let mut reserved = Reserved { bucket, due: false };
        if !due.is_zero() {
            tokio::time::sleep(due).await;
        }
        reserved.due = true;
        // A 429 that came meanwhile holds this one back too.
        while let Some(until) = bucket.paused(Instant::now()) {
            tokio::time::sleep_until(until).await;
        }
        started.elapsed()
    }

    /// A response to a request with `method` came: a `429` with a
    /// `Retry-After` holds back every request of its kind until then.
    pub(crate) fn answered(&self, method: &Method, status: StatusCode, headers: &HeaderMap) {
        if status != StatusCode::TOO_MANY_REQUESTS {
            return;
        }
        let Some(bucket) = self.bucket(method) else {
            return;
        };
        let Some(seconds) = headers
            .get(http::header::RETRY_AFTER)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.trim().parse::<u64>().ok())
        else {
            return;
        };
        bucket.pause(Instant::now() + Duration::from_secs(seconds).min(MAX_PAUSE));
    }
}

/// Holds each request until the cluster's request budget lets it go (the
/// time it waited counted in `stats`), and tells the budget how the server
/// answered. Without a budget it passes every request on at once.
#[derive(Clone)]
pub(super) struct Budgeted {
    pub(super) budget: Option<Arc<Budget>>,
    pub(super) stats: Arc<RequestStats>,
}

impl Around for Budgeted {
    async fn around<S: Below>(
        self,
        request: Request<Body>,
        mut inner: S,
    ) -> Result<Response<AnyBody>, BoxError> {
        let Some(budget) = self.budget else {
            return inner.call(request).await;
        };
        let method = request.method().clone();
        let waited = budget.wait(&method).await;
        self.stats.waited(&method, waited);
        let result = inner.call(request).await;
        if let Ok(response) = &result {
            budget.answered(&method, response.status(), response.headers());
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn retry_after(seconds: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(http::header::RETRY_AFTER, seconds.parse().unwrap());
        headers
    }

    #[tokio::test(start_paused = true)]
    async fn a_burst_goes_at_once_and_the_rest_at_the_rate() {
        let budget = Budget::new(RequestBudget::UNLIMITED.writes(10.0, 5)).unwrap();
        let started = Instant::now();
        for _ in 0..5 {
            assert_eq!(budget.wait(&Method::PATCH).await, Duration::ZERO);
        }
        // The next five at ten a second.
        for _ in 0..5 {
            budget.wait(&Method::POST).await;
        }
        let took = started.elapsed();
        assert!(
            took >= Duration::from_millis(499) && took <= Duration::from_millis(510),
            "{took:?}"
        );
        // Reads are not limited here.
        assert_eq!(budget.wait(&Method::GET).await, Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn requests_waiting_together_are_spread_at_the_rate() {
        let budget =
            std::sync::Arc::new(Budget::new(RequestBudget::UNLIMITED.reads(100.0, 1)).unwrap());
        let started = Instant::now();
        let waits = futures::future::join_all((0..11).map(|_| {
            let budget = budget.clone();
            async move { budget.wait(&Method::GET).await }
        }))
        .await;
        let longest = waits.into_iter().max().unwrap();
        assert!(
            (Duration::from_millis(99)..=Duration::from_millis(101)).contains(&longest),
            "{longest:?}"
        );
        assert!(started.elapsed() <= Duration::from_millis(101));
    }

    #[tokio::test(start_paused = true)]
    async fn a_429_with_retry_after_holds_its_kind_back_until_then_and_lets_no_burst_through() {
        let budget = Budget::new(RequestBudget::UNLIMITED.reads(10.0, 5).writes(10.0, 5)).unwrap();
        budget.answered(
            &Method::GET,
            StatusCode::TOO_MANY_REQUESTS,
            &retry_after("2"),
        );
        // Writes go on.
        assert_eq!(budget.wait(&Method::PATCH).await, Duration::ZERO);
        assert_eq!(budget.wait(&Method::GET).await, Duration::from_secs(2));
        // After the pause, at the rate: no burst saved up meanwhile.
        assert_eq!(budget.wait(&Method::GET).await, Duration::from_millis(100));
        // No Retry-After, another status, or one beyond a minute.
        budget.answered(
            &Method::PUT,
            StatusCode::TOO_MANY_REQUESTS,
            &HeaderMap::new(),
        );
        budget.answered(
            &Method::PUT,
            StatusCode::SERVICE_UNAVAILABLE,
            &retry_after("5"),
        );
        assert_eq!(budget.wait(&Method::PUT).await, Duration::ZERO);
        budget.answered(
            &Method::DELETE,
            StatusCode::TOO_MANY_REQUESTS,
            &retry_after("3600"),
        );
        assert!(budget.wait(&Method::DELETE).await >= MAX_PAUSE);
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_due_later_waits_out_a_pause_that_came_meanwhile() {
        let budget =
            std::sync::Arc::new(Budget::new(RequestBudget::UNLIMITED.writes(1.0, 1)).unwrap());
        assert_eq!(budget.wait(&Method::POST).await, Duration::ZERO);
        // Due in a second; a 429 half-way holds it back three seconds.
        let waiting = tokio::spawn({
            let budget = budget.clone();
            async move { budget.wait(&Method::POST).await }
        });
        tokio::time::sleep(Duration::from_millis(500)).await;
        budget.answered(
            &Method::POST,
            StatusCode::TOO_MANY_REQUESTS,
            &retry_after("3"),
        );
        assert_eq!(waiting.await.unwrap(), Duration::from_millis(3500));
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_given_up_while_it_waits_gives_its_token_back() {
        let budget = Budget::new(RequestBudget::UNLIMITED.writes(1.0, 1)).unwrap();
        assert_eq!(budget.wait(&Method::POST).await, Duration::ZERO);
        // Ten requests given up before they were due owe nothing.
        for _ in 0..10 {
            let given_up =
                tokio::time::timeout(Duration::from_millis(10), budget.wait(&Method::POST));
            assert!(given_up.await.is_err());
        }
        assert!(budget.wait(&Method::POST).await <= Duration::from_secs(1));
    }

    #[test]
    fn a_rate_too_low_to_wait_for_waits_an_hour_at_most() {
        let bucket = Bucket::new(Rate::new(1e-300, 1));
        let now = Instant::now();
        assert_eq!(bucket.reserve(now), Duration::ZERO);
        assert_eq!(bucket.reserve(now), MAX_DUE);
    }

    #[test]
    fn an_unlimited_budget_is_no_budget() {
        assert!(Budget::new(RequestBudget::UNLIMITED).is_none());
        assert!(Budget::new(RequestBudget::UNLIMITED.reads(1.0, 1)).is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn the_layer_holds_a_request_for_the_budget_and_tells_it_of_a_429() {
        use tower::{Layer, ServiceExt};

        use crate::client::inner::AroundLayer;

        let budget = Arc::new(Budget::new(RequestBudget::UNLIMITED.reads(10.0, 5)).unwrap());
        let stats = Arc::new(RequestStats::default());
        let (below, mut handle) = tower_test::mock::pair::<Request<Body>, Response<AnyBody>>();
        let service = AroundLayer(Budgeted {
            budget: Some(budget.clone()),
            stats: stats.clone(),
        })
        .layer(below);
        let get = || Request::get("/api/v1/pods").body(Body::empty()).unwrap();
        let first = tokio::spawn(service.clone().oneshot(get()));
        let (_, send) = handle.next_request().await.unwrap();
        let mut throttled = Response::new(AnyBody::default());
        *throttled.status_mut() = StatusCode::TOO_MANY_REQUESTS;
        throttled.headers_mut().extend(retry_after("3"));
        send.send_response(throttled);
        assert_eq!(
            first.await.unwrap().unwrap().status(),
            StatusCode::TOO_MANY_REQUESTS
        );
        // The next read waits out the Retry-After before anything below sees it.
        let started = Instant::now();
        let second = tokio::spawn(service.oneshot(get()));
        let (_, send) = handle.next_request().await.unwrap();
        assert_eq!(started.elapsed(), Duration::from_secs(3));
        send.send_response(Response::new(AnyBody::default()));
        second.await.unwrap().unwrap();
        let waits = stats.budget_waits();
        assert_eq!(waits[0].count, 2, "{waits:?}");
        assert!((waits[0].sum - 3.0).abs() < 0.01, "{waits:?}");
    }

    #[tokio::test]
    async fn without_a_budget_the_layer_passes_requests_on() {
        use tower::{Layer, ServiceExt};

        use crate::client::inner::AroundLayer;

        let (below, mut handle) = tower_test::mock::pair::<Request<Body>, Response<AnyBody>>();
        let service = AroundLayer(Budgeted {
            budget: None,
            stats: Arc::default(),
        })
        .layer(below);
        let call = tokio::spawn(service.oneshot(Request::get("/").body(Body::empty()).unwrap()));
        let (_, send) = handle.next_request().await.unwrap();
        send.send_response(Response::new(AnyBody::default()));
        call.await.unwrap().unwrap();
    }
}
