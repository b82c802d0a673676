//! One cluster under two names: found from each engaged cluster's identity,
//! warned about, or engaged once.

use std::{collections::HashMap, time::Duration};

use tokio::{task::AbortHandle, time::Instant};

use super::State;
use crate::{
    client::ClusterClient,
    cluster::Cluster,
    cluster_name::ClusterName,
    identity::{ClusterIdentity, IdSource},
    panic::lock,
    problems::Problems,
};

/// How long the fleet tries to read a cluster's identity before it gives
/// up on checking it.
const IDENTITY_WAIT: Duration = Duration::from_secs(30);

/// How long the fleet waits before it tries again a read that failed.
const IDENTITY_RETRY: Duration = Duration::from_secs(1);

/// What the fleet does when two names it engages are one cluster, as told
/// by the cluster's [identity](crate::identity::ClusterIdentity): the
/// `ClusterProperty` `cluster.clusterset.k8s.io`, else the UID of its
/// `kube-system` namespace ([`FleetConfig::duplicates`](crate::FleetConfig::duplicates)).
///
/// Two providers may know one cluster (a kubeconfig Secret and a Cluster
/// API `Cluster`, say), or one provider twice (two Secrets, two
/// `ClusterProfile`s in two namespaces). Engaged under both names, the
/// cluster has two caches, and every controller reconciles each of its
/// objects twice, from two queues, at once.
///
/// ```
/// use kube_multicluster::{Duplicates, Fleet, FleetConfig};
///
/// let fleet = Fleet::with_config(FleetConfig {
///     duplicates: Duplicates::EngageOnce,
///     ..FleetConfig::default()
/// });
/// assert_eq!(fleet.config().duplicates, Duplicates::EngageOnce);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Duplicates {
    /// Engage every name at once; read each cluster's identity meanwhile
    /// and, for a name that is a cluster engaged already, warn once and
    /// report it in [`Fleet::problems`](crate::Fleet::problems) and
    /// [`FleetStatus::duplicates`](crate::FleetStatus::duplicates), until one of the
    /// two leaves. The default.
    #[default]
    Warn,
    /// Engage each cluster once: a new name joins the fleet only once its
    /// cluster's identity is read (a round trip or two; nothing runs there
    /// before; a name engaged already keeps its engagement meanwhile), and
    /// a name whose cluster is engaged already under another is held back,
    /// reported as for `Warn`. When the name engaged leaves (or is set
    /// aside for want of an answer), the first name held back for the same
    /// cluster is engaged in its place, with the client it was offered
    /// with. The local cluster ([`ClusterName::local`]) is never held back.
    /// A cluster whose identity cannot be read within 30 s (tried every
    /// second) is engaged unchecked, and that is reported.
    EngageOnce,
    /// Read no identity: every name is taken for a cluster of its own (as
    /// where many names for one API server are meant, in tests and
    /// benchmarks).
    Ignore,
}

/// A name the fleet was offered for a cluster engaged already under
/// another ([`FleetStatus::duplicates`](crate::FleetStatus::duplicates)).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Duplicate {
    /// The second name.
    pub name: ClusterName,
    /// The name the cluster was engaged under first.
    pub of: ClusterName,
    /// The cluster's ID.
    pub id: String,
    /// Whether the second name is engaged too ([`Duplicates::Warn`]) or
    /// held back ([`Duplicates::EngageOnce`]).
    pub engaged: bool,
}

/// The fleet's record of which cluster each name is.
#[derive(Default)]
pub(super) struct Sameness {
    pub(super) policy: Duplicates,
    /// The ID of each engaged name whose identity was read.
    ids: HashMap<ClusterName, String>,
    /// The engaged names of each ID, the first engaged first.
    names: HashMap<String, Vec<ClusterName>>,
    /// Names whose identity is being read before they join
    /// ([`Duplicates::EngageOnce`]).
    pending: HashMap<ClusterName, Cluster>,
    /// Names held back as a cluster engaged under another, the first
    /// offered first ([`Duplicates::EngageOnce`]).
    held: Vec<Held>,
    /// The identity read under way for each name.
    reading: HashMap<ClusterName, AbortHandle>,
    pub(super) problems: Problems,
}

impl Drop for Sameness {
    fn drop(&mut self) {
        for read in self.reading.values() {
            read.abort();
        }
    }
}

struct Held {
    name: ClusterName,
    id: String,
    /// What it was offered with, to engage it with if its cluster's name
    /// leaves.
    client: ClusterClient,
}

