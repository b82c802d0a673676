//! One cluster whose parts are clusters of their own (its namespaces, or
//! the logical clusters an annotation names): one watch per type at the API
//! server for all of them, its objects kept once, in a part each, each part
//! read as the watch of one part's cluster.

mod registry;
mod split;
mod view;

pub use registry::ClusterCache;
use registry::{WatchKey, watch_key};
pub use view::HostView;

use std::{
    any::Any,
    collections::HashMap,
    fmt,
    sync::{Arc, Mutex, Weak},
};

use kube::{Client, api::ObjectMeta, runtime::watcher};

use super::permits::InitialLists;
use super::{Shape, SharedWatch, Watchable};
use crate::{
    client::{ClusterClient, Parts, Reachability, Writes, counting},
    cluster_name::ClusterName,
    panic::lock,
};
use split::Split;

/// The cache of a cluster whose parts are engaged as clusters of their own,
/// each through a [`HostView`]: what a namespace provider builds its
/// clusters on (a part per namespace), and a provider of logical clusters
/// served through one endpoint, such as kcp's (a part per value of an
/// annotation: [`SplitBy`]).
///
/// However many parts are engaged, each type (and watch configuration) is
/// watched once at the API server, across all of them, and each object is
/// cached once, in its part. A part's cluster reads its part only: its
/// stores and subscriptions see the objects of its part and of no other.
/// The watch starts when the first part's controller asks for the type,
/// and stops when the last one lets go.
///
/// Split by namespace, cluster-scoped kinds (`Namespace`, `Node`, a
/// cluster-scoped custom resource) are not split: each namespace's cluster
/// reads the host's one watch of them, all of it. A controller knows the
/// scope of every kind it watches; code that reads a namespace's cache
/// directly should read a cluster-scoped `DynamicObject` kind from
/// [`HostCache::cache`], since a namespace's cache takes every
/// `DynamicObject` kind for a namespaced one. Split by annotation, every
/// kind is split, and a part's watch of one namespace is a watch of its
/// own, through its own client (the host's one watch is of all namespaces).
///
/// The host's watches hold the objects of every part, as one watch of all
/// namespaces would, also of parts that no cluster reads (yet): a part
/// engaged later starts with its objects, with no list of its own. So the
/// memory a type costs is that of all its objects in the host, and the
/// host's client needs rights to list and watch it in all namespaces. A
/// part that holds nothing is forgotten when its last reader leaves.
///
/// Split by namespace, the split is of the cache, not of rights: a
/// namespace's client is the host's client with another default namespace,
/// and can reach any namespace the host's credentials can. It keeps honest
/// controllers apart; it is no security boundary between them.
///
/// Cheap to clone; clones share the cache.
///
/// ```no_run
/// # async fn example(client: kube::Client) {
/// use kube_multicluster::{Fleet, cache::HostCache};
///
/// let host = HostCache::new("host", client);
/// let fleet = Fleet::new();
/// // Two clusters, one watch per type between them.
/// fleet.engage_view("team-a", host.view("team-a"));
/// fleet.engage_view("team-b", host.view("team-b"));
/// assert_eq!(fleet.get("team-a").unwrap().client().default_namespace(), "team-a");
/// # }
/// ```
#[derive(Clone)]
pub struct HostCache {
    inner: Arc<HostInner>,
}

struct HostInner {
    /// The client it was given: what its parts' requests go through.
    raw: ClusterClient,
    /// The host's own cache: its client, its list mode, and the watches of
    /// cluster-scoped types (split by namespace).
    cache: ClusterCache,
    /// What tells its parts apart.
    by: SplitBy,
    /// Whether the host answers, as its watches and every part's requests
    /// find it: one for all its parts.
    reachability: Arc<Reachability>,
    /// The split watches, by their key in all namespaces.
    split: Mutex<HashMap<WatchKey, Weak<dyn Any + Send + Sync>>>,
}

