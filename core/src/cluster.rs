use std::{
    collections::HashMap,
    fmt,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
};

use kube::{
    Client,
    runtime::{
        events::{Recorder, Reporter},
        reflector::Store,
    },
};
use tokio::sync::{Notify, OnceCell};

use crate::{
    cache::{ClusterCache, HostView, InitialLists, Watchable},
    client::{
        Budget, ClusterClient, LazyClient, Parts, Reachability, RequestBudget, RequestStats,
        WriteWaits, Writes, counting, counting_lazily,
    },
    cluster_name::ClusterName,
    health::ClusterHealth,
    identity,
    identity::{ClusterIdentity, IdentityError},
    panic::lock,
};

/// One engaged cluster: its name, a client, and its shared cache.
///
/// Cheap to clone: clones share the client's connection pool and the cache.
/// A `Cluster` is one engagement: when the fleet disengages the name, or
/// engages it again with another client, this value says so through
/// [`is_engaged`](Self::is_engaged) and [`disengaged`](Self::disengaged), and a new
/// `Cluster` takes the name.
///
/// ```
/// # async fn example(client: kube::Client) {
/// use kube_multicluster::Cluster;
///
/// let cluster = Cluster::new("east", client);
/// assert_eq!(cluster.name(), "east");
/// assert_eq!(cluster.cache().watch_count(), 0);
/// assert!(cluster.is_engaged());
/// # }
/// ```
#[derive(Clone)]
pub struct Cluster {
    inner: Arc<Inner>,
}

struct Inner {
    name: ClusterName,
    /// Made on first use: a view's cluster that sends nothing holds no
    /// request queue.
    client: LazyClient,
    cache: ClusterCache,
    requests: Arc<RequestStats>,
    reachability: Arc<Reachability>,
    /// The reachability is a host's, which outlives this engagement.
    shares_reachability: bool,
    /// Read before every reconcile, so a flag rather than a lock.
    left: AtomicBool,
    leaving: Notify,
    /// One event recorder per reporting controller, made on first use.
    recorders: Mutex<HashMap<Arc<str>, Recorder>>,
    /// Read on first use, once per engagement.
    identity: OnceCell<ClusterIdentity>,
}

impl fmt::Debug for Cluster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cluster")
            .field("name", &self.inner.name)
            .field("engaged", &self.is_engaged())
            .field("identity", &self.inner.identity.get())
            .field("cache", &self.inner.cache)
            .finish_non_exhaustive()
    }
}

impl Cluster {
    /// A cluster reached through `client`, with an empty cache. Its
    /// requests are counted in [`requests`](Self::requests), and sent within
    /// the client's [budget](ClusterClient::with_budget), else
    /// [`RequestBudget::DEFAULT`]. Call it inside a tokio runtime.
    pub fn new(name: impl Into<ClusterName>, client: impl Into<ClusterClient>) -> Self {
        Self::listing(
            name,
            client.into(),
            InitialLists::unbounded(),
            RequestBudget::DEFAULT,
        )
    }

    /// [`new`](Self::new), its watches' lists bounded by `permits`, within
    /// `budget` unless the client has its own.
    pub(crate) fn listing(
        name: impl Into<ClusterName>,
        client: ClusterClient,
        permits: InitialLists,
        budget: RequestBudget,
    ) -> Self {
        let name = name.into();
        let requests = Arc::<RequestStats>::default();
        let reachability = Arc::new(Reachability::new(name.clone(), client.clone()));
        let budget = Budget::new(client.budget().unwrap_or(budget)).map(Arc::new);
        let writes = Arc::<Writes>::default();
        let client = counting(Parts {
            cluster: name.clone(),
            client,
            stats: requests.clone(),
            reachability: reachability.clone(),
            budget,
            writes: writes.clone(),
        });
        let client = LazyClient::from(client);
        let cache = ClusterCache::new(name.clone(), client.clone(), permits, writes, &reachability);
        Self::with_cache(name, client, cache, requests, reachability)
    }

