//! The host's one watch of a type, dealt out to its parts.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use futures::Stream;
use kube::{
    Resource,
    runtime::{
        reflector::store::Writer,
        watcher::{self, Event},
    },
};
use tokio::task::AbortHandle;

use super::SplitBy;
use crate::cache::{
    SharedWatch, TypeInfo,
    retry::Retries,
    state::Health,
    watch::{Crossing, Hub, apply},
};
use crate::{client::Writes, cluster_name::ClusterName, panic::lock};

/// One watch of the host, split by part.
pub(super) struct Split<K: Resource<DynamicType: TypeInfo> + Clone + 'static> {
    parts: Arc<Mutex<Parts<K>>>,
    task: AbortHandle,
}

impl<K: Resource<DynamicType: TypeInfo> + Clone> Drop for Split<K> {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct Parts<K: Resource<DynamicType: TypeInfo> + Clone + 'static> {
    by_part: HashMap<String, Part<K>>,
    dyntype: K::DynamicType,
    /// Whether a list is under way (between `Init` and `InitDone`).
    listing: bool,
    /// Whether a list has completed.
    listed: bool,
    health: Health,
    /// Whether each part tells its events to the writes of the clusters
    /// that read it, rather than all to the host's.
    own_writes: bool,
}

struct Part<K: Resource<DynamicType: TypeInfo> + Clone + 'static> {
    writer: Writer<K>,
    hub: Arc<Hub<K>>,
    /// Whether a list has completed since it was made: one made during a
    /// list holds nothing until that list is done.
    synced: bool,
    /// How many watches read it now.
    readers: usize,
    /// Where its events are told, when each part has writes of its own
    /// (a split by annotation): the writes of each cluster that reads it,
    /// with how many of its readers are that cluster's.
    crossings: Vec<(Crossing, usize)>,
}

impl<K: Resource<DynamicType: TypeInfo> + Clone + 'static> Part<K> {
    /// Its crossings that are not among `seen`: those of readers that came
    /// since `seen` was looked at.
    fn crossings_besides(&self, seen: &[Crossing]) -> Vec<Crossing> {
        self.crossings
            .iter()
            .map(|(c, _)| c)
            .filter(|c| !seen.iter().any(|seen| seen.same(c)))
            .cloned()
            .collect()
    }
}

impl<K: Resource<DynamicType: TypeInfo> + Clone + 'static> Parts<K> {
    /// The part `part`, made empty now if there is none.
    fn part(&mut self, part: &str) -> &mut Part<K> {
        if !self.by_part.contains_key(part) {
            let mut writer = Writer::new(self.dyntype.clone());
            let synced = !self.listing && self.listed;
            let hub = if self.listing {
                // It takes part in the list under way, and is synced when
                // that list is done.
                writer.apply_watcher_event(&Event::Init);
                Hub::new(self.health.unsynced(), false)
            } else {
                Hub::new(self.health.clone(), self.listed)
            };
            self.by_part.insert(
                part.to_owned(),
                Part {
                    writer,
                    hub: Arc::new(hub),
                    synced,
                    readers: 0,
                    crossings: Vec::new(),
                },
            );
        }
        self.by_part.get_mut(part).expect("inserted above")
    }

    /// Tells every part where the host's watch stands: a part that has not
    /// seen a list complete is not synced yet.
    fn tell_health(&self) {
        let unsynced = self.health.unsynced();
        for part in self.by_part.values() {
            let health = if part.synced { &self.health } else { &unsynced };
            part.hub.set_health(health);
        }
    }

    /// Forgets the parts that hold nothing and that no watch reads.
    fn forget_unread(&mut self) {
        self.by_part
            .retain(|_, part| part.readers > 0 || !part.writer.as_reader().is_empty());
    }

    /// The crossings an event is told to, each part having its own: those
    /// of its object's part, or every part's for a list.
    fn crossings(&self, event: &Event<K>, by: &SplitBy) -> Vec<Crossing> {
        let told = |part: &Part<K>| part.crossings.iter().map(|(c, _)| c.clone()).collect();
        match event {
            Event::Apply(object) | Event::InitApply(object) | Event::Delete(object) => by
                .part_of(object.meta())
                .and_then(|part| self.by_part.get(part))
                .map(told)
                .unwrap_or_default(),
            Event::Init | Event::InitDone => self.by_part.values().flat_map(told).collect(),
        }
    }
}

