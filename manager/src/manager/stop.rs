//! What stops, however `Manager::run` ends: its gates, its status, its
//! tasks.

use std::sync::{
    Arc,
    atomic::{AtomicBool, Ordering},
};

use kube_multicluster::Fleet;
use tokio::sync::watch;

use crate::{election::Role, gate::Gate, shard::ShardStatus};

/// Stops what `run` started when it returns or its future is dropped:
/// closes the gates, so that no reconcile starts after and running ones
/// stop when next polled; ends the sharding status's stretches of
/// ownership; says the replica no longer leads; and marks the controllers
/// as not running. After a return all this has happened already, and it
/// changes nothing.
pub(super) struct StopGuard {
    /// The fleet, whose sharded clusters the guard disengages.
    pub(super) fleet: Fleet,
    pub(super) gate: Gate,
    pub(super) role: watch::Sender<Role>,
    pub(super) shards: Option<ShardStatus>,
    pub(super) started: Vec<Arc<AtomicBool>>,
}

impl Drop for StopGuard {
    fn drop(&mut self) {
        // The clusters this replica ran as a shard: with the run gone,
        // nothing renews their Leases, so they leave the fleet, their
        // watches with them.
        for cluster in self.gate.close() {
            self.fleet.disengage(&cluster);
        }
        // And the hubs, every replica's.
        if let Some(hubs) = self.gate.hubs() {
            for cluster in self.fleet.clusters() {
                if hubs.selects(cluster.name()) {
                    self.fleet.disengage(cluster.name());
                }
            }
        }
        if let Some(status) = &self.shards {
            status.stopped(tokio::time::Instant::now());
        }
        self.role.send_replace(Role::Stopped);
        for started in &self.started {
            started.store(false, Ordering::SeqCst);
        }
    }
}

/// Aborts the manager's tasks when it returns or is dropped.
#[derive(Default)]
pub(super) struct Tasks(pub(super) Vec<tokio::task::AbortHandle>);

impl Drop for Tasks {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}
