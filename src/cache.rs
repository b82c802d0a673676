//! A cluster's cache: one shared watch per type (and watch configuration),
//! whatever the number of controllers that read it.

use std::{
    any::{Any, TypeId},
    collections::HashMap,
    fmt,
    hash::Hash,
    sync::{Arc, Mutex, MutexGuard},
};

use futures::{Stream, StreamExt};
use kube::{
    Api, Client, Resource,
    core::PartialObjectMeta,
    runtime::{
        WatchStreamExt,
        reflector::{self, ObjectRef, Store},
        watcher::{self, Event},
    },
};
use serde::de::DeserializeOwned;
use tokio::{
    sync::{mpsc, watch},
    task::AbortHandle,
};

use crate::ClusterName;

/// What a shared watch needs of a type: a static Kubernetes resource.
pub trait Watchable:
    Resource<DynamicType = ()> + Clone + DeserializeOwned + fmt::Debug + Send + Sync + 'static
{
}

impl<K> Watchable for K where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + fmt::Debug + Send + Sync + 'static
{
}

/// Whether objects of kind `K` live in namespaces.
///
/// ```
/// use k8s_openapi::api::core::v1::{ConfigMap, Node};
///
/// assert!(kube_fleet::cache::is_namespaced::<ConfigMap>());
/// assert!(!kube_fleet::cache::is_namespaced::<Node>());
/// ```
pub fn is_namespaced<K: Resource>() -> bool {
    // `Resource::Scope` need not be 'static, so no TypeId: its name tells.
    std::any::type_name::<K::Scope>() != std::any::type_name::<kube::core::ClusterResourceScope>()
}

#[derive(Clone, PartialEq, Eq, Hash, Debug)]
struct WatchKey {
    type_id: TypeId,
    metadata_only: bool,
    /// The whole `watcher::Config`, so that watches with different selectors
    /// or list semantics are different watches.
    config: String,
}

/// The watches and stores of one engaged cluster, shared by every controller.
///
/// A type is watched once per cluster and watch configuration: the first
/// controller that needs it starts the watch, later ones subscribe to the same
/// stream and read the same [`Store`]. The watch stops when the cluster is
/// disengaged and no controller holds it any more.
pub struct ClusterCache {
    cluster: ClusterName,
    client: Client,
    watches: Mutex<HashMap<WatchKey, Arc<dyn Any + Send + Sync>>>,
}

impl fmt::Debug for ClusterCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClusterCache")
            .field("cluster", &self.cluster)
            .field("watches", &self.watches().len())
            .finish_non_exhaustive()
    }
}

impl ClusterCache {
    pub(crate) fn new(cluster: ClusterName, client: Client) -> Self {
        Self {
            cluster,
            client,
            watches: Mutex::new(HashMap::new()),
        }
    }

    fn watches(&self) -> MutexGuard<'_, HashMap<WatchKey, Arc<dyn Any + Send + Sync>>> {
        self.watches.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The shared watch of `K` objects with this configuration, started now
    /// if this cluster had none.
    pub fn watch<K: Watchable>(&self, config: &watcher::Config) -> Arc<SharedWatch<K>> {
        self.shared(false, config, || {
            watcher::watcher(Api::<K>::all(self.client.clone()), config.clone())
        })
    }

    /// The shared watch of `K`'s metadata only, started now if needed: for
    /// types a controller needs only to key on (owner references, labels).
    pub fn watch_metadata<K: Watchable>(
        &self,
        config: &watcher::Config,
    ) -> Arc<SharedWatch<PartialObjectMeta<K>>> {
        self.shared(true, config, || {
            watcher::watcher(
                Api::<PartialObjectMeta<K>>::all(self.client.clone()),
                config.clone(),
            )
        })
    }

    /// The watch of `K` objects with this configuration, if one runs here;
    /// unlike [`watch`](Self::watch), never starts one.
    pub fn find<K: Watchable>(&self, config: &watcher::Config) -> Option<Arc<SharedWatch<K>>> {
        let key = watch_key::<K>(false, config);
        let watch = self.watches().get(&key)?.clone();
        watch.downcast::<SharedWatch<K>>().ok()
    }

    /// The store of `K` objects watched with the default configuration, if a
    /// controller watches them in this cluster.
    pub fn store<K: Watchable>(&self) -> Option<Store<K>> {
        self.find::<K>(&watcher::Config::default())
            .map(|w| w.store())
    }

    /// How many watches this cluster runs.
    pub fn watch_count(&self) -> usize {
        self.watches().len()
    }

    fn shared<T, S>(
        &self,
        metadata_only: bool,
        config: &watcher::Config,
        stream: impl FnOnce() -> S,
    ) -> Arc<SharedWatch<T>>
    where
        T: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
        S: Stream<Item = watcher::Result<Event<T>>> + Send + 'static,
    {
        // Keyed by the watched type `K`; for metadata watches `T` is
        // `PartialObjectMeta<K>`, a type of its own, so the keys never clash.
        let key = watch_key::<T>(metadata_only, config);
        let mut watches = self.watches();
        if let Some(existing) = watches.get(&key)
            && let Ok(existing) = existing.clone().downcast::<SharedWatch<T>>()
        {
            return existing;
        }
        let watch = Arc::new(SharedWatch::start(self.cluster.clone(), stream()));
        watches.insert(key, watch.clone());
        watch
    }
}

