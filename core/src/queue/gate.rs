//! Clusters as the controller serves them: held until its watches there
//! sync, released, purged when they leave, and woken when they answer
//! again after they gave no answer.

use tokio::time::Instant;

use super::{
    Queue,
    keys::{KeyState, Phase},
    lanes::Lane,
};
use crate::cluster_name::ClusterName;

impl Queue {
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
        if let Some(metrics) = &self.metrics {
            // A cluster served has its figures from the start.
            let depth = entry.ready;
            entry.stats(metrics, cluster).depth(depth);
        }
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

    /// Lets `cluster`'s keys start again after a
    /// [`pause`](super::PopReady::pause); nothing if it left meanwhile.
    pub(crate) fn resume(&mut self, cluster: &ClusterName) {
        let Some(entry) = self.clusters.get_mut(cluster) else {
            return;
        };
        entry.paused = false;
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
        self.shrink_keys();
        if let Some(metrics) = &self.metrics {
            metrics.forget(cluster);
        }
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
}
