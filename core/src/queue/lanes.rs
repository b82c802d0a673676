//! Each cluster's lanes of ready keys, and the round-robin of clusters.
//!
//! Clusters take turns. Within a cluster, keys from changes seen while the
//! watches ran (the `Changed` lane) alternate with keys from lists (the
//! `Listed` lane: the start-up backlog); changes that only echo the
//! controller's own writes (the `Echoed` lane) wait for both.

use std::{
    collections::{HashSet, VecDeque},
    sync::Arc,
    time::Duration,
};

use tokio::time::Instant;

use super::{
    Queue,
    keys::{KeyState, Phase},
    metrics::{ClusterStats, QueueMetrics},
    token_bucket::Tokens,
};
use crate::{cluster_name::ClusterName, reason::ReconcileReason, request::McRequest};

/// How clusters with work share a controller's slots
/// ([`Config::sharing`](crate::controller::Config::sharing)).
///
/// ```
/// use kube_fleet::{controller::Config, queue::Sharing};
///
/// // Ten kind clusters on a laptop: one API server busy at a time.
/// let config = Config::default().concurrency(16).sharing(Sharing::InTurn);
/// # drop(config);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Sharing {
    /// Clusters take turns key by key, and with a total
    /// [`concurrency`](crate::controller::Config::concurrency) limit each
    /// cluster with work gets at most its fair share of the slots: every
    /// cluster progresses at once, and one whose reconciles hang holds only
    /// its share. The default.
    #[default]
    Fair,
    /// With a total [`concurrency`](crate::controller::Config::concurrency)
    /// limit `G`: the cluster at the front of the line runs as many keys as
    /// it had ready when its turn came, up to `8 × G` (at least 64), as
    /// many at once as the limits allow (all `G` slots unless
    /// [`cluster_concurrency`](crate::controller::Config::cluster_concurrency)
    /// caps it), before the next cluster's turn. A run that fails because
    /// its cluster gave no answer ends the cluster's turn, and until the
    /// cluster answers again it runs no more than its fair share, as with
    /// `Fair`. A start-up backlog drains a
    /// cluster or two at a time, keeping few API servers busy at once:
    /// where the servers share a machine's cores (kind or envtest clusters
    /// on a laptop), ten clusters labelled this way cost the servers
    /// 0.6–0.7 of their CPU and finished in 0.6–0.7 of the time
    /// (`docs/benchmarks.md`). The price is latency: a fresh change in one
    /// cluster waits for the turns of the clusters ahead of it, and while
    /// its turn runs, one cluster's slow or hanging reconciles hold up to
    /// every slot (bound their time with a timeout layer). Without a total
    /// limit each cluster has slots of its own, and `InTurn` is `Fair`.
    InTurn,
}

/// How many keys a cluster starts from its other lanes before it starts
/// one waiting in `Echoed`, however busy they are: an echo waits behind
/// the changes and the backlog, but not for ever.
pub(super) const ECHO_EVERY: u32 = 100;

/// Which lane of its cluster a ready key waits in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lane {
    /// A change seen while the watch ran, a due requeue or retry, or a
    /// request from outside.
    Changed,
    /// An object listed when a watch (re)started.
    Listed,
    /// A change that only echoes the controller's own write: served once
    /// the other two lanes are empty, or after [`ECHO_EVERY`] keys from
    /// them.
    Echoed,
}

impl Lane {
    fn rank(self) -> u8 {
        match self {
            Lane::Changed => 2,
            Lane::Listed => 1,
            Lane::Echoed => 0,
        }
    }

    /// Whether a key in `self` is served before one in `other`.
    pub(super) fn outranks(self, other: Lane) -> bool {
        self.rank() > other.rank()
    }

    pub(super) fn max(self, other: Lane) -> Lane {
        if other.outranks(self) { other } else { self }
    }
}