impl Sameness {
    /// Records that `name`, engaged, is the cluster `id`.
    pub(super) fn register(&mut self, name: ClusterName, id: String) {
        if let Some(earlier) = self.ids.get(&name) {
            if *earlier == id {
                // Offered again, the same cluster: it keeps its place.
                self.tell(&id);
                return;
            }
            let earlier = earlier.clone();
            self.unregister(&name, &earlier);
        }
        self.names.entry(id.clone()).or_default().push(name.clone());
        self.ids.insert(name, id.clone());
        self.tell(&id);
    }

    /// `name`'s identity read stops, and it neither waits to join nor is
    /// held back any more.
    fn stop_waiting(&mut self, name: &ClusterName) {
        if let Some(read) = self.reading.remove(name) {
            read.abort();
        }
        if let Some(pending) = self.pending.remove(name) {
            pending.leave();
        }
        self.held.retain(|held| held.name != *name);
    }

    /// `name` is no longer one of the names of `id`.
    fn unregister(&mut self, name: &ClusterName, id: &str) {
        self.ids.remove(name);
        if let Some(names) = self.names.get_mut(id) {
            names.retain(|n| n != name);
            if names.is_empty() {
                self.names.remove(id);
            }
        }
        self.tell(id);
    }

    /// The name, as the fleet holds it, of the name waiting for its
    /// identity or held back that equals `name`.
    pub(super) fn waiting<Q>(&self, name: &Q) -> Option<ClusterName>
    where
        ClusterName: std::borrow::Borrow<Q>,
        Q: std::hash::Hash + Eq + ?Sized,
    {
        let pending = self.pending.get_key_value(name).map(|(name, _)| name);
        let mut held = self.held.iter().map(|held| &held.name);
        let held = || held.find(|held| std::borrow::Borrow::<Q>::borrow(*held) == name);
        pending.or_else(held).cloned()
    }

    /// Every name that is a cluster engaged under another.
    pub(super) fn duplicates(&self) -> Vec<Duplicate> {
        let mut found = Vec::new();
        for (id, names) in &self.names {
            let Some((first, rest)) = names.split_first() else {
                continue;
            };
            let held = self.held.iter().filter(|held| held.id == *id);
            let twice = rest.iter().map(|name| (name, true));
            found.extend(twice.chain(held.map(|held| (&held.name, false))).map(
                |(name, engaged)| Duplicate {
                    name: name.clone(),
                    of: first.clone(),
                    id: id.clone(),
                    engaged,
                },
            ));
        }
        found.sort_by(|a, b| a.name.cmp(&b.name));
        found
    }

    /// Reports or clears, for the names of `id`, that each but the first
    /// is the first's cluster.
    fn tell(&self, id: &str) {
        let Some(names) = self.names.get(id) else {
            return;
        };
        let Some((first, rest)) = names.split_first() else {
            return;
        };
        self.problems.clear(&source(first));
        let hint = match self.policy {
            Duplicates::Warn => ", or set Duplicates::EngageOnce",
            _ => "",
        };
        let twice = format!(
            "engaged under both names, so each of its objects is reconciled twice; remove one{hint}"
        );
        let engaged = rest.iter().map(|name| (name, twice.as_str()));
        let held = self.held.iter().filter(|held| held.id == id);
        let held = held.map(|held| (&held.name, "not engaged under this name while that one is"));
        let first = first.as_str();
        for (name, what) in engaged.chain(held) {
            let problem = format!("is the cluster engaged as {first:?} (ID {id}): {what}");
            self.problems.report(source(name), problem);
        }
    }
}

/// The source a name's problem is reported under.
fn source(name: &ClusterName) -> String {
    format!("cluster {:?}", name.as_str())
}

/// `name` is offered anew: its read stops, it waits no more and is held
/// back no more; while its engagement stands, it keeps its place among its
/// cluster's names (the new offer's read decides what follows).
pub(super) fn reoffer(state: &mut State, name: &ClusterName) {
    if state.clusters.contains_key(name) {
        state.same.stop_waiting(name);
    } else {
        forget(state, name);
    }
}

/// Forgets what is known of `name`: its read stops, it waits no more, is
/// held back no more, and is no longer one of its cluster's names.
pub(super) fn forget(state: &mut State, name: &ClusterName) {
    let same = &mut state.same;
    same.stop_waiting(name);
    same.problems.clear(&source(name));
    if let Some(id) = same.ids.get(name).cloned() {
        same.unregister(name, &id);
    }
}

