//! What a controller's queue does in each cluster, for metrics under
//! controller-runtime's workqueue names: keys waiting, added and retried,
//! how long they waited and ran, and what runs now.

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex, MutexGuard, OnceLock,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use tokio::time::Instant;

use crate::{cluster_name::ClusterName, panic::lock};

/// The upper bounds, in seconds, of the buckets of
/// [`ClusterQueueMetrics::queue_duration`] and
/// [`work_duration`](ClusterQueueMetrics::work_duration): controller-runtime's
/// for `workqueue_queue_duration_seconds` and
/// `workqueue_work_duration_seconds`, ten nanoseconds to a thousand seconds
/// by factors of ten.
pub const WORKQUEUE_BUCKETS: [f64; 12] = [
    1e-8, 1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0, 100.0, 1000.0,
];

/// A controller's queue, cluster by cluster, as metrics read it: a handle
/// from [`Controller::queue_metrics`](crate::Controller::queue_metrics),
/// which turns the counting on for that controller. Cheap to clone.
///
/// Each cluster the queue holds keys of, or that the controller serves, has
/// its [`ClusterQueueMetrics`]; a cluster's entry goes when the controller
/// stops serving it and holds no key of it, so series made from it go with
/// the cluster. The layers' `WorkqueueMetrics` reports them under
/// controller-runtime's names with a `cluster` label.
///
/// ```
/// # use k8s_openapi::api::core::v1::ConfigMap;
/// # use kube::runtime::watcher;
/// # use kube_multicluster::{Controller, Fleet};
/// let controller = Controller::<ConfigMap>::new(&Fleet::new(), watcher::Config::default());
/// let metrics = controller.queue_metrics();
/// assert!(metrics.clusters().is_empty());
/// ```
#[derive(Debug, Clone)]
pub struct QueueMetrics {
    inner: Arc<Registry>,
}

#[derive(Debug)]
struct Registry {
    controller: OnceLock<Arc<str>>,
    clusters: Mutex<HashMap<ClusterName, Arc<ClusterStats>>>,
    /// What the running keys' start times count from.
    epoch: Instant,
}

impl Default for QueueMetrics {
    fn default() -> Self {
        Self {
            inner: Arc::new(Registry {
                controller: OnceLock::new(),
                clusters: Mutex::default(),
                epoch: Instant::now(),
            }),
        }
    }
}

impl QueueMetrics {
    /// The controller's name
    /// ([`Controller::named`](crate::Controller::named)), once it runs.
    pub fn controller(&self) -> Option<&str> {
        self.inner.controller.get().map(|name| &**name)
    }

    /// Each cluster's figures now, by name, in no particular order.
    pub fn clusters(&self) -> Vec<(ClusterName, ClusterQueueMetrics)> {
        let now = Instant::now();
        let clusters: Vec<_> = self
            .registry()
            .iter()
            .map(|(name, stats)| (name.clone(), stats.clone()))
            .collect();
        clusters
            .into_iter()
            .map(|(name, stats)| (name, stats.read(self.inner.epoch, now)))
            .collect()
    }

    fn registry(&self) -> MutexGuard<'_, HashMap<ClusterName, Arc<ClusterStats>>> {
        lock(&self.inner.clusters)
    }

    pub(crate) fn name(&self, controller: Arc<str>) {
        let _ = self.inner.controller.set(controller);
    }

    /// The figures of `cluster`, made if new.
    pub(super) fn of(&self, cluster: &ClusterName) -> Arc<ClusterStats> {
        self.registry().entry(cluster.clone()).or_default().clone()
    }

    /// `cluster`'s entry goes.
    pub(super) fn forget(&self, cluster: &ClusterName) {
        self.registry().remove(cluster);
    }

    /// When `at` was, counted from this registry's epoch.
    pub(super) fn since_epoch(&self, at: Instant) -> u64 {
        nanos(at.saturating_duration_since(self.inner.epoch))
    }
}