fn watch_key<T: 'static>(metadata_only: bool, config: &watcher::Config) -> WatchKey {
    WatchKey {
        type_id: TypeId::of::<T>(),
        metadata_only,
        config: format!("{config:?}"),
    }
}

/// A change a shared watch reports to its subscribers.
#[derive(Debug)]
pub enum Change<K> {
    /// The object was created or updated, or listed when the watch (re)started.
    Applied(Arc<K>),
    /// The object was deleted; this is its last known state.
    Deleted(Arc<K>),
}

impl<K> Clone for Change<K> {
    fn clone(&self) -> Self {
        match self {
            Self::Applied(object) => Self::Applied(object.clone()),
            Self::Deleted(object) => Self::Deleted(object.clone()),
        }
    }
}

impl<K> Change<K> {
    /// The object, whether applied or deleted.
    pub fn object(&self) -> &Arc<K> {
        match self {
            Self::Applied(object) | Self::Deleted(object) => object,
        }
    }
}

type Subscribers<K> = Arc<Mutex<Vec<mpsc::UnboundedSender<Change<K>>>>>;

/// One watch of one type in one cluster: its store, and a stream of changed
/// objects for each subscriber.
///
/// Subscribers get the same `Arc` that the store holds; objects are never
/// copied per controller. A subscriber's channel is unbounded, so a slow
/// controller never holds up the watch or the other controllers.
pub struct SharedWatch<K: Resource<DynamicType = ()> + 'static> {
    store: Store<K>,
    subscribers: Subscribers<K>,
    /// Becomes true after the first complete list. `Store::wait_until_ready`
    /// wakes only the last of several concurrent waiters, and a fleet and its
    /// controllers wait on the same watch at once.
    synced: watch::Receiver<bool>,
    task: AbortHandle,
}

impl<K: Resource<DynamicType = ()> + Clone> fmt::Debug for SharedWatch<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedWatch")
            .field("kind", &K::kind(&()))
            .field("objects", &self.store.len())
            .finish_non_exhaustive()
    }
}

impl<K: Resource<DynamicType = ()>> Drop for SharedWatch<K> {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl<K> SharedWatch<K>
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    fn start<S>(cluster: ClusterName, events: S) -> Self
    where
        S: Stream<Item = watcher::Result<Event<K>>> + Send + 'static,
    {
        let (store, mut writer) = reflector::store::<K>();
        let subscribers: Subscribers<K> = Arc::default();
        let fan_out = subscribers.clone();
        let reader = store.clone();
        let (synced_tx, synced) = watch::channel(false);
        // Without a backoff the watcher retries an unreachable cluster in a hot loop.
        let events = events.default_backoff();
        let task = tokio::spawn(async move {
            let mut events = std::pin::pin!(events);
            while let Some(event) = events.next().await {
                let event = match event {
                    Ok(event) => event,
                    Err(error) => {
                        tracing::warn!(cluster = %cluster, kind = %K::kind(&()), %error, "watch failed; retrying with backoff");
                        continue;
                    }
                };
                // On a (re)list, objects that vanished get no Delete event:
                // remember what was there to tell subscribers afterwards.
                let before = matches!(event, Event::InitDone).then(|| reader.state());
                writer.apply_watcher_event(&event);
                if matches!(event, Event::InitDone) {
                    synced_tx.send_replace(true);
                }
                let changed: Vec<Change<K>> = match event {
                    Event::Apply(object) => reader
                        .get(&ObjectRef::from_obj(&object))
                        .map(Change::Applied)
                        .into_iter()
                        .collect(),
                    Event::Delete(object) => vec![Change::Deleted(Arc::new(object))],
                    Event::InitDone => {
                        let mut changed: Vec<_> =
                            reader.state().into_iter().map(Change::Applied).collect();
                        changed.extend(
                            before
                                .into_iter()
                                .flatten()
                                .filter(|old| reader.get(&ObjectRef::from_obj(old.as_ref())).is_none())
                                .map(Change::Deleted),
                        );
                        changed
                    }
                    Event::Init | Event::InitApply(_) => Vec::new(),
                };
                if !changed.is_empty() {
                    let mut subscribers = fan_out.lock().unwrap_or_else(|e| e.into_inner());
                    subscribers.retain(|tx| changed.iter().all(|o| tx.send(o.clone()).is_ok()));
                }
            }
        })
        .abort_handle();
        Self {
            store,
            subscribers,
            synced,
            task,
        }
    }

    /// The cache of every object this watch has seen.
    pub fn store(&self) -> Store<K> {
        self.store.clone()
    }

    /// Every change from now on: objects applied or deleted, every object
    /// listed when the watch (re)starts, and objects that vanished during a
    /// relist as deletions.
    ///
    /// Objects already in the store are not replayed: read them from
    /// [`store`](Self::store) after subscribing.
    pub fn subscribe(&self) -> mpsc::UnboundedReceiver<Change<K>> {
        let (tx, rx) = mpsc::unbounded_channel();
        self.subscribers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(tx);
        rx
    }

    /// Whether the first list has completed.
    pub fn is_synced(&self) -> bool {
        *self.synced.borrow()
    }

    /// Waits until the first list has completed, so that the store holds
    /// everything the cluster had.
    pub async fn synced(&self) {
        // The sender lives in the watch task, which this watch keeps alive.
        let _ = self.synced.clone().wait_for(|synced| *synced).await;
    }
}
