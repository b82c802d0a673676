//! The fleet: the engaged clusters, and the one place that changes them.

mod config;
mod duplicates;
mod set_aside;
mod status;

use std::{
    borrow::Borrow,
    collections::HashMap,
    fmt,
    hash::Hash,
    sync::{Arc, Mutex, MutexGuard, Weak},
};

use crate::client::{ClusterClient, RequestBudget};
use futures::{Stream, StreamExt};
use tokio::sync::mpsc;

use crate::{
    cache::{BudgetReport, HostView, InitialLists},
    cluster::Cluster,
    cluster_name::ClusterName,
    panic::lock,
    problems::Problems,
};
pub use config::FleetConfig;
use duplicates::Sameness;
pub use duplicates::{Duplicate, Duplicates};
use set_aside::Vigil;
pub use status::FleetStatus;

/// A change in the fleet, as controllers see it.
#[derive(Debug, Clone)]
pub enum FleetEvent {
    /// A cluster joined, or replaced an earlier cluster of the same name.
    Engaged(Cluster),
    /// A cluster left.
    Disengaged(ClusterName),
}

/// The engaged clusters at the moment of subscribing, and every change after.
#[derive(Debug)]
pub struct FleetSubscription {
    /// The clusters engaged when the subscription was made.
    pub clusters: Vec<Cluster>,
    /// Every later change, in order.
    pub events: mpsc::UnboundedReceiver<FleetEvent>,
}

/// The engaged clusters of a process.
///
/// Providers' events go in through [`run`](Self::run) (or
/// [`engage`](Self::engage) and [`disengage`](Self::disengage) from code);
/// controllers and reconcilers look clusters up with [`get`](Self::get) and
/// follow changes with [`subscribe`](Self::subscribe). Cheap to clone.
///
/// Engaging and disengaging take effect at once and in the order they are
/// made, so for every name the fleet is in the state of the last event about
/// it (with [`Duplicates::EngageOnce`], a new name joins once its
/// cluster's identity is read). A cluster is visible as soon as it is engaged; each controller then
/// starts its watches there and serves the cluster once they have synced
/// (see [`Controller::status`](crate::Controller::status)). A cluster that is
/// slow, unreachable or lacks a type thus holds up no other cluster, and no
/// controller that does not need what it lacks. At most
/// [`InitialLists::DEFAULT`] watches list at once across the fleet (see
/// [`FleetConfig::initial_lists`]), so engaging thousands
/// of clusters at once lists them a bounded number at a time.
///
/// ```no_run
/// # async fn example(client: kube::Client) {
/// use kube_multicluster::Fleet;
///
/// let fleet = Fleet::new();
/// let east = fleet.engage("east", client);
/// assert_eq!(fleet.get("east").unwrap().name(), "east");
/// assert!(fleet.disengage("east"));
/// assert!(!east.is_engaged());
/// # }
/// ```
#[derive(Clone)]
pub struct Fleet {
    inner: Arc<Mutex<State>>,
}

impl Default for Fleet {
    fn default() -> Self {
        Self {
            inner: Arc::new_cyclic(|this| Mutex::new(State::new(this.clone()))),
        }
    }
}

struct State {
    /// The fleet itself, for the tasks it starts (identity reads, the
    /// sweep), which hold it only weakly: they end with it.
    this: Weak<Mutex<State>>,
    clusters: HashMap<ClusterName, Cluster>,
    subscribers: Vec<mpsc::UnboundedSender<FleetEvent>>,
    /// The bound on lists in flight of the clusters engaged from now on.
    lists: InitialLists,
    /// The request budget of clusters engaged from now on without one of
    /// their own.
    budget: RequestBudget,
    /// What the fleet does on its own about its clusters' answers.
    vigil: Vigil,
    /// Which cluster each name is.
    same: Sameness,
}

impl State {
    fn new(this: Weak<Mutex<State>>) -> Self {
        Self {
            this,
            clusters: HashMap::new(),
            subscribers: Vec::new(),
            lists: InitialLists::new(InitialLists::DEFAULT),
            budget: RequestBudget::DEFAULT,
            vigil: Vigil::default(),
            same: Sameness::default(),
        }
    }

    fn publish(&mut self, event: FleetEvent) {
        self.subscribers.retain(|tx| tx.send(event.clone()).is_ok());
    }
}