/// One cluster's part of a controller's queue, as
/// [`QueueMetrics::clusters`] reads it.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct ClusterQueueMetrics {
    /// Keys ready to run, waiting for their turn (not those delayed until
    /// a requeue or a retry, nor those running), as controller-runtime
    /// counts `workqueue_depth`.
    pub depth: u64,
    /// Keys that became ready to run (a key already waiting is not added
    /// again): `workqueue_adds_total`.
    pub adds: u64,
    /// Runs that failed and were scheduled again: `workqueue_retries_total`.
    pub retries: u64,
    /// How long keys were ready before they ran:
    /// `workqueue_queue_duration_seconds`.
    pub queue_duration: DurationHistogram,
    /// How long their runs took: `workqueue_work_duration_seconds`.
    pub work_duration: DurationHistogram,
    /// The time the runs under way have taken so far, summed:
    /// `workqueue_unfinished_work_seconds`.
    pub unfinished_work: Duration,
    /// The time the longest run under way has taken so far:
    /// `workqueue_longest_running_processor_seconds`.
    pub longest_running: Duration,
}

/// Durations counted in [`WORKQUEUE_BUCKETS`].
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct DurationHistogram {
    /// How many fell at or under each bound of [`WORKQUEUE_BUCKETS`]
    /// (cumulative, as Prometheus counts them).
    pub buckets: [u64; 12],
    /// How many in all.
    pub count: u64,
    /// Their sum.
    pub sum: Duration,
}

/// One cluster's figures, written by the queue and read by metrics.
#[derive(Debug, Default)]
pub(super) struct ClusterStats {
    depth: AtomicU64,
    adds: AtomicU64,
    retries: AtomicU64,
    queue_duration: Histogram,
    work_duration: Histogram,
    /// Runs under way, and the sum of their starts (from the epoch).
    running: AtomicU64,
    started_sum: AtomicU64,
    /// The earliest start of a run under way plus one (0: none).
    oldest: AtomicU64,
}

impl ClusterStats {
    pub(super) fn depth(&self, depth: usize) {
        self.depth.store(depth as u64, Ordering::Relaxed);
    }

