//! Each cluster's lanes of ready keys, and the round-robin of clusters.
//!
//! Clusters take turns. Within a cluster, keys from changes seen while the
//! watches ran (the `Changed` lane) alternate with keys from lists (the
//! `Listed` lane: the start-up backlog); changes that only echo the
//! controller's own writes (the `Echoed` lane) wait for both.

use std::{
    collections::{HashMap, HashSet, VecDeque},
    sync::Arc,
    time::Duration,
};

use tokio::time::Instant;
use tokio_util::time::DelayQueue;

use super::{
    keys::{KeyState, Keys, Phase},
    lane::Lane,
    metrics::{ClusterStats, QueueMetrics},
    token_bucket::Tokens,
};
use crate::{cluster_name::ClusterName, reason::ReconcileReason, request::McRequest};

/// How clusters with work share a controller's slots
/// ([`Config::sharing`](crate::controller::Config::sharing)).
///
/// ```
/// use kube_multicluster::{controller::Config, queue::Sharing};
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

/// Every cluster's part of the queue, the round-robin of those with keys
/// to run, and the counts the limits are reckoned from.
#[derive(Debug, Default)]
pub(super) struct Lanes {
    clusters: HashMap<ClusterName, ClusterQueue>,
    /// Clusters with ready keys that are not held or throttled, in the order
    /// they are served.
    turns: VecDeque<ClusterName>,
    ready: usize,
    running: usize,
    /// Clusters that have keys running, or ready and not held.
    busy: usize,
    /// Clusters held until the controller's watches there sync.
    held: usize,
    /// Where each cluster's figures are counted, if anyone reads them.
    metrics: Option<QueueMetrics>,
}

impl Drop for Lanes {
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

impl Lanes {
    /// Counts each cluster's figures in `metrics` from now on.
    pub(super) fn count_in(&mut self, metrics: QueueMetrics) {
        self.metrics = Some(metrics);
    }

    /// Whether figures are counted (then a key's wait is timed).
    pub(super) fn counted(&self) -> bool {
        self.metrics.is_some()
    }

    /// How many keys are ready.
    pub(super) fn ready(&self) -> usize {
        self.ready
    }

    /// How many keys run.
    pub(super) fn running(&self) -> usize {
        self.running
    }

    /// How many clusters have keys running, or ready and not held.
    pub(super) fn busy(&self) -> usize {
        self.busy
    }

    /// How many clusters the queue knows that are not held.
    pub(super) fn unheld(&self) -> usize {
        self.clusters.len() - self.held
    }

    pub(super) fn get(&self, name: &ClusterName) -> Option<&ClusterQueue> {
        self.clusters.get(name)
    }

    pub(super) fn get_mut(&mut self, name: &ClusterName) -> Option<&mut ClusterQueue> {
        self.clusters.get_mut(name)
    }

    pub(super) fn cluster_mut(&mut self, name: &ClusterName) -> &mut ClusterQueue {
        self.clusters.entry(name.clone()).or_default()
    }

    /// The cluster first in line.
    pub(super) fn front(&self) -> Option<&ClusterName> {
        self.turns.front()
    }

    /// Puts `key` in its cluster's `lane` under `ticket`, as a ready key.
    pub(super) fn make_ready(&mut self, key: McRequest, lane: Lane, ticket: u64) {
        let name = key.cluster.clone();
        let cluster = self.clusters.entry(name.clone()).or_default();
        cluster.lane_mut(lane).push_back((ticket, key));
        cluster.ready += 1;
        if let Some(metrics) = &self.metrics {
            cluster.stats(metrics, &name).added();
        }
        self.ready += 1;
        self.take_turn(&name);
    }

