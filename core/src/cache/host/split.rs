//! One cluster whose namespaces are clusters of their own: one watch per type
//! at the API server for all of them, its objects kept once, in a part per
//! namespace, each part read as the watch of one namespace's cluster.

use std::{
    any::Any,
    collections::HashMap,
    fmt,
    sync::{Arc, Mutex, MutexGuard, Weak},
};

use futures::{Stream, StreamExt};
use http::Request;
use kube::{
    Client, Resource,
    client::Body,
    runtime::{
        WatchStreamExt,
        reflector::store::Writer,
        watcher::{self, Event},
    },
};
use tokio::task::AbortHandle;
use tower::BoxError;

use super::permits::InitialLists;
use super::registry::{WatchKey, watch_key};
use super::{
    ClusterCache, Shape, SharedWatch, TypeInfo, Watchable,
    state::{FailureLog, Health},
    watch::{Crossing, Hub, apply},
};
use crate::{
    client::{ClusterClient, Reachability, Writes, counting, is_unanswered},
    cluster_name::ClusterName,
};

/// The cache of a cluster whose namespaces are engaged as clusters of their
/// own, each through a [`NamespaceView`]: what a namespace provider builds
/// its clusters on.
///
/// However many namespaces are engaged, each type (and watch configuration)
/// is watched once at the API server, across all namespaces, and each object
/// is cached once, in the part of the cache that belongs to its namespace. A
/// namespace's cluster reads its part only: its stores and subscriptions see
/// the objects of its namespace and of no other. The watch starts when the
/// first namespace's controller asks for the type, and stops when the last
/// one lets go.
///
/// Cluster-scoped kinds (`Namespace`, `Node`, a cluster-scoped custom
/// resource) are not split: each namespace's cluster reads the host's one
/// watch of them, all of it. A controller knows the scope of every kind it
/// watches; code that reads a namespace's cache directly should read a
/// cluster-scoped `DynamicObject` kind from [`HostCache::cache`], since a
/// namespace's cache takes every `DynamicObject` kind for a namespaced one.
///
/// The host's watches hold the objects of every namespace, as one watch of
/// all namespaces would, also of namespaces that no cluster reads (yet):
/// a namespace engaged later starts with its objects, with no list of its
/// own. So the memory a type costs is that of all its objects in the host,
/// and the host's client needs rights to list and watch it in all
/// namespaces. The part of a namespace that holds nothing is forgotten when
/// its last reader leaves.
///
/// The split is of the cache, not of rights: a namespace's client is the
/// host's client with another default namespace, and can reach any
/// namespace the host's credentials can. It keeps honest controllers apart;
/// it is no security boundary between them.
///
/// Cheap to clone; clones share the cache.
///
/// ```no_run
/// # async fn example(client: kube::Client) {
/// use kube_fleet::{Fleet, cache::HostCache};
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
    /// The host's own cache: its client, its list mode, and the watches of
    /// cluster-scoped types.
    cache: ClusterCache,
    /// Whether the host answers, as its watches and every namespace's
    /// requests find it: one for all its namespaces.
    reachability: Arc<Reachability>,
    /// The split watches, by their key in all namespaces.
    split: Mutex<HashMap<WatchKey, Weak<dyn Any + Send + Sync>>>,
}

impl fmt::Debug for HostCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostCache")
            .field("host", &self.inner.cache.cluster)
            .field("watches", &self.watch_count())
            .finish()
    }
}

/// One namespace of a [`HostCache`], to be engaged as a cluster of its own
/// ([`Fleet::engage_view`](crate::Fleet::engage_view),
/// [`ClusterEvent::EngageView`](crate::provider::ClusterEvent::EngageView)).
#[derive(Clone)]
pub struct NamespaceView {
    host: HostCache,
    namespace: String,
    client: Client,
}

