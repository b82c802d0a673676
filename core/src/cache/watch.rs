//! One watch of one type in one cluster: the task that runs it, its store,
//! its state, and the notes it hands its subscribers.

use std::{
    collections::HashMap,
    fmt,
    sync::{Arc, Mutex, Weak, atomic::AtomicBool},
};

use futures::{FutureExt, Stream, future::BoxFuture};
use kube::{
    Resource,
    api::ObjectMeta,
    runtime::{
        reflector::{ObjectRef, Store, store::Writer},
        watcher::{self, Event},
    },
};
use tokio::{sync::watch, task::AbortHandle};

use super::{
    TypeInfo,
    retry::Retries,
    state::{Health, WatchState, WatchStatus},
    subscription::{Inbox, Note, Subscription, key_of},
};
use crate::{
    client::{Shown, Writes, Written},
    cluster_name::ClusterName,
    panic::lock,
    request::McRequest,
};

/// The subscribers of a watch, and whether it has listed yet (a subscriber
/// that comes later is told of the objects already there).
pub(super) struct Subscribers<K: Resource<DynamicType: TypeInfo>> {
    inboxes: Vec<Weak<Inbox<K>>>,
    listed: bool,
}

/// What the watch task and the [`SharedWatch`] handle share.
pub(super) struct Hub<K: Resource<DynamicType: TypeInfo>> {
    subscribers: Mutex<Subscribers<K>>,
    health: watch::Sender<Health>,
}

impl<K: Resource<DynamicType: TypeInfo>> Hub<K> {
    /// A hub in the state `health`, which has `listed` already or not.
    pub(super) fn new(health: Health, listed: bool) -> Self {
        Self {
            subscribers: Mutex::new(Subscribers {
                inboxes: Vec::new(),
                listed,
            }),
            health: watch::Sender::new(health),
        }
    }

    /// Sets where the watch stands, telling those who wait if it changed.
    pub(super) fn set_health(&self, health: &Health) {
        self.health.send_if_modified(|now| {
            let changed = now != health;
            if changed {
                *now = health.clone();
            }
            changed
        });
    }

    /// Hands `notes` to every subscriber. The list of subscribers is locked
    /// only to copy it; each inbox merges on its own.
    pub(super) fn notify(&self, notes: &[Note<K>], listed: bool) {
        if notes.is_empty() && !listed {
            return;
        }
        let inboxes: Vec<Arc<Inbox<K>>> = {
            let mut subscribers = lock(&self.subscribers);
            subscribers.listed |= listed;
            subscribers.inboxes.retain(|inbox| inbox.strong_count() > 0);
            subscribers
                .inboxes
                .iter()
                .filter_map(Weak::upgrade)
                .collect()
        };
        for inbox in inboxes {
            inbox.notify(notes);
        }
    }
}

/// Reads objects of one watch by key: what a reconcile's request keeps of
/// its controller's watch. A trait object rather than the watch itself
/// because [`SharedWatch`] needs `K: Resource` and the request does not.
pub(crate) trait Lookup<K>: Send + Sync {
    /// The object `key` names, as the watch holds it now.
    fn lookup(&self, key: &McRequest) -> Option<Arc<K>>;
}

impl<K: Resource<DynamicType: TypeInfo> + Clone + Send + Sync + 'static> Lookup<K>
    for SharedWatch<K>
{
    fn lookup(&self, key: &McRequest) -> Option<Arc<K>> {
        self.get(key)
    }
}

/// One watch of one type in one cluster: its store, its state, and a
/// [`Subscription`] for each reader that wants to hear of changes.
///
/// Subscribers read the same `Arc`s the store holds; objects are never
/// copied per reader. The watch runs as long as a handle or a subscription
/// holds it, and stops at the API server when the last one is dropped.
pub struct SharedWatch<K: Resource<DynamicType: TypeInfo> + 'static> {
    store: Store<K>,
    hub: Arc<Hub<K>>,
    dyntype: K::DynamicType,
    /// True while it waits for a permit to list.
    queued: Arc<AtomicBool>,
    /// Last: fields drop in order, and a shared task's reader looks at the
    /// part once this watch has let go of its hub.
    task: Task,
}

