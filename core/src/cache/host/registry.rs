//! The watches of one cluster, one per type, namespace and configuration,
//! shared by every caller.

use std::{
    any::{Any, TypeId},
    collections::HashMap,
    fmt,
    sync::{Arc, Mutex, Weak, atomic::AtomicBool},
};

use futures::StreamExt;
use kube::{
    Resource,
    runtime::{reflector::Store, watcher},
};

use super::{HostCache, HostView};
use crate::cache::{
    Shape, SharedWatch, TypeInfo, Watchable, initial_list, is_namespaced, permits::InitialLists,
    scope, selects::Scope, state::WatchStatus, watch::WatchProbe,
};
use crate::{
    client::{LazyClient, Reachability, Writes, Written},
    cluster_name::ClusterName,
    panic::lock,
};

#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub(in crate::cache) struct WatchKey {
    /// The watched type (`PartialObjectMeta<K>` for a metadata watch).
    type_id: TypeId,
    /// Whether objects keep their `managedFields`, and the identity of the
    /// transform they go through.
    shape: (bool, Option<u64>),
    /// The type information of a dynamic type (its `ApiResource`).
    dynamic: String,
    /// The namespace the watch is limited to; `None` for all.
    namespace: Option<String>,
    /// The `watcher::Config`, so that watches with different selectors or
    /// list semantics are different watches; its initial list strategy only
    /// as far as it changes how the watch lists.
    config: String,
}

pub(in crate::cache) type Watches = HashMap<WatchKey, Held>;

/// A watch as the cache holds it, without keeping it alive: by its type,
/// to hand it out again, and by its health.
pub(in crate::cache) struct Held {
    watch: Weak<dyn Any + Send + Sync>,
    probe: Weak<dyn WatchProbe>,
    /// What it holds; `None` for a watch that never holds anything (a
    /// namespace view's watch of another namespace).
    scope: Option<Scope>,
}

impl Held {
    fn is_live(&self) -> bool {
        self.watch.strong_count() > 0
    }
}

/// Where a watch lives, as one cluster sees it, and what feeds it.
enum Place<'a> {
    /// In the host's own cache, in all namespaces: a cluster-scoped kind,
    /// for a namespace of a host.
    Host(&'a ClusterCache),
    /// Here, a watch of its own, through this cluster's client.
    Own,
    /// Here, a part of the host's one watch.
    Part(&'a HostCache, &'a str),
    /// Here, fed nothing: a namespace of the host this cluster does not see.
    Nothing,
}

/// The watches and stores of one engaged cluster, shared by every controller.
///
/// A type is watched once per cluster and watch configuration: the first
/// caller starts the watch, later ones get the same [`SharedWatch`] and read
/// the same [`Store`]. The cache does not keep watches alive by itself: a
/// watch stops when the last controller or subscription holding it lets go,
/// and the next caller starts a fresh one.
pub struct ClusterCache {
    pub(in crate::cache) cluster: ClusterName,
    pub(in crate::cache) client: LazyClient,
    pub(in crate::cache) watches: Mutex<Watches>,
    pub(in crate::cache) lists: Arc<initial_list::ListMode>,
    /// The fleet's bound on lists in flight.
    pub(in crate::cache) permits: InitialLists,
    /// For a part of a host engaged as a cluster: the host, whose watches
    /// it reads its part of, and the part (a namespace, split by namespace).
    pub(in crate::cache) view: Option<(HostCache, String)>,
    /// What reconciles wrote through the cluster's client and its watches
    /// have not shown yet: the host's, for a namespace of a host.
    pub(in crate::cache) writes: Arc<Writes>,
    /// Changes each time the cluster answers again after it did not: its
    /// failing watches then retry at once.
    pub(in crate::cache) recoveries: Option<tokio::sync::watch::Receiver<u64>>,
}