/// What tells the parts of a [`HostCache`] apart: which cluster an object
/// of the host's watches belongs to.
///
/// ```
/// use kube_multicluster::cache::SplitBy;
///
/// // kcp marks each object its wildcard watches return with its logical cluster.
/// let by = SplitBy::annotation("kcp.io/cluster");
/// assert_eq!(by, SplitBy::Annotation("kcp.io/cluster".into()));
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SplitBy {
    /// Each namespace is a cluster; cluster-scoped kinds are the host's,
    /// read whole by every namespace's cluster.
    Namespace,
    /// Each value of this annotation is a cluster, and every kind is split,
    /// cluster-scoped kinds too. An object without the annotation belongs
    /// to no part's cluster.
    Annotation(String),
}

impl SplitBy {
    /// Split by the value of the annotation `key`.
    pub fn annotation(key: impl Into<String>) -> Self {
        Self::Annotation(key.into())
    }

    /// The part an object with this metadata belongs to: its namespace (the
    /// empty string for a cluster-scoped object) or its annotation's value
    /// (`None` without one).
    pub(crate) fn part_of<'a>(&self, meta: &'a ObjectMeta) -> Option<&'a str> {
        match self {
            Self::Namespace => Some(meta.namespace.as_deref().unwrap_or_default()),
            Self::Annotation(key) => meta
                .annotations
                .as_ref()
                .and_then(|annotations| annotations.get(key))
                .map(String::as_str),
        }
    }
}

impl fmt::Debug for HostCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostCache")
            .field("host", &self.inner.cache.cluster)
            .field("by", &self.inner.by)
            .field("watches", &self.watch_count())
            .finish()
    }
}

impl HostCache {
    /// The cache of the cluster `client` reaches, split by namespace, named
    /// `host` in logs. Call it inside a Tokio runtime: the client it keeps
    /// starts a task there.
    pub fn new(host: impl Into<ClusterName>, client: impl Into<ClusterClient>) -> Self {
        Self::split_by(host, client, SplitBy::Namespace)
    }