    /// Puts `name` in the round-robin if it has ready keys and is neither
    /// held nor throttled (and is not in it already); then recounts it
    /// ([`refresh`](Self::refresh)).
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
        self.refresh(name);
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
                self.busy += 1;
            } else {
                self.busy -= 1;
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

    /// Takes the cluster first in line out of the round-robin until
    /// [`resume`](Self::resume): it starts no key meanwhile.
    pub(super) fn pause_front(&mut self) {
        let name = self.turns.pop_front().expect("an admitted cluster");
        if let Some(cluster) = self.clusters.get_mut(&name) {
            cluster.paused = true;
            cluster.in_turns = false;
            cluster.turn_left = 0;
        }
        // No longer counted among the clusters with work while it waits.
        self.refresh(&name);
    }

    /// Holds `cluster`'s keys until [`release`](Self::release): the
    /// controller serves it but its watches there have not synced.
    pub(super) fn hold(&mut self, cluster: &ClusterName) {
        let entry = self.clusters.entry(cluster.clone()).or_default();
        entry.served = true;
        if let Some(metrics) = &self.metrics {
            // A cluster served has its figures from the start.
            let depth = entry.ready;
            entry.stats(metrics, cluster).depth(depth);
        }
        if !entry.held {
            entry.held = true;
            self.held += 1;
        }
        self.refresh(cluster);
    }

    /// Lets `cluster`'s keys run.
    pub(super) fn release(&mut self, cluster: &ClusterName) {
        let entry = self.cluster_mut(cluster);
        if entry.held {
            entry.held = false;
            self.held -= 1;
        }
        self.take_turn(cluster);
    }

    /// Lets `cluster`'s keys start again after a
    /// [`pause_front`](Self::pause_front); nothing if it left meanwhile.
    pub(super) fn resume(&mut self, cluster: &ClusterName) {
        let Some(entry) = self.clusters.get_mut(cluster) else {
            return;
        };
        entry.paused = false;
        self.take_turn(cluster);
    }

    /// Lets `cluster`'s keys run and stops keeping its entry for it: the
    /// controller does not serve the cluster (it only receives requests for
    /// it).
    pub(super) fn unserve(&mut self, cluster: &ClusterName) {
        self.release(cluster);
        if let Some(entry) = self.clusters.get_mut(cluster) {
            entry.served = false;
        }
        self.refresh(cluster);
    }

    /// Rotates the round-robin until its front cluster may run a key, taking
    /// out clusters that are held or out of tokens (timed in `throttled`)
    /// and skipping those at their concurrency cap (`cap`, or
    /// `unanswering_cap` for one whose keys wait for it to answer). Each
    /// cluster is looked at once at most.
    pub(super) fn front_admissible(
        &mut self,
        (cap, unanswering_cap): (usize, usize),
        rate_limit: Option<(f64, u32)>,
        throttled: &mut DelayQueue<ClusterName>,
        now: Instant,
    ) -> bool {
        for _ in 0..self.turns.len() {
            let Some(name) = self.turns.front().cloned() else {
                return false;
            };
            let Some(cluster) = self.clusters.get_mut(&name) else {
                self.turns.pop_front();
                continue;
            };
            if cluster.held || cluster.paused || cluster.ready == 0 {
                cluster.in_turns = false;
                cluster.turn_left = 0;
                self.turns.pop_front();
                continue;
            }
            let cap = if cluster.unanswered.is_empty() {
                cap
            } else {
                cap.min(unanswering_cap)
            };
            if cluster.running >= cap {
                // Keeps its place in line for when a run ends.
                self.turns.rotate_left(1);
                continue;
            }
            if let Some((rate, burst)) = rate_limit
                && !cluster.has_token
            {
                let bucket = cluster
                    .bucket
                    .get_or_insert_with(|| Tokens::full(rate, burst));
                match bucket.try_take(now) {
                    // Held for this cluster's next key.
                    Ok(()) => cluster.has_token = true,
                    Err(at) => {
                        cluster.in_turns = false;
                        cluster.turn_left = 0;
                        cluster.throttled = true;
                        self.turns.pop_front();
                        throttled.insert_at(name, at);
                        continue;
                    }
                }
            }
            return true;
        }
        false
    }

    /// `name`'s tokens are due again: it takes its turn.
    pub(super) fn unthrottle(&mut self, name: &ClusterName) {
        if let Some(cluster) = self.clusters.get_mut(name) {
            cluster.throttled = false;
            self.take_turn(name);
        }
    }

    /// Takes the next key of the cluster at the front of the round-robin,
    /// and marks it running in `keys`; a turn is at most `turns` keys
    /// (`None`: one key per turn). Call only when admission said yes.
    pub(super) fn pop_front(
        &mut self,
        keys: &mut Keys,
        turns: Option<usize>,
    ) -> Option<(McRequest, ReconcileReason)> {
        let name = self.turns.pop_front()?;
        let cluster = self.clusters.get_mut(&name)?;
        // The token taken when the key was admitted is used now.
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
            // An entry is stale unless it bears the key's ticket.
            if let Some(KeyState {
                phase: Phase::Ready {
                    ticket: t, since, ..
                },
                ..
            }) = keys.get(&key)
                && *t == ticket
            {
                if let (Some(metrics), Some(started)) = (&self.metrics, started) {
                    cluster.started(metrics, &name, *since, started);
                }
                cluster.changed_last = lane == Lane::Changed;
                cluster.since_echo = match lane {
                    Lane::Echoed => 0,
                    _ => cluster.since_echo.saturating_add(1),
                };
                break key;
            }
        };
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
        self.ready -= 1;
        self.running += 1;
        let running = Phase::Running {
            rerun: None,
            purged: false,
            recoveries: cluster.recoveries,
            started,
        };
        keys.set(&key, running);
        let reason = keys
            .get(&key)
            .map_or(ReconcileReason::Unknown, |state| state.reason.clone());
        self.refresh(&name);
        Some((key, reason))
    }

