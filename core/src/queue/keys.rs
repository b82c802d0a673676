//! Each key's state: waiting (ready or delayed), running, or only
//! remembering its failures; and what a run's outcome schedules next.

use std::time::Duration;

use tokio::time::Instant;
use tokio_util::time::delay_queue;

use super::{Lane, Queue};
use crate::{action::Action, reason::ReconcileReason, request::McRequest};

/// Requeue delays are clamped to this: tokio's timer wheel panics for delays
/// beyond about two years.
pub(super) const MAX_DELAY: Duration = Duration::from_secs(365 * 24 * 60 * 60);

#[derive(Debug)]
pub(super) enum Phase {
    /// Waits in its cluster's lane, in the entry marked with this ticket;
    /// since when, if the queue's metrics are counted.
    Ready {
        ticket: u64,
        lane: Lane,
        since: Option<Instant>,
    },
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
        /// When it started, if the queue's metrics are counted.
        started: Option<Instant>,
    },
    /// Nothing scheduled; kept only to remember failures for the backoff.
    Idle,
}

#[derive(Debug)]
pub(super) struct KeyState {
    pub(super) phase: Phase,
    pub(super) failures: u32,
    /// A hash of the error its last run failed with (0 for none).
    pub(super) last_error: u64,
    /// Why the key's next (or current) run runs.
    pub(super) reason: ReconcileReason,
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

impl Queue {
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
            Phase::Ready {
                lane: current,
                since,
                ..
            } => {
                if lane.outranks(*current) {
                    // Promoted: its entry in the lower lane goes stale.
                    self.next_ticket += 1;
                    let ticket = self.next_ticket;
                    let since = *since;
                    state.phase = Phase::Ready {
                        ticket,
                        lane,
                        since,
                    };
                    state.reason = reason;
                    let cluster = self.clusters.entry(key.cluster.clone()).or_default();
                    cluster.lane_mut(lane).push_back((ticket, key.clone()));
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

    pub(super) fn ticket(&mut self) -> u64 {
        self.next_ticket += 1;
        self.next_ticket
    }

    /// Puts a key whose state exists into a lane or the delay queue.
    pub(super) fn enqueue(&mut self, key: McRequest, at: Instant, lane: Lane) {
        let phase = if at <= Instant::now() {
            Phase::Ready {
                ticket: self.make_ready(key.clone(), lane),
                lane,
                since: self.metrics.as_ref().map(|_| Instant::now()),
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
            started,
        } = &mut state.phase
        else {
            return;
        };
        let (rerun, purged, started_at, started) = (rerun.take(), *purged, *recoveries, *started);
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
                    (at, Lane::Changed, ReconcileReason::ReconcilerRequestedRetry)
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
                Some((
                    at,
                    Lane::Changed,
                    ReconcileReason::ErrorPolicyRequestedRetry,
                ))
            }
        };
        if !purged
            && let Some(cluster) = self.clusters.get_mut(&key.cluster)
            && let (Some(metrics), Some(started)) = (&self.metrics, started)
        {
            let retried = matches!(outcome, Outcome::Failure(_) | Outcome::Unanswered);
            cluster.finished(metrics, &key.cluster, started, now, retried);
        }
        if !purged && let Some(cluster) = self.clusters.get_mut(&key.cluster) {
            if outcome == Outcome::Unanswered {
                // A cluster that does not answer gives its turn up (not for
                // a run that waited through an outage that is over).
                if cluster.turn_left > 0 && cluster.recoveries == started_at {
                    cluster.turn_left = 0;
                    if self.turns.front() == Some(&key.cluster) {
                        self.turns.rotate_left(1);
                    }
                }
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
                self.shrink_keys();
            }
        }
        if !purged && let Some(cluster) = self.clusters.get_mut(&key.cluster) {
            cluster.running -= 1;
            self.take_turn(&key.cluster);
            self.refresh(&key.cluster);
        }
    }
}

impl Queue {
    /// Gives a drained backlog's memory back: a map of keys sized for a
    /// start-up of thousands would otherwise keep that size for the
    /// controller's life.
    pub(super) fn shrink_keys(&mut self) {
        let capacity = self.keys.capacity();
        if capacity > 1024 && self.keys.len() * 8 < capacity {
            self.keys.shrink_to(self.keys.len() * 2);
        }
    }
}
