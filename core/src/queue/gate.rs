//! Clusters as the controller serves them: held until its watches there
//! sync, released, resumed after a pause (`Lanes::pause_front`), and not
//! served at all.

use super::lanes::Lanes;
use crate::cluster_name::ClusterName;

impl Lanes {
    /// Holds `cluster`'s keys until [`release`](Self::release): the
    /// controller serves it but its watches there have not synced.
    pub(super) fn hold(&mut self, cluster: &ClusterName) {
        let counted = self.metrics().cloned();
        let entry = self.cluster_mut(cluster);
        entry.served = true;
        if let Some(metrics) = &counted {
            // A cluster served has its figures from the start.
            let depth = entry.ready;
            entry.stats(metrics, cluster).depth(depth);
        }
        if !entry.held {
            entry.held = true;
            self.held_one_more();
        }
        self.refresh(cluster);
    }

    /// Lets `cluster`'s keys run.
    pub(super) fn release(&mut self, cluster: &ClusterName) {
        let entry = self.cluster_mut(cluster);
        if entry.held {
            entry.held = false;
            self.held_one_fewer();
        }
        self.take_turn(cluster);
        self.refresh(cluster);
    }

    /// Lets `cluster`'s keys start again after a
    /// [`pause_front`](Self::pause_front); nothing if it left meanwhile.
    pub(super) fn resume(&mut self, cluster: &ClusterName) {
        let Some(entry) = self.get_mut(cluster) else {
            return;
        };
        entry.paused = false;
        self.take_turn(cluster);
        self.refresh(cluster);
    }

    /// Lets `cluster`'s keys run and stops keeping its entry for it: the
    /// controller does not serve the cluster (it only receives requests for
    /// it).
    pub(super) fn unserve(&mut self, cluster: &ClusterName) {
        self.release(cluster);
        if let Some(entry) = self.get_mut(cluster) {
            entry.served = false;
        }
        self.refresh(cluster);
    }
}
