//! One type, read across every engaged cluster, with indexes.

use std::{
    collections::{HashMap, HashSet},
    fmt,
    sync::{Arc, Mutex, Weak},
};

use futures::StreamExt;
use kube::runtime::reflector::ObjectRef;
use tokio::task::AbortHandle;
use tokio_stream::StreamMap;

use crate::{
    cache::{Change, SharedWatch, Subscription, WatchState, Watchable},
    cluster::Cluster,
    cluster_name::ClusterName,
    controller::{Watch, watch::Resolved},
    fleet::{Fleet, FleetEvent},
    panic::lock,
    request::ObjectKey,
};

/// An object and the cluster it lives in.
#[derive(Debug)]
pub struct InCluster<K> {
    /// The cluster's name.
    pub cluster: ClusterName,
    /// The object, shared with the cluster's cache.
    pub object: Arc<K>,
}

impl<K> Clone for InCluster<K> {
    fn clone(&self) -> Self {
        Self {
            cluster: self.cluster.clone(),
            object: self.object.clone(),
        }
    }
}

type Extract<K> = Arc<dyn Fn(&K) -> Vec<String> + Send + Sync>;

/// One index: each object's values, and the objects of each value.
struct Index<K> {
    extract: Extract<K>,
    of: HashMap<ClusterName, HashMap<ObjectKey, Vec<String>>>,
    by_value: HashMap<String, HashSet<(ClusterName, ObjectKey)>>,
}

impl<K> Index<K> {
    fn put(&mut self, cluster: &ClusterName, object: &K)
    where
        K: kube::Resource,
    {
        let key = ObjectKey::of(object);
        self.remove(cluster, &key);
        let mut values = (self.extract)(object);
        values.sort();
        values.dedup();
        for value in &values {
            self.by_value
                .entry(value.clone())
                .or_default()
                .insert((cluster.clone(), key.clone()));
        }
        if !values.is_empty() {
            self.of
                .entry(cluster.clone())
                .or_default()
                .insert(key, values);
        }
    }

    fn remove(&mut self, cluster: &ClusterName, key: &ObjectKey) {
        let Some(objects) = self.of.get_mut(cluster) else {
            return;
        };
        let Some(values) = objects.remove(key) else {
            return;
        };
        if objects.is_empty() {
            self.of.remove(cluster);
        }
        let entry = (cluster.clone(), key.clone());
        for value in values {
            if let Some(set) = self.by_value.get_mut(&value) {
                set.remove(&entry);
                if set.is_empty() {
                    self.by_value.remove(&value);
                }
            }
        }
    }

    fn forget(&mut self, cluster: &ClusterName) {
        let keys: Vec<ObjectKey> = self
            .of
            .get(cluster)
            .map(|objects| objects.keys().cloned().collect())
            .unwrap_or_default();
        for key in keys {
            self.remove(cluster, &key);
        }
    }
}

struct State<K: Watchable> {
    /// The watch in each engaged cluster the store reads.
    watches: HashMap<ClusterName, (Cluster, Arc<SharedWatch<K>>)>,
    indexes: HashMap<String, Index<K>>,
    /// The task that follows the fleet and the watches' changes.
    task: Option<AbortHandle>,
}

struct Inner<K: Watchable> {
    watch: Resolved<K>,
    state: Mutex<State<K>>,
}

impl<K: Watchable> Drop for Inner<K> {
    fn drop(&mut self) {
        if let Some(task) = lock(&self.state).task.take() {
            task.abort();
        }
    }
}

impl<K: Watchable> Inner<K> {
    fn selects(&self, name: &ClusterName) -> bool {
        self.watch.clusters().is_none_or(|c| c.selects(name))
    }
}

