//! The fleet: the engaged clusters, and the one place that changes them.

use std::{
    borrow::Borrow,
    collections::HashMap,
    fmt,
    hash::Hash,
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use futures::{
    Stream, StreamExt,
    future::{BoxFuture, join_all},
    stream::FuturesUnordered,
};
use kube::Client;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::{Cluster, ClusterName, cache::ClusterCache, provider::ClusterEvent};

/// How long an engage waits for its caches to sync before it says so in a
/// warning (it keeps waiting; see [`Fleet::engage`]).
pub const DEFAULT_SYNC_WARNING: Duration = Duration::from_secs(30);

/// A change in the fleet, as controllers see it.
#[derive(Debug, Clone)]
pub enum FleetEvent {
    /// A cluster joined, or replaced an earlier cluster of the same name. Its
    /// caches have synced.
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

/// Starts (or finds) a watch in a cluster's cache; the future ends once the
/// watch has synced.
pub(crate) type StartWatch = Arc<dyn Fn(&ClusterCache) -> BoxFuture<'static, ()> + Send + Sync>;

/// A watch that a controller needs in every cluster it selects, started
/// by the fleet before the cluster becomes visible.
pub(crate) struct Requirement {
    pub(crate) selects: Arc<dyn Fn(&ClusterName) -> bool + Send + Sync>,
    pub(crate) start: StartWatch,
}

/// The engaged clusters of a process.
///
/// Providers' events go in through [`run`](Self::run) (or
/// [`engage`](Self::engage) and [`disengage`](Self::disengage) from code);
/// controllers and reconcilers look clusters up with [`get`](Self::get) and
/// follow changes with [`subscribe`](Self::subscribe). Cheap to clone.
///
/// A cluster is engaged in this order: its client is given, the watches that
/// running controllers need are started, the fleet waits until they have
/// synced, and only then does the cluster become visible. Engages run
/// concurrently, so one slow or unreachable cluster delays no other.
///
/// ```no_run
/// # async fn example(client: kube::Client) {
/// use kube_fleet::{ClusterName, Fleet};
///
/// let fleet = Fleet::new();
/// fleet.engage("east", client).await;
/// let east = fleet.get("east").expect("engaged");
/// assert_eq!(east.name(), "east");
/// assert!(fleet.disengage("east"));
/// # }
/// ```
#[derive(Clone)]
pub struct Fleet {
    inner: Arc<Inner>,
}

struct Inner {
    state: Mutex<State>,
    sync_warning: Duration,
}

#[derive(Default)]
struct State {
    clusters: HashMap<ClusterName, Cluster>,
    /// Engages under way, by name, with a generation that tells a superseded
    /// engage (the name was disengaged or engaged again meanwhile) to give up.
    engaging: HashMap<ClusterName, Engaging>,
    generation: u64,
    subscribers: Vec<mpsc::UnboundedSender<FleetEvent>>,
    requirements: Vec<(u64, Requirement)>,
    next_requirement: u64,
}

/// An engage under way: its number, and how to tell it to give up.
struct Engaging {
    generation: u64,
    cancel: CancellationToken,
}

/// Removes an engage's entry when the engage ends in any way, including by
/// its future being dropped.
struct EngagingGuard<'a> {
    fleet: &'a Fleet,
    name: ClusterName,
    generation: u64,
}

impl Drop for EngagingGuard<'_> {
    fn drop(&mut self) {
        let mut state = self.fleet.state();
        if state
            .engaging
            .get(&self.name)
            .is_some_and(|e| e.generation == self.generation)
        {
            state.engaging.remove(&self.name);
        }
    }
}

/// Keeps a [`Requirement`] registered; dropping it withdraws it.
pub(crate) struct RequirementGuard {
    fleet: Fleet,
    id: u64,
}

impl Drop for RequirementGuard {
    fn drop(&mut self) {
        let id = self.id;
        self.fleet.state().requirements.retain(|(i, _)| *i != id);
    }
}

impl fmt::Debug for Fleet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.state();
        let mut names: Vec<_> = state.clusters.keys().collect();
        names.sort();
        f.debug_struct("Fleet")
            .field("clusters", &names)
            .field("engaging", &state.engaging.len())
            .finish_non_exhaustive()
    }
}

impl Default for Fleet {
    fn default() -> Self {
        Self::new()
    }
}

impl Fleet {
    /// An empty fleet.
    pub fn new() -> Self {
        Self::with_sync_warning(DEFAULT_SYNC_WARNING)
    }

