//! A cluster's cache: one shared watch per type (and watch configuration),
//! whatever the number of controllers that read it.
//!
//! [`ClusterCache::watch`] starts a [`SharedWatch`] the first time a type is
//! asked for and hands the same one to every later caller. Each caller that
//! wants to hear of changes takes a [`Subscription`]: a stream of the objects
//! that changed, merged per object while it has not read them, so a slow
//! reader costs memory in proportion to the objects, never to the versions
//! it missed. A watch lives as long as someone holds it (a controller, a
//! subscription): the last one to let go stops it at the API server.
//!
//! ```no_run
//! # async fn example(cluster: kube_fleet::Cluster) {
//! use futures::StreamExt;
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use kube::runtime::watcher;
//! use kube_fleet::cache::{Change, WatchState};
//!
//! let watch = cluster.cache().watch::<ConfigMap>(&watcher::Config::default());
//! let mut changes = watch.subscribe();
//! watch.synced().await;
//! assert_eq!(watch.state(), WatchState::Synced);
//! while let Some(change) = changes.next().await {
//!     match change {
//!         Change::Listed(cm) | Change::Applied(cm) => println!("{:?} is there", cm.metadata.name),
//!         Change::Deleted(cm) => println!("{:?} is gone", cm.metadata.name),
//!     }
//! }
//! # }
//! ```

mod scoped;
mod state;
mod subscription;
mod watch;

use std::{
    any::{Any, TypeId},
    collections::HashMap,
    fmt,
    sync::{Arc, Mutex, MutexGuard, Weak},
};

use futures::{Stream, StreamExt};
use kube::{
    Api, Client, Resource,
    core::PartialObjectMeta,
    runtime::{reflector::Store, watcher},
};
use serde::de::DeserializeOwned;

pub use state::{WatchState, WatchStatus};
pub use subscription::{Change, Subscription};
pub use watch::SharedWatch;
pub(crate) use watch::WatchProbe;

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
    /// The namespace the watch is limited to; `None` for all.
    namespace: Option<String>,
    /// The whole `watcher::Config`, so that watches with different selectors
    /// or list semantics are different watches.
    config: String,
}

type Watches = HashMap<WatchKey, Weak<dyn Any + Send + Sync>>;

/// The watches and stores of one engaged cluster, shared by every controller.
///
/// A type is watched once per cluster and watch configuration: the first
/// caller starts the watch, later ones get the same [`SharedWatch`] and read
/// the same [`Store`]. The cache does not keep watches alive by itself: a
/// watch stops when the last controller or subscription holding it lets go,
/// and the next caller starts a fresh one.
pub struct ClusterCache {
    cluster: ClusterName,
    client: Client,
    watches: Mutex<Watches>,
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
    pub(crate) fn new(cluster: ClusterName, client: Client) -> Self {
        Self {
            cluster,
            client,
            watches: Mutex::new(HashMap::new()),
        }
    }

    fn watches(&self) -> MutexGuard<'_, Watches> {
        self.watches.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The shared watch of `K` objects in all namespaces with this
    /// configuration, started now if none runs here.
    pub fn watch<K: Watchable>(&self, config: &watcher::Config) -> Arc<SharedWatch<K>> {
        self.watch_in(None, config)
    }

    /// The shared watch of `K` objects in `namespace` (all namespaces for
    /// `None`, and for a cluster-scoped `K`) with this configuration, started
    /// now if none runs here. A watch of one namespace needs read rights in
    /// that namespace only.
    pub fn watch_in<K: Watchable>(
        &self,
        namespace: Option<&str>,
        config: &watcher::Config,
    ) -> Arc<SharedWatch<K>> {
        let namespace = scope::<K>(namespace);
        self.shared(false, namespace, config, || match namespace {
            Some(namespace) => {
                scoped::objects::<K>(self.client.clone(), namespace, config.clone()).boxed()
            }
            None => watcher::watcher(Api::<K>::all(self.client.clone()), config.clone()).boxed(),
        })
    }

    /// The shared watch of `K`'s metadata only, in all namespaces, started
    /// now if needed: for types a controller needs only to key on (owner
    /// references, labels).
    pub fn watch_metadata<K: Watchable>(
        &self,
        config: &watcher::Config,
    ) -> Arc<SharedWatch<PartialObjectMeta<K>>> {
        self.watch_metadata_in(None, config)
    }