/// One type read across every engaged cluster's cache: each object with its
/// cluster's name, and indexes by any value of an object (a field, a label,
/// an owner), as multicluster-runtime's `IndexField` gives.
///
/// A store follows the fleet: it reads the shared watch of its type in every
/// cluster the [`Watch`] selects (by default every cluster), started there
/// if no controller runs it, and shared with every controller that watches
/// the type the same way (same configuration, namespace and transform), so
/// it costs no second watch. A cluster is read from once it joins and has
/// synced, and forgotten when it leaves. A cluster that cannot sync (a
/// missing CRD, a server that does not answer) holds nothing up: its objects
/// are simply not there, and [`unsynced`](Self::unsynced) names it. Reads
/// never wait and never copy an object: each is the `Arc` the cache holds.
///
/// The store learns of clusters from the fleet a moment after they are
/// engaged (the store's own task follows the fleet), so a reconciler in a
/// cluster that has just joined may not find that cluster in the store yet;
/// read that cluster's own watch for its objects. Clones share one store;
/// dropping the last stops its task and lets go of its watches (each stops
/// when nothing else holds it). Create it inside a tokio runtime.
///
/// ```no_run
/// use k8s_openapi::api::core::v1::Pod;
/// use kube::runtime::watcher;
/// use kube_multicluster::{Fleet, fleetwide::FleetStore};
///
/// # fn example(fleet: Fleet) {
/// let pods = FleetStore::<Pod>::new(&fleet, watcher::Config::default()).with_index(
///     "spec.nodeName",
///     |pod| pod.spec.as_ref().and_then(|s| s.node_name.clone()).into_iter().collect(),
/// );
/// for pod in pods.indexed("spec.nodeName", "node-1").unwrap_or_default() {
///     println!("{}/{:?}", pod.cluster, pod.object.metadata.name);
/// }
/// println!("{} pods across {} clusters", pods.list().len(), pods.clusters().len());
/// # }
/// ```
pub struct FleetStore<K: Watchable> {
    inner: Arc<Inner<K>>,
}

impl<K: Watchable> Clone for FleetStore<K> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<K: Watchable> fmt::Debug for FleetStore<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = lock(&self.inner.state);
        let mut clusters: Vec<_> = state.watches.keys().collect();
        clusters.sort();
        let mut indexes: Vec<_> = state.indexes.keys().collect();
        indexes.sort();
        f.debug_struct("FleetStore")
            .field("kind", &K::kind(self.inner.watch.dyntype()))
            .field("clusters", &clusters)
            .field("indexes", &indexes)
            .finish()
    }
}

/// Why a [`FleetStore`] could not be made: its watch was built wrong.
#[derive(Debug, thiserror::Error)]
#[error("a fleet store of {kind} cannot be made: {reason}")]
pub struct InvalidWatch {
    kind: &'static str,
    reason: String,
}

impl<K: Watchable> FleetStore<K> {
    /// A store of `K` objects, watched as `watch` says, in every engaged
    /// cluster (or those the [`Watch`] selects). Panics if `watch` is built
    /// wrong (a dynamic type without its resource, a transform of another
    /// type); [`try_new`](Self::try_new) returns that as an error.
    pub fn new(fleet: &Fleet, watch: impl Into<Watch>) -> Self {
        Self::try_new(fleet, watch).unwrap_or_else(|error| panic!("{error}"))
    }

    /// A store of `K` objects, or why `watch` cannot give one.
    pub fn try_new(fleet: &Fleet, watch: impl Into<Watch>) -> Result<Self, InvalidWatch> {
        let watch = Resolved::<K>::from(watch.into()).map_err(|reason| InvalidWatch {
            kind: std::any::type_name::<K>(),
            reason,
        })?;
        let inner = Arc::new(Inner {
            watch,
            state: Mutex::new(State {
                watches: HashMap::new(),
                indexes: HashMap::new(),
                task: None,
            }),
        });
        let subscription = fleet.subscribe();
        let mut subscriptions = StreamMap::new();
        for cluster in subscription.clusters {
            engage(&inner, cluster, &mut subscriptions);
        }
        let task = tokio::spawn(follow(
            Arc::downgrade(&inner),
            subscription.events,
            subscriptions,
        ));
        lock(&inner.state).task = Some(task.abort_handle());
        Ok(Self { inner })
    }

