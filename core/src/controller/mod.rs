//! Controllers: watch types across the fleet, queue requests, run a service.
//!
//! A [`Controller`] is built like kube-runtime's: `for` one type, [`owns`]
//! child types, [`watches`] other types with a mapper that may return
//! requests for any cluster. It runs a `tower::Service<ObjectRequest<K>>`
//! whose response is an [`Action`], in every cluster it selects, as clusters
//! join and leave the [`Fleet`].
//!
//! ```no_run
//! use std::time::Duration;
//!
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use kube::runtime::watcher;
//! use kube_multicluster::{Action, Controller, Fleet, ObjectRequest, controller::Config};
//! use tower::{BoxError, service_fn};
//!
//! # async fn example(fleet: Fleet) -> Result<(), kube_multicluster::controller::Error> {
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
//! layer: the queue hands each cluster its fair share of the slots (with
//! the default [`Sharing::Fair`](crate::queue::Sharing::Fair)), where a
//! layer, which cannot see which cluster a request is for, lets one hung
//! cluster hold every slot.
//!
//! [`owns`]: Controller::owns
//! [`watches`]: Controller::watches

mod config;
mod error;
mod permissions;
mod relations;
mod runner;
mod selector;
mod status;
mod trigger;
mod warm;
pub(crate) mod watch;

use std::{fmt, future::Future, marker::PhantomData, sync::Arc};

use futures::{FutureExt, Stream, StreamExt, future::BoxFuture, stream::BoxStream};
use tower::{BoxError, Service};

pub use config::{
    Config, DEFAULT_CLUSTER_CONCURRENCY, DEFAULT_READ_YOUR_WRITES_WAIT, DEFAULT_SHUTDOWN_TIMEOUT,
    DEFAULT_SYNC_TIMEOUT,
};
pub use error::{Error, ErrorPolicy};
pub use selector::ClusterSelector;
pub use status::{ClusterStatus, ControllerStatus};
pub use warm::WarmUp;
use watch::Resolved;
pub use watch::Watch;

use crate::{
    action::Action,
    cache::{Change, Watchable},
    fleet::Fleet,
    object_request::ObjectRequest,
    queue,
    request::McRequest,
};
use runner::{Runner, Setup};
use trigger::{FilterFactory, Trigger, WatchTrigger, Watched};

