use std::time::Duration;

use crate::queue::{Backoff, Limits, Sharing, TokenBucket};

/// How many reconciles a controller runs at once in one cluster by default,
/// when no [`Config::concurrency`] limit is set.
///
/// Each cluster has slots of its own, so a cluster whose reconciles hang holds
/// only its own; in all, a controller runs at most this many times the number
/// of clusters with work. Beyond what an API server serves at once, more
/// reconciles in flight only wait in memory: labelling 10,000 ConfigMaps in
/// 10 clusters with no limit peaked at 143–167 MiB, with this default at
/// 57–59 MiB (`docs/benchmarks.md`). One controller's reconciles in a cluster
/// then stay within what one HTTP/2 connection carries
/// ([`crate::client::DEFAULT_MAX_STREAMS`]); with several controllers on one
/// cluster, requests beyond it take HTTP/1.1 connections.
pub const DEFAULT_CLUSTER_CONCURRENCY: usize = 64;

/// How long a graceful shutdown waits for running reconciles by default.
pub const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a controller's watches in a cluster may take to sync before the
/// controller reports them failing and logs a warning (they keep trying).
pub const DEFAULT_SYNC_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a controller that reads its own writes waits, by default, for
/// its watches in a cluster to show them before it reads its object
/// through the API instead ([`Config::read_your_writes_within`]): as long
/// as an API server waits for its own watch cache to catch up with a read
/// that asks for the latest state.
pub const DEFAULT_READ_YOUR_WRITES_WAIT: Duration = Duration::from_secs(3);

/// The longest wait for watches to show a controller's writes: a write is
/// remembered no longer.
const MAX_READ_YOUR_WRITES_WAIT: Duration = Duration::from_secs(60);

/// A controller's knobs: concurrency, rate limits, backoff and timeouts.
///
/// Every limit is applied by the controller's queue when it hands out the
/// next key, so a key that may not run yet stays queued: deduplicated,
/// counted in the queue depth, and in its place in line. One cluster's
/// limits hold up no other cluster.
///
/// ```
/// use std::time::Duration;
/// use kube_multicluster::{
///     controller::Config,
///     queue::{Backoff, TokenBucket},
/// };
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
/// By default each cluster has slots of its own: at most
/// [`DEFAULT_CLUSTER_CONCURRENCY`] reconciles at once in each, and no limit
/// on all of them together, so no cluster can take another's slots.
///
/// With a [`concurrency`](Self::concurrency) limit `G`, no explicit
/// [`cluster_concurrency`](Self::cluster_concurrency) and
/// [`Sharing::Fair`] (the default), a cluster may run at
/// most `max(1, ⌈G / max(k, m)⌉)` reconciles at once, where `k` is the
/// number of clusters that have work (keys running, or queued and ready)
/// and `m` is 2 once the controller knows more than one cluster (1
/// otherwise). A controller of a single cluster uses all `G` slots; in a
/// fleet, no cluster holds more than half of them, and when several
/// clusters have work each gets at most its fair share, so a cluster whose
/// reconciles hang holds at most half of the slots. Slots are counted when a
/// reconcile starts and are not taken back: a cluster that started its
/// reconciles while it was the only one with work (the first to sync, say)
/// keeps those slots until they end. Bound how long a reconcile may take
/// (a timeout layer) when one cluster must never wait on another's. With
/// [`Sharing::InTurn`] a cluster may take all `G` slots in its turn.
///
/// With a total limit, [`sharing`](Self::sharing) chooses how clusters with
/// work share it: [`Sharing::Fair`] key by key, each cluster its share, or
/// [`Sharing::InTurn`], a turn of one cluster's ready keys at a time, which
/// costs API servers that share a machine less.
#[derive(Debug, Clone)]
#[must_use]
pub struct Config {
    pub(crate) limits: Limits,
    pub(crate) backoff: Backoff,
    pub(crate) sync_timeout: Duration,
    pub(crate) shutdown_timeout: Duration,
    pub(crate) warm_standby: bool,
    pub(crate) read_your_writes: Option<Duration>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            limits: Limits {
                default_cluster_concurrency: Some(DEFAULT_CLUSTER_CONCURRENCY),
                ..Limits::default()
            },
            backoff: Backoff::default(),
            sync_timeout: DEFAULT_SYNC_TIMEOUT,
            shutdown_timeout: DEFAULT_SHUTDOWN_TIMEOUT,
            warm_standby: false,
            read_your_writes: Some(DEFAULT_READ_YOUR_WRITES_WAIT),
        }
    }
}

