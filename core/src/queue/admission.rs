//! The limits a key is admitted under: the controller's and each cluster's
//! concurrency, and the shared and per-cluster token buckets.

use std::task::{Context, Poll};

use tokio::time::Instant;

use super::{
    Queue,
    keys::Phase,
    lanes::{Lane, Sharing},
    token_bucket::{TokenBucket, Tokens},
};

/// The limits the queue admits keys under.
#[derive(Debug, Clone, Default)]
pub(crate) struct Limits {
    /// Reconciles at once in all clusters; `None` for no limit.
    pub(crate) concurrency: Option<usize>,
    /// Reconciles at once in one cluster; `None` for the fair share (or,
    /// in turn, all of `concurrency`).
    pub(crate) cluster_concurrency: Option<usize>,
    /// Reconciles at once in one cluster when neither limit above is set;
    /// `None` for no limit.
    pub(crate) default_cluster_concurrency: Option<usize>,
    /// One bucket for all clusters (and every controller it is given to).
    pub(crate) rate_limit: Option<TokenBucket>,
    /// A bucket of this rate and burst for each cluster.
    pub(crate) cluster_rate_limit: Option<(f64, u32)>,
    /// How clusters with work share the slots.
    pub(crate) sharing: Sharing,
}

impl Limits {
    /// With [`Sharing::InTurn`] and a total limit, the most keys a turn
    /// runs: eight waves of the slots, at least 64; `None` when clusters
    /// take turns key by key.
    pub(super) fn turns(&self) -> Option<usize> {
        const FLOOR: usize = 64;
        match (self.sharing, self.concurrency) {
            (Sharing::InTurn, Some(global)) => Some(global.saturating_mul(8).max(FLOOR)),
            _ => None,
        }
    }
}

impl Queue {
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
        match self.limits.turns() {
            Some(_) if self.limits.cluster_concurrency.is_none() => {
                self.limits.concurrency.unwrap_or(usize::MAX)
            }
            _ => self.fair_cap(),
        }
    }

    /// [`cluster_cap`](Self::cluster_cap) with [`Sharing::Fair`].
    fn fair_cap(&self) -> usize {
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
    /// [`pop_front`](Self::pop_front) serves.
    pub(super) fn poll_admit(&mut self, cx: &mut Context<'_>) -> bool {
        while let Poll::Ready(Some(expired)) = self.delayed.poll_expired(cx) {
            let key = expired.into_inner();
            if self.keys.contains_key(&key) {
                self.cluster_mut(&key.cluster).delayed -= 1;
                let ticket = self.make_ready(key.clone(), Lane::Changed);
                if let Some(state) = self.keys.get_mut(&key) {
                    state.phase = Phase::Ready {
                        ticket,
                        lane: Lane::Changed,
                        since: self.metrics.as_ref().map(|_| Instant::now()),
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
        // In turn, a cluster whose keys wait for it to answer again runs
        // no more than its fair share: its runs hang until they time out.
        // Otherwise the fair share is the cap already.
        let unanswering_cap = match self.limits.turns() {
            Some(_) => self.fair_cap(),
            None => cap,
        };
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
                        cluster.turn_left = 0;
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
}