    /// The cluster that is `view`'s part of its host (a namespace, or a
    /// logical cluster of a host split by annotation): its client is the
    /// view's, and its cache reads that part of the host's watches (see
    /// [`HostCache`](crate::cache::HostCache)).
    /// Its [`requests`](Self::requests) count what goes through its client;
    /// the host's shared watches are counted under no view. Call it inside a
    /// tokio runtime.
    pub fn of_view(name: impl Into<ClusterName>, view: &HostView) -> Self {
        Self::viewing(
            name,
            view,
            RequestBudget::DEFAULT,
            InitialLists::unbounded(),
        )
    }

    /// [`of_view`](Self::of_view), its requests within `budget` unless its
    /// client has its own, and its own watches' lists under `permits`.
    pub(crate) fn viewing(
        name: impl Into<ClusterName>,
        view: &HostView,
        budget: RequestBudget,
        permits: InitialLists,
    ) -> Self {
        let name = name.into();
        let requests = Arc::<RequestStats>::default();
        // The host's, shared with its other parts: a view that leaves
        // does not end it.
        let reachability = view.host().reachability().clone();
        let given = view.cluster_client().clone();
        let budget = Budget::new(given.budget().unwrap_or(budget)).map(Arc::new);
        let client = counting_lazily(Parts {
            cluster: name.clone(),
            client: given,
            stats: requests.clone(),
            reachability: reachability.clone(),
            budget,
            writes: view.writes().clone(),
        });
        let cache = ClusterCache::of_view(name.clone(), view, client.clone(), permits);
        let mut cluster = Self::with_cache(name, client, cache, requests, reachability);
        Arc::get_mut(&mut cluster.inner)
            .expect("not shared yet")
            .shares_reachability = true;
        cluster
    }