impl fmt::Debug for ClusterCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClusterCache")
            .field("cluster", &self.cluster)
            .field("watches", &self.watch_count())
            .finish_non_exhaustive()
    }
}

impl ClusterCache {
    /// The cache of `cluster`, its lists bounded by `permits`, whose
    /// failing watches retry at once when `reachability` says the cluster
    /// answers again.
    pub(crate) fn new(
        cluster: ClusterName,
        client: impl Into<LazyClient>,
        permits: InitialLists,
        writes: Arc<Writes>,
        reachability: &Reachability,
    ) -> Self {
        Self {
            cluster,
            client: client.into(),
            watches: Mutex::new(HashMap::new()),
            lists: Arc::default(),
            permits,
            view: None,
            writes,
            recoveries: Some(reachability.recoveries()),
        }
    }

    /// The cache of the cluster that is `view`'s part of its host, whose
    /// client is `client`. Its watches are the host's, under the host's
    /// bound on lists; its own (of one namespace, split by annotation) go
    /// through `client` under `permits`.
    pub(crate) fn of_view(
        cluster: ClusterName,
        view: &HostView,
        client: LazyClient,
        permits: InitialLists,
    ) -> Self {
        Self {
            view: Some((view.host().clone(), view.part().to_owned())),
            ..Self::new(
                cluster,
                client,
                permits,
                view.writes().clone(),
                view.host().reachability(),
            )
        }
    }

    /// The cache that holds cluster-scoped kinds for this cluster: its
    /// host's, for a namespace of a host; itself otherwise.
    pub(crate) fn whole(&self) -> &ClusterCache {
        match self.namespace_of() {
            Some((host, _)) => host.cache(),
            None => self,
        }
    }

    /// The host and namespace, for a namespace of a host.
    fn namespace_of(&self) -> Option<(&HostCache, &str)> {
        self.view
            .as_ref()
            .filter(|(host, _)| host.by_namespace())
            .map(|(host, namespace)| (host, namespace.as_str()))
    }

    /// What reconciles wrote through the cluster's client and its watches
    /// have not shown yet.
    pub(crate) fn writes(&self) -> &Arc<Writes> {
        &self.writes
    }

    /// The namespace of its host this cluster is, if it is one (of a
    /// [`HostCache`] split by namespace).
    pub fn view_namespace(&self) -> Option<&str> {
        self.namespace_of().map(|(_, namespace)| namespace)
    }

    /// The part of its host this cluster is, if it is one: its namespace,
    /// or its annotation's value (see [`SplitBy`](super::SplitBy)).
    pub fn view_part(&self) -> Option<&str> {
        self.view.as_ref().map(|(_, part)| part.as_str())
    }

    /// The shared watch of `K` objects in all namespaces with this
    /// configuration, started now if none runs here.
    pub fn watch<K>(&self, config: &watcher::Config) -> Arc<SharedWatch<K>>
    where
        K: Watchable<DynamicType = ()>,
    {
        self.watch_with(&(), None, config)
    }

    /// The shared watch of `K` objects described by `dyntype` (`&()` for a
    /// typed `K`; `DynamicObject` with its
    /// [`ApiResource`](kube::core::ApiResource), say) in `namespace` (all
    /// namespaces for `None`, and for a cluster-scoped `K`) with this
    /// configuration, started now if none runs here. A watch of one
    /// namespace needs read rights in that namespace only; give one only
    /// for a namespaced kind (the type cannot tell for `DynamicObject`; a
    /// controller checks it with the scope its `Watch` was given). For
    /// metadata only (the types a controller needs only to key on: owner
    /// references, labels), watch
    /// [`PartialObjectMeta<K>`](kube::core::PartialObjectMeta). A
    /// resource of version `*` (from
    /// [`Watch::discover`](crate::controller::Watch::discover)) is watched at
    /// the version this cluster's discovery finds.
    ///
    /// ```no_run
    /// # fn example(cluster: kube_multicluster::Cluster) {
    /// use kube::{api::{ApiResource, DynamicObject, GroupVersionKind}, runtime::watcher};
    ///
    /// let widgets = ApiResource::from_gvk(&GroupVersionKind::gvk("example.com", "v1", "Widget"));
    /// let watch = cluster
    ///     .cache()
    ///     .watch_with::<DynamicObject>(&widgets, None, &watcher::Config::default());
    /// # }
    /// ```
    pub fn watch_with<K: Watchable>(
        &self,
        dyntype: &K::DynamicType,
        namespace: Option<&str>,
        config: &watcher::Config,
    ) -> Arc<SharedWatch<K>> {
        self.watch_shaped(dyntype, namespace, &Shape::default(), config)
    }

