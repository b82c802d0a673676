//! The controller's queue, and the knobs that shape it: [`Backoff`] for a
//! failing key, [`TokenBucket`] for a rate limit shared between controllers,
//! [`QueueDepth`] to read how many keys wait. The limits are set through
//! [`controller::Config`](crate::controller::Config).
//!
//! Each controller has one queue of [`McRequest`] keys. It keeps, per key,
//! whether the key waits (ready or delayed), runs, or only remembers its
//! failures; and per cluster, two lanes of ready keys and what the cluster
//! may run now. A key leaves the queue only when its cluster may run one
//! more reconcile: the controller serves the cluster (its watches there have
//! synced), the controller and the cluster are under their concurrency
//! limits, and the token buckets have a token. Keys that may not run yet
//! stay queued: deduplicated, counted and in order.
//!
//! Clusters take turns round-robin, one key per turn ([`Sharing::Fair`]),
//! or, under a total limit, the keys each had ready when its turn came, up
//! to a bound ([`Sharing::InTurn`]).
//! Within a cluster, keys from changes seen while the watches ran alternate
//! with keys from lists (the start-up backlog), so a fresh edit waits behind
//! at most one backlog key, and the backlog still gets every other turn.
//! A change that only echoes the controller's own write (see
//! [`Config::read_your_writes`](crate::controller::Config::read_your_writes))
//! waits until neither has a key ready, or for a hundred keys of theirs.

// Its parts: `keys` (each key's state, its delays and what a run's outcome
// schedules), `lanes` (each cluster's lanes of ready keys and the
// round-robin of clusters), `admission` (the limits a key is admitted under)
// and `gate` (clusters held until their watches sync, purged when they
// leave, woken when they answer again).

mod admission;
mod backoff;
mod depth;
mod gate;
mod keys;
mod lanes;
mod metrics;
#[cfg(test)]
mod tests;
mod token_bucket;

use std::{
    collections::{HashMap, VecDeque},
    pin::Pin,
    task::{Context, Poll},
};

use tokio::time::{Instant, Sleep};
use tokio_util::time::DelayQueue;

pub(crate) use admission::Limits;
pub use backoff::Backoff;
pub use depth::QueueDepth;
pub(crate) use keys::Outcome;
pub(crate) use lanes::Lane;
pub use lanes::Sharing;
pub use metrics::{ClusterQueueMetrics, DurationHistogram, QueueMetrics, WORKQUEUE_BUCKETS};
pub use token_bucket::TokenBucket;

use crate::{cluster_name::ClusterName, reason::ReconcileReason, request::McRequest};
use backoff::Jitter;
use keys::KeyState;
use lanes::ClusterQueue;

/// Deduplicating, delaying, backing-off, admitting, fair queue of requests.
#[derive(Debug)]
pub(crate) struct Queue {
    keys: HashMap<McRequest, KeyState>,
    clusters: HashMap<ClusterName, ClusterQueue>,
    /// Clusters with ready keys that are not held or throttled, in the order
    /// they are served.
    turns: VecDeque<ClusterName>,
    ready_len: usize,
    running_len: usize,
    /// Clusters that have keys running, or ready and not held.
    busy_clusters: usize,
    /// Clusters held until the controller's watches there sync.
    held_clusters: usize,
    delayed: DelayQueue<McRequest>,
    throttled: DelayQueue<ClusterName>,
    /// Waits for the shared bucket's next token.
    shared_wait: Option<Pin<Box<Sleep>>>,
    /// A token of the shared bucket is taken for the next key.
    shared_token: bool,
    limits: Limits,
    backoff: Backoff,
    jitter: Jitter,
    next_ticket: u64,
    hasher: std::hash::RandomState,
    /// Where each cluster's figures are counted, if anyone reads them.
    metrics: Option<QueueMetrics>,
}

impl Drop for Queue {
    /// The controller has stopped: its figures go, rather than stand still
    /// with runs that will never end.
    fn drop(&mut self) {
        if let Some(metrics) = &self.metrics {
            for cluster in self.clusters.keys() {
                metrics.forget(cluster);
            }
        }
    }
}

/// The key the queue admits next, taken out only by [`pop`](Self::pop): a
/// caller whose service is not ready leaves it first in line.
pub(crate) struct PopReady<'a> {
    queue: &'a mut Queue,
}

impl PopReady<'_> {
    /// The cluster of the key admitted next.
    pub(crate) fn cluster(&self) -> &ClusterName {
        self.queue
            .turns
            .front()
            .expect("an admitted cluster is first in line")
    }

    /// Leaves the key queued and starts no key of its cluster until
    /// [`Queue::resume`]: the controller waits for its watches there.
    pub(crate) fn pause(self) {
        let name = self.queue.turns.pop_front().expect("an admitted cluster");
        if let Some(cluster) = self.queue.clusters.get_mut(&name) {
            cluster.paused = true;
            cluster.in_turns = false;
            cluster.turn_left = 0;
        }
        // No longer counted among the clusters with work while it waits.
        self.queue.refresh(&name);
    }

    /// Takes the key out and marks it running, with the reason it runs.
    pub(crate) fn pop(self) -> (McRequest, ReconcileReason) {
        self.queue
            .pop_front()
            .expect("an admitted cluster has a ready key")
    }
}

impl Queue {
    pub(crate) fn new(backoff: Backoff, limits: Limits) -> Self {
        Self {
            keys: HashMap::new(),
            clusters: HashMap::new(),
            turns: VecDeque::new(),
            ready_len: 0,
            running_len: 0,
            busy_clusters: 0,
            held_clusters: 0,
            delayed: DelayQueue::new(),
            throttled: DelayQueue::new(),
            shared_wait: None,
            shared_token: false,
            limits,
            backoff,
            jitter: Jitter::new(),
            next_ticket: 0,
            hasher: std::hash::RandomState::new(),
            metrics: None,
        }
    }

    /// Counts each cluster's figures in `metrics` from now on.
    pub(crate) fn count_in(&mut self, metrics: QueueMetrics) {
        self.metrics = Some(metrics);
    }

    /// Schedules `key` to run now, in `lane`, for `reason`.
    pub(crate) fn push(&mut self, key: McRequest, lane: Lane, reason: ReconcileReason) {
        self.schedule(key, Instant::now(), lane, reason);
    }

    /// Ready once a key may run now: moves keys whose delay has passed into
    /// their lanes, brings clusters whose tokens are due back into the
    /// round-robin, checks the limits, and registers `cx` to be woken for
    /// the next timer.
    pub(crate) fn poll_pop_ready(&mut self, cx: &mut Context<'_>) -> Poll<PopReady<'_>> {
        if self.poll_admit(cx) {
            Poll::Ready(PopReady { queue: self })
        } else {
            Poll::Pending
        }
    }

    /// Notes that the run of `key` failed with `error`; whether its last
    /// run failed with the same (a repeat, not news).
    pub(crate) fn failed_again(&mut self, key: &McRequest, error: &str) -> bool {
        use std::hash::BuildHasher;

        let Some(state) = self.keys.get_mut(key) else {
            return false;
        };
        let hash = self.hasher.hash_one(error).max(1);
        std::mem::replace(&mut state.last_error, hash) == hash
    }

    /// How many keys wait to run, ready or delayed (not those running).
    pub(crate) fn waiting(&self) -> usize {
        self.ready_len + self.delayed.len()
    }

    /// How many failures `key` has had in a row.
    #[cfg(test)]
    fn failures(&self, key: &McRequest) -> u32 {
        self.keys.get(key).map_or(0, |s| s.failures)
    }
}