/// Engages each name held back whose cluster is engaged under no name any
/// more (it left, or was set aside), the first held back for each, in its
/// place, with the client it was offered with.
pub(super) fn engage_heirs(state: &mut State) {
    let same = &mut state.same;
    // The first held back for each cluster.
    let mut ids = std::collections::HashSet::new();
    let heirs: Vec<Held> = same
        .held
        .extract_if(.., |held| {
            !same.names.contains_key(&held.id) && ids.insert(held.id.clone())
        })
        .collect();
    for Held { name, id, client } in heirs {
        state.same.problems.clear(&source(&name));
        tracing::warn!(cluster = %name, id = %id, "the cluster's engaged name is gone: engaged under this one instead");
        let cluster = Cluster::listing(name.clone(), client, state.lists.clone(), state.budget);
        state.same.register(name, id);
        super::insert_locked(state, cluster);
    }
}

/// Engages `cluster`, offered with a client of its own, as `state`'s
/// policy says: at once (its identity read meanwhile, unless ignored), or
/// once its identity is read.
pub(super) fn admit(state: &mut State, cluster: Cluster) {
    match state.same.policy {
        Duplicates::Ignore => super::insert_locked(state, cluster),
        Duplicates::Warn => {
            super::insert_locked(state, cluster.clone());
            read(state, cluster);
        }
        // Outside a runtime no identity can be read: it joins unchecked.
        Duplicates::EngageOnce if tokio::runtime::Handle::try_current().is_err() => {
            state.same.problems.report(
                source(cluster.name()),
                "engaged outside a tokio runtime: not checked for duplicates",
            );
            super::insert_locked(state, cluster);
        }
        Duplicates::EngageOnce => {
            if let Some(earlier) = state
                .same
                .pending
                .insert(cluster.name().clone(), cluster.clone())
            {
                earlier.leave();
            }
            read(state, cluster);
        }
    }
}

/// Reads `cluster`'s identity in a task of the caller's runtime, trying
/// again every second for up to 30 s, then records it in the fleet of
/// `state` (if that still stands and the cluster is still the one offered
/// under its name).
fn read(state: &mut State, cluster: Cluster) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let fleet = state.this.clone();
    let name = cluster.name().clone();
    let task = runtime.spawn(async move {
        let began = Instant::now();
        let read = loop {
            let left = IDENTITY_WAIT.saturating_sub(began.elapsed());
            let error = match tokio::time::timeout(left, cluster.identity()).await {
                Ok(Ok(identity)) => break Ok(identity),
                Ok(Err(error)) => error.to_string(),
                Err(_) => format!("no answer within {IDENTITY_WAIT:?}"),
            };
            if began.elapsed() + IDENTITY_RETRY >= IDENTITY_WAIT || !cluster.is_engaged() {
                break Err(error);
            }
            tokio::time::sleep(IDENTITY_RETRY).await;
        };
        let Some(fleet) = fleet.upgrade() else {
            return;
        };
        let mut state = lock(&fleet);
        found(&mut state, &cluster, read);
    });
    if let Some(earlier) = state.same.reading.insert(name, task.abort_handle()) {
        earlier.abort();
    }
}

fn found(state: &mut State, cluster: &Cluster, read: Result<ClusterIdentity, String>) {
    let name = cluster.name().clone();
    // Still the one engaged or waiting under its name.
    let offered = [state.clusters.get(&name), state.same.pending.get(&name)];
    if !offered
        .into_iter()
        .flatten()
        .any(|offered| offered.same_engagement(cluster))
    {
        return;
    }
    state.same.reading.remove(&name);
    let pending = state.same.pending.remove(&name);
    settle(state, &name, cluster, pending, read);
    engage_heirs(state);
}

/// What a read's outcome makes of `name`, offered as `cluster` (`pending`
/// if it waits to join).
fn settle(
    state: &mut State,
    name: &ClusterName,
    cluster: &Cluster,
    pending: Option<Cluster>,
    read: Result<ClusterIdentity, String>,
) {
    match read {
        Err(error) => state.same.problems.report(
            source(name),
            format!("its identity could not be read ({error}): not checked for duplicates"),
        ),
        Ok(identity) => {
            let id = identity.id().to_owned();
            let names = state.same.names.get(&id);
            let other = names.is_some_and(|names| names.iter().any(|n| n != name));
            let once = state.same.policy == Duplicates::EngageOnce;
            if once && other && *name != ClusterName::local() {
                tracing::debug!(cluster = %name, id = %id, how = %how(&identity), "the cluster is engaged under another name already: held back");
                if let Some(engaged) = state.clusters.remove(name) {
                    // The engagement this offer was to replace goes too.
                    engaged.leave();
                    state.publish(super::FleetEvent::Disengaged(name.clone()));
                }
                if let Some(earlier) = state.same.ids.get(name).cloned() {
                    state.same.unregister(name, &earlier);
                }
                state.same.held.push(Held {
                    name: name.clone(),
                    id: id.clone(),
                    client: cluster.reachability().client().clone(),
                });
                cluster.leave();
                state.same.tell(&id);
                return;
            }
            state.same.register(name.clone(), id);
        }
    }
    if let Some(pending) = pending {
        super::insert_locked(state, pending);
    }
}

