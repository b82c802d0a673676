//! Each key's state: waiting (ready or delayed), running, or only
//! remembering its failures; the delays of those that wait for a time, and
//! the backoff of those that failed.

use std::{
    collections::HashMap,
    hash::{BuildHasher, RandomState},
    task::{Context, Poll, ready},
    time::Duration,
};

use tokio::time::Instant;
use tokio_util::time::{DelayQueue, delay_queue};

use super::{
    backoff::{Backoff, Jitter},
    lane::Lane,
};
use crate::{
    action::Action, cluster_name::ClusterName, reason::ReconcileReason, request::McRequest,
};

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
    /// ([`answering`](super::Queue::answering)).
    Unanswered,
    /// The run did not start, or was cut short, because its cluster left or
    /// was replaced: run it again at once, unless its cluster was purged.
    Interrupted,
}

/// Every key the queue knows, and the timers of those delayed.
#[derive(Debug)]
pub(super) struct Keys {
    states: HashMap<McRequest, KeyState>,
    delayed: DelayQueue<McRequest>,
    backoff: Backoff,
    jitter: Jitter,
    next_ticket: u64,
    hasher: RandomState,
}

impl Keys {
    pub(super) fn new(backoff: Backoff) -> Self {
        Self {
            states: HashMap::new(),
            delayed: DelayQueue::new(),
            backoff,
            jitter: Jitter::new(),
            next_ticket: 0,
            hasher: RandomState::new(),
        }
    }

    pub(super) fn get(&self, key: &McRequest) -> Option<&KeyState> {
        self.states.get(key)
    }

    pub(super) fn get_mut(&mut self, key: &McRequest) -> Option<&mut KeyState> {
        self.states.get_mut(key)
    }

    /// Sets `key`'s phase, if the key is known.
    pub(super) fn set(&mut self, key: &McRequest, phase: Phase) {
        if let Some(state) = self.states.get_mut(key) {
            state.phase = phase;
        }
    }

    /// A new key, with nothing scheduled yet.
    pub(super) fn insert(&mut self, key: McRequest, reason: ReconcileReason) {
        self.states.insert(
            key,
            KeyState {
                phase: Phase::Idle,
                failures: 0,
                last_error: 0,
                reason,
            },
        );
    }

    /// Forgets `key`.
    pub(super) fn remove(&mut self, key: &McRequest) {
        self.states.remove(key);
        self.shrink();
    }

    /// A ticket marking a key's entry in a lane; a later one makes the
    /// earlier entry stale.
    pub(super) fn ticket(&mut self) -> u64 {
        self.next_ticket += 1;
        self.next_ticket
    }

    /// Delays `key` until `at`.
    pub(super) fn delay(&mut self, key: McRequest, at: Instant) -> Phase {
        let slot = self.delayed.insert_at(key, at);
        Phase::Delayed { at, slot }
    }

    /// Takes a delayed key's timer out.
    pub(super) fn undelay(&mut self, slot: &delay_queue::Key) {
        self.delayed.remove(slot);
    }

    /// The next delayed key whose time has come, if it is still known.
    pub(super) fn poll_due(&mut self, cx: &mut Context<'_>) -> Poll<Option<McRequest>> {
        while let Some(expired) = ready!(self.delayed.poll_expired(cx)) {
            let key = expired.into_inner();
            if self.states.contains_key(&key) {
                return Poll::Ready(Some(key));
            }
        }
        Poll::Ready(None)
    }

    /// How many keys wait for a time.
    pub(super) fn delayed(&self) -> usize {
        self.delayed.len()
    }

    /// The backoff after a key's `failures`-th failure in a row.
    pub(super) fn backoff(&mut self, failures: u32) -> Duration {
        self.backoff.jittered(failures, self.jitter.next())
    }

    /// Notes that the run of `key` failed with `error`; whether its last
    /// run failed with the same (a repeat, not news).
    pub(super) fn failed_again(&mut self, key: &McRequest, error: &str) -> bool {
        let Some(state) = self.states.get_mut(key) else {
            return false;
        };
        let hash = self.hasher.hash_one(error).max(1);
        std::mem::replace(&mut state.last_error, hash) == hash
    }

    /// Forgets every key of `cluster` but those running, which are marked
    /// purged: they stay until their run ends, so that none runs twice at
    /// once, and their outcome then counts for nothing.
    pub(super) fn purge(&mut self, cluster: &ClusterName) {
        let delayed = &mut self.delayed;
        self.states.retain(|key, state| {
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
        self.shrink();
    }

    /// Gives a drained backlog's memory back: a map of keys sized for a
    /// start-up of thousands would otherwise keep that size for the
    /// controller's life.
    fn shrink(&mut self) {
        let capacity = self.states.capacity();
        if capacity > 1024 && self.states.len() * 8 < capacity {
            self.states.shrink_to(self.states.len() * 2);
        }
    }

    #[cfg(test)]
    pub(super) fn capacity(&self) -> usize {
        self.states.capacity()
    }

    #[cfg(test)]
    pub(super) fn states(&self) -> impl Iterator<Item = &KeyState> {
        self.states.values()
    }

    #[cfg(test)]
    pub(super) fn is_empty(&self) -> bool {
        self.states.is_empty()
    }
}