impl fmt::Debug for Fleet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.state();
        let mut names: Vec<_> = state.clusters.keys().collect();
        names.sort();
        f.debug_struct("Fleet")
            .field("clusters", &names)
            .finish_non_exhaustive()
    }
}

impl Fleet {
    /// An empty fleet with the default [`FleetConfig`].
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty fleet that treats its clusters as `config` says, it and
    /// every clone of it.
    pub fn with_config(config: FleetConfig) -> Self {
        let fleet = Self::default();
        {
            let mut state = fleet.state();
            let problems = state.same.problems.clone();
            let report = move |source: &str, why: Option<String>| match why {
                Some(why) => problems.report(source, why),
                None => problems.clear(source),
            };
            let budget = config
                .cache_budget
                .map(|bytes| (bytes, Arc::new(report) as BudgetReport));
            state.lists = InitialLists::with_budget(config.initial_lists, budget);
            state.budget = config.request_budget;
            state.vigil.keep_alive = config.keep_alive;
            state.vigil.set_aside_after = config.set_aside_after;
            state.vigil.settling = config.settling;
            state.same.policy = config.duplicates;
        }
        fleet
    }

    /// How the fleet treats its clusters.
    pub fn config(&self) -> FleetConfig {
        let state = self.state();
        FleetConfig {
            initial_lists: state.lists.limit(),
            request_budget: state.budget,
            keep_alive: state.vigil.keep_alive,
            set_aside_after: state.vigil.set_aside_after,
            settling: state.vigil.settling,
            duplicates: state.same.policy,
            cache_budget: state.lists.cache_budget(),
        }
    }

    /// What the fleet can say of its clusters now: each one's health, the
    /// clusters set aside, the duplicates and the lists in flight.
    ///
    /// ```
    /// let fleet = kube_multicluster::Fleet::new();
    /// assert!(fleet.status().health.is_empty());
    /// ```
    pub fn status(&self) -> FleetStatus {
        let state = self.state();
        let clusters: Vec<Cluster> = state.clusters.values().cloned().collect();
        let aside = &state.vigil.set_aside;
        let mut health: Vec<_> = aside
            .iter()
            .map(|(name, aside)| (name.clone(), aside.health()))
            .collect();
        let mut set_aside: Vec<_> = aside.keys().cloned().collect();
        set_aside.sort();
        let damping = state.vigil.damping();
        let (duplicates, initial_lists) = (state.same.duplicates(), state.lists.clone());
        drop(state);
        // Each cluster's health is read outside the fleet's lock.
        health.extend(
            clusters
                .iter()
                .map(|cluster| (cluster.name().clone(), cluster.health())),
        );
        health.sort_by(|(a, _), (b, _)| a.cmp(b));
        FleetStatus {
            health,
            set_aside,
            damping,
            duplicates,
            initial_lists,
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.inner)
    }

    /// The lists bound and request budget a cluster engaged now is given.
    fn terms(&self) -> (InitialLists, RequestBudget) {
        let state = self.state();
        (state.lists.clone(), state.budget)
    }