/// One cluster's part of the queue.
#[derive(Debug, Default)]
pub(super) struct ClusterQueue {
    pub(super) changed: VecDeque<(u64, McRequest)>,
    pub(super) listed: VecDeque<(u64, McRequest)>,
    pub(super) echoed: VecDeque<(u64, McRequest)>,
    /// Ready keys (the lanes may also hold stale entries of promoted keys).
    pub(super) ready: usize,
    pub(super) delayed: usize,
    pub(super) running: usize,
    /// The last key came from the `Changed` lane: the backlog goes next.
    pub(super) changed_last: bool,
    /// Keys started from the other lanes since the last echo.
    pub(super) since_echo: u32,
    /// The controller serves this cluster: keep its entry while idle.
    pub(super) served: bool,
    /// The controller's watches here have not synced: no key may run.
    pub(super) held: bool,
    /// The controller waits for its watches here to show its writes: no
    /// key may start meanwhile.
    pub(super) paused: bool,
    /// In the round-robin of clusters with ready keys.
    pub(super) in_turns: bool,
    /// Waits for its bucket's next token.
    pub(super) throttled: bool,
    /// With [`Sharing::InTurn`]: how many more keys it runs in the turn
    /// under way (0 when it has none under way).
    pub(super) turn_left: usize,
    /// Counted among the clusters with work.
    pub(super) busy: bool,
    pub(super) bucket: Option<Tokens>,
    /// A token of `bucket` is taken for the next key.
    pub(super) has_token: bool,
    /// Keys whose last run failed for want of an answer from the cluster
    /// (some may have run since: only those still delayed count).
    pub(super) unanswered: HashSet<McRequest>,
    /// How many times the cluster answered again after it did not.
    pub(super) recoveries: u64,
    /// Its figures, if the queue's metrics are counted (made on first
    /// use).
    pub(super) stats: Option<Arc<ClusterStats>>,
    /// When its runs under way started, from the metrics' epoch (kept
    /// only while they are counted).
    pub(super) running_since: Vec<u64>,
}

impl ClusterQueue {
    /// Its figures in `metrics`, made on first use.
    pub(super) fn stats(&mut self, metrics: &QueueMetrics, name: &ClusterName) -> &ClusterStats {
        self.stats.get_or_insert_with(|| metrics.of(name))
    }

    /// A key that was ready since `since` starts its run at `now`.
    fn started(
        &mut self,
        metrics: &QueueMetrics,
        name: &ClusterName,
        since: Option<Instant>,
        now: Instant,
    ) {
        let start = metrics.since_epoch(now);
        self.running_since.push(start);
        let oldest = self.running_since.iter().copied().min().unwrap_or(start);
        let waited = since.map_or(Duration::ZERO, |since| now - since);
        self.stats(metrics, name).started(waited, start, oldest);
    }

    /// A run started at `started` ended at `now`; `retried` if it failed
    /// and is scheduled again.
    pub(super) fn finished(
        &mut self,
        metrics: &QueueMetrics,
        name: &ClusterName,
        started: Instant,
        now: Instant,
        retried: bool,
    ) {
        let start = metrics.since_epoch(started);
        if let Some(at) = self.running_since.iter().position(|s| *s == start) {
            self.running_since.swap_remove(at);
        }
        let oldest = self.running_since.iter().copied().min();
        let stats = self.stats(metrics, name);
        stats.finished(now - started, start, oldest);
        if retried {
            stats.retried();
        }
    }

    /// The lane `lane`'s entries.
    pub(super) fn lane_mut(&mut self, lane: Lane) -> &mut VecDeque<(u64, McRequest)> {
        match lane {
            Lane::Changed => &mut self.changed,
            Lane::Listed => &mut self.listed,
            Lane::Echoed => &mut self.echoed,
        }
    }

    pub(super) fn is_busy(&self) -> bool {
        self.running > 0 || (self.ready > 0 && !self.held && !self.paused)
    }

    /// Nothing to keep: not served, no keys, and no bucket whose state a
    /// new entry would forget (entries exist only for engaged clusters, and
    /// go when they leave).
    pub(super) fn is_empty(&self) -> bool {
        !self.served
            && self.bucket.is_none()
            && self.ready == 0
            && self.delayed == 0
            && self.running == 0
    }
}

impl Queue {
    pub(super) fn cluster_mut(&mut self, name: &ClusterName) -> &mut ClusterQueue {
        self.clusters.entry(name.clone()).or_default()
    }

    pub(super) fn make_ready(&mut self, key: McRequest, lane: Lane) -> u64 {
        let ticket = self.ticket();
        let name = key.cluster.clone();
        let cluster = self.clusters.entry(name.clone()).or_default();
        cluster.lane_mut(lane).push_back((ticket, key));
        cluster.ready += 1;
        if let Some(metrics) = &self.metrics {
            cluster.stats(metrics, &name).added();
        }
        self.ready_len += 1;
        self.take_turn(&name);
        self.refresh(&name);
        ticket
    }