/// What runs a watch: its own task, stopped when the watch is dropped, or a
/// task that feeds many watches (one per namespace), kept alive by each.
enum Task {
    Own(AbortHandle),
    Shared(#[allow(dead_code)] Arc<dyn std::any::Any + Send + Sync>),
}

impl<K: Resource<DynamicType: TypeInfo> + Clone> fmt::Debug for SharedWatch<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedWatch")
            .field("kind", &K::kind(&self.dyntype))
            .field("metadata_only", &K::metadata_api())
            .field("objects", &self.store.len())
            .field("state", &self.hub.health.borrow().current())
            .finish_non_exhaustive()
    }
}

impl<K: Resource<DynamicType: TypeInfo>> Drop for SharedWatch<K> {
    fn drop(&mut self) {
        if let Task::Own(task) = &self.task {
            task.abort();
        }
    }
}

impl<K> SharedWatch<K>
where
    K: Resource<DynamicType: TypeInfo> + Clone + Send + Sync + 'static,
{
    /// A watch of `events`, run by its own task; `queued` is true while it
    /// waits for a permit to list. After a failure it retries with backoff,
    /// or at once when `recoveries` (if any) says the cluster answers again.
    pub(super) fn start<S>(
        cluster: ClusterName,
        dyntype: K::DynamicType,
        events: S,
        queued: Arc<AtomicBool>,
        writes: Arc<Writes>,
        recoveries: Option<watch::Receiver<u64>>,
    ) -> Self
    where
        S: Stream<Item = watcher::Result<Event<K>>> + Send + 'static,
    {
        let writer = Writer::new(dyntype.clone());
        let store = writer.as_reader();
        let hub = Arc::new(Hub::new(Health::syncing(), false));
        let run = run(
            events,
            (writer, store.clone()),
            hub.clone(),
            dyntype.clone(),
            Crossing::new::<K>(writes, &dyntype),
            Retries::of::<K>(cluster, &dyntype, recoveries),
        );
        // A watch that resumes where it was tells nothing until something
        // changes: its request's answer says it runs again.
        let started = Arc::downgrade(&hub);
        let task = tokio::spawn(crate::client::telling(
            move || {
                if let Some(hub) = started.upgrade() {
                    hub.health.send_if_modified(Health::answered);
                }
            },
            run,
        ));
        Self {
            store,
            hub,
            dyntype,
            task: Task::Own(task.abort_handle()),
            queued,
        }
    }

    /// A watch of part of what another task watches: its objects are in
    /// `store`, its subscribers and health in `hub`, both kept up by that
    /// task, which `feeder` keeps running.
    pub(super) fn part(
        store: Store<K>,
        hub: Arc<Hub<K>>,
        dyntype: K::DynamicType,
        feeder: Arc<dyn std::any::Any + Send + Sync>,
    ) -> Self {
        Self {
            store,
            hub,
            dyntype,
            task: Task::Shared(feeder),
            queued: Arc::default(),
        }
    }

    /// The cache of every object this watch has seen.
    pub fn store(&self) -> Store<K> {
        self.store.clone()
    }

    /// The object `key` names, as this watch holds it now.
    pub(crate) fn get(&self, key: &McRequest) -> Option<Arc<K>> {
        self.get_named(key.namespace.as_ref(), &key.name)
    }

    /// The object `namespace/name`, as this watch holds it now.
    fn get_named(&self, namespace: Option<&String>, name: &str) -> Option<Arc<K>> {
        let mut reference = ObjectRef::<K>::new_with(name, self.dyntype.clone());
        reference.namespace = namespace.cloned();
        self.store.get(&reference)
    }

    /// A stream of the changes from now on: first every object already in
    /// the store (or, before the first list completes, every object that
    /// list finds) as [`Change::Listed`](super::Change::Listed), then each
    /// change as it happens. The subscription keeps the watch running.
    pub fn subscribe(self: &Arc<Self>) -> Subscription<K> {
        let inbox = Arc::new(Inbox::new());
        {
            let mut subscribers = lock(&self.hub.subscribers);
            subscribers.inboxes.push(Arc::downgrade(&inbox));
            if subscribers.listed {
                inbox.notify(&[Note::Everything]);
            }
        }
        Subscription::new(
            self.clone(),
            self.dyntype.clone(),
            self.store.clone(),
            inbox,
        )
    }

    /// Where the watch stands now.
    pub fn state(&self) -> WatchState {
        self.hub.health.borrow().current()
    }

    /// Whether the first list has completed (the watch may be failing since).
    pub fn has_synced(&self) -> bool {
        self.hub.health.borrow().has_synced
    }

    /// Waits until the first list has completed, so that the store holds
    /// everything the cluster had.
    pub async fn synced(&self) {
        // The sender lives in the hub, which this watch keeps alive.
        let _ = self.hub.health.subscribe().wait_for(|h| h.has_synced).await;
    }

    /// How many subscriptions read this watch now.
    pub fn subscribers(&self) -> usize {
        let subscribers = lock(&self.hub.subscribers);
        subscribers
            .inboxes
            .iter()
            .filter(|inbox| inbox.strong_count() > 0)
            .count()
    }

    /// Whether this watch reads only metadata.
    pub fn is_metadata_only(&self) -> bool {
        K::metadata_api()
    }
}

