//! What the fleet does on its own about its clusters' answers, once a
//! second: asks a cluster gone silent whether it is ready (its
//! [`KeepAlive`]), sets aside a
//! cluster that has not answered for too long, and engages again one set
//! aside once it has answered for its settling time ([`Settling`]): each
//! time it flaps, a longer one. Each cluster's flaps are kept here, from
//! when it is set aside until it has stayed engaged for the cap, or its
//! provider lets go of its name.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, Weak},
    time::Duration,
};

use futures::FutureExt;
use tokio::{sync::watch, task::JoinHandle, time::Instant};

use super::{FleetEvent, State};
use crate::{
    client::{ClusterClient, KeepAlive, LOOK_EVERY, Reachability},
    cluster::Cluster,
    cluster_name::ClusterName,
    health::{ClusterHealth, Damping, Settling},
    panic::lock,
};

/// The fleet's watch over its clusters' answers.
pub(super) struct Vigil {
    /// Ask a cluster silent for this long whether it is ready, and how long
    /// to wait for its answer.
    pub(super) keep_alive: Option<KeepAlive>,
    /// Set aside a cluster that has not answered for this long.
    pub(super) set_aside_after: Option<Duration>,
    /// How long a cluster set aside must answer before it is engaged again.
    pub(super) settling: Settling,
    /// The clusters set aside, by name.
    pub(super) set_aside: HashMap<ClusterName, SetAside>,
    /// The clusters engaged again, by name, until they have stayed for the
    /// settling's cap: their flaps, should they be set aside again.
    engaged_again: HashMap<ClusterName, EngagedAgain>,
    /// The sweep's task, once started: started again if its runtime has
    /// gone.
    sweeping: Option<tokio::task::JoinHandle<()>>,
}

impl Default for Vigil {
    fn default() -> Self {
        Self {
            keep_alive: Some(KeepAlive::DEFAULT),
            set_aside_after: None,
            settling: Settling::DEFAULT,
            set_aside: HashMap::new(),
            engaged_again: HashMap::new(),
            sweeping: None,
        }
    }
}

impl Vigil {
    /// Forgets all it holds of `name` (its provider has let go of it, or
    /// offers it anew): whether it was set aside.
    pub(super) fn forget(&mut self, name: &ClusterName) -> bool {
        self.engaged_again.remove(name);
        let Some(aside) = self.set_aside.remove(name) else {
            return false;
        };
        aside.forget();
        true
    }

    /// Each cluster set aside, with its flaps and settling time, sorted.
    pub(super) fn damping(&self) -> Vec<(ClusterName, Damping)> {
        let mut damping: Vec<_> = (self.set_aside.iter())
            .map(|(name, aside)| (name.clone(), aside.damping()))
            .collect();
        damping.sort_by(|(a, _), (b, _)| a.cmp(b));
        damping
    }

    /// How many times `name`, set aside now, has flapped: once more than
    /// when it was engaged again if it was last heard from (`last_heard`)
    /// less than the cap after that; none if it was not engaged again, or
    /// stayed longer.
    fn flaps(&mut self, name: &ClusterName, last_heard: Instant) -> u32 {
        let Some(engaged) = self.engaged_again.remove(name) else {
            return 0;
        };
        let stayed = last_heard.saturating_duration_since(engaged.at);
        if stayed < self.settling.cap() {
            engaged.flaps.saturating_add(1)
        } else {
            0
        }
    }

    /// Forgets the clusters engaged again that have stayed for the cap:
    /// engaged and answering, or no longer engaged (held back as a
    /// duplicate, say).
    fn forget_stayed(&mut self, clusters: &HashMap<ClusterName, Cluster>, now: Instant) {
        let cap = self.settling.cap();
        self.engaged_again.retain(|name, engaged| {
            let failing = clusters
                .get(name)
                .is_some_and(|cluster| !cluster.reachability().is_answering());
            now.saturating_duration_since(engaged.at) < cap || failing
        });
    }
}