impl Config {
    /// At most `limit` reconciles at once, in all clusters together
    /// (default: none, with at most [`DEFAULT_CLUSTER_CONCURRENCY`] in each
    /// cluster; 0 means none, and keeps that per-cluster default).
    ///
    /// With this limit set, each cluster gets the fair share described (or,
    /// with [`Sharing::InTurn`], every slot in its turn)
    /// [above](Self#concurrency-across-clusters) instead of the default
    /// per-cluster slots, which may be more than those in one cluster (a
    /// lone cluster may use all `limit`); add
    /// [`cluster_concurrency`](Self::cluster_concurrency) to cap it as well.
    pub fn concurrency(mut self, limit: usize) -> Self {
        self.limits.concurrency = (limit > 0).then_some(limit);
        self
    }

    /// At most `limit` reconciles at once in any one cluster (at least 1).
    /// The default is [`DEFAULT_CLUSTER_CONCURRENCY`] without a
    /// [`concurrency`](Self::concurrency) limit, and the fair share described
    /// [above](Self#concurrency-across-clusters) with one.
    /// `cluster_concurrency(usize::MAX)` without a `concurrency` limit
    /// removes every limit.
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

    /// How clusters with work share a total [`concurrency`](Self::concurrency)
    /// limit (default [`Sharing::Fair`]): key by key with each its fair
    /// share, or [`Sharing::InTurn`], a turn of one cluster's ready keys
    /// after another's, for fleets whose API servers share a machine.
    /// Without a total limit each cluster has slots of its own and the two
    /// differ little.
    pub fn sharing(mut self, sharing: Sharing) -> Self {
        self.limits.sharing = sharing;
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

    /// How long a graceful shutdown waits for running reconciles (default
    /// [`DEFAULT_SHUTDOWN_TIMEOUT`]); those still running then are cancelled.
    pub fn shutdown_timeout(mut self, timeout: Duration) -> Self {
        self.shutdown_timeout = timeout;
        self
    }

    /// Whether a replica that does not lead keeps this controller's
    /// watches synced (default `false`): the manager then runs
    /// [`Controller::warm_up`](crate::Controller::warm_up) from its start,
    /// so that on taking over the controller reconciles at once from
    /// caches already full, rather than after listing every type in every
    /// cluster. A standby then costs what the leader's watches cost.
    ///
    /// ```
    /// use kube_multicluster::controller::Config;
    ///
    /// let config = Config::default().warm_standby(true);
    /// assert!(config.is_warm_standby());
    /// ```
    pub fn warm_standby(mut self, warm: bool) -> Self {
        self.warm_standby = warm;
        self
    }

    /// Whether a standby keeps the controller's watches synced.
    pub fn is_warm_standby(&self) -> bool {
        self.warm_standby
    }

    /// Whether the controller's reconciles read its own writes (default
    /// `true`).
    ///
    /// Each write a reconcile makes through an engaged cluster's client
    /// (create, replace, patch, apply, delete, also of a status) is recorded
    /// with the resourceVersion the API server answered with. Before it
    /// starts a reconcile in a cluster, the controller waits until the
    /// cluster's synced watches that hold a written object (by resource,
    /// namespace and selectors) show that version or its deletion. A write
    /// that a reconcile of a key in one cluster made to another (a hub's
    /// reconcile making a child in a member) holds the first cluster's next
    /// reconciles until the other's watches show it too. So a reconcile the
    /// controller starts, in the written cluster or in the cluster of the
    /// key whose reconcile wrote, after the write was answered reads no
    /// older copy of the written object from the written cluster's caches:
    /// not as its own object, nor through
    /// [`Children`](crate::ownership::Children), a
    /// [`FleetStore`](crate::fleetwide::FleetStore), a related watch or
    /// [`Cluster::store`](crate::Cluster::store). A reconciler that creates
    /// a child "if absent" and is requeued at once creates it once. Other
    /// clusters' reconciles go on meanwhile (and one in a third cluster
    /// that reads the written cluster's cache is not held).
    ///
    /// The wait is bounded
    /// ([`read_your_writes_within`](Self::read_your_writes_within)). Past
    /// it, the objects of the controller's own type still not shown are
    /// read through the API for their next reconcile, for at most as long
    /// again while the cluster stays held (those not read by then, and
    /// other objects, children among them, are read from the cache as it
    /// is), and the controller does not wait for that cluster's watches
    /// again for 30 s: a watch that lags holds its reconciles once, not at
    /// every write. Waits and
    /// timeouts are counted for the cluster whose reconciles waited
    /// ([`Cluster::read_your_writes`](crate::Cluster::read_your_writes)).
    ///
    /// The watch event of the controller's own write is then known for an
    /// echo: it still queues its key (nothing is dropped), with the reason
    /// [`OwnWrite`](crate::ReconcileReason::OwnWrite), behind every other
    /// change and the start-up backlog rather than ahead of the backlog as
    /// a fresh change, though at least one in every hundred keys its cluster
    /// starts. A change someone else makes to an object while the
    /// controller's own write of it awaits its answer is taken for the
    /// echo.
    ///
    /// Not covered: reconciles started while the write was still on its
    /// way; writes from a task the reconcile spawned or through a client it
    /// built itself (they are followed on the reconcile's own task, as
    /// [`OwnerReferenceAcross`](crate::ownership::OwnerReferenceAcross) is
    /// checked); objects that no synced watch of the cluster holds (another
    /// type, a namespace or labels outside every watch, a watch that
    /// fails). The cost, measured in `docs/benchmarks.md`, is a read of each
    /// write's answer for its version and, in a cluster where the
    /// controller just wrote, the time its watch takes to bring the event:
    /// turn it off where reconciles never read what they wrote.
    ///
    /// ```
    /// use kube_multicluster::controller::Config;
    ///
    /// assert!(Config::default().reads_your_writes().is_some());
    /// let config = Config::default().read_your_writes(false);
    /// assert_eq!(config.reads_your_writes(), None);
    /// ```
    pub fn read_your_writes(mut self, on: bool) -> Self {
        self.read_your_writes = on.then_some(
            self.read_your_writes
                .unwrap_or(DEFAULT_READ_YOUR_WRITES_WAIT),
        );
        self
    }

    /// Reads its own writes, waiting at most `wait` (up to a minute) for a
    /// cluster's watches to show them (default
    /// [`DEFAULT_READ_YOUR_WRITES_WAIT`]).
    ///
    /// ```
    /// use std::time::Duration;
    /// use kube_multicluster::controller::Config;
    ///
    /// let config = Config::default().read_your_writes_within(Duration::from_secs(1));
    /// assert_eq!(config.reads_your_writes(), Some(Duration::from_secs(1)));
    /// ```
    pub fn read_your_writes_within(mut self, wait: Duration) -> Self {
        self.read_your_writes = Some(wait.min(MAX_READ_YOUR_WRITES_WAIT));
        self
    }

    /// How long the controller waits for its writes to be shown, if it
    /// reads them.
    pub fn reads_your_writes(&self) -> Option<Duration> {
        self.read_your_writes
    }
}
