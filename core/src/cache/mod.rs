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
//! Cached objects carry no `metadata.managedFields` (a controller's
//! [`Watch::keep_managed_fields`](crate::controller::Watch::keep_managed_fields)
//! keeps them), and a [`Transform`] given to a controller's watch
//! ([`Watch::transform`](crate::controller::Watch::transform)) drops more.
//!
//! A watch whose `watcher::Config` accepts a list from the API server's
//! cache (`any_semantic()`, or `streaming_lists()`) lists what is there by a
//! *streaming list*: the API server sends the objects as events on the watch
//! itself (`sendInitialEvents=true`), with no LIST request and no page held
//! on either side. kube's default, `ListSemantic::MostRecent`, is a
//! consistent read, which kube's streaming list is not (it reads at resource
//! version `0`, which may be older than what was seen before, and after a
//! relist a store could go back in time), so such watches list in pages of
//! the configuration's `page_size`, as before. An API server whose
//! `WatchList` feature is off refuses a streaming list with `422 Invalid`, as
//! do API servers before Kubernetes 1.27: the watch then lists in pages, and
//! so does every later watch in that cluster. A streaming list that ends
//! before it is complete starts again from nothing: one that ran until its
//! watch timed out (a large list over a slow link), or two in a row cut
//! short, make that watch list in consistent pages for the rest of its life. A configuration without bookmarks (`disable_bookmarks`)
//! always lists in pages: bookmarks mark where a streaming list ends.
//!
//! While a watch lists again (after its watch expired, say), at most two
//! full copies of its objects are alive: the store as it was, which readers
//! go on reading, and the new list, which replaces it at once when complete.
//! Paged lists add one page (500 objects by default) being decoded.
//! Subscribers hold no copies: they read the store's `Arc`s.
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

pub(crate) mod discovery;
mod host;
mod initial_list;
pub(crate) use sealed::Sealed;
mod scoped;
mod state;
mod subscription;
mod transform;
mod watch;

use std::{
    any::{Any, TypeId},
    collections::HashMap,
    fmt,
    sync::{Arc, Mutex, MutexGuard, Weak},
};

use futures::{Stream, StreamExt, stream::BoxStream};
use kube::{
    Api, Client, Resource,
    core::{ApiResource, PartialObjectMeta},
    runtime::{reflector::Store, watcher},
};
use serde::de::DeserializeOwned;

pub use host::{HostCache, NamespaceView};
pub use state::{WatchState, WatchStatus};
pub use subscription::{Change, Subscription};
pub(crate) use transform::Shape;
pub use transform::Transform;
pub use watch::SharedWatch;
pub(crate) use watch::{Lookup, WatchProbe};

use crate::{cluster_name::ClusterName, panic::contain};

/// What a shared watch needs of a type: a Kubernetes resource, either
/// static (`k8s-openapi` and `kube-derive` types, whose type information is
/// `()`) or dynamic (`DynamicObject` and other types described at run time
/// by an [`ApiResource`]).
pub trait Watchable:
    Resource<DynamicType: TypeInfo> + Clone + DeserializeOwned + fmt::Debug + Send + Sync + 'static
{
}

impl<K> Watchable for K where
    K: Resource<DynamicType: TypeInfo>
        + Clone
        + DeserializeOwned
        + fmt::Debug
        + Send
        + Sync
        + 'static
{
}

/// The type information a watched type carries: `()` for static types,
/// [`ApiResource`] for dynamic ones. Sealed: these two are all kube has.
pub trait TypeInfo:
    Clone + Eq + std::hash::Hash + fmt::Debug + Send + Sync + Unpin + 'static + sealed::Sealed
{
    /// The type information a [`Watch`](crate::controller::Watch) gives, if
    /// it gives what this type needs: nothing for static types, an
    /// `ApiResource` for dynamic ones.
    fn from_watch(resource: Option<&ApiResource>) -> Option<Self>;
}

impl TypeInfo for () {
    fn from_watch(_: Option<&ApiResource>) -> Option<Self> {
        Some(())
    }
}

impl TypeInfo for ApiResource {
    fn from_watch(resource: Option<&ApiResource>) -> Option<Self> {
        resource.cloned()
    }
}

