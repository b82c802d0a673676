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

// Its parts, each owning its state: `keys` (`Keys`: each key's state, its
// timer, its backoff), `lanes` (`Lanes`: each cluster's lanes of ready keys,
// the round-robin of clusters, the counts, and which clusters are held) and
// `admission` (`Admission`: the limits and the token buckets' state). What
// crosses them (a key scheduled, popped or completed; a cluster purged or
// woken) is `Queue`'s, in `schedule.rs`.

mod admission;
mod backoff;
mod depth;
mod keys;
mod lane;
mod lanes;
mod metrics;
mod schedule;
#[cfg(test)]
mod tests;
mod token_bucket;

use std::task::{Context, Poll};

use tokio::time::Instant;

pub(crate) use admission::Limits;
pub use backoff::Backoff;
pub use depth::QueueDepth;
pub(crate) use keys::Outcome;
pub(crate) use lane::Lane;
pub use lanes::Sharing;
pub use metrics::{ClusterQueueMetrics, DurationHistogram, QueueMetrics, WORKQUEUE_BUCKETS};
pub use token_bucket::TokenBucket;

use crate::{cluster_name::ClusterName, reason::ReconcileReason, request::McRequest};
use admission::Admission;
use keys::Keys;
use lanes::Lanes;

/// Deduplicating, delaying, backing-off, admitting, fair queue of requests.
#[derive(Debug)]
pub(crate) struct Queue {
    keys: Keys,
    lanes: Lanes,
    admission: Admission,
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
            .lanes
            .front()
            .expect("an admitted cluster is first in line")
    }

    /// Leaves the key queued and starts no key of its cluster until
    /// [`Queue::resume`]: the controller waits for its watches there.
    pub(crate) fn pause(self) {
        self.queue.lanes.pause_front();
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
            keys: Keys::new(backoff),
            lanes: Lanes::default(),
            admission: Admission::new(limits),
        }
    }

    /// Counts each cluster's figures in `metrics` from now on.
    pub(crate) fn count_in(&mut self, metrics: QueueMetrics) {
        self.lanes.count_in(metrics);
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
        self.keys.failed_again(key, error)
    }

    /// How many keys wait to run, ready or delayed (not those running).
    pub(crate) fn waiting(&self) -> usize {
        self.lanes.ready() + self.keys.delayed()
    }

    /// Holds `cluster`'s keys until [`release`](Self::release): the
    /// controller serves it but its watches there have not synced.
    pub(crate) fn hold(&mut self, cluster: &ClusterName) {
        self.lanes.hold(cluster);
    }

    /// Lets `cluster`'s keys run.
    pub(crate) fn release(&mut self, cluster: &ClusterName) {
        self.lanes.release(cluster);
    }

    /// Lets `cluster`'s keys start again after a
    /// [`pause`](PopReady::pause); nothing if it left meanwhile.
    pub(crate) fn resume(&mut self, cluster: &ClusterName) {
        self.lanes.resume(cluster);
    }

    /// Lets `cluster`'s keys run and stops keeping its entry for it: the
    /// controller does not serve the cluster (it only receives requests for
    /// it).
    pub(crate) fn unserve(&mut self, cluster: &ClusterName) {
        self.lanes.unserve(cluster);
    }

    /// How many failures `key` has had in a row.
    #[cfg(test)]
    fn failures(&self, key: &McRequest) -> u32 {
        self.keys.get(key).map_or(0, |s| s.failures)
    }
}
