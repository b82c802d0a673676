//! Controllers: watch types across the fleet, queue requests, run a service.
//!
//! A [`Controller`] is built like kube-runtime's: `for` one type, [`owns`]
//! child types, [`watches`] other types with a mapper that may return
//! requests for any cluster. It runs a `tower::Service<ObjectRequest<K>>`
//! whose response is an [`Action`], in every cluster it selects, as clusters
//! join and leave the [`Fleet`]; [`run_raw`](Controller::run_raw) runs a
//! service of plain [`McRequest`] keys instead.
//!
//! ```no_run
//! use std::time::Duration;
//!
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use kube::runtime::watcher;
//! use kube_fleet::{Action, Controller, Fleet, ObjectRequest, controller::Config};
//! use tower::{BoxError, service_fn};
//!
//! # async fn example(fleet: Fleet) -> Result<(), kube_fleet::controller::Error> {
//! let reconcile = service_fn(|request: ObjectRequest<ConfigMap>| async move {
//!     match &request.object {
//!         Some(config_map) => println!("{request}: {:?}", config_map.data),
//!         None => println!("{request} is gone"),
//!     }
//!     Ok::<_, BoxError>(Action::requeue(Duration::from_secs(300)))
//! });
//! Controller::<ConfigMap>::new(&fleet, watcher::Config::default())
//!     // At most 8 reconciles at once, shared fairly between the clusters.
//!     .with_config(Config::default().concurrency(8))
//!     .run(reconcile)
//!     .await
//! # }
//! ```
//!
//! Limit concurrency with [`Config`], not with tower's `ConcurrencyLimit`
//! layer: the queue hands each cluster its fair share of the slots, where a
//! layer, which cannot see which cluster a request is for, lets one hung
//! cluster hold every slot.
//!
//! [`owns`]: Controller::owns
//! [`watches`]: Controller::watches

mod config;
mod deliver;
mod permissions;
mod runner;
mod status;
mod trigger;
mod watch;

use std::{
    fmt,
    future::Future,
    marker::PhantomData,
    sync::{
        Arc, OnceLock,
        atomic::{AtomicUsize, Ordering},
    },
};

use futures::{FutureExt, Stream, StreamExt, future::BoxFuture, stream::BoxStream};
use kube::{core::PartialObjectMeta, runtime::watcher};
use tower::{BoxError, Service};

pub use config::{
    Config, DEFAULT_CLUSTER_CONCURRENCY, DEFAULT_SHUTDOWN_TIMEOUT, DEFAULT_SYNC_TIMEOUT,
};
pub use status::{ClusterStatus, ControllerStatus};
pub use watch::Watch;

use crate::{
    action::Action,
    cache::{Change, ClusterCache, Shape, TypeInfo, Watchable},
    cluster_name::ClusterName,
    fleet::Fleet,
    object_request::ObjectRequest,
    request::{McRequest, ObjectKey},
};
use deliver::{Deliver, Keys, Objects};
use trigger::{FilterFactory, Trigger, WatchTrigger, Watched};

/// Why a controller stopped other than by a graceful shutdown.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The controller was built wrong: a `DynamicObject` watch without the
    /// type it watches, or a verb Kubernetes does not have in
    /// [`Controller::writes`], say. Reported when it is run.
    #[error("controller {controller}: {reason}")]
    Invalid {
        /// The controller's name.
        controller: String,
        /// What is wrong.
        reason: String,
    },
    /// The service reported from `poll_ready` that it has failed for good.
    #[error("controller {controller}: the reconcile service failed")]
    Service {
        /// The controller's name.
        controller: String,
        /// The service's error.
        #[source]
        source: BoxError,
    },
}

/// What a [`Watch`] says of a type `T`, checked: its type information, its
/// namespace (none for a cluster-scoped type), and whether its objects live
/// in namespaces.
pub(crate) struct Resolved<T: Watchable> {
    dyntype: T::DynamicType,
    config: watcher::Config,
    clusters: Option<Clusters>,
    namespace: Option<String>,
    namespaced: bool,
    shape: Shape,
}