impl<K: Resource<DynamicType: TypeInfo>> SharedWatch<K> {
    /// The type information its objects are stored under: `()` for static
    /// types, the `ApiResource` for `DynamicObject` (for a kind found by
    /// discovery, a stand-in of version `*` that is the same in every
    /// cluster).
    pub fn dyntype(&self) -> &K::DynamicType {
        &self.dyntype
    }
}

/// A watch's health, whatever its type: what a controller reports and waits on.
pub(crate) trait WatchProbe: Send + Sync {
    fn status(&self) -> WatchStatus;
    fn has_synced(&self) -> bool;
    /// Whether it waits for a permit to list.
    fn is_queued(&self) -> bool;
    /// Its status, if it fails.
    fn failure(&self) -> Option<WatchStatus>;
    /// Completes once the first list has completed.
    fn synced(&self) -> BoxFuture<'static, ()>;
    /// Whether the store shows `written`: holds its object at its version
    /// or later, or, for a deletion, no longer holds it.
    fn shows(&self, written: &Written) -> bool;
    /// Whether the store holds `written`'s object, at any version.
    fn holds(&self, written: &Written) -> bool;
}

impl<K> WatchProbe for SharedWatch<K>
where
    K: Resource<DynamicType: TypeInfo> + Clone + Send + Sync + 'static,
{
    fn status(&self) -> WatchStatus {
        WatchStatus {
            kind: K::kind(&self.dyntype).into_owned(),
            api_version: K::api_version(&self.dyntype).into_owned(),
            metadata_only: K::metadata_api(),
            state: self.state(),
        }
    }

    fn has_synced(&self) -> bool {
        SharedWatch::has_synced(self)
    }

    fn is_queued(&self) -> bool {
        self.queued.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn failure(&self) -> Option<WatchStatus> {
        // Read before the status is built: this is asked of every watch.
        matches!(self.state(), WatchState::Failing { .. }).then(|| self.status())
    }

    fn holds(&self, written: &Written) -> bool {
        self.get_named(written.id.namespace.as_ref(), &written.id.name)
            .is_some()
    }

    fn shows(&self, written: &Written) -> bool {
        let object = self.get_named(written.id.namespace.as_ref(), &written.id.name);
        // A version it cannot read is not waited for.
        written.shown_by(object.as_deref().map(Resource::meta), true)
    }

    fn synced(&self) -> BoxFuture<'static, ()> {
        let mut health = self.hub.health.subscribe();
        async move {
            if health.wait_for(|h| h.has_synced).await.is_err() {
                // The watch is gone without ever syncing: it never will.
                std::future::pending::<()>().await;
            }
        }
        .boxed()
    }
}

async fn run<K, S>(
    events: S,
    (mut writer, reader): (Writer<K>, Store<K>),
    hub: Arc<Hub<K>>,
    dyntype: K::DynamicType,
    crossing: Crossing,
    mut retries: Retries,
) where
    K: Resource<DynamicType: TypeInfo> + Clone + Send + Sync + 'static,
    S: Stream<Item = watcher::Result<Event<K>>> + Send + 'static,
{
    let mut events = std::pin::pin!(events);
    let resumed = || hub.health.borrow().resumed();
    let fail = |reason: &str| {
        hub.health.send_if_modified(|health| health.fail(reason));
    };
    while let Some((event, healthy)) = retries.next(&mut events, resumed, fail).await {
        let listed = matches!(event, Event::InitDone);
        let shown = crossing.before(&event);
        // The store first, so that whoever learns the watch synced finds it
        // full, and a reconcile that waited for a write finds it there.
        let notes = apply(&mut writer, &reader, event, &dyntype);
        crossing.after(shown);
        if healthy {
            hub.health.send_if_modified(|health| health.heard(listed));
        }
        hub.notify(&notes, listed);
    }
}