impl fmt::Debug for NamespaceView {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NamespaceView")
            .field("host", &self.host.inner.cache.cluster)
            .field("namespace", &self.namespace)
            .finish()
    }
}

impl NamespaceView {
    /// The namespace.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// A client of the host whose default namespace is this one. It sends
    /// its requests through the host's client: one connection for all.
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    pub(crate) fn host(&self) -> &HostCache {
        &self.host
    }
}

impl HostCache {
    /// The cache of the cluster `client` reaches, named `host` in logs.
    /// Call it inside a Tokio runtime: the client it keeps starts a task
    /// there.
    pub fn new(host: impl Into<ClusterName>, client: impl Into<ClusterClient>) -> Self {
        let host = host.into();
        let client = client.into();
        let reachability = Arc::new(Reachability::new(host.clone(), client.clone()));
        // The host's own requests (its shared watches) are counted under no
        // cluster; each namespace's count in its own engagement.
        // Its watches only: no budget to hold them back.
        let writes = Arc::<Writes>::default();
        let client = counting(
            host.clone(),
            client,
            Arc::default(),
            reachability.clone(),
            None,
            writes.clone(),
        );
        Self {
            inner: Arc::new(HostInner {
                cache: ClusterCache::new(host, client, InitialLists::unbounded(), writes),
                reachability,
                split: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// Whether the host answers, shared by its namespaces.
    pub(crate) fn reachability(&self) -> &Arc<Reachability> {
        &self.inner.reachability
    }

    /// The namespace `namespace` of the host, to be engaged as a cluster.
    /// Call it inside a Tokio runtime: its client starts a task there.
    pub fn view(&self, namespace: impl Into<String>) -> NamespaceView {
        let namespace = namespace.into();
        let host = self.inner.cache.client.clone();
        let send = tower::service_fn(move |request: Request<Body>| {
            let host = host.clone();
            async move { host.send(request).await.map_err(BoxError::from) }
        });
        NamespaceView {
            host: self.clone(),
            client: Client::new(send, namespace.clone()),
            namespace,
        }
    }

    /// The host's name, as given.
    pub fn name(&self) -> &ClusterName {
        &self.inner.cache.cluster
    }

    /// A client of the host, in its kubeconfig's default namespace.
    pub fn client(&self) -> Client {
        self.inner.cache.client.clone()
    }

    /// How many watches of the host run now, split by namespace or not:
    /// what the API server serves, whatever the number of namespaces.
    pub fn watch_count(&self) -> usize {
        let split = self
            .split()
            .values()
            .filter(|w| w.strong_count() > 0)
            .count();
        split + self.inner.cache.watch_count()
    }

    /// The host's own cache: the watches of cluster-scoped kinds, which
    /// every namespace's cluster reads whole.
    pub fn cache(&self) -> &ClusterCache {
        &self.inner.cache
    }

    fn split(&self) -> MutexGuard<'_, HashMap<WatchKey, Weak<dyn Any + Send + Sync>>> {
        self.inner.split.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The watch of `K` objects in `namespace`: its part of the host's
    /// one watch of them in all namespaces, started now if it does not run.
    pub(super) fn part<K: Watchable>(
        &self,
        dyntype: &K::DynamicType,
        namespace: &str,
        shape: &Shape,
        config: &watcher::Config,
        cluster: &ClusterName,
    ) -> SharedWatch<K> {
        let key = watch_key::<K>(shape, dyntype, None, config);
        let split = {
            let mut watches = self.split();
            let running = watches
                .get(&key)
                .and_then(Weak::upgrade)
                .and_then(|w| w.downcast::<Split<K>>().ok());
            match running {
                Some(split) => split,
                None => {
                    watches.retain(|_, w| w.strong_count() > 0);
                    let events =
                        self.inner
                            .cache
                            .events::<K>(dyntype, None, shape, config, Arc::default());
                    let split = Arc::new(Split::start(
                        self.inner.cache.cluster.clone(),
                        dyntype.clone(),
                        events,
                        self.inner.cache.writes().clone(),
                    ));
                    let weak: Weak<dyn Any + Send + Sync> = Arc::downgrade(&split) as _;
                    watches.insert(key, weak);
                    split
                }
            }
        };
        tracing::debug!(%cluster, namespace, kind = %K::kind(dyntype), "reading a part of the host's watch");
        split.part(namespace)
    }
}

/// One watch of the host, split by namespace.
struct Split<K: Resource<DynamicType: TypeInfo> + Clone + 'static> {
    parts: Arc<Mutex<Parts<K>>>,
    task: AbortHandle,
}

impl<K: Resource<DynamicType: TypeInfo> + Clone> Drop for Split<K> {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct Parts<K: Resource<DynamicType: TypeInfo> + Clone + 'static> {
    by_namespace: HashMap<String, Part<K>>,
    dyntype: K::DynamicType,
    /// Whether a list is under way (between `Init` and `InitDone`).
    listing: bool,
    /// Whether a list has completed.
    listed: bool,
    health: Health,
}

struct Part<K: Resource<DynamicType: TypeInfo> + Clone + 'static> {
    writer: Writer<K>,
    hub: Arc<Hub<K>>,
}

impl<K: Resource<DynamicType: TypeInfo> + Clone + 'static> Parts<K> {
    /// The part of `namespace`, made empty now if there is none.
    fn part(&mut self, namespace: &str) -> &mut Part<K> {
        if !self.by_namespace.contains_key(namespace) {
            let mut writer = Writer::new(self.dyntype.clone());
            if self.listing {
                // It takes part in the list under way.
                writer.apply_watcher_event(&Event::Init);
            }
            let hub = Arc::new(Hub::new(self.health.clone(), self.listed));
            self.by_namespace
                .insert(namespace.to_owned(), Part { writer, hub });
        }
        self.by_namespace
            .get_mut(namespace)
            .expect("inserted above")
    }

    /// Tells every part where the host's watch stands.
    fn tell_health(&self) {
        for part in self.by_namespace.values() {
            part.hub.set_health(&self.health);
        }
    }

    /// Forgets the parts that hold nothing and that no watch reads.
    fn forget_unread(&mut self) {
        self.by_namespace.retain(|_, part| {
            Arc::strong_count(&part.hub) > 1 || !part.writer.as_reader().is_empty()
        });
    }
}

impl<K> Split<K>
where
    K: Resource<DynamicType: TypeInfo> + Clone + Send + Sync + 'static,
{
    fn start<S>(host: ClusterName, dyntype: K::DynamicType, events: S, writes: Arc<Writes>) -> Self
    where
        S: Stream<Item = watcher::Result<Event<K>>> + Send + 'static,
    {
        let parts = Arc::new(Mutex::new(Parts {
            by_namespace: HashMap::new(),
            dyntype: dyntype.clone(),
            listing: false,
            listed: false,
            health: Health::syncing(),
        }));
        let crossing = Crossing::new::<K>(writes, &dyntype);
        let task = tokio::spawn(feed(host, events, parts.clone(), dyntype, crossing));
        Self {
            parts,
            task: task.abort_handle(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Parts<K>> {
        lock(&self.parts)
    }

    /// The watch of one namespace: its part, read.
    fn part(self: Arc<Self>, namespace: &str) -> SharedWatch<K> {
        let (store, hub, dyntype) = {
            let mut parts = self.lock();
            let dyntype = parts.dyntype.clone();
            let part = parts.part(namespace);
            (part.writer.as_reader(), part.hub.clone(), dyntype)
        };
        let reader = Arc::new(Reader {
            split: self,
            namespace: namespace.to_owned(),
        });
        SharedWatch::part(store, hub, dyntype, reader)
    }
}

/// What keeps a split watch running for one reader of a part, and forgets
/// the part when the last reader of an empty one leaves.
struct Reader<K: Resource<DynamicType: TypeInfo> + Clone + 'static> {
    // Keeps the watch running.
    split: Arc<Split<K>>,
    namespace: String,
}

impl<K: Resource<DynamicType: TypeInfo> + Clone> Drop for Reader<K> {
    fn drop(&mut self) {
        // The reader's watch has let go of the part's hub by now (a
        // watch's fields drop in order, this last).
        let mut parts = lock(&self.split.parts);
        if parts.listing {
            // Its store looks empty while the list is held back until it
            // is complete; the end of the list forgets what is unread.
            return;
        }
        let unread_and_empty = parts.by_namespace.get(&self.namespace).is_some_and(|part| {
            Arc::strong_count(&part.hub) == 1 && part.writer.as_reader().is_empty()
        });
        if unread_and_empty {
            parts.by_namespace.remove(&self.namespace);
        }
    }
}

fn lock<K: Resource<DynamicType: TypeInfo> + Clone>(
    parts: &Mutex<Parts<K>>,
) -> MutexGuard<'_, Parts<K>> {
    parts.lock().unwrap_or_else(|e| e.into_inner())
}

/// A part's subscribers, and what to tell them.
type Told<K> = (Arc<Hub<K>>, Vec<super::subscription::Note<K>>);

/// Runs the host's watch, and hands each event to the part of its object's
/// namespace: the list's start and end to every part.
async fn feed<K, S>(
    host: ClusterName,
    events: S,
    parts: Arc<Mutex<Parts<K>>>,
    dyntype: K::DynamicType,
    crossing: Crossing,
) where
    K: Resource<DynamicType: TypeInfo> + Clone + Send + Sync + 'static,
    S: Stream<Item = watcher::Result<Event<K>>> + Send + 'static,
{
    let mut events = std::pin::pin!(events.default_backoff());
    let mut failures = FailureLog::default();
    let kind = K::kind(&dyntype).into_owned();
    let api_version = K::api_version(&dyntype).into_owned();
    while let Some(event) = events.next().await {
        let event = match event {
            Ok(event) => event,
            Err(error) => {
                let reason = super::discovery::failure_reason(&error, &kind, &api_version);
                let unanswered = is_unanswered(&error);
                failures.failed(&host, &kind, &reason, unanswered);
                let mut parts = lock(&parts);
                if parts.health.fail(&reason, unanswered) {
                    parts.tell_health();
                }
                continue;
            }
        };
        let listed = matches!(event, Event::InitDone);
        let healthy = !matches!(event, Event::Init);
        let shown = crossing.before(&event);
        // What to tell each part's subscribers, told once the lock is let go.
        let mut told: Vec<Told<K>> = Vec::new();
        let mut parts = lock(&parts);
        match event {
            Event::Init => {
                parts.listing = true;
                for part in parts.by_namespace.values_mut() {
                    part.writer.apply_watcher_event(&Event::Init);
                }
            }
            Event::InitApply(object) => {
                let namespace = object.meta().namespace.clone().unwrap_or_default();
                let part = parts.part(&namespace);
                part.writer.apply_watcher_event(&Event::InitApply(object));
            }
            Event::InitDone => {
                parts.listing = false;
                parts.listed = true;
                for part in parts.by_namespace.values_mut() {
                    let reader = part.writer.as_reader();
                    let notes = apply(&mut part.writer, &reader, Event::InitDone, &dyntype);
                    told.push((part.hub.clone(), notes));
                }
            }
            event @ (Event::Apply(_) | Event::Delete(_)) => {
                let (Event::Apply(object) | Event::Delete(object)) = &event else {
                    unreachable!("matched above");
                };
                let namespace = object.meta().namespace.clone().unwrap_or_default();
                let part = parts.part(&namespace);
                let reader = part.writer.as_reader();
                let notes = apply(&mut part.writer, &reader, event, &dyntype);
                if Arc::strong_count(&part.hub) == 1 && reader.is_empty() {
                    // Its namespace's last object is gone, and nobody reads it.
                    parts.by_namespace.remove(&namespace);
                } else {
                    told.push((part.hub.clone(), notes));
                }
            }
        }
        if healthy {
            failures.recovered();
            if parts.health.heard(listed) {
                parts.tell_health();
            }
        }
        if listed {
            parts.forget_unread();
        }
        drop(parts);
        // Out of the parts' lock: the writes' lock is never taken inside it.
        crossing.after(shown);
        for (hub, notes) in told {
            hub.notify(&notes, listed);
        }
    }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::ObjectMeta;
    use tokio::sync::mpsc;
    use tokio_stream::wrappers::UnboundedReceiverStream;

    use super::*;

    type Events = mpsc::UnboundedSender<watcher::Result<Event<ConfigMap>>>;

    fn config_map(namespace: &str, name: &str) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(namespace.into()),
                resource_version: Some("1".into()),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        }
    }