impl<T: Watchable> Resolved<T> {
    /// The shared watch this describes in `cluster`, started if none runs:
    /// the same one a controller's trigger with this watch reads.
    pub(crate) fn watch_in(
        &self,
        cluster: &crate::cluster::Cluster,
    ) -> Arc<crate::cache::SharedWatch<T>> {
        let cache = if self.namespaced {
            cluster.cache()
        } else {
            cluster.cache().whole()
        };
        cache.watch_shaped::<T>(
            &self.dyntype,
            self.namespace.as_deref(),
            &self.shape,
            &self.config,
        )
    }

    /// The clusters the watch is limited to, if any.
    pub(crate) fn clusters(&self) -> Option<&Clusters> {
        self.clusters.as_ref()
    }

    /// The watched type's information.
    pub(crate) fn dyntype(&self) -> &T::DynamicType {
        &self.dyntype
    }

    pub(crate) fn from(watch: Watch) -> Result<Self, String> {
        let Watch {
            config,
            clusters,
            namespace,
            resource,
            keep_managed_fields,
            transform,
        } = watch;
        let dyntype =
            T::DynamicType::from_watch(resource.as_ref().map(|(r, _)| r)).ok_or_else(|| {
                format!(
                    "a watch of {} needs the type it watches: give it Watch::resource(..)",
                    std::any::type_name::<T>()
                )
            })?;
        if let Some(transform) = &transform
            && !transform.applies_to::<T>()
        {
            return Err(format!(
                "a watch of {} was given a transform of {}",
                std::any::type_name::<T>(),
                transform.type_name().unwrap_or("metadata"),
            ));
        }
        if namespace.as_deref() == Some("") {
            return Err(format!(
                "a watch of {} names an empty namespace",
                T::kind(&dyntype)
            ));
        }
        // A static type knows its scope; a dynamic one is told.
        let namespaced = crate::cache::is_namespaced::<T>()
            && !(<T::DynamicType as crate::cache::Sealed>::DYNAMIC
                && matches!(resource, Some((_, kube::core::discovery::Scope::Cluster))));
        if namespace.is_some() && !namespaced {
            tracing::warn!(
                kind = %T::kind(&dyntype),
                ?namespace,
                "a cluster-scoped type cannot be watched in one namespace; watching it cluster-wide"
            );
        }
        Ok(Self {
            namespace: namespace.filter(|_| namespaced),
            dyntype,
            config,
            clusters,
            namespaced,
            shape: Shape {
                keep_managed_fields,
                transform,
            },
        })
    }

    /// The kind, as reconcile reasons name it.
    fn kind(&self) -> Arc<str> {
        T::kind(&self.dyntype).into()
    }
}

/// The controlled type's kind and API version, as owner references name it,
/// and whether it lives in namespaces.
#[derive(Clone)]
struct Owner {
    kind: String,
    api_version: String,
    namespaced: bool,
}

