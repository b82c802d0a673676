//! How many requests a second one cluster's client may send: a budget for
//! reads and one for writes, as client-go's client-side flow control.

use std::{sync::Mutex, time::Duration};

use http::{HeaderMap, Method, StatusCode};
use tokio::time::Instant;

/// How many requests a second one cluster's client may send, and how many
/// at once after a quiet while: one budget for reads (gets, lists and
/// watches, counted as they start) and one for writes (creates, updates,
/// patches and deletes), each a token bucket as client-go's `QPS` and
/// `Burst` are.
///
/// A request over budget waits for it in the cluster's client before it is
/// sent; the wait is counted per cluster
/// ([`RequestStats::budget_waits`](super::RequestStats::budget_waits),
/// reported as client-go's `rest_client_rate_limiter_duration_seconds`).
/// A `429 Too Many Requests` with a `Retry-After` holds back every request
/// of that cluster (and no other's) until the time it names, at most a
/// minute. A runaway reconciler, or a burst of engages, so cannot flood
/// one cluster's API server, while other clusters go on as before.
///
/// The default ([`RequestBudget::DEFAULT`]) never slowed a healthy
/// controller in this crate's benchmarks: 1,000 requests a second of each
/// kind after 4,000 at once, where the fastest run here wrote about 1,800
/// objects a second for under three seconds to one API server. Set another
/// for a whole fleet ([`Fleet::with_request_budget`](crate::Fleet::with_request_budget)),
/// for a provider's clusters ([`with_request_budget`](crate::provider::with_request_budget)),
/// or for one cluster ([`ClusterClient::with_budget`](super::ClusterClient::with_budget)).
///
/// ```
/// use kube_fleet::client::RequestBudget;
///
/// // Writes held to 20 a second after 40 at once; reads as by default.
/// let budget = RequestBudget::DEFAULT.writes(20.0, 40);
/// assert_eq!(budget.write_rate(), Some((20.0, 40)));
/// assert_eq!(RequestBudget::UNLIMITED.read_rate(), None);
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
    /// 1,000 reads and 1,000 writes a second, 4,000 of each at once.
    pub const DEFAULT: Self = Self {
        reads: Some(Rate {
            per_second: 1_000.0,
            burst: 4_000,
        }),
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

/// One cluster's budget as its client spends it.
#[derive(Debug)]
pub(crate) struct Budget {
    reads: Option<Bucket>,
    writes: Option<Bucket>,
    /// Until when a `429`'s `Retry-After` holds every request back.
    paused_until: Mutex<Option<Instant>>,
}

#[derive(Debug)]
struct Bucket {
    rate: Rate,
    /// Tokens left (below zero: owed by requests waiting), as of when.
    state: Mutex<(f64, Instant)>,
}

impl Bucket {
    fn new(rate: Rate) -> Self {
        Self {
            rate,
            state: Mutex::new((f64::from(rate.burst), Instant::now())),
        }
    }

    /// Takes a token now, and says how long to wait before it is due.
    fn reserve(&self, now: Instant) -> Duration {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let (tokens, since) = *state;
        let refilled = (tokens
            + now.saturating_duration_since(since).as_secs_f64() * self.rate.per_second)
            .min(f64::from(self.rate.burst));
        let left = refilled - 1.0;
        *state = (left, now.max(since));
        if left >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-left / self.rate.per_second)
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
            paused_until: Mutex::new(None),
        })
    }

    /// Waits until a request with `method` may be sent; how long it waited.
    pub(crate) async fn wait(&self, method: &Method) -> Duration {
        let started = Instant::now();
        loop {
            let paused = *self.paused_until.lock().unwrap_or_else(|e| e.into_inner());
            match paused {
                Some(until) if until > Instant::now() => tokio::time::sleep_until(until).await,
                _ => break,
            }
        }
        let bucket = match *method {
            Method::GET | Method::HEAD | Method::OPTIONS => &self.reads,
            _ => &self.writes,
        };
        if let Some(bucket) = bucket {
            let due = bucket.reserve(Instant::now());
            if !due.is_zero() {
                tokio::time::sleep(due).await;
            }
        }
        started.elapsed()
    }

    /// A response came: a `429` with a `Retry-After` holds every request
    /// back until then.
    pub(crate) fn answered(&self, status: StatusCode, headers: &HeaderMap) {
        if status != StatusCode::TOO_MANY_REQUESTS {
            return;
        }
        let Some(seconds) = headers
            .get(http::header::RETRY_AFTER)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.trim().parse::<u64>().ok())
        else {
            return;
        };
        let until = Instant::now() + Duration::from_secs(seconds).min(MAX_PAUSE);
        let mut paused = self.paused_until.lock().unwrap_or_else(|e| e.into_inner());
        if paused.is_none_or(|paused| paused < until) {
            *paused = Some(until);
        }
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
    async fn a_429_with_retry_after_holds_everything_back_until_then() {
        let budget = Budget::new(RequestBudget::DEFAULT).unwrap();
        budget.answered(StatusCode::TOO_MANY_REQUESTS, &retry_after("2"));
        assert_eq!(budget.wait(&Method::GET).await, Duration::from_secs(2));
        assert_eq!(budget.wait(&Method::GET).await, Duration::ZERO);
        // No Retry-After, another status, or one beyond a minute.
        budget.answered(StatusCode::TOO_MANY_REQUESTS, &HeaderMap::new());
        budget.answered(StatusCode::SERVICE_UNAVAILABLE, &retry_after("5"));
        assert_eq!(budget.wait(&Method::PUT).await, Duration::ZERO);
        budget.answered(StatusCode::TOO_MANY_REQUESTS, &retry_after("3600"));
        assert_eq!(budget.wait(&Method::DELETE).await, MAX_PAUSE);
    }

    #[test]
    fn an_unlimited_budget_is_no_budget() {
        assert!(Budget::new(RequestBudget::UNLIMITED).is_none());
        assert!(Budget::new(RequestBudget::UNLIMITED.reads(1.0, 1)).is_some());
    }
}