    pub(super) fn added(&self) {
        self.adds.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn retried(&self) {
        self.retries.fetch_add(1, Ordering::Relaxed);
    }

    /// A key ready for `waited` starts its run at `start` (from the
    /// epoch); `oldest` is the earliest start of the runs under way now.
    pub(super) fn started(&self, waited: Duration, start: u64, oldest: u64) {
        self.queue_duration.observe(waited);
        // The sum before the count, and the count read first: a reading
        // between the two may understate the work under way; one across a
        // run's end is bounded by the longest run (see `read`).
        self.started_sum.fetch_add(start, Ordering::Relaxed);
        self.running.fetch_add(1, Ordering::Release);
        self.oldest.store(oldest + 1, Ordering::Relaxed);
    }

    /// A run begun at `start` (from the epoch) ended after `took`;
    /// `oldest` is the earliest start of the runs still under way.
    pub(super) fn finished(&self, took: Duration, start: u64, oldest: Option<u64>) {
        self.work_duration.observe(took);
        self.running.fetch_sub(1, Ordering::Release);
        self.started_sum.fetch_sub(start, Ordering::Relaxed);
        self.oldest
            .store(oldest.map_or(0, |o| o + 1), Ordering::Relaxed);
    }

    fn read(&self, epoch: Instant, now: Instant) -> ClusterQueueMetrics {
        let now = nanos(now.saturating_duration_since(epoch));
        let running = self.running.load(Ordering::Acquire);
        let started = self.started_sum.load(Ordering::Relaxed);
        let oldest = self.oldest.load(Ordering::Relaxed);
        let longest = if oldest == 0 {
            0
        } else {
            now.saturating_sub(oldest - 1)
        };
        // A run that ends between the two readings leaves its start in the
        // count but not in the sum: no run under way has run longer than
        // the longest, so neither can their sum.
        let unfinished = (running.saturating_mul(now))
            .saturating_sub(started)
            .min(running.saturating_mul(longest));
        ClusterQueueMetrics {
            depth: self.depth.load(Ordering::Relaxed),
            adds: self.adds.load(Ordering::Relaxed),
            retries: self.retries.load(Ordering::Relaxed),
            queue_duration: self.queue_duration.read(),
            work_duration: self.work_duration.read(),
            unfinished_work: Duration::from_nanos(if running == 0 { 0 } else { unfinished }),
            longest_running: Duration::from_nanos(longest),
        }
    }
}

/// Counts of durations per bucket (not cumulative), their number and sum.
#[derive(Debug, Default)]
struct Histogram {
    buckets: [AtomicU64; 12],
    count: AtomicU64,
    sum: AtomicU64,
}

impl Histogram {
    fn observe(&self, took: Duration) {
        let seconds = took.as_secs_f64();
        if let Some(bucket) = WORKQUEUE_BUCKETS.iter().position(|b| seconds <= *b) {
            self.buckets[bucket].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum.fetch_add(nanos(took), Ordering::Relaxed);
    }

    fn read(&self) -> DurationHistogram {
        let mut buckets = [0; 12];
        let mut total = 0;
        for (bucket, count) in buckets.iter_mut().zip(&self.buckets) {
            total += count.load(Ordering::Relaxed);
            *bucket = total;
        }
        DurationHistogram {
            buckets,
            count: self.count.load(Ordering::Relaxed),
            sum: Duration::from_nanos(self.sum.load(Ordering::Relaxed)),
        }
    }
}

fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_fall_in_controller_runtimes_buckets() {
        let histogram = Histogram::default();
        histogram.observe(Duration::from_millis(5));
        histogram.observe(Duration::from_secs(2));
        histogram.observe(Duration::from_secs(5000));
        let read = histogram.read();
        assert_eq!(read.count, 3);
        assert_eq!(read.buckets[5], 0, "none at or under 1 ms");
        assert_eq!(read.buckets[6], 1, "5 ms at or under 10 ms");
        assert_eq!(read.buckets[9], 2, "2 s at or under 10 s");
        assert_eq!(read.buckets[11], 2, "5000 s over every bound");
        assert_eq!(read.sum, Duration::from_millis(5_002_005));
    }

    #[tokio::test(start_paused = true)]
    async fn runs_under_way_are_summed_and_the_longest_told() {
        let metrics = QueueMetrics::default();
        let east = ClusterName::from("east");
        let stats = metrics.of(&east);
        let first = metrics.since_epoch(Instant::now());
        stats.started(Duration::from_millis(1), first, first);
        tokio::time::advance(Duration::from_secs(3)).await;
        let second = metrics.since_epoch(Instant::now());
        stats.started(Duration::from_millis(1), second, first);
        tokio::time::advance(Duration::from_secs(1)).await;
        let read = &metrics.clusters()[0].1;
        assert_eq!(read.unfinished_work, Duration::from_secs(5), "4 s and 1 s");
        assert_eq!(read.longest_running, Duration::from_secs(4));
        stats.finished(Duration::from_secs(4), first, Some(second));
        let read = &metrics.clusters()[0].1;
        assert_eq!(read.unfinished_work, Duration::from_secs(1));
        assert_eq!(read.longest_running, Duration::from_secs(1));
        assert_eq!(read.work_duration.count, 1);
        stats.finished(Duration::from_secs(1), second, None);
        let read = &metrics.clusters()[0].1;
        assert_eq!(read.unfinished_work, Duration::ZERO);
        assert_eq!(read.longest_running, Duration::ZERO);
        metrics.forget(&east);
        assert!(metrics.clusters().is_empty());
    }
}