/// Crosses off the writes a watch's events show (see `client::writes`).
#[derive(Clone)]
pub(super) struct Crossing {
    writes: Arc<Writes>,
    group: Arc<str>,
    resource: Arc<str>,
}

/// What one event shows of its object, taken before the event is applied:
/// the parts of its metadata that [`Shown::of`] reads.
pub(super) struct Seen {
    meta: ObjectMeta,
    deleted: bool,
}

impl Crossing {
    /// For a watch of `K` described by `dyntype`.
    pub(super) fn new<K: Resource>(writes: Arc<Writes>, dyntype: &K::DynamicType) -> Self {
        Self {
            writes,
            group: K::group(dyntype).into(),
            resource: K::plural(dyntype).into(),
        }
    }

    /// Whether it tells `writes`.
    pub(super) fn tells(&self, writes: &Arc<Writes>) -> bool {
        Arc::ptr_eq(&self.writes, writes)
    }

    /// Whether it tells the same writes as `other`.
    pub(super) fn same(&self, other: &Crossing) -> bool {
        self.tells(&other.writes)
    }

    /// What `event` shows, if any write waits to be shown.
    pub(super) fn before<K: Resource>(&self, event: &Event<K>) -> Option<Seen> {
        if !self.writes.is_tracking() {
            return None;
        }
        let (object, deleted) = match event {
            Event::Apply(object) | Event::InitApply(object) => (object, false),
            Event::Delete(object) => (object, true),
            Event::Init | Event::InitDone => return None,
        };
        let meta = object.meta();
        Some(Seen {
            meta: ObjectMeta {
                namespace: meta.namespace.clone(),
                name: Some(meta.name.clone()?),
                resource_version: meta.resource_version.clone(),
                uid: meta.uid.clone(),
                ..ObjectMeta::default()
            },
            deleted,
        })
    }

    /// Tells the cluster's writes what the event applied showed: a write
    /// recorded while it was applied, or a list that replaced the store,
    /// wakes those who wait to look again.
    pub(super) fn after(&self, seen: Option<Seen>) {
        let Some(seen) = seen else {
            self.writes.relisted();
            return;
        };
        if let Some(shown) = Shown::of((&self.group, &self.resource), &seen.meta, seen.deleted) {
            self.writes.shown(&shown);
        }
    }
}

/// Applies one event to the store and says which objects it changed.
pub(super) fn apply<K>(
    writer: &mut Writer<K>,
    reader: &Store<K>,
    event: Event<K>,
    dyntype: &K::DynamicType,
) -> Vec<Note<K>>
where
    K: Resource<DynamicType: TypeInfo> + Clone + 'static,
{
    match event {
        Event::Apply(object) => {
            let key = key_of(&object, dyntype);
            writer.apply_watcher_event(&Event::Apply(object));
            vec![Note::Applied(key)]
        }
        Event::Delete(object) => {
            let key = key_of(&object, dyntype);
            writer.apply_watcher_event(&Event::Delete(object.clone()));
            vec![Note::Deleted(key, Arc::new(object))]
        }
        Event::InitDone => {
            let before = reader.state();
            writer.apply_watcher_event(&Event::InitDone);
            relisted(before, reader.state(), dyntype)
        }
        event @ (Event::Init | Event::InitApply(_)) => {
            // Buffered by the writer until the list is done.
            writer.apply_watcher_event(&event);
            Vec::new()
        }
    }
}