/// What a controller does with a reconcile's error: see
/// [`Controller::error_policy`].
pub type ErrorPolicy = Arc<
    dyn Fn(&McRequest, &(dyn std::error::Error + Send + Sync + 'static)) -> Option<Action>
        + Send
        + Sync,
>;

/// How many keys wait in a controller's queue (ready or delayed, not
/// running): a handle to read while the controller runs, for metrics.
///
/// ```
/// # use k8s_openapi::api::core::v1::ConfigMap;
/// # use kube::runtime::watcher;
/// # use kube_fleet::{Controller, Fleet};
/// let controller = Controller::<ConfigMap>::new(&Fleet::new(), watcher::Config::default());
/// let depth = controller.queue_depth();
/// assert_eq!(depth.get(), 0);
/// ```
#[derive(Debug, Clone, Default)]
pub struct QueueDepth {
    depth: Arc<AtomicUsize>,
    controller: Arc<OnceLock<Arc<str>>>,
}

impl QueueDepth {
    /// The number of waiting keys at the controller's last step.
    pub fn get(&self) -> usize {
        self.depth.load(Ordering::Relaxed)
    }

    /// The controller's name ([`Controller::named`]), once it runs: for
    /// metrics that label the depth by controller.
    pub fn controller(&self) -> Option<&str> {
        self.controller.get().map(|name| &**name)
    }

    pub(crate) fn set(&self, depth: usize) {
        self.depth.store(depth, Ordering::Relaxed);
    }

    pub(crate) fn name(&self, controller: Arc<str>) {
        let _ = self.controller.set(controller);
    }
}

/// Which clusters of the fleet a controller works in.
#[derive(Clone)]
pub enum Clusters {
    /// Only the local cluster ([`ClusterName::local`]).
    Local,
    /// Every cluster except the local one: the providers' clusters.
    Provided,
    /// Every cluster.
    All,
    /// The clusters whose names pass the filter.
    Matching(Arc<dyn Fn(&ClusterName) -> bool + Send + Sync>),
}

impl Clusters {
    /// The clusters whose names pass `filter`.
    ///
    /// ```
    /// let members = kube_fleet::controller::Clusters::matching(|name| name.as_str().starts_with("member-"));
    /// assert!(members.selects(&"member-a".into()));
    /// assert!(!members.selects(&"hub".into()));
    /// ```
    pub fn matching(filter: impl Fn(&ClusterName) -> bool + Send + Sync + 'static) -> Self {
        Self::Matching(Arc::new(filter))
    }

    /// Whether the cluster `name` is one of these.
    pub fn selects(&self, name: &ClusterName) -> bool {
        match self {
            Self::Local => name.is_local(),
            Self::Provided => !name.is_local(),
            Self::All => true,
            Self::Matching(filter) => filter(name),
        }
    }
}

impl fmt::Debug for Clusters {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Local => f.write_str("Local"),
            Self::Provided => f.write_str("Provided"),
            Self::All => f.write_str("All"),
            Self::Matching(_) => f.write_str("Matching(..)"),
        }
    }
}

/// A controller for `K` objects across the fleet; see the [module docs](self).
#[must_use]
pub struct Controller<K: Watchable> {
    fleet: Fleet,
    name: String,
    triggers: Vec<Arc<dyn Trigger>>,
    /// `None` if the controlled type's watch was built wrong (`problems`).
    for_trigger: Option<WatchTrigger<K>>,
    owner: Owner,
    problems: Vec<String>,
    clusters: Clusters,
    config: Config,
    error_policy: Option<ErrorPolicy>,
    shutdown: Option<BoxFuture<'static, ()>>,
    external: Vec<BoxStream<'static, McRequest>>,
    reconcile_all: Vec<BoxStream<'static, ()>>,
    queue_depth: QueueDepth,
    status: ControllerStatus,
    /// What the reconciler writes, with which verbs: see [`Self::writes`].
    writes: Vec<(Watched, Vec<String>)>,
    _for: PhantomData<fn() -> K>,
}

