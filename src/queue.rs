//! The controller's queue of [`McRequest`]s.
//!
//! One queue per controller. It keeps, per key, whether the key waits (ready
//! or delayed), runs, or only remembers its failures; and per cluster, two
//! lanes of ready keys and what the cluster may run now. A key leaves the
//! queue only when its cluster may run one more reconcile: the controller
//! serves the cluster (its watches there have synced), the controller and
//! the cluster are under their concurrency limits, and the token buckets
//! have a token. Keys that may not run yet stay queued: deduplicated,
//! counted and in order.
//!
//! Clusters take turns round-robin. Within a cluster, keys from changes seen
//! while the watches ran (the `Changed` lane) alternate with keys from lists
//! (the `Listed` lane: the start-up backlog), so a fresh edit waits behind
//! at most one backlog key, and the backlog still gets every other turn.

use std::{
    collections::{HashMap, HashSet, VecDeque},
    pin::Pin,
    task::{Context, Poll},
    time::Duration,
};

use tokio::time::{Instant, Sleep};
use tokio_util::time::{DelayQueue, delay_queue};

use crate::{
    action::Action,
    backoff::{Backoff, Jitter},
    cluster_name::ClusterName,
    reason::ReconcileReason,
    request::McRequest,
    token_bucket::{TokenBucket, Tokens},
};

/// Requeue delays are clamped to this: tokio's timer wheel panics for delays
/// beyond about two years.
const MAX_DELAY: Duration = Duration::from_secs(365 * 24 * 60 * 60);

/// Which lane of its cluster a ready key waits in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lane {
    /// A change seen while the watch ran, a due requeue or retry, or a
    /// request from outside.
    Changed,
    /// An object listed when a watch (re)started.
    Listed,
}

impl Lane {
    fn max(self, other: Lane) -> Lane {
        if self == Lane::Changed || other == Lane::Changed {
            Lane::Changed
        } else {
            Lane::Listed
        }
    }
}

#[derive(Debug)]
enum Phase {
    /// Waits in its cluster's lane, in the entry marked with this ticket.
    Ready { ticket: u64, lane: Lane },
    /// Waits in the delay queue until `at`.
    Delayed { at: Instant, slot: delay_queue::Key },
    /// A reconcile runs; if `rerun` is set, the key was scheduled again
    /// meanwhile and runs once more afterwards, no sooner than that. A purged
    /// key stays here until its cancelled run has ended, so that it never
    /// runs twice at once; its outcome then counts for nothing.
    Running {
        rerun: Option<(Instant, Lane, ReconcileReason)>,
        purged: bool,
        /// How many times its cluster had answered again when it started.
        recoveries: u64,
    },
    /// Nothing scheduled; kept only to remember failures for the backoff.
    Idle,
}

#[derive(Debug)]
struct KeyState {
    phase: Phase,
    failures: u32,
    /// A hash of the error its last run failed with (0 for none).
    last_error: u64,
    /// Why the key's next (or current) run runs.
    reason: ReconcileReason,
}

/// The outcome of one reconcile, as the queue sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Success(Action),
    /// The run failed: run it again after the key's backoff, or after the
    /// given delay.
    Failure(Option<Duration>),
    /// The run failed because its cluster gave no answer: run it again
    /// after the key's backoff, or as soon as the cluster answers again
    /// ([`answering`](Queue::answering)).
    Unanswered,
    /// The run did not start, or was cut short, because its cluster left or
    /// was replaced: run it again at once, unless its cluster was purged.
    Interrupted,
}

/// The limits the queue admits keys under.
#[derive(Debug, Clone, Default)]
pub(crate) struct Limits {
    /// Reconciles at once in all clusters; `None` for no limit.
    pub(crate) concurrency: Option<usize>,
    /// Reconciles at once in one cluster; `None` for the fair share.
    pub(crate) cluster_concurrency: Option<usize>,
    /// Reconciles at once in one cluster when neither limit above is set;
    /// `None` for no limit.
    pub(crate) default_cluster_concurrency: Option<usize>,
    /// One bucket for all clusters (and every controller it is given to).
    pub(crate) rate_limit: Option<TokenBucket>,
    /// A bucket of this rate and burst for each cluster.
    pub(crate) cluster_rate_limit: Option<(f64, u32)>,
}

/// One cluster's part of the queue.
#[derive(Debug, Default)]
struct ClusterQueue {
    changed: VecDeque<(u64, McRequest)>,
    listed: VecDeque<(u64, McRequest)>,
    /// Ready keys (the lanes may also hold stale entries of promoted keys).
    ready: usize,
    delayed: usize,
    running: usize,
    /// The last key came from the `Changed` lane: the backlog goes next.
    changed_last: bool,
    /// The controller serves this cluster: keep its entry while idle.
    served: bool,
    /// The controller's watches here have not synced: no key may run.
    held: bool,
    /// In the round-robin of clusters with ready keys.
    in_turns: bool,
    /// Waits for its bucket's next token.
    throttled: bool,
    /// Counted among the clusters with work.
    busy: bool,
    bucket: Option<Tokens>,
    /// A token of `bucket` is taken for the next key.
    has_token: bool,
    /// Keys whose last run failed for want of an answer from the cluster
    /// (some may have run since: only those still delayed count).
    unanswered: HashSet<McRequest>,
    /// How many times the cluster answered again after it did not.
    recoveries: u64,
}

impl ClusterQueue {
    fn is_busy(&self) -> bool {
        self.running > 0 || (self.ready > 0 && !self.held)
    }