/// What a (re)list changed: objects that are new or whose resource version
/// moved, and objects that vanished (they get no delete event of their own).
fn relisted<K>(before: Vec<Arc<K>>, after: Vec<Arc<K>>, dyntype: &K::DynamicType) -> Vec<Note<K>>
where
    K: Resource<DynamicType: TypeInfo>,
{
    if before.is_empty() {
        return vec![Note::Everything];
    }
    let mut before: HashMap<ObjectRef<K>, Arc<K>> = before
        .into_iter()
        .map(|object| (key_of(object.as_ref(), dyntype), object))
        .collect();
    let mut notes = Vec::new();
    for object in &after {
        let key = key_of(object.as_ref(), dyntype);
        let (meta, version) = (object.meta(), object.meta().resource_version.as_ref());
        match before.remove(&key) {
            // Deleted and created again under the same name meanwhile.
            Some(old) if old.meta().uid != meta.uid => {
                notes.push(Note::Deleted(key.clone(), old));
                notes.push(Note::Listed(key));
            }
            Some(old) if version.is_some() && old.meta().resource_version.as_ref() == version => {}
            _ => notes.push(Note::Listed(key)),
        }
    }
    notes.extend(before.into_iter().map(|(key, old)| Note::Deleted(key, old)));
    notes
}

#[cfg(test)]
mod tests {
    use futures::{FutureExt, StreamExt};
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::ObjectMeta;
    use tokio::sync::mpsc;
    use tokio_stream::wrappers::UnboundedReceiverStream;

    use super::*;
    use crate::cache::Change;

    type Events = mpsc::UnboundedSender<watcher::Result<Event<ConfigMap>>>;