impl<K> Split<K>
where
    K: Resource<DynamicType: TypeInfo> + Clone + Send + Sync + 'static,
{
    /// Starts feeding `events` to the parts `by` tells apart. With
    /// `writes`, every part's events are told to those (a split by
    /// namespace); without, each part's to its readers' own. After a
    /// failure the watch retries with backoff, or at once when
    /// `recoveries` (if any) says the host answers again.
    pub(super) fn start<S>(
        host: ClusterName,
        by: SplitBy,
        dyntype: K::DynamicType,
        events: S,
        writes: Option<Arc<Writes>>,
        recoveries: Option<tokio::sync::watch::Receiver<u64>>,
    ) -> Self
    where
        S: Stream<Item = watcher::Result<Event<K>>> + Send + 'static,
    {
        let parts = Arc::new(Mutex::new(Parts {
            by_part: HashMap::new(),
            dyntype: dyntype.clone(),
            listing: false,
            listed: false,
            health: Health::syncing(),
            own_writes: writes.is_none(),
        }));
        let crossing = writes.map(|writes| Crossing::new::<K>(writes, &dyntype));
        let retries = Retries::of::<K>(host, &dyntype, recoveries);
        let feed = feed(by, events, parts.clone(), dyntype, crossing, retries);
        // A watch that resumes where it was tells nothing until something
        // changes: its request's answer says it runs again.
        let started = Arc::downgrade(&parts);
        let task = tokio::spawn(crate::client::telling(
            move || {
                if let Some(parts) = started.upgrade() {
                    let mut parts = lock(&parts);
                    if parts.health.answered() {
                        parts.tell_health();
                    }
                }
            },
            feed,
        ));
        Self {
            parts,
            task: task.abort_handle(),
        }
    }

    /// The watch of one part, read by a cluster whose writes are `writes`.
    pub(super) fn part(self: Arc<Self>, part: &str, writes: &Arc<Writes>) -> SharedWatch<K> {
        let (store, hub, dyntype, told) = {
            let mut parts = lock(&self.parts);
            let dyntype = parts.dyntype.clone();
            let own_writes = parts.own_writes;
            let own = parts.part(part);
            own.readers += 1;
            let told = own_writes.then(|| writes.clone());
            if let Some(writes) = &told {
                match own.crossings.iter_mut().find(|(c, _)| c.tells(writes)) {
                    Some((_, readers)) => *readers += 1,
                    None => own
                        .crossings
                        .push((Crossing::new::<K>(writes.clone(), &dyntype), 1)),
                }
            }
            (own.writer.as_reader(), own.hub.clone(), dyntype, told)
        };
        let reader = Arc::new(Reader {
            split: self,
            part: part.to_owned(),
            told,
        });
        SharedWatch::part(store, hub, dyntype, reader)
    }
}

/// What keeps a split watch running for one reader of a part, and forgets
/// the part when the last reader of an empty one leaves.
struct Reader<K: Resource<DynamicType: TypeInfo> + Clone + 'static> {
    // Keeps the watch running.
    split: Arc<Split<K>>,
    part: String,
    /// The writes its part's events are told to for this reader, if the
    /// part has writes of its own.
    told: Option<Arc<Writes>>,
}

impl<K: Resource<DynamicType: TypeInfo> + Clone> Drop for Reader<K> {
    fn drop(&mut self) {
        let mut parts = lock(&self.split.parts);
        let listing = parts.listing;
        let Some(part) = parts.by_part.get_mut(&self.part) else {
            return;
        };
        part.readers = part.readers.saturating_sub(1);
        if let Some(writes) = &self.told
            && let Some(at) = part.crossings.iter().position(|(c, _)| c.tells(writes))
        {
            part.crossings[at].1 -= 1;
            if part.crossings[at].1 == 0 {
                // Its cluster's writes are no longer told.
                part.crossings.swap_remove(at);
            }
        }
        if listing {
            // Its store looks empty while the list is held back until it
            // is complete; the end of the list forgets what is unread.
            return;
        }
        if part.readers == 0 && part.writer.as_reader().is_empty() {
            parts.by_part.remove(&self.part);
        }
    }
}

/// A part's subscribers, and what to tell them.
type Told<K> = (Arc<Hub<K>>, Vec<crate::cache::subscription::Note<K>>);