    /// The cache of the cluster `client` reaches, its parts told apart by
    /// `by`. For a split by annotation, `client` is what the host's watches
    /// go through (kcp: the wildcard endpoint `…/clusters/*` of a virtual
    /// workspace), and each part's cluster is given a client of its own
    /// with [`view_with`](Self::view_with).
    ///
    /// ```no_run
    /// # async fn example(all: kube::Client, tenant_a: kube::Client) {
    /// use kube_multicluster::{Fleet, cache::{HostCache, SplitBy}};
    ///
    /// let host = HostCache::split_by("shard", all, SplitBy::annotation("kcp.io/cluster"));
    /// Fleet::new().engage_view("tenant-a", host.view_with("2x5qrt7c", tenant_a));
    /// # }
    /// ```
    pub fn split_by(
        host: impl Into<ClusterName>,
        client: impl Into<ClusterClient>,
        by: SplitBy,
    ) -> Self {
        let host = host.into();
        let client = client.into();
        // Split by annotation, each part is a cluster of its own to the
        // garbage collector.
        let apart = by != SplitBy::Namespace;
        let reachability =
            Arc::new(Reachability::new(host.clone(), client.clone()).collected_apart(apart));
        // The host's own requests (its shared watches) are counted under no
        // cluster; each part's count in its own engagement.
        // Its watches only: no budget to hold them back.
        let writes = Arc::<Writes>::default();
        let raw = client.clone();
        let client = counting(Parts {
            cluster: host.clone(),
            client,
            stats: Arc::default(),
            reachability: reachability.clone(),
            budget: None,
            writes: writes.clone(),
        });
        Self {
            inner: Arc::new(HostInner {
                raw,
                cache: ClusterCache::new(
                    host,
                    client,
                    InitialLists::unbounded(),
                    writes,
                    &reachability,
                ),
                by,
                reachability,
                split: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// What tells its parts apart.
    pub fn by(&self) -> &SplitBy {
        &self.inner.by
    }

    /// Whether its parts are its namespaces.
    pub(crate) fn by_namespace(&self) -> bool {
        self.inner.by == SplitBy::Namespace
    }

    /// Whether the host answers, shared by its parts.
    pub(crate) fn reachability(&self) -> &Arc<Reachability> {
        &self.inner.reachability
    }

    /// The part `part` of the host (a namespace, for a split by namespace),
    /// to be engaged as a cluster, its requests sent through the client the
    /// host was made with, with `part` as their default namespace. For a
    /// split by annotation, give the part a client of its own with
    /// [`view_with`](Self::view_with): this one sends its requests where
    /// the host's go.
    pub fn view(&self, part: impl Into<String>) -> HostView {
        HostView::through_host(self.clone(), part.into())
    }

    /// The part `part` of the host, to be engaged as a cluster whose
    /// requests go through `client`: for a split by annotation, the client
    /// of that part's own cluster (kcp: `…/clusters/<logical cluster>` of
    /// the host's virtual workspace), best made with
    /// [`ClusterClient::under_path`] from the client of the server the host
    /// is under (kcp: the virtual workspace's, before the host's own
    /// `/clusters/*`), so that it shares the host's connection and adds no
    /// request queue. Its watches of all namespaces
    /// are the host's, split; split by annotation, a watch of one namespace
    /// is its own, through `client`.
    pub fn view_with(&self, part: impl Into<String>, client: impl Into<ClusterClient>) -> HostView {
        HostView::with_client(self.clone(), part.into(), client.into())
    }

    /// The host's name, as given.
    pub fn name(&self) -> &ClusterName {
        &self.inner.cache.cluster
    }

    /// A client of the host, in its kubeconfig's default namespace.
    pub fn client(&self) -> Client {
        self.inner.cache.client.get()
    }

    /// How many watches of the host run now, split or not: what the API
    /// server serves for the host, whatever the number of parts (not
    /// counting a part's own watches of one namespace, split by annotation).
    pub fn watch_count(&self) -> usize {
        let split = lock(&self.inner.split)
            .values()
            .filter(|w| w.strong_count() > 0)
            .count();
        split + self.inner.cache.watch_count()
    }

    /// The host's own cache: split by namespace, the watches of
    /// cluster-scoped kinds, which every namespace's cluster reads whole.
    pub fn cache(&self) -> &ClusterCache {
        &self.inner.cache
    }

    /// The watch of `K` objects in `part`: its part of the host's one watch
    /// of them, started now if it does not run. The part's writes are
    /// `writes`: shown by this watch as its events come.
    pub(in crate::cache) fn part<K: Watchable>(
        &self,
        dyntype: &K::DynamicType,
        part: &str,
        shape: &Shape,
        config: &watcher::Config,
        cluster: &ClusterName,
        writes: &Arc<Writes>,
    ) -> SharedWatch<K> {
        let key = watch_key::<K>(shape, dyntype, None, config);
        let mut watches = lock(&self.inner.split);
        let running = watches.get(&key).and_then(Weak::upgrade);
        let split = running.and_then(|w| w.downcast::<Split<K>>().ok());
        let split = split.unwrap_or_else(|| {
            watches.retain(|_, w| w.strong_count() > 0);
            // What tells the parts apart outlives a transform.
            let shape = match &self.inner.by {
                SplitBy::Annotation(key) => &Shape {
                    keep_annotation: Some(key.as_str().into()),
                    ..shape.clone()
                },
                SplitBy::Namespace => shape,
            };
            let events = self
                .inner
                .cache
                .events::<K>(dyntype, None, shape, config, Arc::default());
            // Split by namespace, the host's writes are its namespaces';
            // otherwise each part has writes of its own.
            let writes = self
                .by_namespace()
                .then(|| self.inner.cache.writes().clone());
            let split = Arc::new(Split::start(
                self.inner.cache.cluster.clone(),
                self.inner.by.clone(),
                dyntype.clone(),
                events,
                writes,
                Some(self.inner.reachability.recoveries()),
            ));
            watches.insert(key, Arc::downgrade(&split) as _);
            split
        });
        drop(watches);
        tracing::debug!(%cluster, part, kind = %K::kind(dyntype), "reading a part of the host's watch");
        split.part(part, writes)
    }
}
