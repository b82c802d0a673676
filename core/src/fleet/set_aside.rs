//! What the fleet does on its own about its clusters' answers, once a
//! second: asks a cluster gone silent whether it is ready (its
//! [`KeepAlive`]), sets aside a
//! cluster that has not answered for too long, and engages again one set
//! aside that answers.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, Weak},
    time::Duration,
};

use tokio::time::Instant;

use super::{FleetEvent, State};
use crate::{
    client::{ClusterClient, KeepAlive, LOOK_EVERY, Reachability},
    cluster::Cluster,
    cluster_name::ClusterName,
    health::ClusterHealth,
    panic::lock,
};

/// The fleet's watch over its clusters' answers.
pub(super) struct Vigil {
    /// Ask a cluster silent for this long whether it is ready, and how long
    /// to wait for its answer.
    pub(super) keep_alive: Option<KeepAlive>,
    /// Set aside a cluster that has not answered for this long.
    pub(super) set_aside_after: Option<Duration>,
    /// The clusters set aside, by name.
    pub(super) set_aside: HashMap<ClusterName, SetAside>,
    /// The sweep's task, once started: started again if its runtime has
    /// gone.
    sweeping: Option<tokio::task::JoinHandle<()>>,
}

impl Default for Vigil {
    fn default() -> Self {
        Self {
            keep_alive: Some(KeepAlive::DEFAULT),
            set_aside_after: None,
            set_aside: HashMap::new(),
            sweeping: None,
        }
    }
}

/// A cluster set aside: disengaged for want of an answer, still asked
/// whether it is back.
pub(super) struct SetAside {
    /// What it was engaged with, to engage it with again.
    client: ClusterClient,
    /// Its outage, its probes running while this is held.
    reachability: Arc<Reachability>,
    /// Since when it has not answered, and why, when it was set aside.
    since: Instant,
    cause: String,
}

impl SetAside {
    /// Forgets it: its probes stop.
    pub(super) fn forget(self) {
        self.reachability.close();
    }

    /// `Unreachable`, for as long as it has not answered.
    pub(super) fn health(&self) -> ClusterHealth {
        let since = || (self.since.elapsed(), self.cause.clone());
        let (down_for, cause) = self.reachability.down().unwrap_or_else(since);
        ClusterHealth::Unreachable { down_for, cause }
    }
}

/// Starts the sweep of the fleet, unless it runs, in the tokio
/// runtime of the caller (if any); it ends with the fleet, or with its
/// runtime (and starts again in the next caller's).
pub(super) fn start(state: &mut State) {
    if state
        .vigil
        .sweeping
        .as_ref()
        .is_some_and(|task| !task.is_finished())
    {
        return;
    }
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    state.vigil.sweeping = Some(runtime.spawn(sweeping(state.this.clone())));
}

async fn sweeping(fleet: Weak<Mutex<State>>) {
    let mut every = tokio::time::interval(LOOK_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        let Some(fleet) = fleet.upgrade() else {
            return;
        };
        let mut state = lock(&fleet);
        sweep(&mut state, Instant::now());
    }
}

/// One look over the fleet at `now`.
fn sweep(state: &mut State, now: Instant) {
    // Also where the fleet asks nothing: a cluster's client may.
    for cluster in state.clusters.values() {
        cluster
            .reachability()
            .probe_if_silent(state.vigil.keep_alive, now);
    }
    if let Some(after) = state.vigil.set_aside_after {
        let due: Vec<ClusterName> = state
            .clusters
            .iter()
            .filter(|(_, cluster)| {
                cluster.owns_reachability()
                    && !cluster.reachability().is_answering()
                    && cluster
                        .reachability()
                        .known_down_for()
                        .is_some_and(|down_for| down_for >= after)
            })
            .map(|(name, _)| name.clone())
            .collect();
        for name in due {
            set_aside(state, name);
        }
    }
    let back: Vec<ClusterName> = state
        .vigil
        .set_aside
        .iter()
        .filter(|(_, aside)| aside.reachability.is_answering())
        .map(|(name, _)| name.clone())
        .collect();
    for name in back {
        engage_again(state, name);
    }
}

fn set_aside(state: &mut State, name: ClusterName) {
    if state.same.waiting(&name).is_some() {
        // A newer offer of it waits for its identity: that one decides.
        return;
    }
    let Some(cluster) = state.clusters.get(&name) else {
        return;
    };
    let Some((down_for, cause)) = cluster.reachability().down() else {
        return;
    };
    let Some(reachability) = cluster.set_aside() else {
        return;
    };
    state.clusters.remove(&name);
    tracing::warn!(
        cluster = %name,
        down_for = ?down_for,
        cause = %cause,
        "the cluster has not answered for too long: set aside (disengaged) until it answers"
    );
    state.publish(FleetEvent::Disengaged(name.clone()));
    let aside = SetAside {
        client: reachability.client().clone(),
        since: Instant::now() - down_for,
        cause,
        reachability,
    };
    state.vigil.set_aside.insert(name.clone(), aside);
    // Another name held back for the same cluster may serve it meanwhile.
    super::duplicates::forget(state, &name);
    super::duplicates::engage_heirs(state);
}

fn engage_again(state: &mut State, name: ClusterName) {
    let Some(aside) = state.vigil.set_aside.remove(&name) else {
        return;
    };
    let client = aside.client.clone();
    let set_aside_for = aside.since.elapsed();
    aside.forget();
    let cluster = Cluster::listing(name.clone(), client, state.lists.clone(), state.budget);
    tracing::warn!(cluster = %name, down_for = ?set_aside_for, "the cluster set aside answers again: engaged again");
    // Checked again, as any offer: another name may serve it now.
    super::duplicates::admit(state, cluster);
}