/// The controlled type's kind and API version, as owner references name it,
/// and whether it lives in namespaces.
#[derive(Clone)]
struct Owner {
    kind: String,
    api_version: String,
    namespaced: bool,
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
    clusters: ClusterSelector,
    config: Config,
    error_policy: Option<ErrorPolicy>,
    shutdown: Option<BoxFuture<'static, ()>>,
    external: Vec<BoxStream<'static, McRequest>>,
    reconcile_all: Vec<BoxStream<'static, ()>>,
    queue_depth: queue::QueueDepth,
    /// Each cluster's queue figures, counted once someone asked for them.
    queue_metrics: std::sync::OnceLock<queue::QueueMetrics>,
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
            Ok(mut watch) => {
                let owner = Owner {
                    kind: K::kind(&watch.dyntype).into_owned(),
                    api_version: K::api_version(&watch.dyntype).into_owned(),
                    namespaced: watch.namespaced,
                };
                // The controller's selection is its own, kept apart.
                let clusters = watch.clusters.take();
                let trigger = WatchTrigger {
                    watch,
                    mapper: Arc::new(trigger::for_self::<K>),
                    filters: Vec::new(),
                    related: None,
                    across: None,
                };
                (Some(trigger), owner, clusters, Vec::new())
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
            clusters: clusters.unwrap_or(ClusterSelector::All),
            config: Config::default(),
            error_policy: None,
            shutdown: None,
            external: Vec::new(),
            reconcile_all: Vec::new(),
            queue_depth: queue::QueueDepth::default(),
            queue_metrics: std::sync::OnceLock::new(),
            status: ControllerStatus::new(fleet.clone()),
            writes: Vec::new(),
            _for: PhantomData,
        }
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
    /// # use kube_multicluster::{Controller, Fleet};
    /// let controller = Controller::<ConfigMap>::new(&Fleet::new(), watcher::Config::default());
    /// assert_eq!(controller.name(), "configmap");
    /// ```
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Selects the clusters the controller works in: where it watches its
    /// own type and reconciles (default [`ClusterSelector::All`]), and where it
    /// watches owned and watched types whose [`Watch`] selects none of its
    /// own.
    pub fn clusters(mut self, clusters: ClusterSelector) -> Self {
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
    /// # use kube_multicluster::{Controller, Fleet};
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

    /// The controller's watches, kept running and synced in every cluster
    /// it would serve without reconciling anything, for as long as the
    /// returned future runs: for a standby replica, so that on taking
    /// over the controller serves each cluster at once (see [`WarmUp`]).
    /// The manager runs it for a controller configured with
    /// [`Config::warm_standby`].
    ///
    /// ```no_run
    /// # use k8s_openapi::api::core::v1::ConfigMap;
    /// # use kube::runtime::watcher;
    /// # use kube_multicluster::{Controller, Fleet};
    /// # async fn example(fleet: Fleet, leading: impl std::future::Future<Output = ()>) {
    /// let controller = Controller::<ConfigMap>::new(&fleet, watcher::Config::default());
    /// let warm = tokio::spawn(controller.warm_up());
    /// leading.await;
    /// // The controller finds its watches synced in every cluster.
    /// # let service = tower::service_fn(|_: kube_multicluster::ObjectRequest<ConfigMap>| async {
    /// #     Ok::<_, tower::BoxError>(kube_multicluster::Action::await_change())
    /// # });
    /// controller.run(service).await.unwrap();
    /// # warm.abort();
    /// # }
    /// ```
    pub fn warm_up(&self) -> WarmUp {
        WarmUp::new(
            self.fleet.clone(),
            self.clusters.clone(),
            self.for_trigger.as_ref().map(|own| own.watch.clone()),
            self.triggers.clone(),
        )
    }

    /// Its configuration ([`with_config`](Self::with_config)).
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// A handle to the number of keys waiting in this controller's queue.
    pub fn queue_depth(&self) -> queue::QueueDepth {
        self.queue_depth.clone()
    }

    /// A handle to this controller's queue, cluster by cluster: keys
    /// waiting, added and retried, how long they waited and ran, and what
    /// runs now (see [`QueueMetrics`](queue::QueueMetrics)), for the
    /// layers' `WorkqueueMetrics` to report under controller-runtime's
    /// workqueue names with a `cluster` label. Asking for it turns the
    /// counting on for this controller (it costs a few atomic additions
    /// and two clock reads per key run; `docs/benchmarks.md`); every call
    /// gives the same handle. The [`Manager`](https://docs.rs/kube-multicluster-manager)
    /// asks for it for every controller it runs.
    pub fn queue_metrics(&self) -> queue::QueueMetrics {
        self.queue_metrics.get_or_init(Default::default).clone()
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
    /// # use kube_multicluster::{Action, Controller, Fleet};
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
        self.queue_depth.name(self.name.as_str().into());
        let own = match self.for_trigger {
            Some(trigger) if self.problems.is_empty() => trigger,
            _ => {
                let error = Error::Invalid {
                    controller: self.name,
                    reason: self.problems.join("; "),
                };
                return futures::future::Either::Left(futures::future::ready(Err(error)));
            }
        };
        let runner = Runner::new(Setup {
            fleet: self.fleet,
            error_policy: self.error_policy,
            name: self.name,
            own: Arc::new(own),
            related: self.triggers,
            clusters: self.clusters,
            config: self.config,
            shutdown: self
                .shutdown
                .unwrap_or_else(|| futures::future::pending().boxed()),
            external: futures::stream::select_all(self.external).boxed(),
            reconcile_all: futures::stream::select_all(self.reconcile_all).boxed(),
            queue_depth: self.queue_depth,
            queue_metrics: self.queue_metrics.into_inner(),
            status: self.status,
        });
        futures::future::Either::Right(runner.run(service))
    }
}