    /// The engaged cluster of this name.
    pub fn get<Q>(&self, name: &Q) -> Option<Cluster>
    where
        ClusterName: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.state().clusters.get(name).cloned()
    }

    /// Every engaged cluster, in no particular order.
    pub fn clusters(&self) -> Vec<Cluster> {
        self.state().clusters.values().cloned().collect()
    }

    /// The engaged clusters now, and a channel of every change after.
    pub fn subscribe(&self) -> FleetSubscription {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut state = self.state();
        state.subscribers.push(tx);
        FleetSubscription {
            clusters: state.clusters.values().cloned().collect(),
            events: rx,
        }
    }

    /// Every cluster engaged from now on (a cluster engaged again under its
    /// name included), as it joins: to act when the fleet grows, such as
    /// reconciling every parent that should reach the newcomer with
    /// [`Controller::reconcile_all_on`](crate::Controller::reconcile_all_on).
    ///
    /// ```no_run
    /// # use futures::StreamExt;
    /// # use k8s_openapi::api::core::v1::ConfigMap;
    /// # use kube::runtime::watcher;
    /// # use kube_multicluster::{Controller, Fleet};
    /// # fn example(fleet: &Fleet) -> Controller<ConfigMap> {
    /// Controller::<ConfigMap>::new(fleet, watcher::Config::default())
    ///     .reconcile_all_on(fleet.engagements().map(|_| ()))
    /// # }
    /// ```
    pub fn engagements(&self) -> impl Stream<Item = Cluster> + Send + 'static {
        let events = tokio_stream::wrappers::UnboundedReceiverStream::new(self.subscribe().events);
        events.filter_map(|event| async move {
            match event {
                FleetEvent::Engaged(cluster) => Some(cluster),
                FleetEvent::Disengaged(_) => None,
            }
        })
    }

    /// Engages `name` through `client`; the cluster is visible at once
    /// (with [`Duplicates::EngageOnce`], once its identity is read and no
    /// other name serves the same cluster; until then the returned
    /// `Cluster` is not in the fleet, and if it is held back it is
    /// [disengaged](Cluster::disengaged)).
    ///
    /// Engaging a name that is engaged already replaces that cluster: the
    /// old one is [disengaged](Cluster::disengaged) (its watches stop once controllers
    /// let go of them) and controllers start over with the new one.
    /// Call it inside the tokio runtime that will use the client.
    pub fn engage(
        &self,
        name: impl Into<ClusterName>,
        client: impl Into<ClusterClient>,
    ) -> Cluster {
        let name = name.into();
        let (lists, budget) = self.terms();
        let cluster = Cluster::listing(name.clone(), client.into(), lists, budget);
        let mut state = self.state();
        self.offered(&mut state, &name);
        duplicates::admit(&mut state, cluster.clone());
        cluster
    }

    /// Engages (or replaces) the cluster `name` that is a part of a host
    /// (a namespace, or a logical cluster of a host split by annotation):
    /// see [`HostCache`](crate::cache::HostCache). Call it inside a tokio
    /// runtime. The parts of one host are one server's, by design: they
    /// are not checked for [duplicates](FleetConfig::duplicates). Its own
    /// watches' lists (of one namespace, split by annotation) count against
    /// the fleet's [initial lists](FleetConfig::initial_lists).
    pub fn engage_view(&self, name: impl Into<ClusterName>, view: HostView) -> Cluster {
        let name = name.into();
        let (lists, budget) = self.terms();
        let cluster = Cluster::viewing(name.clone(), &view, budget, lists);
        let mut state = self.state();
        self.offered(&mut state, &name);
        // A namespace of a host is not one of a cluster's names.
        duplicates::forget(&mut state, &name);
        insert_locked(&mut state, cluster.clone());
        duplicates::engage_heirs(&mut state);
        cluster
    }

    /// `name` is offered anew: what was known of it goes (a cluster set
    /// aside under it, its identity, its wait), and the sweep runs. A name
    /// engaged keeps its engagement until the new one replaces it.
    fn offered(&self, state: &mut State, name: &ClusterName) {
        set_aside::start(state);
        state.vigil.forget(name);
        duplicates::reoffer(state, name);
    }

    /// Disengages `name`: it is no longer visible, its reconciles are
    /// cancelled, and controllers stop its watches and forget its queued
    /// work. Returns whether the cluster was engaged. A cluster
    /// [set aside](FleetConfig::set_aside_after) under `name`, or waiting
    /// for its identity or held back as a
    /// [duplicate](FleetConfig::duplicates), is forgotten (and `true`
    /// returned).
    pub fn disengage<Q>(&self, name: &Q) -> bool
    where
        ClusterName: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let mut state = self.state();
        let engaged = state.clusters.get_key_value(name);
        let aside = state.vigil.set_aside.get_key_value(name);
        let waiting = || state.same.waiting(name);
        let known = engaged.map(|(name, _)| name.clone()).or_else(waiting);
        let Some(name) = known.or(aside.map(|(name, _)| name.clone())) else {
            return false;
        };
        if state.vigil.forget(&name) {
            tracing::info!(cluster = %name, "cluster set aside disengaged");
        }
        duplicates::forget(&mut state, &name);
        if let Some(cluster) = state.clusters.remove::<ClusterName>(&name) {
            cluster.leave();
            state.publish(FleetEvent::Disengaged(name.clone()));
            tracing::info!(cluster = %name, "cluster disengaged");
        }
        duplicates::engage_heirs(&mut state);
        true
    }

    /// What is wrong with the clusters as offered, under the source
    /// `cluster "<name>"`: a name that is a cluster engaged under another
    /// (engaged too, or held back; see
    /// [`FleetConfig::duplicates`]), or whose identity could
    /// not be read, so that it was not checked.
    ///
    /// ```
    /// let fleet = kube_multicluster::Fleet::new();
    /// assert!(fleet.problems().current().is_empty());
    /// ```
    pub fn problems(&self) -> Problems {
        self.state().same.problems.clone()
    }

    /// Applies a provider's events, in order, until its stream ends.
    ///
    /// A fleet may be filled by several providers at once: call `run` once
    /// per provider, each in its own task (or merge their streams with
    /// `futures::stream::select`). Each engage and disengage takes effect
    /// at once and in the order it is made, whichever provider makes it.
    /// Names are the providers' to keep apart: an engage under a name
    /// already engaged replaces that cluster. Providers whose names may
    /// collide (two kubeconfig directories, say) should be given distinct
    /// prefixes; the local cluster's name, [`ClusterName::local`], is the
    /// empty name and collides with no provider's. The usual pair is the local
    /// cluster, under [`ClusterName::local`], beside a provider's clusters,
    /// which a controller then tells apart with
    /// [`ClusterSelector::Local`](crate::controller::ClusterSelector::Local) and
    /// [`ClusterSelector::Provided`](crate::controller::ClusterSelector::Provided), for
    /// the whole controller or per watch
    /// ([`Watch::in_clusters`](crate::controller::Watch::in_clusters)).
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), kube::Error> {
    /// use kube_multicluster::{Fleet, provider::{LocalProvider, ProgrammaticProvider}};
    ///
    /// let fleet = Fleet::new();
    /// let local = LocalProvider::try_default().await?;
    /// let (members, handle) = ProgrammaticProvider::new();
    /// tokio::spawn({ let fleet = fleet.clone(); async move { fleet.run(local).await } });
    /// tokio::spawn({ let fleet = fleet.clone(); async move { fleet.run(members).await } });
    /// # drop(handle);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn run(&self, provider: impl Stream<Item = ClusterEvent>) {
        let mut provider = std::pin::pin!(provider);
        while let Some(event) = provider.next().await {
            match event {
                ClusterEvent::Engage { name, client } => {
                    self.engage(name, client);
                }
                ClusterEvent::EngageView { name, view } => {
                    self.engage_view(name, view);
                }
                ClusterEvent::Disengage { name } => {
                    self.disengage(&name);
                }
            }
        }
    }
}