    /// A run of `key` ended, its next run scheduled already: one fewer
    /// running. Unless the key was `purged`, it is counted in its cluster's
    /// figures (`retried` if it failed and goes again); a run that failed
    /// for want of an answer (`unanswered`) gives its cluster's turn up
    /// unless the cluster answered again since it started (`recovered`);
    /// and the cluster may take its turn again.
    pub(super) fn run_ended(
        &mut self,
        (key, purged): (&McRequest, bool),
        started: Option<Instant>,
        (retried, unanswered, recovered): (bool, bool, bool),
        now: Instant,
    ) {
        self.running -= 1;
        let Some(cluster) = self.clusters.get_mut(&key.cluster).filter(|_| !purged) else {
            return;
        };
        if let (Some(metrics), Some(started)) = (&self.metrics, started) {
            cluster.finished(metrics, &key.cluster, started, now, retried);
        }
        if unanswered {
            // A cluster that does not answer gives its turn up (not for
            // a run that waited through an outage that is over).
            if cluster.turn_left > 0 && !recovered {
                cluster.turn_left = 0;
                if self.turns.front() == Some(&key.cluster) {
                    self.turns.rotate_left(1);
                }
            }
            cluster.unanswered.insert(key.clone());
        } else if !cluster.unanswered.is_empty() {
            cluster.unanswered.remove(key);
        }
        cluster.running -= 1;
        self.take_turn(&key.cluster);
    }

    /// Forgets `name`'s part: its lanes, its figures and its place in line.
    pub(super) fn purge(&mut self, name: &ClusterName) {
        if let Some(metrics) = &self.metrics {
            metrics.forget(name);
        }
        if let Some(entry) = self.clusters.remove(name) {
            self.ready -= entry.ready;
            if entry.busy {
                self.busy -= 1;
            }
            if entry.held {
                self.held -= 1;
            }
        }
        self.turns.retain(|c| c != name);
        // A throttle timer of the purged cluster finds no entry and is ignored.
    }

    #[cfg(test)]
    pub(super) fn is_empty(&self) -> bool {
        self.clusters.is_empty()
    }

    #[cfg(test)]
    pub(super) fn knows(&self, name: &str) -> bool {
        self.clusters.contains_key(name)
    }

    #[cfg(test)]
    pub(super) fn known(&self) -> Vec<&ClusterName> {
        self.clusters.keys().collect()
    }

    #[cfg(test)]
    pub(super) fn counts(&self) -> (usize, usize) {
        (self.running, self.busy)
    }
}