    /// Adds an index named `name`: `extract` gives the values an object is
    /// found under (none, one or several). Objects already held are
    /// indexed at once, and every change after. Adding an index under a
    /// name in use replaces it.
    #[must_use]
    pub fn with_index(
        self,
        name: impl Into<String>,
        extract: impl Fn(&K) -> Vec<String> + Send + Sync + 'static,
    ) -> Self {
        let mut index = Index {
            extract: Arc::new(extract),
            of: HashMap::new(),
            by_value: HashMap::new(),
        };
        let mut state = lock(&self.inner.state);
        for (name, (_, watch)) in &state.watches {
            for object in watch.store().state() {
                index.put(name, &object);
            }
        }
        state.indexes.insert(name.into(), index);
        drop(state);
        self
    }

    /// Every object held, in every cluster whose watch has listed.
    pub fn list(&self) -> Vec<InCluster<K>> {
        self.list_where(|_| true)
    }

    /// The objects held for which `keep` holds, in every cluster whose
    /// watch has listed.
    pub(crate) fn list_where(&self, keep: impl Fn(&K) -> bool) -> Vec<InCluster<K>> {
        // Read outside the lock, which the task that follows the fleet needs.
        self.per_watch(|cluster, watch| Some((cluster.clone(), watch.store())))
            .into_iter()
            .flat_map(|(cluster, store)| {
                store
                    .state()
                    .into_iter()
                    .filter(|object| keep(object))
                    .map(move |object| InCluster {
                        cluster: cluster.clone(),
                        object,
                    })
            })
            .collect()
    }

    /// The objects held in the cluster `cluster`; `None` if the store does
    /// not read that cluster (not engaged, not selected, or not yet seen).
    pub fn in_cluster(&self, cluster: &str) -> Option<Vec<Arc<K>>> {
        let store = {
            let state = lock(&self.inner.state);
            state.watches.get(cluster)?.1.store()
        };
        Some(store.state())
    }

    /// The object `key` in the cluster `cluster`, if held.
    pub fn get(&self, cluster: &str, key: &ObjectKey) -> Option<Arc<K>> {
        let state = lock(&self.inner.state);
        let (_, watch) = state.watches.get(cluster)?;
        watch.store().get(&self.object_ref(key))
    }

    /// The objects found under `value` in the index `index`, in every
    /// cluster; `None` if there is no index of that name.
    ///
    /// An index follows the clusters' stores a moment behind them: the
    /// store's task indexes each change after the store has it, so a
    /// reconcile that a change woke may read the index before that change
    /// is in it. Where that matters (deleting what an index no longer
    /// lists, say), read [`list`](Self::list) or
    /// [`in_cluster`](Self::in_cluster), which are current.
    pub fn indexed(&self, index: &str, value: &str) -> Option<Vec<InCluster<K>>> {
        let state = lock(&self.inner.state);
        let found = state.indexes.get(index)?;
        let Some(keys) = found.by_value.get(value) else {
            return Some(Vec::new());
        };
        Some(
            keys.iter()
                .filter_map(|(cluster, key)| {
                    let (_, watch) = state.watches.get(cluster)?;
                    let object = watch.store().get(&self.object_ref(key))?;
                    Some(InCluster {
                        cluster: cluster.clone(),
                        object,
                    })
                })
                .collect(),
        )
    }

    /// Whether the store reads (or will read, once it is engaged) the
    /// cluster `name`: whether its [`Watch`] selects it.
    pub fn reads(&self, name: &ClusterName) -> bool {
        self.inner.selects(name)
    }