    fn split() -> (Arc<Split<ConfigMap>>, Events) {
        let (tx, rx) = mpsc::unbounded_channel();
        let split = Split::start(
            "host".into(),
            (),
            UnboundedReceiverStream::new(rx),
            Arc::default(),
        );
        (Arc::new(split), tx)
    }

    async fn settle() {
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
    }

    fn namespaces(split: &Split<ConfigMap>) -> Vec<String> {
        let mut names: Vec<_> = split.lock().by_namespace.keys().cloned().collect();
        names.sort();
        names
    }

    #[tokio::test]
    async fn each_part_holds_its_namespace_and_a_late_part_starts_with_its_objects() {
        let (split, events) = split();
        let a = split.clone().part("a");
        events.send(Ok(Event::Init)).unwrap();
        for (ns, name) in [("a", "one"), ("b", "two"), ("a", "three")] {
            events
                .send(Ok(Event::InitApply(config_map(ns, name))))
                .unwrap();
        }
        events.send(Ok(Event::InitDone)).unwrap();
        a.synced().await;
        assert_eq!(a.store().len(), 2);
        let b = split.clone().part("b");
        assert!(b.has_synced());
        assert_eq!(b.store().len(), 1);
        let mut changes = Arc::new(b).subscribe();
        let first = changes.next().await.unwrap();
        assert_eq!(first.object().metadata.name.as_deref(), Some("two"));
    }