    /// [`watch_with`](Self::watch_with), with objects shaped as `shape`
    /// says (a separate watch from one shaped otherwise).
    pub(crate) fn watch_shaped<K: Watchable>(
        &self,
        dyntype: &K::DynamicType,
        namespace: Option<&str>,
        shape: &Shape,
        config: &watcher::Config,
    ) -> Arc<SharedWatch<K>> {
        let (namespace, place) = self.place::<K>(namespace);
        if let Place::Host(cache) = place {
            return cache.watch_shaped(dyntype, None, shape, config);
        }
        let holds = !matches!(place, Place::Nothing);
        self.shared(holds, shape, dyntype, namespace, config, || match place {
            Place::Part(host, own) => {
                host.part::<K>(dyntype, own, shape, config, &self.cluster, &self.writes)
            }
            Place::Own | Place::Host(_) => {
                let queued = Arc::<AtomicBool>::default();
                SharedWatch::start(
                    self.cluster.clone(),
                    dyntype.clone(),
                    self.events::<K>(dyntype, namespace, shape, config, queued.clone()),
                    queued,
                    self.writes.clone(),
                    self.recoveries.clone(),
                )
            }
            Place::Nothing => {
                let nothing =
                    futures::stream::iter([Ok(watcher::Event::Init), Ok(watcher::Event::InitDone)])
                        .chain(futures::stream::pending());
                SharedWatch::start(
                    self.cluster.clone(),
                    dyntype.clone(),
                    nothing,
                    Arc::default(),
                    Arc::default(),
                    None,
                )
            }
        })
    }