    /// The clusters the store reads, with the state of its watch in each.
    pub fn clusters(&self) -> Vec<(ClusterName, WatchState)> {
        self.per_watch(|name, watch| Some((name.clone(), watch.state())))
    }

    /// The clusters the store reads whose watch has not synced: their
    /// objects are missing (or partial) in every read.
    pub fn unsynced(&self) -> Vec<ClusterName> {
        self.per_watch(|name, watch| (!watch.has_synced()).then(|| name.clone()))
    }

    /// Completes once the watches of every cluster the store reads now have
    /// synced. A cluster that cannot sync keeps it waiting: bound it with a
    /// timeout, and see [`unsynced`](Self::unsynced).
    pub async fn synced(&self) {
        let watches = self.per_watch(|_, watch| Some(watch.clone()));
        futures::future::join_all(watches.iter().map(|w| w.synced())).await;
    }

    /// What `each` gives for each cluster the store reads and its watch,
    /// under the lock.
    fn per_watch<T>(
        &self,
        each: impl Fn(&ClusterName, &Arc<SharedWatch<K>>) -> Option<T>,
    ) -> Vec<T> {
        let state = lock(&self.inner.state);
        let watches = state.watches.iter();
        watches
            .filter_map(|(name, (_, watch))| each(name, watch))
            .collect()
    }

    fn object_ref(&self, key: &ObjectKey) -> ObjectRef<K> {
        let object = ObjectRef::new_with(&key.name, self.inner.watch.dyntype().clone());
        match &key.namespace {
            Some(namespace) => object.within(namespace),
            None => object,
        }
    }
}

/// Starts reading `cluster`, if the store selects it.
fn engage<K: Watchable>(
    inner: &Inner<K>,
    cluster: Cluster,
    subscriptions: &mut StreamMap<ClusterName, Subscription<K>>,
) {
    let name = cluster.name().clone();
    if !inner.selects(&name) || !cluster.is_engaged() {
        return;
    }
    let watch = inner.watch.watch_in(&cluster);
    subscriptions.insert(name.clone(), watch.subscribe());
    let mut state = lock(&inner.state);
    for index in state.indexes.values_mut() {
        index.forget(&name);
    }
    state.watches.insert(name, (cluster, watch));
}

fn disengage<K: Watchable>(
    inner: &Inner<K>,
    name: &ClusterName,
    subscriptions: &mut StreamMap<ClusterName, Subscription<K>>,
) {
    let mut state = lock(&inner.state);
    // A name engaged again already: this event ended an older engagement.
    if state
        .watches
        .get(name)
        .is_some_and(|(cluster, _)| cluster.is_engaged())
    {
        return;
    }
    subscriptions.remove(name);
    state.watches.remove(name);
    for index in state.indexes.values_mut() {
        index.forget(name);
    }
}

/// Follows the fleet and every read watch's changes, keeping the indexes.
async fn follow<K: Watchable>(
    inner: Weak<Inner<K>>,
    mut events: tokio::sync::mpsc::UnboundedReceiver<FleetEvent>,
    mut subscriptions: StreamMap<ClusterName, Subscription<K>>,
) {
    loop {
        tokio::select! {
            event = events.recv() => {
                let Some(inner) = inner.upgrade() else { return };
                match event {
                    Some(FleetEvent::Engaged(cluster)) => engage(&inner, cluster, &mut subscriptions),
                    Some(FleetEvent::Disengaged(name)) => disengage(&inner, &name, &mut subscriptions),
                    None => return,
                }
            }
            Some((cluster, change)) = subscriptions.next(), if !subscriptions.is_empty() => {
                let Some(inner) = inner.upgrade() else { return };
                let mut state = lock(&inner.state);
                for index in state.indexes.values_mut() {
                    match &change {
                        Change::Listed(object) | Change::Applied(object) => index.put(&cluster, object),
                        Change::Deleted(object) => index.remove(&cluster, &ObjectKey::of(object.as_ref())),
                    }
                }
            }
        }
    }
}