mod sealed {
    use kube::core::ApiResource;

    pub trait Sealed: Sized {
        /// Whether the type is described at run time (so a watch's scope
        /// counts for it).
        const DYNAMIC: bool = false;

        /// The group, kind and namespacedness to find by discovery in each
        /// cluster, for a stand-in resource of any version.
        fn to_discover(&self) -> Option<(&str, &str, bool)> {
            None
        }

        /// This type's information for a resource discovery found.
        fn resolved(_: ApiResource) -> Option<Self> {
            None
        }
    }

    impl Sealed for () {}

    impl Sealed for ApiResource {
        const DYNAMIC: bool = true;

        fn to_discover(&self) -> Option<(&str, &str, bool)> {
            super::discovery::to_discover(self)
        }

        fn resolved(resource: ApiResource) -> Option<Self> {
            Some(resource)
        }
    }
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
    lists: Arc<initial_list::ListMode>,
    /// For a namespace of a host engaged as a cluster: the host, whose
    /// watches it reads its part of, and the namespace.
    view: Option<(HostCache, String)>,
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
            lists: Arc::default(),
            view: None,
        }
    }

    /// The cache of the cluster that is `view`'s namespace of its host.
    pub(crate) fn of_view(cluster: ClusterName, view: &NamespaceView) -> Self {
        Self {
            view: Some((view.host().clone(), view.namespace().to_owned())),
            ..Self::new(cluster, view.client())
        }
    }

    /// The cache that holds cluster-scoped kinds for this cluster: its
    /// host's, for a namespace of a host; itself otherwise.
    pub(crate) fn whole(&self) -> &ClusterCache {
        match &self.view {
            Some((host, _)) => host.cache(),
            None => self,
        }
    }

    /// The namespace of its host this cluster is, if it is one.
    pub fn view_namespace(&self) -> Option<&str> {
        self.view.as_ref().map(|(_, namespace)| namespace.as_str())
    }

    fn watches(&self) -> MutexGuard<'_, Watches> {
        self.watches.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The shared watch of `K` objects in all namespaces with this
    /// configuration, started now if none runs here.
    pub fn watch<K>(&self, config: &watcher::Config) -> Arc<SharedWatch<K>>
    where
        K: Watchable<DynamicType = ()>,
    {
        self.watch_with(&(), None, config)
    }

    /// The shared watch of `K` objects in `namespace` (all namespaces for
    /// `None`, and for a cluster-scoped `K`) with this configuration, started
    /// now if none runs here. A watch of one namespace needs read rights in
    /// that namespace only.
    pub fn watch_in<K>(
        &self,
        namespace: Option<&str>,
        config: &watcher::Config,
    ) -> Arc<SharedWatch<K>>
    where
        K: Watchable<DynamicType = ()>,
    {
        self.watch_with(&(), namespace, config)
    }

    /// Like [`watch_in`](Self::watch_in), for a type described by `dyntype`:
    /// `DynamicObject` with its [`ApiResource`], say. Give a namespace only
    /// for a namespaced kind (the type cannot tell for `DynamicObject`; a
    /// controller checks it with the scope its `Watch` was given). A
    /// resource of version `*` (from
    /// [`Watch::discover`](crate::controller::Watch::discover)) is watched at
    /// the version this cluster's discovery finds.
    ///
    /// ```no_run
    /// # fn example(cluster: kube_fleet::Cluster) {
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
        let namespace = scope::<K>(namespace);
        let Some((host, own)) = &self.view else {
            return self.shared(shape, dyntype, namespace, config, || {
                SharedWatch::start(
                    self.cluster.clone(),
                    dyntype.clone(),
                    self.events::<K>(dyntype, namespace, shape, config),
                )
            });
        };
        if !is_namespaced::<K>() {
            // Not split by namespace: the host's own.
            return host.cache().watch_shaped(dyntype, None, shape, config);
        }
        match namespace {
            Some(other) if other != own => {
                // Another namespace, which this cluster does not see.
                self.shared(shape, dyntype, namespace, config, || {
                    let nothing = futures::stream::iter([
                        Ok(watcher::Event::Init),
                        Ok(watcher::Event::InitDone),
                    ])
                    .chain(futures::stream::pending());
                    SharedWatch::start(self.cluster.clone(), dyntype.clone(), nothing)
                })
            }
            _ => self.shared(shape, dyntype, Some(own), config, || {
                host.part::<K>(dyntype, own, shape, config, &self.cluster)
            }),
        }
    }

    /// The events of a watch of `K` in `namespace` (all for `None`) with
    /// `config`, listed as this cluster lists, each object shaped.
    fn events<K: Watchable>(
        &self,
        dyntype: &K::DynamicType,
        namespace: Option<&str>,
        shape: &Shape,
        config: &watcher::Config,
    ) -> impl Stream<Item = watcher::Result<watcher::Event<K>>> + Send + 'static {
        let (client, config) = (self.client.clone(), config.clone());
        let (lists, cluster) = (self.lists.clone(), self.cluster.clone());
        let namespace = namespace.map(str::to_owned);
        let events = move |dyntype: &K::DynamicType| {
            let (client, dyntype) = (client.clone(), dyntype.clone());
            let namespace = namespace.clone();
            let kind = K::kind(&dyntype).into_owned();
            initial_list::streamed_or_paged(
                lists.clone(),
                cluster.clone(),
                kind,
                config.clone(),
                move |config| match &namespace {
                    Some(namespace) => {
                        scoped::objects::<K>(client.clone(), &dyntype, namespace, config).boxed()
                    }
                    None => {
                        let api = Api::<K>::all_with(client.clone(), &dyntype);
                        watcher::watcher(api, config).boxed()
                    }
                },
            )
        };
        shaped(
            self.discovering(dyntype, events),
            shape.clone(),
            self.cluster.clone(),
            K::kind(dyntype).into_owned(),
        )
    }

    /// The shared watch of `K`'s metadata only, in all namespaces, started
    /// now if needed: for types a controller needs only to key on (owner
    /// references, labels).
    pub fn watch_metadata<K>(
        &self,
        config: &watcher::Config,
    ) -> Arc<SharedWatch<PartialObjectMeta<K>>>
    where
        K: Watchable<DynamicType = ()>,
    {
        self.watch_metadata_with(&(), None, config)
    }

    /// Like [`watch_metadata`](Self::watch_metadata), in `namespace` only
    /// (see [`watch_in`](Self::watch_in)).
    pub fn watch_metadata_in<K>(
        &self,
        namespace: Option<&str>,
        config: &watcher::Config,
    ) -> Arc<SharedWatch<PartialObjectMeta<K>>>
    where
        K: Watchable<DynamicType = ()>,
    {
        self.watch_metadata_with(&(), namespace, config)
    }

    /// Like [`watch_metadata_in`](Self::watch_metadata_in), for a type
    /// described by `dyntype`.
    pub fn watch_metadata_with<K: Watchable>(
        &self,
        dyntype: &K::DynamicType,
        namespace: Option<&str>,
        config: &watcher::Config,
    ) -> Arc<SharedWatch<PartialObjectMeta<K>>> {
        self.watch_with::<PartialObjectMeta<K>>(dyntype, namespace, config)
    }

    /// The watch of `K` objects in all namespaces with this configuration,
    /// if one runs here; unlike [`watch`](Self::watch), never starts one.
    /// Finds only watches whose objects are cached as [`watch`](Self::watch)
    /// caches them: not a controller's watch given a
    /// [`Transform`] or told to keep `managedFields`.
    pub fn find<K>(&self, config: &watcher::Config) -> Option<Arc<SharedWatch<K>>>
    where
        K: Watchable<DynamicType = ()>,
    {
        self.find_with(&(), None, config)
    }

    /// The watch of `K` objects in `namespace` with this configuration, if
    /// one runs here; never starts one.
    pub fn find_in<K>(
        &self,
        namespace: Option<&str>,
        config: &watcher::Config,
    ) -> Option<Arc<SharedWatch<K>>>
    where
        K: Watchable<DynamicType = ()>,
    {
        self.find_with(&(), namespace, config)
    }

    /// The watch of `K` objects described by `dyntype`, in `namespace`,
    /// with this configuration, if one runs here; never starts one.
    pub fn find_with<K: Watchable>(
        &self,
        dyntype: &K::DynamicType,
        namespace: Option<&str>,
        config: &watcher::Config,
    ) -> Option<Arc<SharedWatch<K>>> {
        let namespace = match &self.view {
            Some((host, _)) if !is_namespaced::<K>() => {
                return host.cache().find_with(dyntype, None, config);
            }
            // Its own namespace, whether named or not.
            Some((_, own)) if namespace.is_none() => Some(own.as_str()),
            _ => scope::<K>(namespace),
        };
        let key = watch_key::<K>(&Shape::default(), dyntype, namespace, config);
        let watch = self.watches().get(&key)?.upgrade()?;
        watch.downcast::<SharedWatch<K>>().ok()
    }

    /// The store of `K` objects watched with the default configuration, if a
    /// controller watches them in this cluster (with neither a [`Transform`]
    /// nor `managedFields` kept, as [`find`](Self::find) says).
    pub fn store<K: Watchable<DynamicType = ()>>(&self) -> Option<Store<K>> {
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

    /// The events `events` makes for `dyntype`, or, for a stand-in
    /// resource of any version, for the version this cluster's discovery
    /// finds.
    fn discovering<T>(
        &self,
        dyntype: &T::DynamicType,
        events: impl Fn(&T::DynamicType) -> BoxStream<'static, watcher::Result<watcher::Event<T>>>
        + Send
        + 'static,
    ) -> BoxStream<'static, watcher::Result<watcher::Event<T>>>
    where
        T: Resource<DynamicType: TypeInfo> + Send + 'static,
    {
        use sealed::Sealed;
        match dyntype.to_discover() {
            Some((group, kind, namespaced)) => discovery::discovered(
                self.client.clone(),
                (group.to_owned(), kind.to_owned(), namespaced),
                events,
            ),
            None => events(dyntype),
        }
    }

    fn shared<T>(
        &self,
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
        let mut watches = self.watches();
        if let Some(existing) = watches.get(&key).and_then(Weak::upgrade)
            && let Ok(existing) = existing.downcast::<SharedWatch<T>>()
        {
            return existing;
        }
        // Forget watches that nobody holds any more.
        watches.retain(|_, w| w.strong_count() > 0);
        let watch = Arc::new(start());
        let weak: Weak<dyn Any + Send + Sync> = Arc::downgrade(&watch) as _;
        watches.insert(key, weak);
        watch
    }
}