    /// Puts `name` in the round-robin if it has ready keys and is neither
    /// held nor throttled (and is not in it already).
    pub(super) fn take_turn(&mut self, name: &ClusterName) {
        if let Some(cluster) = self.clusters.get_mut(name)
            && cluster.ready > 0
            && !cluster.held
            && !cluster.paused
            && !cluster.throttled
            && !cluster.in_turns
        {
            cluster.in_turns = true;
            self.turns.push_back(name.clone());
        }
    }

    /// Recounts whether `name` has work, and forgets its entry once it has
    /// nothing left.
    pub(super) fn refresh(&mut self, name: &ClusterName) {
        let Some(cluster) = self.clusters.get_mut(name) else {
            return;
        };
        if let Some(stats) = &cluster.stats {
            stats.depth(cluster.ready);
        }
        let busy = cluster.is_busy();
        if busy != cluster.busy {
            cluster.busy = busy;
            if busy {
                self.busy_clusters += 1;
            } else {
                self.busy_clusters -= 1;
            }
        }
        if cluster.is_empty()
            && !cluster.in_turns
            && !cluster.throttled
            && let Some(entry) = self.clusters.remove(name)
            && entry.stats.is_some()
            && let Some(metrics) = &self.metrics
        {
            metrics.forget(name);
        }
    }

    /// Takes the next key of the cluster at the front of the round-robin
    /// and marks it running. Call [`poll_admit`](Self::poll_admit) first,
    /// and only when it said yes.
    pub(super) fn pop_front(&mut self) -> Option<(McRequest, ReconcileReason)> {
        let name = self.turns.pop_front()?;
        // The tokens taken when the key was admitted are used now.
        self.shared_token = false;
        let cluster = self.clusters.get_mut(&name)?;
        cluster.has_token = false;
        // One reading, kept with the run and counted now, so that its end
        // finds it among the runs under way.
        let started = self.metrics.as_ref().map(|_| Instant::now());
        let key = loop {
            let lane = if cluster.since_echo >= ECHO_EVERY && !cluster.echoed.is_empty() {
                Lane::Echoed
            } else if cluster.changed_last && !cluster.listed.is_empty() {
                Lane::Listed
            } else if !cluster.changed.is_empty() {
                Lane::Changed
            } else if !cluster.listed.is_empty() {
                Lane::Listed
            } else {
                Lane::Echoed
            };
            let list = cluster.lane_mut(lane);
            let (ticket, key) = list.pop_front()?;
            if list.is_empty() && list.capacity() > 1024 {
                // A drained backlog gives its memory back.
                *list = VecDeque::new();
            }
            let since = match self.keys.get(&key) {
                Some(KeyState {
                    phase:
                        Phase::Ready {
                            ticket: t, since, ..
                        },
                    ..
                }) if *t == ticket => Some(*since),
                _ => None,
            };
            if let Some(since) = since {
                if let (Some(metrics), Some(started)) = (&self.metrics, started) {
                    cluster.started(metrics, &name, since, started);
                }
                cluster.changed_last = lane == Lane::Changed;
                cluster.since_echo = match lane {
                    Lane::Echoed => 0,
                    _ => cluster.since_echo.saturating_add(1),
                };
                break key;
            }
        };
        let turns = self.limits.turns();
        if let Some(most) = turns
            && cluster.turn_left == 0
        {
            // A turn begins: the keys ready now, this one included, up to
            // the most a turn runs.
            cluster.turn_left = cluster.ready.min(most);
        }
        cluster.turn_left = cluster.turn_left.saturating_sub(1);
        cluster.ready -= 1;
        cluster.running += 1;
        if cluster.ready == 0 {
            // What is left in the lanes is stale: entries of keys promoted
            // to another lane, or taken out.
            for lane in [Lane::Changed, Lane::Listed, Lane::Echoed] {
                cluster.lane_mut(lane).clear();
            }
            cluster.turn_left = 0;
            cluster.in_turns = false;
        } else if turns.is_some() && cluster.turn_left > 0 {
            // Its turn goes on: it stays first in line.
            self.turns.push_front(name.clone());
        } else {
            cluster.turn_left = 0;
            self.turns.push_back(name.clone());
        }
        self.ready_len -= 1;
        self.running_len += 1;
        let recoveries = cluster.recoveries;
        let reason = match self.keys.get_mut(&key) {
            Some(state) => {
                state.phase = Phase::Running {
                    rerun: None,
                    purged: false,
                    recoveries,
                    started,
                };
                state.reason.clone()
            }
            None => ReconcileReason::Unknown,
        };
        self.refresh(&name);
        Some((key, reason))
    }
}