    #[tokio::test]
    async fn the_part_of_a_reader_that_left_is_forgotten_if_empty() {
        let (split, events) = split();
        events.send(Ok(Event::Init)).unwrap();
        events
            .send(Ok(Event::InitApply(config_map("kept", "x"))))
            .unwrap();
        events.send(Ok(Event::InitDone)).unwrap();
        settle().await;
        for i in 0..100 {
            drop(split.clone().part(&format!("short-lived-{i}")));
        }
        events
            .send(Ok(Event::Apply(config_map("kept", "y"))))
            .unwrap();
        settle().await;
        assert_eq!(namespaces(&split), ["kept"]);
    }

    #[tokio::test]
    async fn the_feed_stops_when_the_last_reader_leaves() {
        let (split, events) = split();
        let watch = split.clone().part("a");
        drop(split);
        drop(watch);
        settle().await;
        assert!(events.is_closed(), "the host's watch runs on");
    }

    #[tokio::test]
    async fn a_reader_leaving_during_a_list_keeps_its_namespaces_listed_objects() {
        let (split, events) = split();
        let a = split.clone().part("a");
        events.send(Ok(Event::Init)).unwrap();
        events
            .send(Ok(Event::InitApply(config_map("a", "x"))))
            .unwrap();
        settle().await;
        drop(a);
        events.send(Ok(Event::InitDone)).unwrap();
        settle().await;
        let again = split.clone().part("a");
        assert!(again.has_synced());
        assert_eq!(again.store().len(), 1);
    }
}