    /// An empty fleet that warns when a cluster's caches have not synced
    /// within `after` (default [`DEFAULT_SYNC_WARNING`], at least one second),
    /// and again each time that long passes.
    pub fn with_sync_warning(after: Duration) -> Self {
        Self {
            inner: Arc::new(Inner {
                state: Mutex::default(),
                sync_warning: after,
            }),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.inner.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The engaged cluster of this name.
    pub fn get<Q>(&self, name: &Q) -> Option<Cluster>
    where
        ClusterName: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.state().clusters.get(name).cloned()
    }

    /// Whether an engage of this name is under way: the cluster is known but
    /// not yet visible, because its caches have not synced.
    pub fn is_engaging<Q>(&self, name: &Q) -> bool
    where
        ClusterName: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.state().engaging.contains_key(name)
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

    /// Registers a watch to start in every selected cluster before it becomes
    /// visible. Clusters engaged already are the controller's to handle.
    pub(crate) fn require(&self, requirement: Requirement) -> RequirementGuard {
        let mut state = self.state();
        state.next_requirement += 1;
        let id = state.next_requirement;
        state.requirements.push((id, requirement));
        RequirementGuard {
            fleet: self.clone(),
            id,
        }
    }

    /// Engages `name` through `client` and returns once it is visible, or
    /// `None` if a later engage or a disengage of the same name superseded it.
    ///
    /// The watches that controllers need are started first, and the cluster
    /// becomes visible only when all of them have synced: a reconciler never
    /// sees a cluster with a half-filled cache. An unreachable cluster thus
    /// stays pending (with a warning every [`DEFAULT_SYNC_WARNING`]) until it
    /// answers or is disengaged.
    pub async fn engage(&self, name: impl Into<ClusterName>, client: Client) -> Option<Cluster> {
        let name = name.into();
        let cluster = Cluster::new(name.clone(), client);
        let cancel = CancellationToken::new();
        let (generation, syncs) = {
            let mut state = self.state();
            state.generation += 1;
            let generation = state.generation;
            let engaging = Engaging {
                generation,
                cancel: cancel.clone(),
            };
            if let Some(superseded) = state.engaging.insert(name.clone(), engaging) {
                superseded.cancel.cancel();
            }
            let syncs: Vec<_> = state
                .requirements
                .iter()
                .map(|(_, r)| r)
                .filter(|r| (r.selects)(&name))
                .map(|r| (r.start)(cluster.cache()))
                .collect();
            (generation, syncs)
        };
        let _guard = EngagingGuard {
            fleet: self,
            name: name.clone(),
            generation,
        };

        let mut synced = std::pin::pin!(join_all(syncs));
        let started = tokio::time::Instant::now();
        let warn_every = self.inner.sync_warning.max(Duration::from_secs(1));
        loop {
            tokio::select! {
                _ = &mut synced => break,
                () = cancel.cancelled() => return None,
                () = tokio::time::sleep(warn_every) => {
                    tracing::warn!(cluster = %name, waited = ?started.elapsed(), "cluster's caches have not synced; it stays invisible until they do");
                }
            }
        }

        let mut state = self.state();
        if cancel.is_cancelled() {
            return None;
        }
        state.clusters.insert(name.clone(), cluster.clone());
        let event = FleetEvent::Engaged(cluster.clone());
        state
            .subscribers
            .retain(|tx| tx.send(event.clone()).is_ok());
        tracing::info!(cluster = %name, "cluster engaged");
        Some(cluster)
    }

    /// Disengages `name`: it is no longer visible, controllers stop its
    /// watches and forget its queued work, and an engage of it that is still
    /// under way gives up. Returns whether the cluster was engaged or engaging.
    pub fn disengage<Q>(&self, name: &Q) -> bool
    where
        ClusterName: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let mut state = self.state();
        let was_engaging = match state.engaging.remove(name) {
            Some(engaging) => {
                engaging.cancel.cancel();
                true
            }
            None => false,
        };
        let Some((name, _)) = state.clusters.remove_entry(name) else {
            return was_engaging;
        };
        let event = FleetEvent::Disengaged(name.clone());
        state
            .subscribers
            .retain(|tx| tx.send(event.clone()).is_ok());
        tracing::info!(cluster = %name, "cluster disengaged");
        true
    }

    /// Applies a provider's events until its stream ends.
    ///
    /// Engages run concurrently; an engage still waiting for its caches is
    /// cancelled when the same name is disengaged or engaged again.
    pub async fn run(&self, provider: impl Stream<Item = ClusterEvent>) {
        let mut provider = std::pin::pin!(provider.fuse());
        let mut engaging = FuturesUnordered::new();
        loop {
            tokio::select! {
                event = provider.next() => match event {
                    // A newer engage or a disengage of the same name makes an
                    // engage under way give up by itself.
                    Some(ClusterEvent::Engage { name, client }) => engaging.push(self.engage(name, client)),
                    Some(ClusterEvent::Disengage { name }) => {
                        self.disengage(&name);
                    }
                    None => break,
                },
                Some(_) = engaging.next(), if !engaging.is_empty() => {}
            }
        }
        // The provider has ended; let the engages under way finish.
        while engaging.next().await.is_some() {}
    }
}
