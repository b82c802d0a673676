//! What crosses the queue's parts: a key scheduled (its state, a lane or a
//! timer), admitted and popped, and its run's outcome turned into its next
//! run; a cluster purged or woken in every part at once.

use std::{
    task::{Context, Poll},
    time::Duration,
};

use tokio::time::Instant;
use tokio_util::time::delay_queue::Key;

use super::{
    Lane, Queue,
    keys::{KeyState, MAX_DELAY, Outcome, Phase},
};
use crate::{cluster_name::ClusterName, reason::ReconcileReason, request::McRequest};

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
            self.keys.insert(key.clone(), reason);
            return self.enqueue(key, at, lane);
        };
        match &mut state.phase {
            Phase::Ready {
                lane: current,
                since,
                ..
            } => {
                if lane.outranks(*current) {
                    // Promoted: its entry in the lower lane goes stale.
                    let since = *since;
                    state.reason = reason;
                    let ticket = self.keys.ticket();
                    self.keys.set(
                        &key,
                        Phase::Ready {
                            ticket,
                            lane,
                            since,
                        },
                    );
                    let cluster = self.lanes.cluster_mut(&key.cluster);
                    cluster.lane_mut(lane).push_back((ticket, key));
                }
            }
            Phase::Running { rerun, .. } => {
                *rerun = Some(match rerun.take() {
                    Some((t, l, first)) => (t.min(at), l.max(lane), first),
                    None => (at, lane, reason),
                });
            }
            Phase::Delayed { at: current, slot } => {
                if at < *current {
                    let slot = *slot;
                    state.reason = reason;
                    self.undelay(key, Some(slot), at, lane);
                }
            }
            Phase::Idle => {
                state.reason = reason;
                self.enqueue(key, at, lane);
            }
        }
    }

    /// Puts a key whose state exists into a lane under a new ticket, or the
    /// delay queue.
    fn enqueue(&mut self, key: McRequest, at: Instant, lane: Lane) {
        let phase = if at <= Instant::now() {
            let ticket = self.keys.ticket();
            self.lanes.make_ready(key.clone(), lane, ticket);
            Phase::Ready {
                ticket,
                lane,
                since: self.lanes.counted().then(Instant::now),
            }
        } else {
            self.lanes.cluster_mut(&key.cluster).delayed += 1;
            self.keys.delay(key.clone(), at)
        };
        self.keys.set(&key, phase);
    }

    /// Takes a delayed key out of the delay queue (its timer `slot`, unless
    /// that has fired) and enqueues it for `at` in `lane`.
    fn undelay(&mut self, key: McRequest, slot: Option<Key>, at: Instant, lane: Lane) {
        if let Some(slot) = slot {
            self.keys.undelay(&slot);
        }
        self.lanes.cluster_mut(&key.cluster).delayed -= 1;
        self.enqueue(key, at, lane);
    }

    /// Whether a key may be popped now: moves keys whose delay has passed
    /// into their lanes, then asks admission (see
    /// [`Admission::poll_admit`](super::admission::Admission::poll_admit)).
    pub(super) fn poll_admit(&mut self, cx: &mut Context<'_>) -> bool {
        while let Poll::Ready(Some(key)) = self.keys.poll_due(cx) {
            self.undelay(key, None, Instant::now(), Lane::Changed);
        }
        self.admission.poll_admit(cx, &mut self.lanes)
    }

    /// Takes the next key of the cluster at the front of the round-robin
    /// and marks it running. Call [`poll_admit`](Self::poll_admit) first,
    /// and only when it said yes.
    pub(super) fn pop_front(&mut self) -> Option<(McRequest, ReconcileReason)> {
        // The tokens taken when the key was admitted are used now.
        self.admission.token_used();
        let turns = self.admission.turns();
        self.lanes.pop_front(&mut self.keys, turns)
    }

    /// Records how a run of `key` ended and schedules its next run: after its
    /// backoff on failure, when the [`Action`](crate::action::Action) asks
    /// on success, and in any case no later than a change that arrived
    /// while it ran.
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
        // A purged key's run counts for nothing, its failures included.
        match outcome {
            _ if purged => {}
            Outcome::Success(_) => {
                state.failures = 0;
                state.last_error = 0;
            }
            Outcome::Failure(_) | Outcome::Unanswered => {
                state.failures = state.failures.saturating_add(1);
            }
            Outcome::Interrupted => {}
        }
        let failures = state.failures;
        // The cluster answered again while the run waited for it.
        let recovered = self
            .lanes
            .get(&key.cluster)
            .is_some_and(|cluster| cluster.recoveries != started_at);
        let now = Instant::now();
        let retry = ReconcileReason::ErrorPolicyRequestedRetry;
        let next = match outcome {
            _ if purged => None,
            Outcome::Interrupted => Some((Duration::ZERO, ReconcileReason::ClusterReplaced)),
            Outcome::Success(action) => action
                .requeue_after()
                .map(|after| (after, ReconcileReason::ReconcilerRequestedRetry)),
            Outcome::Failure(Some(after)) => Some((after, retry)),
            // The run failed of an outage that is over, and goes again at
            // once.
            Outcome::Unanswered if recovered => Some((Duration::ZERO, retry)),
            Outcome::Failure(None) | Outcome::Unanswered => {
                Some((self.keys.backoff(failures), retry))
            }
        }
        .map(|(after, reason)| (now + after.min(MAX_DELAY), Lane::Changed, reason));
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
                if let Some(state) = self.keys.get_mut(key) {
                    state.reason = reason;
                }
                self.enqueue(key.clone(), at, lane);
            }
            None => self.keys.remove(key),
        }
        let retried = matches!(outcome, Outcome::Failure(_) | Outcome::Unanswered);
        let unanswered = outcome == Outcome::Unanswered;
        self.lanes.run_ended(
            (key, purged),
            started,
            (retried, unanswered, recovered),
            now,
        );
    }

    /// The cluster answers again: its keys that wait out their backoff
    /// because it gave no answer run now, each when the queue admits it
    /// (its limits and fair share hold as for any other key). Says how
    /// many.
    pub(crate) fn answering(&mut self, cluster: &ClusterName) -> usize {
        let Some(keys) = self.lanes.get_mut(cluster).map(|entry| {
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
            self.undelay(key, Some(slot), now, Lane::Changed);
            woken += 1;
        }
        woken
    }

    /// Forgets every key of `cluster`, its failures, its limits' state and
    /// its entry. A key whose run is still going stays marked running until
    /// that run ends (its outcome then counts for nothing), so it cannot
    /// start a second time meanwhile; if it is scheduled again before then,
    /// it runs once the old run has ended.
    pub(crate) fn purge(&mut self, cluster: &ClusterName) {
        self.keys.purge(cluster);
        self.lanes.purge(cluster);
    }
}