/// Runs the host's watch, and hands each event to the part of its object
/// (by `by`): the list's start and end to every part. Each event is told
/// to `crossing`, the writes of every part, or else to its part's own.
async fn feed<K, S>(
    by: SplitBy,
    events: S,
    parts: Arc<Mutex<Parts<K>>>,
    dyntype: K::DynamicType,
    crossing: Option<Crossing>,
    mut retries: Retries,
) where
    K: Resource<DynamicType: TypeInfo> + Clone + Send + Sync + 'static,
    S: Stream<Item = watcher::Result<Event<K>>> + Send + 'static,
{
    let mut events = std::pin::pin!(events);
    let resumed = || lock(&parts).health.resumed();
    let fail = |reason: &str| {
        let mut parts = lock(&parts);
        parts.health.fail(reason);
        // Every time: a part made since the last change is told too.
        parts.tell_health();
    };
    while let Some((event, healthy)) = retries.next(&mut events, resumed, fail).await {
        let listed = matches!(event, Event::InitDone);
        // Told before and after the event is applied, out of the parts'
        // lock: the writes' lock is never taken inside it.
        let crossings = match &crossing {
            Some(_) => Vec::new(),
            None => lock(&parts).crossings(&event, &by),
        };
        let shown_to_all = crossing.as_ref().map(|c| c.before(&event));
        let shown: Vec<_> = crossings.iter().map(|c| c.before(&event)).collect();
        // The crossings of the event's part as it is applied: a reader that
        // came between the two looks is woken to look at its store.
        let mut came: Vec<Crossing> = Vec::new();
        // What to tell each part's subscribers, told once the lock is let go.
        let mut told: Vec<Told<K>> = Vec::new();
        let mut parts = lock(&parts);
        match event {
            Event::Init => {
                parts.listing = true;
                for part in parts.by_part.values_mut() {
                    part.writer.apply_watcher_event(&Event::Init);
                }
            }
            Event::InitApply(object) => {
                if let Some(own) = by.part_of(object.meta()).map(str::to_owned) {
                    let part = parts.part(&own);
                    part.writer.apply_watcher_event(&Event::InitApply(object));
                }
            }
            Event::InitDone => {
                parts.listing = false;
                parts.listed = true;
                for part in parts.by_part.values_mut() {
                    part.synced = true;
                    came.extend(part.crossings_besides(&crossings));
                }
                for part in parts.by_part.values_mut() {
                    let reader = part.writer.as_reader();
                    let notes = apply(&mut part.writer, &reader, Event::InitDone, &dyntype);
                    told.push((part.hub.clone(), notes));
                }
            }
            event @ (Event::Apply(_) | Event::Delete(_)) => {
                let (Event::Apply(object) | Event::Delete(object)) = &event else {
                    unreachable!("matched above");
                };
                if let Some(own) = by.part_of(object.meta()).map(str::to_owned) {
                    let part = parts.part(&own);
                    came.extend(part.crossings_besides(&crossings));
                    let reader = part.writer.as_reader();
                    let notes = apply(&mut part.writer, &reader, event, &dyntype);
                    if part.readers == 0 && reader.is_empty() {
                        // Its part's last object is gone, and nobody reads it.
                        parts.by_part.remove(&own);
                    } else {
                        told.push((part.hub.clone(), notes));
                    }
                }
            }
        }
        // After a list, also the parts made while it ran.
        if healthy && (parts.health.heard(listed) || listed) {
            parts.tell_health();
        }
        if listed {
            parts.forget_unread();
        }
        drop(parts);
        if let (Some(crossing), Some(shown)) = (&crossing, shown_to_all) {
            crossing.after(shown);
        }
        for (crossing, shown) in crossings.iter().zip(shown) {
            crossing.after(shown);
        }
        for crossing in came {
            crossing.after(None);
        }
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
        split_by(SplitBy::Namespace)
    }

    fn split_by(by: SplitBy) -> (Arc<Split<ConfigMap>>, Events) {
        let (tx, rx) = mpsc::unbounded_channel();
        let writes = (by == SplitBy::Namespace).then(Arc::default);
        let split = Split::start(
            "host".into(),
            by,
            (),
            UnboundedReceiverStream::new(rx),
            writes,
            None,
        );
        (Arc::new(split), tx)
    }

    async fn settle() {
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
    }

    fn namespaces(split: &Split<ConfigMap>) -> Vec<String> {
        let mut names: Vec<_> = lock(&split.parts).by_part.keys().cloned().collect();
        names.sort();
        names
    }

    #[tokio::test]
    async fn each_part_holds_its_namespace_and_a_late_part_starts_with_its_objects() {
        let (split, events) = split();
        let a = split.clone().part("a", &Arc::default());
        events.send(Ok(Event::Init)).unwrap();
        for (ns, name) in [("a", "one"), ("b", "two"), ("a", "three")] {
            events
                .send(Ok(Event::InitApply(config_map(ns, name))))
                .unwrap();
        }
        events.send(Ok(Event::InitDone)).unwrap();
        a.synced().await;
        assert_eq!(a.store().len(), 2);
        let b = split.clone().part("b", &Arc::default());
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
            drop(
                split
                    .clone()
                    .part(&format!("short-lived-{i}"), &Arc::default()),
            );
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
        let watch = split.clone().part("a", &Arc::default());
        drop(split);
        drop(watch);
        settle().await;
        assert!(events.is_closed(), "the host's watch runs on");
    }

    #[tokio::test]
    async fn a_reader_leaving_during_a_list_keeps_its_namespaces_listed_objects() {
        let (split, events) = split();
        let a = split.clone().part("a", &Arc::default());
        events.send(Ok(Event::Init)).unwrap();
        events
            .send(Ok(Event::InitApply(config_map("a", "x"))))
            .unwrap();
        settle().await;
        drop(a);
        events.send(Ok(Event::InitDone)).unwrap();
        settle().await;
        let again = split.clone().part("a", &Arc::default());
        assert!(again.has_synced());
        assert_eq!(again.store().len(), 1);
    }

    fn in_cluster(mut object: ConfigMap, cluster: &str) -> ConfigMap {
        object
            .metadata
            .annotations
            .get_or_insert_default()
            .insert(CLUSTER.into(), cluster.into());
        object
    }

    const CLUSTER: &str = "kcp.io/cluster";

    #[tokio::test]
    async fn split_by_annotation_each_part_holds_its_clusters_objects_in_every_namespace() {
        let (split, events) = split_by(SplitBy::annotation(CLUSTER));
        let a = split.clone().part("a", &Arc::default());
        events.send(Ok(Event::Init)).unwrap();
        for (cluster, ns, name) in [("a", "x", "one"), ("b", "x", "one"), ("a", "y", "two")] {
            let object = in_cluster(config_map(ns, name), cluster);
            events.send(Ok(Event::InitApply(object))).unwrap();
        }
        // No annotation: no cluster's.
        events
            .send(Ok(Event::InitApply(config_map("x", "stray"))))
            .unwrap();
        events.send(Ok(Event::InitDone)).unwrap();
        a.synced().await;
        let mut names: Vec<_> = a
            .store()
            .state()
            .iter()
            .map(|o| {
                format!(
                    "{}/{}",
                    o.metadata.namespace.as_deref().unwrap_or_default(),
                    o.metadata.name.as_deref().unwrap_or_default()
                )
            })
            .collect();
        names.sort();
        assert_eq!(names, ["x/one", "y/two"]);
        assert_eq!(namespaces(&split), ["a", "b"]);
        let b = split.clone().part("b", &Arc::default());
        assert_eq!(b.store().len(), 1);
        // A delete reaches its own part only.
        let gone = in_cluster(config_map("x", "one"), "b");
        events.send(Ok(Event::Delete(gone))).unwrap();
        settle().await;
        assert_eq!(b.store().len(), 0);
        assert_eq!(a.store().len(), 2);
    }

    fn written(cluster: &str, version: u64) -> crate::client::Written {
        crate::client::Written {
            id: crate::client::ObjectId {
                group: String::new(),
                resource: "configmaps".into(),
                namespace: Some("x".into()),
                name: "one".into(),
            },
            version,
            uid: None,
            gone: false,
            labels: Default::default(),
            writer: "parents".into(),
            cluster: cluster.into(),
            at: tokio::time::Instant::now(),
        }
    }

    #[tokio::test]
    async fn split_by_annotation_an_event_is_told_to_its_own_parts_writes_only() {
        let (split, events) = split_by(SplitBy::annotation(CLUSTER));
        let (a_writes, b_writes) = (Arc::<Writes>::default(), Arc::<Writes>::default());
        let _a = split.clone().part("a", &a_writes);
        let _b = split.clone().part("b", &b_writes);
        events.send(Ok(Event::Init)).unwrap();
        events.send(Ok(Event::InitDone)).unwrap();
        settle().await;
        // The same namespace and name, written in both clusters.
        a_writes.record(written("a", 5));
        b_writes.record(written("b", 5));
        let mut a_shown = std::pin::pin!(a_writes.shown_next());
        let mut b_shown = std::pin::pin!(b_writes.shown_next());
        a_shown.as_mut().enable();
        b_shown.as_mut().enable();
        let mut object = in_cluster(config_map("x", "one"), "a");
        object.metadata.resource_version = Some("5".into());
        events.send(Ok(Event::Apply(object))).unwrap();
        settle().await;
        assert!(
            futures::FutureExt::now_or_never(a_shown).is_some(),
            "a's write is shown"
        );
        assert!(
            futures::FutureExt::now_or_never(b_shown).is_none(),
            "b's write is not: the object was a's"
        );
    }

    /// Records a write of `x/one` at version 5 by `cluster` in `writes`.
    fn waiting(writes: &Arc<Writes>, cluster: &str) {
        writes.record(written(cluster, 5));
    }

    fn apply_in(events: &Events, cluster: &str, version: &str) {
        let mut object = in_cluster(config_map("x", "one"), cluster);
        object.metadata.resource_version = Some(version.into());
        events.send(Ok(Event::Apply(object))).unwrap();
    }

    #[tokio::test]
    async fn split_by_annotation_two_clusters_reading_one_part_are_both_told_until_each_leaves() {
        let (split, events) = split_by(SplitBy::annotation(CLUSTER));
        let (first, second) = (Arc::<Writes>::default(), Arc::<Writes>::default());
        let one = split.clone().part("a", &first);
        let two = split.clone().part("a", &second);
        events.send(Ok(Event::Init)).unwrap();
        events.send(Ok(Event::InitDone)).unwrap();
        settle().await;
        for writes in [&first, &second] {
            waiting(writes, "a");
        }
        {
            let mut told = [
                std::pin::pin!(first.shown_next()),
                std::pin::pin!(second.shown_next()),
            ];
            for t in &mut told {
                t.as_mut().enable();
            }
            apply_in(&events, "a", "5");
            settle().await;
            for t in told {
                assert!(futures::FutureExt::now_or_never(t).is_some(), "both told");
            }
        }
        // The first leaves; the second is still told.
        drop(one);
        waiting(&second, "a");
        let mut told = std::pin::pin!(second.shown_next());
        told.as_mut().enable();
        apply_in(&events, "a", "6");
        settle().await;
        assert!(
            futures::FutureExt::now_or_never(told).is_some(),
            "still told"
        );
        // Once none reads it, no writes are kept for it.
        drop(two);
        let parts = lock(&split.parts);
        let part = parts.by_part.get("a").expect("it holds an object");
        assert_eq!((part.readers, part.crossings.len()), (0, 0));
    }

    #[tokio::test]
    async fn a_part_made_during_a_list_is_synced_when_that_list_is_done_and_not_before() {
        let (split, events) = split();
        let early = split.clone().part("a", &Arc::default());
        events.send(Ok(Event::Init)).unwrap();
        events.send(Ok(Event::InitDone)).unwrap();
        early.synced().await;
        // A second list; a part made while it runs.
        events.send(Ok(Event::Init)).unwrap();
        events
            .send(Ok(Event::InitApply(config_map("b", "x"))))
            .unwrap();
        settle().await;
        let late = split.clone().part("b", &Arc::default());
        assert!(
            !late.has_synced(),
            "its store is empty until the list is done"
        );
        // Nor does a failure meanwhile make it synced.
        events.send(Err(watcher::Error::NoResourceVersion)).unwrap();
        settle().await;
        assert!(!late.has_synced(), "its list is not done");
        assert!(early.has_synced(), "it listed before");
        events.send(Ok(Event::Init)).unwrap();
        events
            .send(Ok(Event::InitApply(config_map("b", "x"))))
            .unwrap();
        events.send(Ok(Event::InitDone)).unwrap();
        tokio::time::timeout(std::time::Duration::from_secs(60), late.synced())
            .await
            .expect("synced");
        assert_eq!(late.store().len(), 1);
    }
}