/// `events` with each object shaped as `shape` says: its `managedFields`
/// dropped unless kept (few controllers read them, and they are often the
/// larger part of a small object's metadata), then the user's transform. A
/// transform that panics is contained: the object is cached as it left it.
/// The first panic of a watch is logged as an error, later ones at debug
/// level (a transform may fail on every object).
fn shaped<T: Resource + 'static, S>(
    events: S,
    shape: Shape,
    cluster: ClusterName,
    kind: String,
) -> impl Stream<Item = S::Item> + Send + 'static
where
    S: Stream<Item = watcher::Result<watcher::Event<T>>> + Send + 'static,
{
    let mut panics = 0_u64;
    events.map(move |event| {
        event.map(|event| {
            event.modify(|object| {
                let Err(message) = contain(|| shape.apply(object)) else {
                    return;
                };
                panics += 1;
                let meta = object.meta();
                let namespace = meta.namespace.as_deref().unwrap_or_default();
                let name = meta.name.as_deref().unwrap_or_default();
                if panics == 1 {
                    tracing::error!(
                        %cluster, %kind, namespace, name, %message,
                        "a watch's transform panicked; the object is cached as the transform left it \
                         (later panics of this watch are logged at debug level)"
                    );
                } else {
                    tracing::debug!(
                        %cluster, %kind, namespace, name, %message, panics,
                        "a watch's transform panicked again"
                    );
                }
            })
        })
    })
}

fn watch_key<T: Resource<DynamicType: TypeInfo> + 'static>(
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

/// The namespace a watch of `K` is limited to: none for a cluster-scoped
/// type, whatever was asked.
fn scope<K: Resource>(namespace: Option<&str>) -> Option<&str> {
    namespace.filter(|_| is_namespaced::<K>())
}