/// Makes `cluster` the one engaged under its name, replacing any, and
/// tells the subscribers.
fn insert_locked(state: &mut State, cluster: Cluster) {
    let name = cluster.name().clone();
    if let Some(replaced) = state.clusters.insert(name.clone(), cluster.clone()) {
        replaced.leave();
        tracing::info!(cluster = %name, "cluster replaced");
    } else {
        tracing::info!(cluster = %name, "cluster engaged");
    }
    state.publish(FleetEvent::Engaged(cluster));
}

/// A change in the set of clusters a provider knows, as the fleet applies
/// it ([`Fleet::run`]).
#[derive(Clone)]
pub enum ClusterEvent {
    /// Engage the cluster `name` through `client`. Engaging a name that is
    /// already engaged replaces that cluster: its watches stop and new ones start.
    Engage {
        /// The cluster's name in the fleet.
        name: ClusterName,
        /// A client for it: a [`kube::Client`] built inside the tokio
        /// runtime (`client.into()`), or, one request queue and task
        /// lighter, a [`ClusterClient`] from
        /// [`cluster_client`](crate::client::cluster_client).
        client: ClusterClient,
    },
    /// Engage the cluster `name` that is one part of a host (a namespace,
    /// or a kcp logical cluster), read through the host's shared watches
    /// (see [`HostCache`](crate::cache::HostCache)). Replaces as `Engage`
    /// does.
    EngageView {
        /// The cluster's name in the fleet.
        name: ClusterName,
        /// The part and its host.
        view: HostView,
    },
    /// The cluster `name` has left: stop its watches and forget its work.
    Disengage {
        /// The cluster's name in the fleet.
        name: ClusterName,
    },
}

impl std::fmt::Debug for ClusterEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Engage { name, .. } => f
                .debug_struct("Engage")
                .field("name", name)
                .finish_non_exhaustive(),
            Self::EngageView { name, view } => f
                .debug_struct("EngageView")
                .field("name", name)
                .field("view", view)
                .finish(),
            Self::Disengage { name } => f.debug_struct("Disengage").field("name", name).finish(),
        }
    }
}
