use std::time::Duration;

use crate::{Backoff, TokenBucket, queue::Limits};

/// How many reconciles a controller runs at once by default, in all clusters
/// together.
///
/// Beyond what the clusters' API servers serve at once, more reconciles in
/// flight only wait in memory: labelling 10,000 ConfigMaps in 10 clusters
/// with no limit peaked at 145–167 MiB of memory and took 5.1–6.9 s; with
/// this limit, 64 MiB and 5.8 s (`docs/benchmarks.md`). In a fleet the
/// limit also gives each cluster a fair share, so that one cluster whose
/// reconciles hang holds at most half of the slots.
pub const DEFAULT_CONCURRENCY: usize = 1024;

/// How long a graceful shutdown waits for running reconciles by default.
pub const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a controller's watches in a cluster may take to sync before the
/// controller reports them failing and logs a warning (they keep trying).
pub const DEFAULT_SYNC_TIMEOUT: Duration = Duration::from_secs(30);

/// A controller's knobs: concurrency, rate limits, backoff and timeouts.
///
/// Every limit is applied by the controller's queue when it hands out the
/// next key, so a key that may not run yet stays queued: deduplicated,
/// counted in the queue depth, and in its place in line. One cluster's
/// limits hold up no other cluster.
///
/// ```
/// use std::time::Duration;
/// use kube_fleet::{Backoff, TokenBucket, controller::Config};
///
/// let config = Config::default()
///     .concurrency(16)                 // at most 16 reconciles at once
///     .cluster_concurrency(4)          // at most 4 in any one cluster
///     .cluster_rate_limit(10.0, 20)    // 10 per second per cluster, bursts of 20
///     .rate_limit(TokenBucket::new(100.0, 200)) // and 100 per second in all
///     .backoff(Backoff { base: Duration::from_millis(50), ..Backoff::default() })
///     .sync_timeout(Duration::from_secs(60));
/// # drop(config);
/// ```
///
/// # Concurrency across clusters
///
/// With a [`concurrency`](Self::concurrency) limit `G` and no explicit
/// [`cluster_concurrency`](Self::cluster_concurrency), a cluster may run at
/// most `max(1, ⌈G / max(k, m)⌉)` reconciles at once, where `k` is the
/// number of clusters that have work (keys running, or queued and ready)
/// and `m` is 2 once the controller knows more than one cluster (1
/// otherwise). A controller of a single cluster uses all `G` slots; in a
/// fleet, no cluster holds more than half of them, and when several
/// clusters have work each gets at most its fair share. A cluster whose
/// reconciles hang therefore cannot take the slots the others need.
#[derive(Debug, Clone)]
#[must_use]
pub struct Config {
    pub(crate) limits: Limits,
    pub(crate) backoff: Backoff,
    pub(crate) sync_timeout: Duration,
    pub(crate) shutdown_timeout: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            limits: Limits {
                concurrency: Some(DEFAULT_CONCURRENCY),
                ..Limits::default()
            },
            backoff: Backoff::default(),
            sync_timeout: DEFAULT_SYNC_TIMEOUT,
            shutdown_timeout: DEFAULT_SHUTDOWN_TIMEOUT,
        }
    }
}

impl Config {
    /// At most `limit` reconciles at once, in all clusters together
    /// (default [`DEFAULT_CONCURRENCY`]; 0 means no limit).
    pub fn concurrency(mut self, limit: usize) -> Self {
        self.limits.concurrency = (limit > 0).then_some(limit);
        self
    }

    /// At most `limit` reconciles at once in any one cluster (default: the
    /// fair share described [above](Self#concurrency-across-clusters); at
    /// least 1).
    pub fn cluster_concurrency(mut self, limit: usize) -> Self {
        self.limits.cluster_concurrency = Some(limit.max(1));
        self
    }

    /// Takes a token from `bucket` for every reconcile. Clones of a bucket
    /// share its tokens, so one bucket given to several controllers limits
    /// them together.
    pub fn rate_limit(mut self, bucket: TokenBucket) -> Self {
        self.limits.rate_limit = Some(bucket);
        self
    }

    /// Gives each cluster a bucket of its own: `rate` reconciles per second,
    /// bursts of `burst`. The bucket goes when the cluster leaves.
    ///
    /// # Panics
    /// If `rate` is not a positive number or `burst` is zero.
    pub fn cluster_rate_limit(mut self, rate: f64, burst: u32) -> Self {
        // Checks the arguments now rather than at the first key.
        let _ = TokenBucket::new(rate, burst);
        self.limits.cluster_rate_limit = Some((rate, burst));
        self
    }

    /// How failing keys are retried (default: 5 ms doubling to 1000 s, 10%
    /// jitter).
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// How long the controller's watches in a cluster may take to sync
    /// before they are reported as failing, with a warning that repeats
    /// each time that long passes (default [`DEFAULT_SYNC_TIMEOUT`]). They
    /// keep trying; the cluster is served once they sync.
    pub fn sync_timeout(mut self, timeout: Duration) -> Self {
        self.sync_timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// How many reconciles a controller runs at once by default, in all clusters
    /// together.
    ///
    /// Beyond what the clusters' API servers serve at once, more reconciles in
    /// flight only wait in memory: labelling 10,000 ConfigMaps in 10 clusters
    /// with no limit peaked at 145–167 MiB of memory and took 5.1–6.9 s; with
    /// this limit, 64 MiB and 5.8 s (`docs/benchmarks.md`). In a fleet the
    /// limit also gives each cluster a fair share, so that one cluster whose
    /// reconciles hang holds at most half of the slots.
    pub const DEFAULT_CONCURRENCY: usize = 1024;

    /// How long a graceful shutdown waits for running reconciles (default
    /// [`DEFAULT_SHUTDOWN_TIMEOUT`]); those still running then are cancelled.
    pub fn shutdown_timeout(mut self, timeout: Duration) -> Self {
        self.shutdown_timeout = timeout;
        self
    }
}