/// A cluster engaged again after it was set aside, remembered for a while.
struct EngagedAgain {
    /// How many times it had flapped.
    flaps: u32,
    /// When it was engaged again.
    at: Instant,
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
    /// How many times it has flapped, and so how long it must answer.
    flaps: u32,
    settling: Duration,
    /// Since when it has answered without a miss, as the looks found it.
    answering: Option<Instant>,
    /// Changes each time it answers again: an outage that came and went
    /// between two looks is a miss too.
    recoveries: watch::Receiver<u64>,
    /// The count of recoveries last looked at.
    recovered: u64,
    /// The ask under way while it answers.
    asking: Option<JoinHandle<bool>>,
}

impl SetAside {
    /// Forgets it: its probes and asks stop.
    pub(super) fn forget(self) {
        self.reachability.close();
        if let Some(asking) = self.asking {
            asking.abort();
        }
    }

    /// `Unreachable`, for as long as it has not answered; `Settling` while
    /// it answers.
    pub(super) fn health(&self) -> ClusterHealth {
        if let Some(answering) = self.answering
            && self.reachability.is_answering()
        {
            return ClusterHealth::Settling {
                answering_for: answering.elapsed(),
                settling: self.settling,
            };
        }
        let since = || (self.since.elapsed(), self.cause.clone());
        let (down_for, cause) = self.reachability.down().unwrap_or_else(since);
        ClusterHealth::Unreachable { down_for, cause }
    }

    fn damping(&self) -> Damping {
        Damping {
            flaps: self.flaps,
            settling: self.settling,
        }
    }