    fn config_map(name: &str, version: u32) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                resource_version: Some(version.to_string()),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        }
    }

    /// A watch fed from a channel instead of an API server.
    fn fed_watch() -> (Arc<SharedWatch<ConfigMap>>, Events) {
        let (tx, rx) = mpsc::unbounded_channel();
        let watch = SharedWatch::start(
            "test".into(),
            (),
            UnboundedReceiverStream::new(rx),
            Arc::default(),
            Arc::default(),
            None,
        );
        (Arc::new(watch), tx)
    }

    /// Lists `objects` as the watch's (re)list.
    fn list(events: &Events, objects: &[ConfigMap]) {
        events.send(Ok(Event::Init)).unwrap();
        for object in objects {
            events.send(Ok(Event::InitApply(object.clone()))).unwrap();
        }
        events.send(Ok(Event::InitDone)).unwrap();
    }

    /// What the subscription has to tell now, as `(kind, name, version)`.
    async fn unread(
        subscription: &mut Subscription<ConfigMap>,
    ) -> Vec<(&'static str, String, String)> {
        // Let the watch task apply what was sent.
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        let mut told = Vec::new();
        while let Some(Some(change)) = subscription.next().now_or_never() {
            let kind = match &change {
                Change::Listed(_) => "listed",
                Change::Applied(_) => "applied",
                Change::Deleted(_) => "deleted",
            };
            let object = change.object();
            told.push((
                kind,
                object.metadata.name.clone().unwrap(),
                object.metadata.resource_version.clone().unwrap(),
            ));
        }
        told
    }

    fn told(kind: &'static str, name: &str, version: u32) -> (&'static str, String, String) {
        (kind, name.to_owned(), version.to_string())
    }

    #[tokio::test]
    async fn a_slow_subscriber_reads_each_object_once_as_it_is_now() {
        let (watch, events) = fed_watch();
        let mut subscription = watch.subscribe();
        list(&events, &[config_map("a", 1)]);
        for version in 2..=1000 {
            events
                .send(Ok(Event::Apply(config_map("a", version))))
                .unwrap();
        }
        assert_eq!(
            unread(&mut subscription).await,
            [told("applied", "a", 1000)]
        );
    }

    #[tokio::test]
    async fn a_deletion_is_told_once_with_the_last_state_and_a_recreation_after_it() {
        let (watch, events) = fed_watch();
        let mut subscription = watch.subscribe();
        list(&events, &[config_map("a", 1)]);
        assert_eq!(unread(&mut subscription).await, [told("listed", "a", 1)]);
        events.send(Ok(Event::Apply(config_map("a", 2)))).unwrap();
        events.send(Ok(Event::Delete(config_map("a", 3)))).unwrap();
        events.send(Ok(Event::Apply(config_map("a", 4)))).unwrap();
        assert_eq!(
            unread(&mut subscription).await,
            [told("deleted", "a", 3), told("applied", "a", 4)]
        );
    }

    #[tokio::test]
    async fn a_subscriber_that_joins_a_synced_watch_reads_the_store_once() {
        let (watch, events) = fed_watch();
        list(&events, &[config_map("a", 1), config_map("b", 1)]);
        watch.synced().await;
        let mut late = watch.subscribe();
        let mut seen = unread(&mut late).await;
        seen.sort();
        assert_eq!(seen, [told("listed", "a", 1), told("listed", "b", 1)]);
        events.send(Ok(Event::Apply(config_map("b", 2)))).unwrap();
        assert_eq!(unread(&mut late).await, [told("applied", "b", 2)]);
    }

    #[tokio::test]
    async fn a_late_subscriber_is_told_each_listed_object_as_it_is_when_read() {
        let (watch, events) = fed_watch();
        let store = [config_map("a", 1), config_map("b", 1), config_map("c", 1)];
        list(&events, &store);
        watch.synced().await;
        let mut late = watch.subscribe();
        let first = late.next().await.unwrap();
        let first = first.object().metadata.name.clone().unwrap();
        // While it reads the store, one object goes and another changes.
        let others: Vec<_> = ["a", "b", "c"]
            .into_iter()
            .filter(|n| *n != first)
            .collect();
        events
            .send(Ok(Event::Delete(config_map(others[0], 2))))
            .unwrap();
        events
            .send(Ok(Event::Apply(config_map(others[1], 2))))
            .unwrap();
        let mut seen = unread(&mut late).await;
        seen.sort();
        let mut expected = vec![told("deleted", others[0], 2), told("applied", others[1], 2)];
        expected.sort();
        assert_eq!(
            seen, expected,
            "no stale version, nothing gone told as there, nothing twice"
        );
    }

    #[tokio::test]
    async fn a_relist_tells_only_what_changed_and_what_vanished() {
        let (watch, events) = fed_watch();
        let mut subscription = watch.subscribe();
        list(
            &events,
            &[
                config_map("same", 1),
                config_map("moved", 1),
                config_map("gone", 1),
            ],
        );
        assert_eq!(unread(&mut subscription).await.len(), 3);
        // The watch was down; the relist finds one object changed, one gone
        // and one new.
        list(
            &events,
            &[
                config_map("same", 1),
                config_map("moved", 2),
                config_map("new", 2),
            ],
        );
        let mut seen = unread(&mut subscription).await;
        seen.sort();
        assert_eq!(
            seen,
            [
                told("deleted", "gone", 1),
                told("listed", "moved", 2),
                told("listed", "new", 2),
            ]
        );
    }

    #[tokio::test]
    async fn a_relist_tells_an_object_recreated_under_the_same_name_as_deleted_then_listed() {
        let (watch, events) = fed_watch();
        let mut subscription = watch.subscribe();
        let mut first = config_map("a", 1);
        first.metadata.uid = Some("first".into());
        list(&events, &[first]);
        assert_eq!(unread(&mut subscription).await.len(), 1);
        // Deleted and created again while the watch was down.
        let mut second = config_map("a", 5);
        second.metadata.uid = Some("second".into());
        list(&events, &[second]);
        assert_eq!(
            unread(&mut subscription).await,
            [told("deleted", "a", 1), told("listed", "a", 5)]
        );
    }

    #[tokio::test]
    async fn unread_changes_are_bounded_by_the_objects_not_the_versions() {
        let (watch, events) = fed_watch();
        let mut subscription = watch.subscribe();
        list(&events, &[]);
        for version in 0..10_000 {
            let name = format!("cm-{}", version % 10);
            events
                .send(Ok(Event::Apply(config_map(&name, version))))
                .unwrap();
        }
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert_eq!(watch.store().len(), 10);
        let unread = lock(&watch.hub.subscribers).inboxes[0]
            .upgrade()
            .unwrap()
            .pending
            .lock()
            .unwrap()
            .objects
            .len();
        assert_eq!(unread, 10);
        assert_eq!(self::unread(&mut subscription).await.len(), 10);
    }

    #[tokio::test]
    async fn a_failing_watch_says_why_and_recovers_when_it_lists() {
        let (watch, events) = fed_watch();
        events.send(Err(watcher::Error::NoResourceVersion)).unwrap();
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert!(
            matches!(watch.state(), WatchState::Failing { reason } if reason.contains("resourceVersion"))
        );
        assert!(!watch.has_synced());
        list(&events, &[config_map("a", 1)]);
        watch.synced().await;
        assert_eq!(watch.state(), WatchState::Synced);
        assert_eq!(watch.store().len(), 1, "the store is full once synced");
    }
}