/// How an identity was read, for the log.
fn how(identity: &ClusterIdentity) -> &'static str {
    match identity.source() {
        IdSource::ClusterProperty => "ClusterProperty cluster.clusterset.k8s.io",
        IdSource::KubeSystemNamespace => "the UID of namespace kube-system",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::Fleet;

    /// A client whose server never answers: identity reads wait, and the
    /// test settles them by hand.
    fn silent() -> kube::Client {
        let (service, handle) = tower_test::mock::pair::<
            http::Request<kube::client::Body>,
            http::Response<kube::client::Body>,
        >();
        std::mem::forget(handle);
        kube::Client::new(service, "default")
    }

    /// Settles the read under way of the cluster offered as `name`, as
    /// the cluster `id`.
    fn read_as(fleet: &Fleet, name: &str, id: &str) {
        let mut state = fleet.state();
        let name = ClusterName::from(name);
        let cluster = state
            .same
            .pending
            .get(&name)
            .or_else(|| state.clusters.get(&name))
            .cloned()
            .expect("offered");
        found(&mut state, &cluster, Ok(ClusterIdentity::of(id)));
    }

    fn engaged(fleet: &Fleet) -> Vec<String> {
        let mut names: Vec<String> = fleet
            .clusters()
            .iter()
            .map(|c| c.name().to_string())
            .collect();
        names.sort();
        names
    }

    #[tokio::test]
    async fn engaged_once_the_name_offered_again_keeps_its_place_and_the_held_one_follows_it() {
        let fleet = Fleet::with_config(crate::FleetConfig {
            duplicates: Duplicates::EngageOnce,
            ..crate::FleetConfig::default()
        });
        fleet.engage("a", silent());
        assert!(engaged(&fleet).is_empty(), "a waits for its identity");
        read_as(&fleet, "a", "x");
        fleet.engage("b", silent());
        read_as(&fleet, "b", "x");
        assert_eq!(engaged(&fleet), ["a"]);
        let duplicates = fleet.status().duplicates;
        assert_eq!(duplicates.len(), 1);
        assert_eq!(
            (duplicates[0].name.as_str(), duplicates[0].of.as_str()),
            ("b", "a")
        );
        assert!(!duplicates[0].engaged);

        // Offered again (its credentials rotated): a keeps its place while
        // the new offer is read, and b stays held back, even when another
        // cluster's read settles meanwhile.
        fleet.engage("a", silent());
        fleet.engage("c", silent());
        read_as(&fleet, "c", "y");
        assert_eq!(engaged(&fleet), ["a", "c"]);
        read_as(&fleet, "a", "x");
        assert_eq!(engaged(&fleet), ["a", "c"]);
        assert_eq!(fleet.status().duplicates.len(), 1);

        // a leaves: b takes its place, and nothing is reported any more.
        assert!(fleet.disengage("a"));
        assert_eq!(engaged(&fleet), ["b", "c"]);
        assert!(fleet.status().duplicates.is_empty());
        assert!(fleet.problems().current().is_empty());
    }

    #[tokio::test]
    async fn warned_both_names_are_engaged_and_reported_until_one_leaves() {
        let fleet = Fleet::new();
        fleet.engage("a", silent());
        fleet.engage("b", silent());
        assert_eq!(engaged(&fleet), ["a", "b"]);
        read_as(&fleet, "a", "x");
        read_as(&fleet, "b", "x");
        let problems = fleet.problems().current();
        assert!(
            problems[r#"cluster "b""#].contains(r#""a""#),
            "{problems:?}"
        );
        // Offered again: the same pair, the same report.
        fleet.engage("a", silent());
        read_as(&fleet, "a", "x");
        assert_eq!(fleet.status().duplicates[0].of.as_str(), "a");
        assert!(fleet.disengage("a"));
        assert!(fleet.status().duplicates.is_empty());
        assert!(fleet.problems().current().is_empty());
    }

    #[tokio::test]
    async fn the_local_cluster_is_never_held_back() {
        let fleet = Fleet::with_config(crate::FleetConfig {
            duplicates: Duplicates::EngageOnce,
            ..crate::FleetConfig::default()
        });
        fleet.engage("member", silent());
        read_as(&fleet, "member", "x");
        fleet.engage(ClusterName::local(), silent());
        read_as(&fleet, "", "x");
        assert_eq!(engaged(&fleet), ["", "member"]);
        assert_eq!(fleet.status().duplicates.len(), 1);
    }
}