    /// Like [`watch_metadata`](Self::watch_metadata), in `namespace` only
    /// (see [`watch_in`](Self::watch_in)).
    pub fn watch_metadata_in<K: Watchable>(
        &self,
        namespace: Option<&str>,
        config: &watcher::Config,
    ) -> Arc<SharedWatch<PartialObjectMeta<K>>> {
        let namespace = scope::<K>(namespace);
        self.shared(true, namespace, config, || match namespace {
            Some(namespace) => {
                scoped::metadata::<K>(self.client.clone(), namespace, config.clone()).boxed()
            }
            None => watcher::watcher(
                Api::<PartialObjectMeta<K>>::all(self.client.clone()),
                config.clone(),
            )
            .boxed(),
        })
    }

    /// The watch of `K` objects in all namespaces with this configuration,
    /// if one runs here; unlike [`watch`](Self::watch), never starts one.
    pub fn find<K: Watchable>(&self, config: &watcher::Config) -> Option<Arc<SharedWatch<K>>> {
        self.find_in(None, config)
    }

    /// The watch of `K` objects in `namespace` with this configuration, if
    /// one runs here; never starts one.
    pub fn find_in<K: Watchable>(
        &self,
        namespace: Option<&str>,
        config: &watcher::Config,
    ) -> Option<Arc<SharedWatch<K>>> {
        let key = watch_key::<K>(false, scope::<K>(namespace), config);
        let watch = self.watches().get(&key)?.upgrade()?;
        watch.downcast::<SharedWatch<K>>().ok()
    }

    /// The store of `K` objects watched with the default configuration, if a
    /// controller watches them in this cluster.
    pub fn store<K: Watchable>(&self) -> Option<Store<K>> {
        self.find::<K>(&watcher::Config::default())
            .map(|w| w.store())
    }

    /// How many watches run in this cluster now.
    pub fn watch_count(&self) -> usize {
        self.watches()
            .values()
            .filter(|w| w.strong_count() > 0)
            .count()
    }

    fn shared<T, S>(
        &self,
        metadata_only: bool,
        namespace: Option<&str>,
        config: &watcher::Config,
        stream: impl FnOnce() -> S,
    ) -> Arc<SharedWatch<T>>
    where
        T: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
        S: Stream<Item = watcher::Result<watcher::Event<T>>> + Send + 'static,
    {
        // Keyed by the watched type `K`; for metadata watches `T` is
        // `PartialObjectMeta<K>`, a type of its own, so the keys never clash.
        let key = watch_key::<T>(metadata_only, namespace, config);
        let mut watches = self.watches();
        if let Some(existing) = watches.get(&key).and_then(Weak::upgrade)
            && let Ok(existing) = existing.downcast::<SharedWatch<T>>()
        {
            return existing;
        }
        // Forget watches that nobody holds any more.
        watches.retain(|_, w| w.strong_count() > 0);
        let watch = Arc::new(SharedWatch::start(
            self.cluster.clone(),
            metadata_only,
            stream(),
        ));
        let weak: Weak<dyn Any + Send + Sync> = Arc::downgrade(&watch) as _;
        watches.insert(key, weak);
        watch
    }
}

fn watch_key<T: 'static>(
    metadata_only: bool,
    namespace: Option<&str>,
    config: &watcher::Config,
) -> WatchKey {
    WatchKey {
        type_id: TypeId::of::<T>(),
        metadata_only,
        namespace: namespace.map(str::to_owned),
        config: format!("{config:?}"),
    }
}

/// The namespace a watch of `K` is limited to: none for a cluster-scoped
/// type, whatever was asked.
fn scope<K: Resource>(namespace: Option<&str>) -> Option<&str> {
    namespace.filter(|_| is_namespaced::<K>())
}

/// An error and every error beneath it, as one line: `a: b: c`.
///
/// A TLS failure reads as what went wrong (an unknown CA, say), not only as
/// the outermost `client error (Connect)`.
pub(crate) fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        // Many errors repeat their source in their own message.
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::error_chain;

    #[derive(Debug, thiserror::Error)]
    #[error("client error (Connect)")]
    struct Outer(#[source] Inner);

    #[derive(Debug, thiserror::Error)]
    #[error("invalid peer certificate: UnknownIssuer")]
    struct Inner;

    #[test]
    fn an_error_chain_names_the_root_cause() {
        assert_eq!(
            error_chain(&Outer(Inner)),
            "client error (Connect): invalid peer certificate: UnknownIssuer"
        );
    }
}