impl<K: Watchable> fmt::Debug for Controller<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Controller")
            .field("name", &self.name)
            .field("triggers", &(self.triggers.len() + 1))
            .field("clusters", &self.clusters)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl<K: Watchable> Controller<K> {
    /// A controller for `K` objects, watched as `watch` says (a
    /// `watcher::Config`, or a [`Watch`] that also limits the clusters or
    /// the namespace), in every cluster of `fleet` unless the `Watch` or
    /// [`clusters`](Self::clusters) selects fewer. This is the only place
    /// the type and its watch are named: each reconcile gets its object from
    /// this watch. A controller of `PartialObjectMeta<K>` watches only the
    /// metadata of `K` (the API server sends nothing else), for controllers
    /// that act on names, labels or owners alone.
    pub fn new(fleet: &Fleet, watch: impl Into<Watch>) -> Self {
        let (for_trigger, owner, clusters, problems) = match Resolved::<K>::from(watch.into()) {
            Ok(watch) => {
                let owner = Owner {
                    kind: K::kind(&watch.dyntype).into_owned(),
                    api_version: K::api_version(&watch.dyntype).into_owned(),
                    namespaced: watch.namespaced,
                };
                let trigger = WatchTrigger {
                    source: ClusterCache::watch_shaped::<K>,
                    dyntype: watch.dyntype,
                    config: watch.config,
                    namespace: watch.namespace,
                    namespaced: watch.namespaced,
                    shape: watch.shape,
                    clusters: None,
                    mapper: Arc::new(trigger::for_self::<K>),
                    filters: Vec::new(),
                    related: None,
                    across: None,
                };
                (Some(trigger), owner, watch.clusters, Vec::new())
            }
            Err(problem) => {
                let owner = Owner {
                    kind: String::new(),
                    api_version: String::new(),
                    namespaced: true,
                };
                (None, owner, None, vec![problem])
            }
        };
        let name = match &owner.kind {
            kind if !kind.is_empty() => kind.to_lowercase(),
            _ => std::any::type_name::<K>()
                .rsplit("::")
                .next()
                .unwrap_or("controller")
                .to_lowercase(),
        };
        Self {
            fleet: fleet.clone(),
            name,
            triggers: Vec::new(),
            for_trigger,
            owner,
            problems,
            clusters: clusters.unwrap_or(Clusters::All),
            config: Config::default(),
            error_policy: None,
            shutdown: None,
            external: Vec::new(),
            reconcile_all: Vec::new(),
            queue_depth: QueueDepth::default(),
            status: ControllerStatus::new(fleet.clone()),
            writes: Vec::new(),
            _for: PhantomData,
        }
    }

    /// Adds a trigger for `T`, watched as `watch` says, with `mapper`; a
    /// watch built wrong is recorded, and reported when the controller runs.
    fn add_trigger<T, M>(
        self,
        watch: Watch,
        source: trigger::Source<T>,
        mapper: impl FnOnce(&Owner) -> M,
    ) -> Self
    where
        T: Watchable,
        M: Fn(&ClusterName, &Change<T>) -> Vec<McRequest> + Send + Sync + 'static,
    {
        self.add_trigger_across(watch, source, mapper, None)
    }

    /// [`add_trigger`](Self::add_trigger), for a trigger whose requests go
    /// to the clusters `across` selects when it is `Some`.
    fn add_trigger_across<T, M>(
        mut self,
        watch: Watch,
        source: trigger::Source<T>,
        mapper: impl FnOnce(&Owner) -> M,
        across: Option<(Clusters, trigger::KeyMapper<T>)>,
    ) -> Self
    where
        T: Watchable,
        M: Fn(&ClusterName, &Change<T>) -> Vec<McRequest> + Send + Sync + 'static,
    {
        match Resolved::<T>::from(watch) {
            Ok(watch) => {
                let related = Some(watch.kind());
                self.triggers.push(Arc::new(WatchTrigger {
                    source,
                    dyntype: watch.dyntype,
                    config: watch.config,
                    namespace: watch.namespace,
                    namespaced: watch.namespaced,
                    shape: watch.shape,
                    clusters: watch.clusters,
                    mapper: Arc::new(mapper(&self.owner)),
                    filters: Vec::new(),
                    related,
                    across,
                }));
            }
            Err(problem) => self.problems.push(problem),
        }
        self
    }

    /// Names the controller in logs (default: `K`'s kind in lower case).
    pub fn named(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// The controller's name, as [`named`](Self::named) set it.
    ///
    /// ```
    /// # use k8s_openapi::api::core::v1::ConfigMap;
    /// # use kube::runtime::watcher;
    /// # use kube_fleet::{Controller, Fleet};
    /// let controller = Controller::<ConfigMap>::new(&Fleet::new(), watcher::Config::default());
    /// assert_eq!(controller.name(), "configmap");
    /// ```
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Selects the clusters the controller works in: where it watches its
    /// own type and reconciles (default [`Clusters::All`]), and where it
    /// watches owned and watched types whose [`Watch`] selects none of its
    /// own.
    pub fn clusters(mut self, clusters: Clusters) -> Self {
        self.clusters = clusters;
        self
    }

    /// Reconciles a `K` only when `predicate`'s value for it changed, as
    /// kube's `predicates::generation` or `predicates::labels` tell.
    /// Deletions always pass, and so does an object deleted and created
    /// again under the same name (objects are remembered by UID, as kube's
    /// predicates do; one unseen for an hour is forgotten). Predicates and
    /// filters add up: a change must pass all of them.
    pub fn with_predicate<P>(mut self, predicate: P) -> Self
    where
        P: Fn(&K) -> Option<u64> + Clone + Send + Sync + 'static,
    {
        if let Some(trigger) = &mut self.for_trigger {
            trigger.filters.push(trigger::predicate_filter(predicate));
        }
        self
    }

    /// Reconciles only the `K` objects that pass `filter` (and every other
    /// filter and predicate given).
    pub fn with_filter(mut self, filter: impl Fn(&K) -> bool + Send + Sync + 'static) -> Self {
        let filter = Arc::new(filter);
        let factory: FilterFactory<K> = Arc::new(move || {
            let filter = filter.clone();
            Box::new(move |change: &Change<K>| filter(change.object()))
        });
        if let Some(trigger) = &mut self.for_trigger {
            trigger.filters.push(factory);
        }
        self
    }

    /// Also reconciles the owner of every `Child` (by owner reference, same
    /// cluster) when the child changes.
    pub fn owns<Child: Watchable>(self, watch: impl Into<Watch>) -> Self {
        self.add_trigger(watch.into(), ClusterCache::watch_shaped::<Child>, |owner| {
            trigger::for_owners::<Child>(
                owner.kind.clone(),
                owner.api_version.clone(),
                owner.namespaced,
            )
        })
    }

    /// Also reconciles the parent of every `Child` that names a `K` as its
    /// parent through [`PARENT_ANNOTATION`](crate::ownership::PARENT_ANNOTATION),
    /// in whichever cluster the child lives (see [`Watch::in_clusters`]):
    /// the parent's request names the parent's own cluster. See
    /// [`ownership`](crate::ownership) for making such children and cleaning
    /// them up.
    ///
    /// Name the clusters the children live in with [`Watch::in_clusters`]:
    /// without it the watch runs in the controller's own clusters only,
    /// while a [`Children`](crate::ownership::Children) given the same
    /// `Watch` reads every cluster.
    pub fn owns_across<Child: Watchable>(self, watch: impl Into<Watch>) -> Self
    where
        K: kube::Resource<DynamicType = ()>,
    {
        self.add_trigger(watch.into(), ClusterCache::watch_shaped::<Child>, |_| {
            |_: &ClusterName, change: &Change<Child>| {
                crate::ownership::parent::parents_of::<K, Child>(change.object().as_ref())
                    .into_iter()
                    .collect()
            }
        })
    }

    /// Like [`owns`](Self::owns), but watches only the children's metadata.
    pub fn owns_metadata<Child: Watchable>(self, watch: impl Into<Watch>) -> Self {
        self.add_trigger(
            watch.into(),
            ClusterCache::watch_shaped::<PartialObjectMeta<Child>>,
            |owner| {
                trigger::for_owners::<PartialObjectMeta<Child>>(
                    owner.kind.clone(),
                    owner.api_version.clone(),
                    owner.namespaced,
                )
            },
        )
    }

    /// Also reconciles whatever `mapper` returns when an `Other` object
    /// changes in a cluster where it is watched (see [`Watch::in_clusters`]).
    /// The requests may name another cluster than the one the change came
    /// from: this is how a change in one cluster makes work in another.
    /// With [`run`](Self::run), a request must name a cluster where the
    /// controller watches `K` (others are dropped with a warning).
    ///
    /// ```no_run
    /// # use k8s_openapi::api::core::v1::{ConfigMap, Secret};
    /// # use kube::runtime::watcher;
    /// # use kube_fleet::{Controller, Fleet, McRequest};
    /// # fn example(fleet: &Fleet, members: Vec<String>) {
    /// // A Secret in the hub asks for a ConfigMap of the same name in every member.
    /// Controller::<ConfigMap>::new(fleet, watcher::Config::default())
    ///     .watches::<Secret, _>(watcher::Config::default(), move |cluster, secret| {
    ///         let name = secret.metadata.name.clone().unwrap_or_default();
    ///         members.iter()
    ///             .filter(|_| cluster == "hub")
    ///             .map(|m| McRequest::new(m.as_str(), Some("default"), name.clone()))
    ///             .collect::<Vec<_>>()
    ///     });
    /// # }
    /// ```
    pub fn watches<Other, I>(
        self,
        watch: impl Into<Watch>,
        mapper: impl Fn(&ClusterName, &Other) -> I + Send + Sync + 'static,
    ) -> Self
    where
        Other: Watchable,
        I: IntoIterator<Item = McRequest>,
    {
        self.add_trigger(watch.into(), ClusterCache::watch_shaped::<Other>, |_| {
            move |cluster: &ClusterName, change: &Change<Other>| {
                mapper(cluster, change.object()).into_iter().collect()
            }
        })
    }

    /// Like [`watches`](Self::watches), but watches only `Other`'s metadata.
    pub fn watches_metadata<Other, I>(
        self,
        watch: impl Into<Watch>,
        mapper: impl Fn(&ClusterName, &PartialObjectMeta<Other>) -> I + Send + Sync + 'static,
    ) -> Self
    where
        Other: Watchable,
        I: IntoIterator<Item = McRequest>,
    {
        self.add_trigger(
            watch.into(),
            ClusterCache::watch_shaped::<PartialObjectMeta<Other>>,
            |_| {
                move |cluster: &ClusterName, change: &Change<PartialObjectMeta<Other>>| {
                    mapper(cluster, change.object()).into_iter().collect()
                }
            },
        )
    }

    /// Also reconciles, in every cluster `to` selects, the objects `mapper`
    /// names when an `Other` object changes in a cluster where it is watched
    /// (see [`Watch::in_clusters`]): a change in one cluster makes work in
    /// all of a set of others. `to` is read when the change is taken in, so
    /// the requests go to the clusters engaged then, and a cluster that
    /// joins later is given the requests that every `Other` object already
    /// watched makes, as soon as it joins. Only clusters where the
    /// controller watches `K` take part (others `to` selects are skipped).
    ///
    /// A hub ConfigMap that every member cluster should hold a copy of:
    ///
    /// ```no_run
    /// # use k8s_openapi::api::core::v1::ConfigMap;
    /// # use kube::runtime::watcher;
    /// # use kube_fleet::{Controller, Fleet, ObjectKey, controller::{Clusters, Watch}};
    /// # fn example(fleet: &Fleet) -> Controller<ConfigMap> {
    /// let in_hub = Watch::new(watcher::Config::default().labels("copy=everywhere"))
    ///     .in_clusters(Clusters::Local);
    /// Controller::<ConfigMap>::new(fleet, watcher::Config::default())
    ///     .clusters(Clusters::Provided)
    ///     .watches_across::<ConfigMap, _>(in_hub, Clusters::Provided, |_hub, source| {
    ///         [ObjectKey::of(source)]
    ///     })
    /// # }
    /// ```
    pub fn watches_across<Other, I>(
        self,
        watch: impl Into<Watch>,
        to: Clusters,
        mapper: impl Fn(&ClusterName, &Other) -> I + Send + Sync + 'static,
    ) -> Self
    where
        Other: Watchable,
        I: IntoIterator<Item = ObjectKey>,
    {
        let keys: trigger::KeyMapper<Other> =
            Arc::new(move |cluster, object| mapper(cluster, object).into_iter().collect());
        self.add_trigger_across(
            watch.into(),
            ClusterCache::watch_shaped::<Other>,
            |_| |_: &ClusterName, _: &Change<Other>| Vec::new(),
            Some((to, keys)),
        )
    }

    /// Also reconciles every request `requests` yields: for triggers from
    /// outside Kubernetes (a timer, a webhook, another system's events).
    pub fn reconcile_on(
        mut self,
        requests: impl Stream<Item = McRequest> + Send + 'static,
    ) -> Self {
        self.external.push(requests.boxed());
        self
    }

    /// Reconciles every `K` the controller knows, in every cluster it works
    /// in, each time `signal` yields: after a configuration change that
    /// concerns all objects, say. Filters and predicates do not apply; the
    /// keys queue behind fresh changes, deduplicated as usual.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # use k8s_openapi::api::core::v1::ConfigMap;
    /// # use kube::runtime::watcher;
    /// # use kube_fleet::{Controller, Fleet};
    /// # fn example(fleet: &Fleet) -> Controller<ConfigMap> {
    /// // A resync every ten minutes.
    /// let every_ten_minutes = futures::stream::unfold((), |()| async {
    ///     tokio::time::sleep(Duration::from_secs(600)).await;
    ///     Some(((), ()))
    /// });
    /// Controller::<ConfigMap>::new(fleet, watcher::Config::default())
    ///     .reconcile_all_on(every_ten_minutes)
    /// # }
    /// ```
    pub fn reconcile_all_on(mut self, signal: impl Stream<Item = ()> + Send + 'static) -> Self {
        self.reconcile_all.push(signal.boxed());
        self
    }

    /// A handle to the number of keys waiting in this controller's queue.
    pub fn queue_depth(&self) -> QueueDepth {
        self.queue_depth.clone()
    }

    /// A live view of the clusters this controller serves and of its
    /// watches in each: see [`ControllerStatus`].
    pub fn status(&self) -> ControllerStatus {
        self.status.clone()
    }

    /// Decides, per failed reconcile, when its key runs again: `Some` of an
    /// [`Action`] to requeue after a delay of your choosing
    /// ([`Action::requeue`]) or only when the object changes
    /// ([`Action::await_change`]); `None` for the key's backoff, the
    /// default. A [`TerminalError`](crate::TerminalError) is never retried,
    /// whatever the policy says; a panic in the policy counts as `None`.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use k8s_openapi::api::core::v1::ConfigMap;
    /// # use kube::runtime::watcher;
    /// # use kube_fleet::{Action, Controller, Fleet};
    /// # fn example(fleet: &Fleet) -> Controller<ConfigMap> {
    /// Controller::<ConfigMap>::new(fleet, watcher::Config::default())
    ///     .error_policy(|_request, error| {
    ///         // A cluster that throttles us: come back in a minute.
    ///         error.to_string().contains("429").then(|| Action::requeue(Duration::from_secs(60)))
    ///     })
    /// # }
    /// ```
    pub fn error_policy(
        mut self,
        policy: impl Fn(&McRequest, &(dyn std::error::Error + Send + Sync + 'static)) -> Option<Action>
        + Send
        + Sync
        + 'static,
    ) -> Self {
        self.error_policy = Some(Arc::new(policy));
        self
    }

    /// Sets concurrency, rate limits, backoff and timeouts; see [`Config`].
    pub fn with_config(mut self, config: Config) -> Self {
        self.config = config;
        self
    }

    /// Shuts down gracefully when `signal` completes: no new reconciles
    /// start, running ones may finish within the
    /// [`Config::shutdown_timeout`], then `run` returns.
    pub fn graceful_shutdown_on(
        mut self,
        signal: impl Future<Output = ()> + Send + 'static,
    ) -> Self {
        self.shutdown = Some(signal.boxed());
        self
    }

    /// Runs `service` for every request until a graceful shutdown completes:
    /// each request an [`ObjectRequest<K>`] carrying the cluster, the object
    /// read from this controller's own watch of `K` there (an `Arc` shared
    /// with the watch; `None` if the watch does not hold it, see
    /// [`ObjectRequest`]), why the reconcile runs, and the controller's name.
    ///
    /// The controller subscribes to the fleet when `run` is called, so it
    /// misses no cluster engaged after that, and starts on the first poll.
    /// In each cluster it selects, it starts its watches and serves the
    /// cluster once they have synced; keys for the cluster wait in the queue
    /// until then (see [`status`](Self::status)), never in error backoff. It
    /// then reconciles every object its watches hold there, and each change
    /// after; changes made while it waited are not followed one by one, so
    /// an object deleted in that time is not reconciled as a deletion (use a
    /// finalizer for clean-up that must not be missed). Requests for clusters
    /// that are not in the fleet, or that the controller does not
    /// [select](Self::clusters) (so has no watch of `K` in), are dropped
    /// with a warning, once per cluster; so are requests that name an object
    /// its watch cannot hold (no namespace for a namespaced `K`, or a
    /// namespace other than the one the watch is limited to), which would
    /// otherwise read as deleted. A namespace named for a cluster-scoped `K`
    /// is ignored.
    ///
    /// A key leaves the queue only when the [`Config`]'s limits allow it and
    /// the service's `poll_ready` says it is ready, so tower's own
    /// middleware paces the controller too. An error from a reconcile sends
    /// the key back to the queue after its backoff (or when the
    /// [`error_policy`](Self::error_policy) says), and a
    /// [`TerminalError`](crate::TerminalError) stops it until the object
    /// changes; a panic anywhere in the service (`poll_ready`, `call` or its
    /// future) counts as an error; an [`Action`] says when to run the key
    /// next on success.
    pub fn run<S>(self, service: S) -> impl Future<Output = Result<(), Error>> + Send
    where
        S: Service<ObjectRequest<K>, Response = Action> + Send + 'static,
        S::Future: Send + 'static,
        S::Error: Into<BoxError>,
    {
        let objects = Objects::<K> {
            controller: self.name.as_str().into(),
            namespaced: self.owner.namespaced,
            namespace: self.for_trigger.as_ref().and_then(|t| t.namespace.clone()),
            _object: PhantomData,
        };
        self.start(service, objects)
    }

    /// Like [`run`](Self::run), but the service receives each key as a
    /// plain [`McRequest`] and finds the cluster and the object itself: for
    /// stacks that load objects their own way. Unlike `run`, requests for
    /// clusters the controller does not select are run too (with no watch
    /// of its there).
    pub fn run_raw<S>(self, service: S) -> impl Future<Output = Result<(), Error>> + Send
    where
        S: Service<McRequest, Response = Action> + Send + 'static,
        S::Future: Send + 'static,
        S::Error: Into<BoxError>,
    {
        self.start(service, Keys)
    }

    fn start<S, D>(self, service: S, deliver: D) -> impl Future<Output = Result<(), Error>> + Send
    where
        D: Deliver,
        S: Service<D::Request, Response = Action> + Send + 'static,
        S::Future: Send + 'static,
        S::Error: Into<BoxError>,
    {
        let Self {
            fleet,
            name,
            mut triggers,
            for_trigger,
            owner: _,
            problems,
            clusters,
            config,
            error_policy,
            shutdown,
            external,
            reconcile_all,
            queue_depth,
            status,
            writes: _,
            _for,
        } = self;
        queue_depth.name(name.as_str().into());
        let for_trigger = match for_trigger {
            Some(trigger) if problems.is_empty() => trigger,
            _ => {
                let error = Error::Invalid {
                    controller: name,
                    reason: problems.join("; "),
                };
                return futures::future::Either::Left(futures::future::ready(Err(error)));
            }
        };
        triggers.insert(0, Arc::new(for_trigger));
        let runner = runner::Runner::new(runner::Setup {
            fleet,
            error_policy,
            name,
            triggers,
            clusters,
            config,
            shutdown: shutdown.unwrap_or_else(|| futures::future::pending().boxed()),
            external: futures::stream::select_all(external).boxed(),
            reconcile_all: futures::stream::select_all(reconcile_all).boxed(),
            queue_depth,
            status,
        });
        futures::future::Either::Right(runner.run(service, deliver))
    }
}

#[cfg(test)]
mod tests {
    use super::Clusters;
    use crate::cluster_name::ClusterName;

    #[test]
    fn a_watch_scope_counts_for_dynamic_types_only() {
        use k8s_openapi::api::core::v1::ConfigMap;
        use kube::{
            api::{ApiResource, DynamicObject},
            core::discovery::Scope,
        };

        use super::{Resolved, Watch};

        let config_maps = ApiResource::erase::<ConfigMap>(&());
        let told = |scope: Scope| Watch::default().resource(config_maps.clone(), scope);
        // A static type knows it lives in namespaces, whatever it is told.
        assert!(
            Resolved::<ConfigMap>::from(told(Scope::Cluster))
                .unwrap()
                .namespaced
        );
        assert!(
            !Resolved::<DynamicObject>::from(told(Scope::Cluster))
                .unwrap()
                .namespaced
        );
        assert!(
            Resolved::<DynamicObject>::from(told(Scope::Namespaced))
                .unwrap()
                .namespaced
        );
        assert!(Resolved::<DynamicObject>::from(Watch::default()).is_err());
        assert!(Resolved::<ConfigMap>::from(Watch::default().in_namespace("")).is_err());
    }

    #[test]
    fn cluster_selections_pick_the_local_the_provided_all_or_matching_clusters() {
        let (local, east) = (ClusterName::local(), ClusterName::new("east"));
        assert!(Clusters::Local.selects(&local) && !Clusters::Local.selects(&east));
        assert!(!Clusters::Provided.selects(&local) && Clusters::Provided.selects(&east));
        assert!(Clusters::All.selects(&local) && Clusters::All.selects(&east));
        let only_east = Clusters::matching(|name| name == "east");
        assert!(only_east.selects(&east) && !only_east.selects(&local));
    }
}