    /// Nothing to keep: not served, no keys, and no bucket whose state a
    /// new entry would forget (entries exist only for engaged clusters, and
    /// go when they leave).
    fn is_empty(&self) -> bool {
        !self.served
            && self.bucket.is_none()
            && self.ready == 0
            && self.delayed == 0
            && self.running == 0
    }
}

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
        }
    }

    /// Schedules `key` to run now, in `lane`, for `reason`.
    pub(crate) fn push(&mut self, key: McRequest, lane: Lane, reason: ReconcileReason) {
        self.schedule(key, Instant::now(), lane, reason);
    }

    /// Schedules `key` to run at `at`, or earlier if it already was.
    ///
    /// A key already waiting keeps the earlier of its two times (and moves
    /// to the `Changed` lane if that is where it is pushed now); a running
    /// key runs once more after the current run ends. The reason that comes
    /// first stays, unless the new one runs the key sooner.
    pub(crate) fn schedule(
        &mut self,
        key: McRequest,
        at: Instant,
        lane: Lane,
        reason: ReconcileReason,
    ) {
        let at = at.min(Instant::now() + MAX_DELAY);
        let Some(state) = self.keys.get_mut(&key) else {
            self.keys.insert(
                key.clone(),
                KeyState {
                    phase: Phase::Idle,
                    failures: 0,
                    last_error: 0,
                    reason,
                },
            );
            self.enqueue(key, at, lane);
            return;
        };
        let enqueue = match &mut state.phase {
            Phase::Ready { lane: current, .. } => {
                if lane == Lane::Changed && *current == Lane::Listed {
                    // Promoted: its entry in the `Listed` lane goes stale.
                    self.next_ticket += 1;
                    let ticket = self.next_ticket;
                    state.phase = Phase::Ready { ticket, lane };
                    state.reason = reason;
                    let cluster = self.clusters.entry(key.cluster.clone()).or_default();
                    cluster.changed.push_back((ticket, key.clone()));
                }
                false
            }
            Phase::Running { rerun, .. } => {
                *rerun = Some(match rerun.take() {
                    Some((t, l, first)) => (t.min(at), l.max(lane), first),
                    None => (at, lane, reason),
                });
                false
            }
            Phase::Delayed { at: current, slot } => {
                let sooner = at < *current;
                if sooner {
                    self.delayed.remove(slot);
                    state.reason = reason;
                }
                sooner
            }
            Phase::Idle => {
                state.reason = reason;
                true
            }
        };
        if enqueue {
            if let Some(state) = self.keys.get(&key)
                && matches!(state.phase, Phase::Delayed { .. })
            {
                self.cluster_mut(&key.cluster).delayed -= 1;
            }
            self.enqueue(key, at, lane);
        }
    }

    fn ticket(&mut self) -> u64 {
        self.next_ticket += 1;
        self.next_ticket
    }

    fn cluster_mut(&mut self, name: &ClusterName) -> &mut ClusterQueue {
        self.clusters.entry(name.clone()).or_default()
    }

    /// Puts a key whose state exists into a lane or the delay queue.
    fn enqueue(&mut self, key: McRequest, at: Instant, lane: Lane) {
        let phase = if at <= Instant::now() {
            Phase::Ready {
                ticket: self.make_ready(key.clone(), lane),
                lane,
            }
        } else {
            self.cluster_mut(&key.cluster).delayed += 1;
            let slot = self.delayed.insert_at(key.clone(), at);
            Phase::Delayed { at, slot }
        };
        if let Some(state) = self.keys.get_mut(&key) {
            state.phase = phase;
        }
    }

    fn make_ready(&mut self, key: McRequest, lane: Lane) -> u64 {
        let ticket = self.ticket();
        let name = key.cluster.clone();
        let cluster = self.clusters.entry(name.clone()).or_default();
        match lane {
            Lane::Changed => cluster.changed.push_back((ticket, key)),
            Lane::Listed => cluster.listed.push_back((ticket, key)),
        }
        cluster.ready += 1;
        self.ready_len += 1;
        self.take_turn(&name);
        self.refresh(&name);
        ticket
    }

    /// Puts `name` in the round-robin if it has ready keys and is neither
    /// held nor throttled (and is not in it already).
    fn take_turn(&mut self, name: &ClusterName) {
        if let Some(cluster) = self.clusters.get_mut(name)
            && cluster.ready > 0
            && !cluster.held
            && !cluster.throttled
            && !cluster.in_turns
        {
            cluster.in_turns = true;
            self.turns.push_back(name.clone());
        }
    }

    /// Recounts whether `name` has work, and forgets its entry once it has
    /// nothing left.
    fn refresh(&mut self, name: &ClusterName) {
        let Some(cluster) = self.clusters.get_mut(name) else {
            return;
        };
        let busy = cluster.is_busy();
        if busy != cluster.busy {
            cluster.busy = busy;
            if busy {
                self.busy_clusters += 1;
            } else {
                self.busy_clusters -= 1;
            }
        }
        if cluster.is_empty() && !cluster.in_turns && !cluster.throttled {
            self.clusters.remove(name);
        }
    }

    /// How many reconciles one cluster may run at once now.
    ///
    /// Unless set explicitly, with a controller-wide limit `G` and `k`
    /// clusters that have work (keys running, or ready and not held), each
    /// cluster may run `max(1, ⌈G / max(k, m)⌉)`, where `m` is 2 when the
    /// queue knows more than one cluster that is not held and 1 otherwise:
    /// a lone cluster uses every slot, and no cluster takes more than half
    /// of them once there are others, or more than its fair share when
    /// several have work. (Slots are counted when keys are admitted; runs
    /// already going are not taken back.)
    fn cluster_cap(&self) -> usize {
        if let Some(cap) = self.limits.cluster_concurrency {
            return cap.max(1);
        }
        let Some(global) = self.limits.concurrency else {
            return self
                .limits
                .default_cluster_concurrency
                .unwrap_or(usize::MAX);
        };
        let floor = if self.clusters.len() - self.held_clusters > 1 {
            2
        } else {
            1
        };
        global.div_ceil(self.busy_clusters.max(floor)).max(1)
    }

    /// Whether a key may be popped now. Moves keys whose delay has passed
    /// into their lanes, brings clusters whose tokens are due back into the
    /// round-robin, and registers `cx` to be woken for the next timer.
    /// Afterwards the cluster at the front of the round-robin is the one
    /// [`pop_ready`](Self::pop_ready) serves.
    pub(crate) fn poll_has_ready(&mut self, cx: &mut Context<'_>) -> bool {
        while let Poll::Ready(Some(expired)) = self.delayed.poll_expired(cx) {
            let key = expired.into_inner();
            if self.keys.contains_key(&key) {
                self.cluster_mut(&key.cluster).delayed -= 1;
                let ticket = self.make_ready(key.clone(), Lane::Changed);
                if let Some(state) = self.keys.get_mut(&key) {
                    state.phase = Phase::Ready {
                        ticket,
                        lane: Lane::Changed,
                    };
                }
            }
        }
        while let Poll::Ready(Some(expired)) = self.throttled.poll_expired(cx) {
            let name = expired.into_inner();
            if let Some(cluster) = self.clusters.get_mut(&name) {
                cluster.throttled = false;
                self.take_turn(&name);
                self.refresh(&name);
            }
        }
        if self
            .limits
            .concurrency
            .is_some_and(|limit| self.running_len >= limit)
        {
            return false; // A finishing reconcile wakes the controller.
        }
        if let Some(wait) = &mut self.shared_wait {
            if wait.as_mut().poll(cx).is_pending() {
                return false;
            }
            self.shared_wait = None;
        }
        if self.turns.is_empty() {
            return false;
        }
        let now = Instant::now();
        if let Some(bucket) = &self.limits.rate_limit
            && !self.shared_token
        {
            match bucket.try_take(now) {
                // Held for the next key, whichever cluster it comes from.
                Ok(()) => self.shared_token = true,
                Err(at) => {
                    let mut wait = Box::pin(tokio::time::sleep_until(at));
                    let _ = wait.as_mut().poll(cx);
                    self.shared_wait = Some(wait);
                    return false;
                }
            }
        }
        self.front_admissible(now)
    }

    /// Rotates the round-robin until its front cluster may run a key, taking
    /// out clusters that are held or out of tokens and skipping those at
    /// their concurrency cap. Each cluster is looked at once at most.
    fn front_admissible(&mut self, now: Instant) -> bool {
        let cap = self.cluster_cap();
        for _ in 0..self.turns.len() {
            let Some(name) = self.turns.front().cloned() else {
                return false;
            };
            let Some(cluster) = self.clusters.get_mut(&name) else {
                self.turns.pop_front();
                continue;
            };
            if cluster.held || cluster.ready == 0 {
                cluster.in_turns = false;
                self.turns.pop_front();
                continue;
            }
            if cluster.running >= cap {
                // Keeps its place in line for when a run ends.
                self.turns.rotate_left(1);
                continue;
            }
            if let Some((rate, burst)) = self.limits.cluster_rate_limit
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
                        cluster.throttled = true;
                        self.turns.pop_front();
                        self.throttled.insert_at(name, at);
                        continue;
                    }
                }
            }
            return true;
        }
        false
    }

    /// Takes the next key of the cluster at the front of the round-robin
    /// and marks it running. Call [`poll_has_ready`](Self::poll_has_ready)
    /// first, and only when it said yes.
    pub(crate) fn pop_ready(&mut self) -> Option<(McRequest, ReconcileReason)> {
        let name = self.turns.pop_front()?;
        // The tokens taken when the key was admitted are used now.
        self.shared_token = false;
        let cluster = self.clusters.get_mut(&name)?;
        cluster.has_token = false;
        let key = loop {
            let lane = if cluster.changed_last && !cluster.listed.is_empty() {
                Lane::Listed
            } else if !cluster.changed.is_empty() {
                Lane::Changed
            } else {
                Lane::Listed
            };
            let list = match lane {
                Lane::Changed => &mut cluster.changed,
                Lane::Listed => &mut cluster.listed,
            };
            let (ticket, key) = list.pop_front()?;
            if list.is_empty() && list.capacity() > 1024 {
                // A drained backlog gives its memory back.
                *list = VecDeque::new();
            }
            let live = matches!(
                self.keys.get(&key),
                Some(KeyState { phase: Phase::Ready { ticket: t, .. }, .. }) if *t == ticket
            );
            if live {
                cluster.changed_last = lane == Lane::Changed;
                break key;
            }
        };
        cluster.ready -= 1;
        cluster.running += 1;
        if cluster.ready > 0 {
            self.turns.push_back(name.clone());
        } else {
            cluster.in_turns = false;
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
                };
                state.reason.clone()
            }
            None => ReconcileReason::Unknown,
        };
        self.refresh(&name);
        Some((key, reason))
    }

    /// Records how a run of `key` ended and schedules its next run: after its
    /// backoff on failure, when the [`Action`] asks on success, and in any
    /// case no later than a change that arrived while it ran.
    pub(crate) fn complete(&mut self, key: &McRequest, outcome: Outcome) {
        let Some(state) = self.keys.get_mut(key) else {
            return;
        };
        let Phase::Running {
            rerun,
            purged,
            recoveries,
        } = &mut state.phase
        else {
            return;
        };
        let (rerun, purged, started_at) = (rerun.take(), *purged, *recoveries);
        self.running_len -= 1;
        let now = Instant::now();
        let next = match outcome {
            _ if purged => None,
            Outcome::Interrupted => Some((now, Lane::Changed, ReconcileReason::ClusterReplaced)),
            Outcome::Success(action) => {
                state.failures = 0;
                state.last_error = 0;
                action.requeue_after().map(|d| {
                    let at = now + d.min(MAX_DELAY);
                    (at, Lane::Changed, ReconcileReason::Requeued)
                })
            }
            Outcome::Failure(_) | Outcome::Unanswered => {
                state.failures = state.failures.saturating_add(1);
                let delay = match outcome {
                    Outcome::Failure(Some(after)) => after,
                    // The cluster answered again while the run waited for
                    // it: the run failed of an outage that is over, and
                    // goes again at once.
                    Outcome::Unanswered
                        if self
                            .clusters
                            .get(&key.cluster)
                            .is_some_and(|cluster| cluster.recoveries != started_at) =>
                    {
                        Duration::ZERO
                    }
                    _ => self.backoff.jittered(state.failures, self.jitter.next()),
                };
                let at = now + delay.min(MAX_DELAY);
                Some((at, Lane::Changed, ReconcileReason::ErrorRetry))
            }
        };
        if !purged && let Some(cluster) = self.clusters.get_mut(&key.cluster) {
            if outcome == Outcome::Unanswered {
                cluster.unanswered.insert(key.clone());
            } else if !cluster.unanswered.is_empty() {
                cluster.unanswered.remove(key);
            }
        }
        // The sooner of the two runs, and its reason.
        let next = match (next, rerun) {
            (Some((a, la, ra)), Some((b, lb, rb))) => {
                let reason = if b <= a { rb } else { ra };
                Some((a.min(b), la.max(lb), reason))
            }
            (a, b) => a.or(b),
        };
        match next {
            Some((at, lane, reason)) => {
                state.phase = Phase::Idle;
                state.reason = reason;
                self.enqueue(key.clone(), at, lane);
            }
            None => {
                self.keys.remove(key);
            }
        }
        if !purged && let Some(cluster) = self.clusters.get_mut(&key.cluster) {
            cluster.running -= 1;
            self.take_turn(&key.cluster);
            self.refresh(&key.cluster);
        }
    }

    /// The cluster answers again: its keys that wait out their backoff
    /// because it gave no answer run now, each when the queue admits it
    /// (its limits and fair share hold as for any other key). Says how
    /// many.
    pub(crate) fn answering(&mut self, cluster: &ClusterName) -> usize {
        let Some(keys) = self.clusters.get_mut(cluster).map(|entry| {
            entry.recoveries += 1;
            std::mem::take(&mut entry.unanswered)
        }) else {
            return 0;
        };
        let now = Instant::now();
        let mut woken = 0;
        for key in keys {
            let Some(KeyState {
                phase: Phase::Delayed { slot, .. },
                ..
            }) = self.keys.get(&key)
            else {
                // Running, or ready already: nothing to hurry.
                continue;
            };
            let slot = *slot;
            self.delayed.remove(&slot);
            self.cluster_mut(cluster).delayed -= 1;
            self.enqueue(key, now, Lane::Changed);
            woken += 1;
        }
        woken
    }

    /// Holds `cluster`'s keys until [`release`](Self::release): the
    /// controller serves it but its watches there have not synced.
    pub(crate) fn hold(&mut self, cluster: &ClusterName) {
        let entry = self.clusters.entry(cluster.clone()).or_default();
        entry.served = true;
        if !entry.held {
            entry.held = true;
            self.held_clusters += 1;
        }
        self.refresh(cluster);
    }

    /// Lets `cluster`'s keys run.
    pub(crate) fn release(&mut self, cluster: &ClusterName) {
        let entry = self.clusters.entry(cluster.clone()).or_default();
        if entry.held {
            entry.held = false;
            self.held_clusters -= 1;
        }
        self.take_turn(cluster);
        self.refresh(cluster);
    }

    /// Lets `cluster`'s keys run and stops keeping its entry for it: the
    /// controller does not serve the cluster (it only receives requests for
    /// it).
    pub(crate) fn unserve(&mut self, cluster: &ClusterName) {
        self.release(cluster);
        if let Some(entry) = self.clusters.get_mut(cluster) {
            entry.served = false;
        }
        self.refresh(cluster);
    }

    /// Forgets every key of `cluster`, its failures, its limits' state and
    /// its entry. A key whose run is still going stays marked running until
    /// that run ends (its outcome then counts for nothing), so it cannot
    /// start a second time meanwhile; if it is scheduled again before then,
    /// it runs once the old run has ended.
    pub(crate) fn purge(&mut self, cluster: &ClusterName) {
        let delayed = &mut self.delayed;
        self.keys.retain(|key, state| {
            if key.cluster != *cluster {
                return true;
            }
            match &mut state.phase {
                Phase::Delayed { slot, .. } => {
                    delayed.remove(slot);
                    false
                }
                Phase::Running { rerun, purged, .. } => {
                    *rerun = None;
                    *purged = true;
                    state.failures = 0;
                    true
                }
                Phase::Ready { .. } | Phase::Idle => false,
            }
        });
        if let Some(entry) = self.clusters.remove(cluster) {
            self.ready_len -= entry.ready;
            if entry.busy {
                self.busy_clusters -= 1;
            }
            if entry.held {
                self.held_clusters -= 1;
            }
        }
        self.turns.retain(|c| c != cluster);
        // A throttle timer of the purged cluster finds no entry and is ignored.
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

#[cfg(test)]
mod tests {
    use std::{future::poll_fn, task::Poll};

    use super::*;

    fn key(cluster: &str, name: &str) -> McRequest {
        McRequest::new(cluster, Some("default"), name)
    }

    /// A queue with these limits and a backoff without jitter.
    fn queue_with(limits: Limits) -> Queue {
        let backoff = Backoff {
            jitter: 0.0,
            ..Backoff::default()
        };
        Queue::new(backoff, limits)
    }

    fn queue() -> Queue {
        queue_with(Limits::default())
    }

    /// The next key to run, waiting (in paused time) as long as it takes.
    async fn next(queue: &mut Queue) -> McRequest {
        poll_fn(|cx| {
            if queue.poll_has_ready(cx) {
                Poll::Ready(queue.pop_ready().expect("a ready key").0)
            } else {
                Poll::Pending
            }
        })
        .await
    }

    /// The key ready right now, if any.
    fn ready_now(queue: &mut Queue) -> Option<McRequest> {
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        if queue.poll_has_ready(&mut cx) {
            queue.pop_ready().map(|(key, _)| key)
        } else {
            None
        }
    }

    /// Every key ready right now, each completed at once with success.
    fn run_all_now(queue: &mut Queue) -> Vec<McRequest> {
        let mut ran = Vec::new();
        while let Some(k) = ready_now(queue) {
            queue.complete(&k, success());
            ran.push(k);
        }
        ran
    }

    /// Every key ready right now, left running.
    fn start_all_now(queue: &mut Queue) -> Vec<McRequest> {
        std::iter::from_fn(|| ready_now(queue)).collect()
    }

    fn success() -> Outcome {
        Outcome::Success(Action::await_change())
    }

    fn push(queue: &mut Queue, k: McRequest) {
        queue.push(k, Lane::Changed, ReconcileReason::Unknown);
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_already_queued_is_queued_once() {
        let mut queue = queue();
        push(&mut queue, key("a", "x"));
        push(&mut queue, key("a", "x"));
        queue.push(key("a", "x"), Lane::Listed, ReconcileReason::Unknown);
        queue.schedule(
            key("a", "x"),
            Instant::now() + Duration::from_secs(5),
            Lane::Changed,
            ReconcileReason::Unknown,
        );
        assert_eq!(queue.waiting(), 1);
        assert_eq!(ready_now(&mut queue), Some(key("a", "x")));
        assert_eq!(ready_now(&mut queue), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_running_key_is_not_handed_out_again_but_reruns_once_after() {
        let mut queue = queue();
        push(&mut queue, key("a", "x"));
        let running = ready_now(&mut queue).unwrap();
        // Changes arrive while it runs: not handed out in parallel.
        push(&mut queue, key("a", "x"));
        push(&mut queue, key("a", "x"));
        assert_eq!(ready_now(&mut queue), None);
        queue.complete(&running, success());
        // Exactly one more run.
        assert_eq!(ready_now(&mut queue), Some(key("a", "x")));
        queue.complete(&key("a", "x"), success());
        assert_eq!(ready_now(&mut queue), None);
        assert_eq!(queue.waiting(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn requeue_after_runs_the_key_again_after_the_delay() {
        let mut queue = queue();
        push(&mut queue, key("a", "x"));
        let k = ready_now(&mut queue).unwrap();
        let done = Instant::now();
        queue.complete(
            &k,
            Outcome::Success(Action::requeue(Duration::from_secs(30))),
        );
        assert_eq!(ready_now(&mut queue), None);
        assert_eq!(next(&mut queue).await, k);
        assert_eq!(done.elapsed(), Duration::from_secs(30));
    }

    #[tokio::test(start_paused = true)]
    async fn a_change_runs_a_delayed_key_sooner() {
        let mut queue = queue();
        queue.schedule(
            key("a", "x"),
            Instant::now() + Duration::from_secs(60),
            Lane::Changed,
            ReconcileReason::Unknown,
        );
        assert_eq!(ready_now(&mut queue), None);
        push(&mut queue, key("a", "x"));
        assert_eq!(ready_now(&mut queue), Some(key("a", "x")));
        queue.complete(&key("a", "x"), success());
        // The old delay is gone with it.
        tokio::time::advance(Duration::from_secs(61)).await;
        assert_eq!(ready_now(&mut queue), None);
        assert!(queue.clusters.is_empty(), "nothing left of cluster a");
    }

    /// The next key and its reason, right now.
    fn reason_now(queue: &mut Queue) -> Option<(McRequest, ReconcileReason)> {
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        queue
            .poll_has_ready(&mut cx)
            .then(|| queue.pop_ready())
            .flatten()
    }

    #[tokio::test(start_paused = true)]
    async fn each_run_carries_the_first_reason_or_the_one_that_made_it_sooner() {
        use ReconcileReason::*;
        let mut queue = queue();
        let x = key("a", "x");
        // Merged while waiting: the first reason stays.
        queue.push(x.clone(), Lane::Listed, Listed);
        queue.push(x.clone(), Lane::Listed, External);
        assert_eq!(reason_now(&mut queue), Some((x.clone(), Listed)));
        // A requeue asked for; then a change runs it sooner, as a change.
        queue.complete(
            &x,
            Outcome::Success(Action::requeue(Duration::from_secs(60))),
        );
        queue.push(x.clone(), Lane::Changed, ObjectChanged);
        assert_eq!(reason_now(&mut queue), Some((x.clone(), ObjectChanged)));
        queue.complete(
            &x,
            Outcome::Success(Action::requeue(Duration::from_secs(60))),
        );
        tokio::time::advance(Duration::from_secs(61)).await;
        assert_eq!(reason_now(&mut queue), Some((x.clone(), Requeued)));
        // A failure retries as such, unless a change came while it ran.
        queue.complete(&x, Outcome::Failure(None));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(reason_now(&mut queue), Some((x.clone(), ErrorRetry)));
        let related = RelatedChanged {
            kind: "Secret".into(),
        };
        queue.push(x.clone(), Lane::Changed, related.clone());
        queue.complete(&x, Outcome::Failure(None));
        assert_eq!(reason_now(&mut queue), Some((x.clone(), related)));
        queue.complete(&x, Outcome::Interrupted);
        assert_eq!(reason_now(&mut queue), Some((x, ClusterReplaced)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_failing_key_backs_off_exponentially_and_success_resets_it() {
        let mut queue = queue();
        push(&mut queue, key("a", "x"));
        let mut delays = Vec::new();
        let mut k = ready_now(&mut queue).unwrap();
        for _ in 0..5 {
            queue.complete(&k, Outcome::Failure(None));
            let failed = Instant::now();
            k = next(&mut queue).await;
            delays.push(failed.elapsed());
        }
        let ms = Duration::from_millis;
        assert_eq!(delays, [ms(5), ms(10), ms(20), ms(40), ms(80)]);
        assert_eq!(queue.failures(&k), 5);

        queue.complete(&k, success());
        assert_eq!(queue.failures(&k), 0);
        push(&mut queue, k.clone());
        let k = ready_now(&mut queue).unwrap();
        queue.complete(&k, Outcome::Failure(None));
        let failed = Instant::now();
        next(&mut queue).await;
        assert_eq!(
            failed.elapsed(),
            ms(5),
            "backoff starts over after a success"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn keys_failing_together_retry_spread_out_by_jitter() {
        let backoff = Backoff {
            base: Duration::from_millis(100),
            ..Backoff::default()
        };
        let mut queue = Queue::new(backoff, Limits::default());
        for i in 0..100 {
            push(&mut queue, key("a", &i.to_string()));
        }
        for k in start_all_now(&mut queue) {
            queue.complete(&k, Outcome::Failure(None));
        }
        let failed = Instant::now();
        let mut retried_at = Vec::new();
        for _ in 0..100 {
            let k = next(&mut queue).await;
            retried_at.push(failed.elapsed());
            queue.complete(&k, success());
        }
        // 10% jitter on 100 ms; the timer counts whole milliseconds.
        let (first, last) = (retried_at[0], retried_at[99]);
        assert!(first >= Duration::from_millis(100), "{first:?}");
        assert!(last <= Duration::from_millis(111), "{last:?}");
        retried_at.dedup();
        assert!(retried_at.len() >= 5, "not in lockstep: {retried_at:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn backoff_is_per_key() {
        let mut queue = queue();
        push(&mut queue, key("a", "bad"));
        let bad = ready_now(&mut queue).unwrap();
        for _ in 0..10 {
            queue.complete(&bad, Outcome::Failure(None));
            next(&mut queue).await;
        }
        push(&mut queue, key("a", "good"));
        let good = ready_now(&mut queue).unwrap();
        queue.complete(&good, Outcome::Failure(None));
        let failed = Instant::now();
        assert_eq!(next(&mut queue).await, good);
        assert_eq!(failed.elapsed(), Duration::from_millis(5));
        assert_eq!(queue.failures(&bad), 10);
    }

    #[tokio::test(start_paused = true)]
    async fn a_busy_cluster_cannot_starve_another() {
        let mut queue = queue();
        for i in 0..100_000 {
            push(&mut queue, key("busy", &format!("obj-{i}")));
        }
        push(&mut queue, key("quiet", "only"));
        let first_two = [
            ready_now(&mut queue).unwrap(),
            ready_now(&mut queue).unwrap(),
        ];
        assert!(
            first_two.contains(&key("quiet", "only")),
            "the quiet cluster's key runs within one turn: {first_two:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_change_runs_ahead_of_the_listed_backlog_and_the_backlog_still_moves() {
        let mut queue = queue();
        for i in 0..10_000 {
            queue.push(
                key("a", &format!("listed-{i}")),
                Lane::Listed,
                ReconcileReason::Unknown,
            );
        }
        let first = ready_now(&mut queue).unwrap();
        assert_eq!(first.name, "listed-0");
        push(&mut queue, key("a", "edited"));
        queue.complete(&first, success());
        assert_eq!(
            ready_now(&mut queue).unwrap().name,
            "edited",
            "a fresh change waits behind one backlog key at most"
        );
        queue.complete(&key("a", "edited"), success());
        // With changes arriving all the time, the backlog keeps every other turn.
        let mut order = Vec::new();
        for i in 0..10 {
            push(&mut queue, key("a", &format!("change-{i}")));
            let k = ready_now(&mut queue).unwrap();
            order.push(k.name.clone());
            queue.complete(&k, success());
        }
        let listed = order.iter().filter(|n| n.starts_with("listed-")).count();
        assert_eq!(listed, 5, "{order:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_listed_key_that_changes_moves_to_the_front_lane_and_runs_once() {
        let mut queue = queue();
        for i in 0..100 {
            queue.push(
                key("a", &format!("listed-{i}")),
                Lane::Listed,
                ReconcileReason::Unknown,
            );
        }
        let first = ready_now(&mut queue).unwrap();
        queue.complete(&first, success());
        // listed-50 changes while it waits in the backlog.
        push(&mut queue, key("a", "listed-50"));
        assert_eq!(queue.waiting(), 99, "still one key");
        assert_eq!(ready_now(&mut queue).unwrap().name, "listed-50");
        queue.complete(&key("a", "listed-50"), success());
        let rest = run_all_now(&mut queue);
        assert_eq!(rest.len(), 98);
        assert!(!rest.contains(&key("a", "listed-50")), "ran once only");
        assert_eq!(queue.waiting(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn turns_alternate_between_clusters() {
        let mut queue = queue();
        for name in ["1", "2", "3"] {
            push(&mut queue, key("a", name));
            push(&mut queue, key("b", name));
        }
        let clusters: Vec<String> = std::iter::from_fn(|| ready_now(&mut queue))
            .map(|k| k.cluster.to_string())
            .collect();
        assert_eq!(clusters, ["a", "b", "a", "b", "a", "b"]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_held_cluster_keeps_its_keys_queued_and_counted_until_released() {
        let mut queue = queue();
        queue.hold(&"syncing".into());
        push(&mut queue, key("syncing", "x"));
        push(&mut queue, key("ready", "y"));
        assert_eq!(run_all_now(&mut queue), [key("ready", "y")]);
        push(&mut queue, key("syncing", "x"));
        assert_eq!(queue.waiting(), 1, "held keys count and stay deduplicated");
        queue.release(&"syncing".into());
        assert_eq!(run_all_now(&mut queue), [key("syncing", "x")]);
    }

    #[tokio::test(start_paused = true)]
    async fn the_controller_limit_caps_reconciles_in_flight() {
        let mut queue = queue_with(Limits {
            concurrency: Some(2),
            ..Limits::default()
        });
        for i in 0..5 {
            push(&mut queue, key("a", &i.to_string()));
        }
        let running = start_all_now(&mut queue);
        assert_eq!(running.len(), 2);
        queue.complete(&running[0], success());
        assert_eq!(start_all_now(&mut queue).len(), 1);
    }

    /// Fills `clusters` with keys and starts every key the queue admits,
    /// completing none: how many each cluster got.
    fn admitted(queue: &mut Queue, clusters: &[&str]) -> HashMap<String, usize> {
        for cluster in clusters {
            for i in 0..100 {
                push(queue, key(cluster, &i.to_string()));
            }
        }
        let mut counts = HashMap::new();
        for k in start_all_now(queue) {
            *counts.entry(k.cluster.to_string()).or_default() += 1;
        }
        counts
    }

    #[tokio::test(start_paused = true)]
    async fn a_lone_cluster_may_use_every_slot() {
        let mut queue = queue_with(Limits {
            concurrency: Some(16),
            ..Limits::default()
        });
        assert_eq!(admitted(&mut queue, &["only"])["only"], 16);
    }

    #[tokio::test(start_paused = true)]
    async fn one_cluster_never_holds_more_than_half_the_slots_once_there_are_others() {
        let mut queue = queue_with(Limits {
            concurrency: Some(16),
            ..Limits::default()
        });
        queue.hold(&"idle".into());
        queue.release(&"idle".into());
        // Only "hung" has work, and its reconciles never end.
        assert_eq!(admitted(&mut queue, &["hung"])["hung"], 8);
        // The others still find half the slots free.
        let later = admitted(&mut queue, &["b", "c"]);
        assert_eq!(later.values().sum::<usize>(), 8, "{later:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn clusters_with_work_share_the_slots_fairly() {
        let mut queue = queue_with(Limits {
            concurrency: Some(16),
            ..Limits::default()
        });
        let counts = admitted(&mut queue, &["a", "b", "c", "d"]);
        assert!(counts.values().all(|n| *n == 4), "{counts:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn an_explicit_cluster_limit_wins_over_the_fair_share() {
        let mut queue = queue_with(Limits {
            concurrency: Some(16),
            cluster_concurrency: Some(3),
            ..Limits::default()
        });
        let counts = admitted(&mut queue, &["a", "b"]);
        assert_eq!((counts["a"], counts["b"]), (3, 3));
    }

    #[tokio::test(start_paused = true)]
    async fn by_default_each_cluster_has_slots_of_its_own() {
        let mut queue = queue_with(Limits {
            default_cluster_concurrency: Some(4),
            ..Limits::default()
        });
        // The first cluster fills its slots and never finishes them...
        let first = admitted(&mut queue, &["first"]);
        assert_eq!(first["first"], 4);
        // ...and the others that come later still get all of theirs.
        let later = admitted(&mut queue, &["second", "third"]);
        assert_eq!((later["second"], later["third"]), (4, 4), "{later:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_controller_limit_replaces_the_default_cluster_slots_with_the_fair_share() {
        let mut queue = queue_with(Limits {
            concurrency: Some(16),
            default_cluster_concurrency: Some(4),
            ..Limits::default()
        });
        let counts = admitted(&mut queue, &["a", "b"]);
        assert_eq!((counts["a"], counts["b"]), (8, 8));
    }

    #[tokio::test(start_paused = true)]
    async fn a_throttled_cluster_keeps_its_keys_deduplicated_and_holds_no_other_back() {
        let mut queue = queue_with(Limits {
            cluster_rate_limit: Some((1.0, 1)),
            ..Limits::default()
        });
        push(&mut queue, key("slow", "first"));
        push(&mut queue, key("slow", "x"));
        let ran = run_all_now(&mut queue);
        assert_eq!(ran, [key("slow", "first")]);
        // "x" waits for slow's next token; it changes twice meanwhile.
        push(&mut queue, key("slow", "x"));
        push(&mut queue, key("slow", "x"));
        assert_eq!(queue.waiting(), 1, "throttled keys are counted once");
        push(&mut queue, key("other", "z"));
        assert_eq!(run_all_now(&mut queue), [key("other", "z")]);
        let waited = Instant::now();
        assert_eq!(next(&mut queue).await, key("slow", "x"));
        assert_eq!(waited.elapsed(), Duration::from_secs(1));
        queue.complete(&key("slow", "x"), success());
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(run_all_now(&mut queue), [], "x ran once");
    }

    #[tokio::test(start_paused = true)]
    async fn a_cluster_keeps_its_bucket_between_keys_even_when_it_has_none_queued() {
        let mut queue = queue_with(Limits {
            cluster_rate_limit: Some((1.0, 1)),
            ..Limits::default()
        });
        // A cluster the controller does not serve: a mapper's target, say.
        let mut ran = 0;
        for i in 0..10 {
            push(&mut queue, key("member", &i.to_string()));
            ran += run_all_now(&mut queue).len();
        }
        assert_eq!(ran, 1, "one token, one run, however idle in between");
    }

    #[tokio::test(start_paused = true)]
    async fn a_shared_bucket_serves_clusters_in_turn_not_in_arrival_order() {
        let mut queue = queue_with(Limits {
            rate_limit: Some(TokenBucket::new(10.0, 1)),
            ..Limits::default()
        });
        for i in 0..10_000 {
            queue.push(
                key("relisting", &i.to_string()),
                Lane::Listed,
                ReconcileReason::Unknown,
            );
        }
        let first = ready_now(&mut queue).unwrap();
        queue.complete(&first, success());
        push(&mut queue, key("quiet", "edited"));
        let started = Instant::now();
        let mut k = next(&mut queue).await;
        queue.complete(&k, success());
        if k.cluster != "quiet" {
            k = next(&mut queue).await;
        }
        assert_eq!(k, key("quiet", "edited"));
        assert!(started.elapsed() <= Duration::from_millis(200));
    }

    #[tokio::test(start_paused = true)]
    async fn keys_that_failed_for_want_of_an_answer_run_once_their_cluster_answers() {
        let mut queue = queue_with(Limits {
            cluster_concurrency: Some(1),
            ..Limits::default()
        });
        for name in ["down-1", "down-2", "own-error", "requeued"] {
            push(&mut queue, key("east", name));
        }
        push(&mut queue, key("west", "down"));
        // Each fails again and again, so that its backoff grows long; the
        // last time, one succeeds and asks to run in an hour instead.
        for round in 0..12 {
            while let Some(k) = ready_now(&mut queue) {
                let outcome = match k.name.as_str() {
                    "own-error" => Outcome::Failure(None),
                    "requeued" if round == 11 => {
                        Outcome::Success(Action::requeue(Duration::from_secs(3600)))
                    }
                    _ => Outcome::Unanswered,
                };
                queue.complete(&k, outcome);
            }
            tokio::time::advance(Duration::from_secs(30)).await;
        }
        while let Some(k) = ready_now(&mut queue) {
            let own = k.name == "own-error";
            queue.complete(
                &k,
                if own {
                    Outcome::Failure(None)
                } else {
                    Outcome::Unanswered
                },
            );
        }
        assert!(queue.failures(&key("east", "down-1")) >= 12);
        assert_eq!(ready_now(&mut queue), None, "all wait");

        // Only east's keys that failed for want of an answer run now, one
        // at a time as east's limit says.
        assert_eq!(queue.answering(&"east".into()), 2);
        let mut ran = Vec::new();
        while let Some(k) = ready_now(&mut queue) {
            assert_eq!(ready_now(&mut queue), None, "the cluster's limit holds");
            queue.complete(&k, success());
            ran.push(k.name);
        }
        ran.sort();
        assert_eq!(ran, ["down-1", "down-2"]);
        assert_eq!(queue.failures(&key("east", "down-1")), 0);
        // Told again, nothing is left to hurry; west is told of its own.
        assert_eq!(queue.answering(&"east".into()), 0);
        assert_eq!(queue.answering(&"west".into()), 1);
        assert_eq!(ready_now(&mut queue), Some(key("west", "down")));
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_running_when_its_cluster_answers_again_does_not_wait_out_its_backoff() {
        let mut queue = queue();
        push(&mut queue, key("east", "slow"));
        push(&mut queue, key("east", "later"));
        let slow = ready_now(&mut queue).unwrap();
        let later = ready_now(&mut queue).unwrap();
        // The cluster answers again while both wait on a request to it.
        queue.answering(&"east".into());
        queue.complete(&slow, Outcome::Unanswered);
        assert_eq!(
            ready_now(&mut queue),
            Some(slow.clone()),
            "it runs again at once"
        );
        queue.complete(&slow, success());
        assert_eq!(ready_now(&mut queue), None);
        // So does the other; but a run that started after the cluster
        // answered and fails for want of an answer backs off.
        queue.complete(&later, Outcome::Unanswered);
        let retried = ready_now(&mut queue).unwrap();
        assert_eq!(retried, later);
        queue.complete(&retried, Outcome::Unanswered);
        assert_eq!(ready_now(&mut queue), None, "a new failure backs off");
    }

    #[tokio::test(start_paused = true)]
    async fn purging_a_cluster_forgets_its_waiting_running_and_delayed_keys() {
        let mut queue = queue_with(Limits {
            cluster_rate_limit: Some((100.0, 100)),
            ..Limits::default()
        });
        queue.hold(&"gone".into());
        queue.release(&"gone".into());
        push(&mut queue, key("gone", "ready"));
        push(&mut queue, key("gone", "running"));
        queue.schedule(
            key("gone", "later"),
            Instant::now() + Duration::from_secs(10),
            Lane::Changed,
            ReconcileReason::Unknown,
        );
        push(&mut queue, key("stays", "x"));
        // Serve "gone" first, then take its second key too.
        let mut running = None;
        while running.is_none() {
            let k = ready_now(&mut queue).unwrap();
            if k.cluster == "gone" && k.name == "running" {
                running = Some(k);
            } else if k.cluster == "gone" {
                push(&mut queue, k.clone());
                queue.complete(&k, success());
            } else {
                queue.complete(&k, success());
                push(&mut queue, k);
            }
        }
        queue.purge(&"gone".into());
        assert!(
            !queue.clusters.contains_key("gone"),
            "its lanes, counts and bucket are gone"
        );
        // A run that was cancelled or finishes late schedules nothing.
        queue.complete(&running.unwrap(), Outcome::Failure(None));
        tokio::time::advance(Duration::from_secs(20)).await;
        let left = run_all_now(&mut queue);
        assert_eq!(left, [key("stays", "x")]);
        assert_eq!(queue.waiting(), 0);
        assert!(queue.keys.is_empty());
        let kept: Vec<_> = queue.clusters.keys().map(|c| c.as_str()).collect();
        assert_eq!(kept, ["stays"], "only the bucket of the cluster that stays");
        assert_eq!((queue.running_len, queue.busy_clusters), (0, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn huge_requeue_delays_are_clamped_instead_of_panicking() {
        let mut queue = queue();
        push(&mut queue, key("a", "x"));
        let k = ready_now(&mut queue).unwrap();
        queue.complete(
            &k,
            Outcome::Success(Action::requeue(Duration::from_secs(u64::MAX / 4))),
        );
        queue.schedule(
            key("a", "y"),
            Instant::now() + Duration::from_secs(100 * 365 * 86400),
            Lane::Changed,
            ReconcileReason::Unknown,
        );
        assert_eq!(queue.waiting(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_purged_key_still_running_cannot_start_again_until_that_run_ends() {
        let mut queue = queue();
        push(&mut queue, key("gone", "x"));
        let running = ready_now(&mut queue).unwrap();
        queue.purge(&"gone".into());
        // The cluster comes back and the key is pushed while the old run
        // has not yet noticed its cancellation.
        push(&mut queue, key("gone", "x"));
        assert_eq!(ready_now(&mut queue), None);
        queue.complete(&running, Outcome::Interrupted);
        assert_eq!(ready_now(&mut queue), Some(key("gone", "x")));
    }

    #[tokio::test(start_paused = true)]
    async fn an_unbounded_backoff_is_clamped_instead_of_panicking() {
        let mut queue = Queue::new(
            Backoff {
                base: Duration::from_secs(1),
                max: Duration::MAX,
                jitter: 0.5,
            },
            Limits::default(),
        );
        push(&mut queue, key("a", "x"));
        let k = ready_now(&mut queue).unwrap();
        for _ in 0..80 {
            queue.complete(&k, Outcome::Failure(None));
            assert_eq!(queue.waiting(), 1);
            // Run it again at once, as a change would.
            push(&mut queue, k.clone());
            assert_eq!(ready_now(&mut queue), Some(k.clone()));
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_waiting_count_follows_every_change() {
        let mut queue = queue();
        let counted = |queue: &Queue| {
            queue
                .keys
                .values()
                .filter(|s| matches!(s.phase, Phase::Ready { .. } | Phase::Delayed { .. }))
                .count()
        };
        push(&mut queue, key("a", "1"));
        push(&mut queue, key("b", "2"));
        queue.schedule(
            key("a", "3"),
            Instant::now() + Duration::from_secs(5),
            Lane::Changed,
            ReconcileReason::Unknown,
        );
        assert_eq!((queue.waiting(), counted(&queue)), (3, 3));
        push(&mut queue, key("a", "3"));
        assert_eq!((queue.waiting(), counted(&queue)), (3, 3));
        let k = ready_now(&mut queue).unwrap();
        assert_eq!((queue.waiting(), counted(&queue)), (2, 2));
        queue.complete(&k, Outcome::Failure(None));
        assert_eq!((queue.waiting(), counted(&queue)), (3, 3));
        queue.purge(&"a".into());
        assert_eq!((queue.waiting(), counted(&queue)), (1, 1));
        tokio::time::advance(Duration::from_secs(10)).await;
        assert!(ready_now(&mut queue).is_some());
        assert_eq!((queue.waiting(), counted(&queue)), (0, 0));
    }
}