    /// Where the watch of `K` objects in `namespace` (all for `None`) lives
    /// for this cluster, and the namespace it is held under here.
    fn place<'a, K: Resource>(
        &'a self,
        namespace: Option<&'a str>,
    ) -> (Option<&'a str>, Place<'a>) {
        let namespace = scope::<K>(namespace);
        match &self.view {
            None => (namespace, Place::Own),
            // Split by annotation: every kind, in all namespaces; in one
            // namespace, a watch of its own, through its own client.
            Some((host, own)) if !host.by_namespace() => match namespace {
                None => (None, Place::Part(host, own)),
                Some(_) => (namespace, Place::Own),
            },
            // Not split by namespace: the host's own.
            Some((host, _)) if !is_namespaced::<K>() => (None, Place::Host(host.cache())),
            Some((host, own)) => match namespace {
                // Another namespace, which this cluster does not see.
                Some(other) if other != own => (namespace, Place::Nothing),
                // Its own namespace, whether named or not.
                _ => (Some(own), Place::Part(host, own)),
            },
        }
    }

    /// The watch of `K` objects in all namespaces with this configuration,
    /// if one runs here; unlike [`watch`](Self::watch), never starts one.
    /// Finds only watches whose objects are cached as [`watch`](Self::watch)
    /// caches them: not a controller's watch given a
    /// [`Transform`](crate::cache::Transform) or told to keep `managedFields`.
    pub fn find<K>(&self, config: &watcher::Config) -> Option<Arc<SharedWatch<K>>>
    where
        K: Watchable<DynamicType = ()>,
    {
        self.find_with(&(), None, config)
    }

    /// The watch of `K` objects described by `dyntype`, in `namespace`,
    /// with this configuration, if one runs here; never starts one.
    pub fn find_with<K: Watchable>(
        &self,
        dyntype: &K::DynamicType,
        namespace: Option<&str>,
        config: &watcher::Config,
    ) -> Option<Arc<SharedWatch<K>>> {
        let (namespace, place) = self.place::<K>(namespace);
        if let Place::Host(cache) = place {
            return cache.find_with(dyntype, None, config);
        }
        let key = watch_key::<K>(&Shape::default(), dyntype, namespace, config);
        let watch = lock(&self.watches).get(&key)?.watch.upgrade()?;
        watch.downcast::<SharedWatch<K>>().ok()
    }

    /// The store of the one watch of `K` objects that runs in this cluster,
    /// whatever its configuration (a label selector, a namespace, a
    /// transform): a controller's watch of its own type, say. `None` if no
    /// watch of `K` runs here, and if several do (two controllers watch
    /// `K` with different selectors, say): then name the one you mean with
    /// [`find`](Self::find) or [`find_with`](Self::find_with) and its
    /// configuration. A watch of `K`'s metadata only is another type
    /// (`PartialObjectMeta<K>`), not counted here.
    ///
    /// ```no_run
    /// # fn example(cluster: kube_multicluster::Cluster) {
    /// use k8s_openapi::api::core::v1::ConfigMap;
    /// use kube::runtime::watcher;
    ///
    /// // The only watch of ConfigMaps here: a controller's, with its selector.
    /// let marked = cluster.cache().store::<ConfigMap>();
    /// // With several, each by its configuration.
    /// let selected = watcher::Config::default().labels("kube-multicluster.dev/quickstart=true");
    /// let marked = cluster.cache().find::<ConfigMap>(&selected).map(|watch| watch.store());
    /// # }
    /// ```
    pub fn store<K: Watchable<DynamicType = ()>>(&self) -> Option<Store<K>> {
        let type_id = TypeId::of::<K>();
        let cache = match self.place::<K>(None).1 {
            // A namespace of a host: its cluster-scoped kinds are the host's.
            Place::Host(host) => host,
            _ => self,
        };
        let mut found = lock(&cache.watches)
            .iter()
            .filter(|(key, held)| key.type_id == type_id && held.scope.is_some())
            .filter_map(|(_, held)| held.watch.upgrade())
            .collect::<Vec<_>>()
            .into_iter();
        match (found.next(), found.next()) {
            (Some(only), None) => only.downcast::<SharedWatch<K>>().ok().map(|w| w.store()),
            _ => None,
        }
    }

    /// How many watches run in this cluster now.
    pub fn watch_count(&self) -> usize {
        lock(&self.watches)
            .values()
            .filter(|held| held.is_live())
            .count()
    }

    /// The watch of this key, started now if none runs here; one that
    /// `holds` objects or not (a namespace of the host this cluster does not
    /// see).
    fn shared<T>(
        &self,
        holds: bool,
        shape: &Shape,
        dyntype: &T::DynamicType,
        namespace: Option<&str>,
        config: &watcher::Config,
        start: impl FnOnce() -> SharedWatch<T>,
    ) -> Arc<SharedWatch<T>>
    where
        T: Resource<DynamicType: TypeInfo> + Clone + Send + Sync + 'static,
    {
        // Keyed by the watched type: for metadata watches it is
        // `PartialObjectMeta<K>`, a type of its own, so the keys never clash.
        let key = watch_key::<T>(shape, dyntype, namespace, config);
        let mut watches = lock(&self.watches);
        if let Some(existing) = watches.get(&key).and_then(|held| held.watch.upgrade())
            && let Ok(existing) = existing.downcast::<SharedWatch<T>>()
        {
            return existing;
        }
        // Forget watches that nobody holds any more.
        watches.retain(|_, held| held.is_live());
        let watch = Arc::new(start());
        let held = Held {
            watch: Arc::downgrade(&watch) as Weak<dyn Any + Send + Sync>,
            probe: Arc::downgrade(&watch) as Weak<dyn WatchProbe>,
            scope: holds.then(|| Scope::of::<T>(dyntype, namespace, config)),
        };
        watches.insert(key, held);
        watch
    }

    /// Whether a watch of this cluster that holds the object `written`
    /// wrote has yet to show the write. A watch that has not synced or
    /// fails is not waited for: it lists everything when it comes back.
    pub(crate) fn awaits(&self, written: &Written) -> bool {
        // Read out of the lock: the store is read for each. A watch holds
        // the object if its selectors select it as written, or if it holds
        // it now (the write takes it out of the selection: the watch then
        // shows it deleted).
        let probes: Vec<_> = lock(&self.watches)
            .values()
            .filter_map(|held| {
                let scope = held.scope.as_ref().filter(|s| s.covers(written))?;
                Some((scope.selects(written), held.probe.upgrade()?))
            })
            .collect();
        let here = probes.iter().any(|(selects, probe)| {
            probe.has_synced()
                && probe.failure().is_none()
                && (*selects || probe.holds(written))
                && !probe.shows(written)
        });
        here || self
            .namespace_of()
            .is_some_and(|(host, _)| host.cache().awaits(written))
    }

    /// Whether a watch of this cluster (synced or not yet) holds objects
    /// of the resource `written` wrote, in any namespace: else
    /// read-your-writes cannot wait for its writes of that resource here.
    pub(crate) fn holds_resource(&self, written: &Written) -> bool {
        lock(&self.watches).values().any(|held| {
            held.is_live() && held.scope.as_ref().is_some_and(|s| s.of_resource(written))
        }) || self
            .namespace_of()
            .is_some_and(|(host, _)| host.cache().holds_resource(written))
    }

    /// The watches started here that fail now, for health: each fails
    /// until it hears something again, or its retry's request was answered
    /// and it ran a second without failing.
    pub(crate) fn failing(&self) -> Vec<WatchStatus> {
        // Read out of the lock: a watch let go meanwhile ends here.
        let probes: Vec<_> = lock(&self.watches)
            .values()
            .filter_map(|held| held.probe.upgrade())
            .collect();
        probes.iter().filter_map(|probe| probe.failure()).collect()
    }

    /// The watches of this cluster whose first list waits for room in the
    /// fleet's cache budget, each as its kind and why.
    pub(crate) fn waiting_for_room(&self) -> Vec<String> {
        let prefix = format!("cluster {:?}: ", self.cluster.as_str());
        self.permits
            .waiting_for_room()
            .into_iter()
            .filter_map(|(source, need)| {
                let what = source.strip_prefix(&prefix)?;
                Some(format!(
                    "{what}: its first list (at least {need} bytes) waits for room in the cache budget"
                ))
            })
            .collect()
    }
}

pub(in crate::cache) fn watch_key<T: Resource<DynamicType: TypeInfo> + 'static>(
    shape: &Shape,
    dyntype: &T::DynamicType,
    namespace: Option<&str>,
    config: &watcher::Config,
) -> WatchKey {
    WatchKey {
        type_id: TypeId::of::<T>(),
        shape: shape.key(),
        dynamic: format!("{dyntype:?}"),
        namespace: namespace.map(str::to_owned),
        // Watches that list the same way (streamed or paged) share, whichever
        // way their configuration asked for it.
        config: format!(
            "{:?}",
            watcher::Config {
                initial_list_strategy: if initial_list::wants_streaming(config) {
                    watcher::InitialListStrategy::StreamingList
                } else {
                    watcher::InitialListStrategy::ListWatch
                },
                ..config.clone()
            }
        ),
    }
}