    /// One look at `now`: whether it has answered for its settling time,
    /// every ask answered, and may be engaged again. Else, while it
    /// answers, it is asked again (`keep_alive` gives the time to answer).
    fn settled(&mut self, name: &ClusterName, now: Instant, keep_alive: Option<KeepAlive>) -> bool {
        // Read before whether it answers: an ask that has ended has told
        // its answer. One that learnt nothing (credentials that could not
        // be had) is a miss: the settling counts answers only.
        // A finished ask not read this time (its task's cooperative
        // budget spent over many clusters) is read at the next look.
        let (asked, unanswered) = match &mut self.asking {
            Some(asking) if asking.is_finished() => match asking.now_or_never() {
                Some(answered) => {
                    self.asking = None;
                    (true, !answered.unwrap_or(false))
                }
                None => (false, false),
            },
            Some(_) => (false, false),
            None => (true, false),
        };
        let recovered = *self.recoveries.borrow_and_update();
        let missed = unanswered || recovered != self.recovered;
        self.recovered = recovered;
        if !self.reachability.is_answering() {
            if self.answering.take().is_some() {
                tracing::debug!(cluster = %name, "the cluster set aside does not answer again: its settling starts over when it answers");
            }
            return false;
        }
        let answering = match self.answering {
            Some(since) if !missed => since,
            Some(_) => {
                tracing::debug!(cluster = %name, "the cluster set aside missed an ask: its settling starts over");
                *self.answering.insert(now)
            }
            None => {
                tracing::info!(
                    cluster = %name,
                    settling = ?self.settling,
                    flaps = self.flaps,
                    "the cluster set aside answers again: engaged again once it has answered for its settling time"
                );
                *self.answering.insert(now)
            }
        };
        if asked && now.saturating_duration_since(answering) >= self.settling {
            return true;
        }
        if asked {
            let timeout = (self.reachability.client().keep_alive())
                .or(keep_alive)
                .map_or(KeepAlive::DEFAULT.timeout(), |keep_alive| {
                    keep_alive.timeout()
                });
            let check = self.reachability.clone().check(timeout);
            self.asking = Some(tokio::spawn(check));
        }
        false
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
    let vigil = &mut state.vigil;
    vigil.forget_stayed(&state.clusters, now);
    let keep_alive = vigil.keep_alive;
    let settled: Vec<ClusterName> = (vigil.set_aside.iter_mut())
        .filter_map(|(name, aside)| aside.settled(name, now, keep_alive).then(|| name.clone()))
        .collect();
    for name in settled {
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
    let since = Instant::now() - down_for;
    let flaps = state.vigil.flaps(&name, since);
    let settling = state.vigil.settling.after_flaps(flaps);
    tracing::warn!(
        cluster = %name,
        down_for = ?down_for,
        cause = %cause,
        flaps,
        settling = ?settling,
        "the cluster has not answered for too long: set aside (disengaged) until it has answered for its settling time"
    );
    state.publish(FleetEvent::Disengaged(name.clone()));
    let mut recoveries = reachability.recoveries();
    let recovered = *recoveries.borrow_and_update();
    let aside = SetAside {
        client: reachability.client().clone(),
        since,
        cause,
        flaps,
        settling,
        answering: None,
        recoveries,
        recovered,
        asking: None,
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
    let (flaps, settling) = (aside.flaps, aside.settling);
    aside.forget();
    let at = Instant::now();
    (state.vigil.engaged_again).insert(name.clone(), EngagedAgain { flaps, at });
    let cluster = Cluster::listing(name.clone(), client, state.lists.clone(), state.budget);
    tracing::warn!(cluster = %name, down_for = ?set_aside_for, settled_for = ?settling, flaps, "the cluster set aside has answered for its settling time: engaged again");
    // Checked again, as any offer: another name may serve it now.
    super::duplicates::admit(state, cluster);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vigil(first: u64, cap: u64) -> Vigil {
        Vigil {
            settling: Settling::new(Duration::from_secs(first), Duration::from_secs(cap)),
            ..Vigil::default()
        }
    }

    fn engaged_again(vigil: &mut Vigil, name: &str, flaps: u32, at: Instant) {
        let engaged = EngagedAgain { flaps, at };
        vigil.engaged_again.insert(name.into(), engaged);
    }

    #[test]
    fn a_cluster_that_stops_answering_soon_after_it_was_engaged_again_has_flapped() {
        let mut vigil = vigil(5, 300);
        let at = Instant::now();
        engaged_again(&mut vigil, "east", 2, at);
        let flaps = vigil.flaps(&"east".into(), at + Duration::from_secs(299));
        assert_eq!(flaps, 3);
        assert_eq!(vigil.settling.after_flaps(flaps), Duration::from_secs(40));
        // Its record moves to the cluster set aside.
        assert!(vigil.engaged_again.is_empty());
    }

    #[test]
    fn a_cluster_that_stayed_for_the_cap_settles_for_the_first_time_again() {
        let mut vigil = vigil(5, 300);
        let at = Instant::now();
        engaged_again(&mut vigil, "east", 4, at);
        assert_eq!(
            vigil.flaps(&"east".into(), at + Duration::from_secs(300)),
            0
        );
        // One never engaged again has not flapped.
        assert_eq!(vigil.flaps(&"west".into(), at), 0);
    }

    #[test]
    fn a_cluster_engaged_again_is_forgotten_once_it_has_stayed_for_the_cap() {
        let mut vigil = vigil(5, 300);
        let at = Instant::now();
        engaged_again(&mut vigil, "east", 1, at);
        let clusters = HashMap::new();
        vigil.forget_stayed(&clusters, at + Duration::from_secs(299));
        assert_eq!(vigil.engaged_again.len(), 1);
        vigil.forget_stayed(&clusters, at + Duration::from_secs(300));
        assert!(vigil.engaged_again.is_empty());
    }

    #[test]
    fn forgetting_a_name_leaves_nothing_of_it() {
        let mut vigil = vigil(5, 300);
        engaged_again(&mut vigil, "east", 1, Instant::now());
        assert!(!vigil.forget(&"east".into()), "it was not set aside");
        assert!(vigil.engaged_again.is_empty() && vigil.set_aside.is_empty());
    }
}