    fn with_cache(
        name: ClusterName,
        client: LazyClient,
        cache: ClusterCache,
        requests: Arc<RequestStats>,
        reachability: Arc<Reachability>,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                name,
                client,
                cache,
                requests,
                reachability,
                shares_reachability: false,
                left: AtomicBool::new(false),
                leaving: Notify::new(),
                recorders: Mutex::default(),
                identity: OnceCell::new(),
            }),
        }
    }

    /// The cluster's name in the fleet.
    pub fn name(&self) -> &ClusterName {
        &self.inner.name
    }

    /// A client for this cluster. Call it inside a Tokio runtime: the
    /// client of a cluster that is a part of a host is made on first use,
    /// and its request queue runs a task there.
    pub fn client(&self) -> Client {
        self.inner.client.get()
    }

    /// The API requests made through this cluster's [`client`](Self::client)
    /// in this engagement, its cache's watches and lists included. (A
    /// namespace view's cache reads the host's watches, which no view
    /// counts: see [`of_view`](Self::of_view).)
    pub fn requests(&self) -> &RequestStats {
        &self.inner.requests
    }

    /// How long this cluster's reconciles waited for its watches to show
    /// what their controllers wrote, and how often the wait ran out (see
    /// [`Config::read_your_writes`](crate::controller::Config::read_your_writes)).
    /// A namespace of a host shares its host's figures, as it shares its
    /// watches.
    pub fn read_your_writes(&self) -> WriteWaits {
        self.inner.cache.writes().stats()
    }

    /// The cluster's shared watches and stores.
    pub fn cache(&self) -> &ClusterCache {
        &self.inner.cache
    }

    /// The store of `K` objects, if one watch of `K` runs here (a
    /// controller's, whatever its selector or namespace); `None` if none
    /// does, and if several do: see [`ClusterCache::store`], and
    /// [`ClusterCache::find`] to name one by its configuration.
    ///
    /// ```no_run
    /// # fn example(cluster: kube_multicluster::Cluster) {
    /// use k8s_openapi::api::core::v1::ConfigMap;
    ///
    /// if let Some(store) = cluster.store::<ConfigMap>() {
    ///     println!("{} ConfigMaps cached in {}", store.state().len(), cluster.name());
    /// }
    /// # }
    /// ```
    pub fn store<K: Watchable<DynamicType = ()>>(&self) -> Option<Store<K>> {
        self.inner.cache.store::<K>()
    }

    /// The recorder of Kubernetes Events in this cluster for `controller`:
    /// kube-runtime's [`Recorder`], writing `events.k8s.io/v1` Events
    /// through this cluster's client, reported by `controller` from this
    /// host (the reporting instance). One recorder per controller and
    /// engagement, made on first use, so repeats of an Event within
    /// kube-runtime's few minutes are counted on one Event rather than
    /// written anew; it goes when the engagement goes. Writing Events needs
    /// `create` and `patch` on `events` in the `events.k8s.io` group.
    ///
    /// [`ObjectRequest::publish`](crate::ObjectRequest::publish) records on
    /// a reconcile's own object.
    pub fn recorder(&self, controller: &str) -> Recorder {
        let mut recorders = lock(&self.inner.recorders);
        if let Some(recorder) = recorders.get(controller) {
            return recorder.clone();
        }
        let recorder = Recorder::new(self.client(), Reporter::from(controller));
        recorders.insert(controller.into(), recorder.clone());
        recorder
    }

    /// The cluster's own ID, and the clusterset it belongs to, as the About
    /// API (KEP-2149) defines them:
    ///
    /// - the ID is the `spec.value` of the cluster's `ClusterProperty`
    ///   `cluster.clusterset.k8s.io` (`about.k8s.io/v1alpha1`) where it has
    ///   one, else the UID of its `kube-system` namespace (see
    ///   [`IdSource`](crate::identity::IdSource));
    /// - the clusterset is the `spec.value` of its `ClusterProperty`
    ///   `clusterset.k8s.io`, if it has one.
    ///
    /// Where the fleet names a cluster as its provider sees it, the ID is
    /// the same whichever provider or process engaged the cluster.
    ///
    /// Read through this cluster's [`client`](Self::client) on the first
    /// call, and kept for the rest of the engagement: the ID of a cluster
    /// in a clusterset does not change while it is a member, and a property
    /// set or changed later is seen in the next engagement (when the fleet
    /// engages the name again). Concurrent calls wait for one read. A
    /// failed read is not kept: the next call reads again.
    ///
    /// A property that is missing, or a cluster that does not serve
    /// `ClusterProperty` at all, is "not found" and falls back as above;
    /// any other failure is an [`IdentityError`] naming the cluster and
    /// what was being read, never an ID from elsewhere: a cluster whose
    /// `ClusterProperty` the client may not read does not get its
    /// `kube-system` UID instead. The reads are bounded by the client's own
    /// timeouts; wrap the call in `tokio::time::timeout` for a tighter
    /// bound.
    ///
    /// The reads need `get` on `namespaces` and on `clusterproperties` of
    /// `about.k8s.io` ([`ClusterIdentity::rules`]), the second even where
    /// the cluster does not serve `ClusterProperty`.
    ///
    /// A cluster that is a namespace of a host ([`of_view`](Self::of_view))
    /// reads the host's properties and `kube-system`: every namespace of
    /// one host has the host's identity.
    ///
    /// ```no_run
    /// # async fn example(cluster: kube_multicluster::Cluster) -> Result<(), kube_multicluster::identity::IdentityError> {
    /// let identity = cluster.identity().await?;
    /// tracing::info!(
    ///     cluster = %cluster.name(),
    ///     id = identity.id(),
    ///     clusterset = identity.clusterset(),
    ///     "engaged",
    /// );
    /// # Ok(())
    /// # }
    /// ```
    pub async fn identity(&self) -> Result<ClusterIdentity, IdentityError> {
        let inner = &self.inner;
        inner
            .identity
            .get_or_try_init(|| identity::read(&inner.name, inner.client.get()))
            .await
            .cloned()
    }

    /// Whether this engagement still holds: `false` once the fleet has
    /// disengaged the cluster or replaced it under the same name.
    pub fn is_engaged(&self) -> bool {
        !self.inner.left.load(Ordering::Acquire)
    }

    /// Completes when this engagement ends (see [`is_engaged`](Self::is_engaged)):
    /// for work that should stop when its cluster is disengaged.
    pub async fn disengaged(&self) {
        loop {
            let notified = self.inner.leaving.notified();
            let mut notified = std::pin::pin!(notified);
            // Registered before looking, so a leave in between is not missed.
            notified.as_mut().enable();
            if !self.is_engaged() {
                return;
            }
            notified.await;
        }
    }

    /// An API for objects of the static type `K` in `namespace` (all
    /// namespaces, or a cluster-scoped type, for `None`), through this
    /// cluster's client: written for any scope, where kube's typed `Api`
    /// constructors each want theirs known.
    pub(crate) fn api_for<K: kube::Resource<DynamicType = ()>>(
        &self,
        namespace: Option<&str>,
    ) -> kube::Api<kube::api::DynamicObject> {
        let resource = kube::api::ApiResource::erase::<K>(&());
        match namespace {
            Some(namespace) => kube::Api::namespaced_with(self.client(), namespace, &resource),
            None => kube::Api::all_with(self.client(), &resource),
        }
    }

    /// Whether `other` is the same engagement (not only the same name).
    pub(crate) fn same_engagement(&self, other: &Cluster) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// Whether it answers and its watches run: see [`ClusterHealth`].
    ///
    /// ```no_run
    /// # fn example(cluster: kube_multicluster::Cluster) {
    /// if !cluster.health().is_healthy() {
    ///     eprintln!("{}: {}", cluster.name(), cluster.health());
    /// }
    /// # }
    /// ```
    pub fn health(&self) -> ClusterHealth {
        let reachability = &self.inner.reachability;
        if let Some((down_for, cause)) = reachability.down() {
            return ClusterHealth::Unreachable { down_for, cause };
        }
        let cache = &self.inner.cache;
        let mut failing: Vec<String> = cache.failing().iter().map(ToString::to_string).collect();
        if cache.view_namespace().is_some() {
            // Its cluster-scoped kinds are watched by its host.
            failing.extend(cache.whole().failing().iter().map(ToString::to_string));
        }
        failing.extend(cache.waiting_for_room());
        if failing.is_empty() {
            return ClusterHealth::Healthy;
        }
        ClusterHealth::Degraded {
            cause: failing.join("; "),
        }
    }

    /// Whether the cluster answers, as its client's requests find it:
    /// shared with the other namespaces of its host, for a namespace view.
    pub(crate) fn reachability(&self) -> &Arc<Reachability> {
        &self.inner.reachability
    }

    pub(crate) fn leave(&self) {
        if !self.inner.shares_reachability {
            self.inner.reachability.close();
        }
        self.ended();
    }

    /// Ends this engagement but keeps asking the cluster whether it is
    /// back: its reachability, to hold while it is set aside, and what its
    /// probes ask through, to engage it with again. `None` for a namespace
    /// of a host, whose reachability is the host's and is not set aside.
    pub(crate) fn set_aside(&self) -> Option<Arc<Reachability>> {
        if self.inner.shares_reachability {
            return None;
        }
        self.ended();
        Some(self.inner.reachability.clone())
    }

    /// Whether its reachability is its own (not a host's).
    pub(crate) fn owns_reachability(&self) -> bool {
        !self.inner.shares_reachability
    }

    fn ended(&self) {
        self.inner.left.store(true, Ordering::Release);
        self.inner.leaving.notify_waiters();
    }
}
