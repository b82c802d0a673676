//! The limits a key is admitted under: the controller's and each cluster's
//! concurrency, and the shared and per-cluster token buckets.

use std::{
    pin::Pin,
    task::{Context, Poll},
};

use tokio::time::{Instant, Sleep};
use tokio_util::time::DelayQueue;

use super::{
    lanes::{Lanes, Sharing},
    token_bucket::TokenBucket,
};
use crate::cluster_name::ClusterName;

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

/// What admits a key: the limits, and the state of the token buckets.
#[derive(Debug)]
pub(super) struct Admission {
    limits: Limits,
    /// Clusters out of tokens, until their next one is due.
    throttled: DelayQueue<ClusterName>,
    /// Waits for the shared bucket's next token.
    shared_wait: Option<Pin<Box<Sleep>>>,
    /// A token of the shared bucket is taken for the next key.
    shared_token: bool,
}

impl Admission {
    pub(super) fn new(limits: Limits) -> Self {
        Self {
            limits,
            throttled: DelayQueue::new(),
            shared_wait: None,
            shared_token: false,
        }
    }

    /// With [`Sharing::InTurn`] and a total limit, the most keys a turn
    /// runs: eight waves of the slots, at least 64; `None` when clusters
    /// take turns key by key.
    pub(super) fn turns(&self) -> Option<usize> {
        const FLOOR: usize = 64;
        match (self.limits.sharing, self.limits.concurrency) {
            (Sharing::InTurn, Some(global)) => Some(global.saturating_mul(8).max(FLOOR)),
            _ => None,
        }
    }

    /// The key admitted has started: the shared token taken for it is used.
    pub(super) fn token_used(&mut self) {
        self.shared_token = false;
    }

    /// How many reconciles one cluster may run at once now, with
    /// [`Sharing::Fair`].
    ///
    /// Unless set explicitly, with a controller-wide limit `G` and `k`
    /// clusters that have work (keys running, or ready and not held), each
    /// cluster may run `max(1, ⌈G / max(k, m)⌉)`, where `m` is 2 when the
    /// queue knows more than one cluster that is not held and 1 otherwise:
    /// a lone cluster uses every slot, and no cluster takes more than half
    /// of them once there are others, or more than its fair share when
    /// several have work. (Slots are counted when keys are admitted; runs
    /// already going are not taken back.)
    fn fair_cap(&self, lanes: &Lanes) -> usize {
        if let Some(cap) = self.limits.cluster_concurrency {
            return cap.max(1);
        }
        let Some(global) = self.limits.concurrency else {
            return self
                .limits
                .default_cluster_concurrency
                .unwrap_or(usize::MAX);
        };
        let floor = if lanes.unheld() > 1 { 2 } else { 1 };
        global.div_ceil(lanes.busy().max(floor)).max(1)
    }

    /// Whether a key of `lanes` may be popped now. Brings clusters whose
    /// tokens are due back into the round-robin, and registers `cx` to be
    /// woken for the next timer. Afterwards the cluster at the front of the
    /// round-robin is the one [`Lanes::pop_front`] serves.
    pub(super) fn poll_admit(&mut self, cx: &mut Context<'_>, lanes: &mut Lanes) -> bool {
        while let Poll::Ready(Some(expired)) = self.throttled.poll_expired(cx) {
            lanes.unthrottle(&expired.into_inner());
        }
        if self
            .limits
            .concurrency
            .is_some_and(|limit| lanes.running() >= limit)
        {
            return false; // A finishing reconcile wakes the controller.
        }
        if let Some(wait) = &mut self.shared_wait {
            if wait.as_mut().poll(cx).is_pending() {
                return false;
            }
            self.shared_wait = None;
        }
        if lanes.front().is_none() {
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
        // In turn, a cluster may use every slot unless its own limit is
        // set; one whose keys wait for it to answer again runs no more than
        // its fair share: its runs hang until they time out.
        let fair = self.fair_cap(lanes);
        let cap = match (self.turns(), self.limits.concurrency) {
            (Some(_), Some(global)) if self.limits.cluster_concurrency.is_none() => global,
            _ => fair,
        };
        lanes.front_admissible(
            (cap, fair),
            self.limits.cluster_rate_limit,
            &mut self.throttled,
            now,
        )
    }
}
