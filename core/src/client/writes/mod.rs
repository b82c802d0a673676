//! What a controller wrote to one cluster and its watches have not shown
//! yet: read-your-writes and own-write echoes.
//!
//! A reconcile's write through its cluster's client is recorded with the
//! resourceVersion the API server gave it ([`answer`]). A controller holds
//! the cluster's next reconciles until the stores of the watches that hold
//! the written object show it (see `controller::Config::read_your_writes`);
//! each watch event that shows a write wakes those who wait. A watch event
//! that only echoes a controller's own write is told from a change made by
//! someone else.

mod answer;
mod record;
mod writer;

use std::{
    collections::{BTreeMap, HashMap},
    hash::BuildHasher,
    sync::{
        Arc, Mutex, Weak,
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
    },
    time::Duration,
};

use kube::api::ObjectMeta;
use tokio::{sync::Notify, time::Instant};

use crate::{cluster_name::ClusterName, panic::lock};
pub(crate) use record::RecordWrites;
pub(crate) use writer::Writer;

/// How long a write is remembered at most: to tell its echo by, or as
/// unshown by a controller that no longer asks (one that stopped).
const KEPT: Duration = Duration::from_secs(60);

/// How long a write is remembered for its echo once a watch showed it:
/// time for the controller to read the change.
const ECHO_AFTER_SHOWN: Duration = Duration::from_secs(5);

/// How often a watch event sweeps out what is remembered too long.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// An object of one cluster, by its resource rather than its kind: the one
/// a write names in its path and a watch of any version of it sees.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct ObjectId {
    pub(crate) group: String,
    pub(crate) resource: String,
    pub(crate) namespace: Option<String>,
    pub(crate) name: String,
}

impl ObjectId {
    fn is(&self, shown: &Shown<'_>) -> bool {
        self.group == shown.group
            && self.resource == shown.resource
            && self.namespace.as_deref() == shown.namespace
            && self.name == shown.name
    }
}

/// A write, as the cluster's watches will show it.
#[derive(Debug, Clone)]
pub(crate) struct Written {
    pub(crate) id: ObjectId,
    /// The resourceVersion it made; for a deletion, the object's last.
    pub(crate) version: u64,
    pub(crate) uid: Option<String>,
    /// It deleted the object.
    pub(crate) gone: bool,
    /// The object's labels after the write, to tell which watches show it.
    pub(crate) labels: BTreeMap<String, String>,
    /// The controller whose reconcile wrote it.
    pub(crate) writer: Arc<str>,
    /// The cluster whose client wrote it (a namespace of a host, for one).
    pub(crate) cluster: ClusterName,
    pub(crate) at: Instant,
}

impl Written {
    /// Whether a copy of its object (`meta`, or none) shows this write: at
    /// its version or later, made anew since, or gone for a deletion. A
    /// version that is not a number counts as `unreadable` says.
    pub(crate) fn shown_by(&self, meta: Option<&ObjectMeta>, unreadable: bool) -> bool {
        let Some(meta) = meta else {
            return self.gone;
        };
        if !same_uid(self.uid.as_deref(), meta.uid.as_deref()) {
            return true;
        }
        !self.gone
            && version_of(meta.resource_version.as_deref())
                .map_or(unreadable, |v| v >= self.version)
    }
}

/// A write no store has shown yet.
#[derive(Debug)]
struct Unshown {
    written: Arc<Written>,
    /// A watch showed the object deleted since: nothing is left to show.
    vanished: bool,
}

/// A write remembered to tell its echo by.
#[derive(Debug)]
struct Echo {
    id: ObjectId,
    version: u64,
    uid: Option<String>,
    gone: bool,
    writer: Arc<str>,
    at: Instant,
    /// When a watch showed it.
    shown: Option<Instant>,
}

/// Whose writes: a controller's, through one cluster's client.
type Group = (Arc<str>, ClusterName);

/// Everything by object (a hash of its [`ObjectId`]).
#[derive(Debug, Default)]
struct Ledger {
    /// Unshown writes of each writer through each cluster's client, one per
    /// object.
    unshown: HashMap<Group, HashMap<u64, Unshown>>,
    /// Writes remembered for their echoes, one per object and writer.
    echoes: HashMap<u64, Vec<Echo>>,
    /// Writes sent and not answered yet: their event may come before their
    /// answer. The object, its writer, and how many.
    sending: HashMap<u64, Vec<(ObjectId, Arc<str>, usize)>>,
    /// Objects read through the API after a wait, watched for a deletion
    /// that makes the read stale.
    read: HashMap<u64, Vec<(ObjectId, Weak<AtomicBool>)>>,
    swept: Option<Instant>,
}

impl Ledger {
    fn is_empty(&self) -> bool {
        self.unshown.is_empty()
            && self.echoes.is_empty()
            && self.sending.is_empty()
            && self.read.is_empty()
    }

    /// Forgets what is remembered too long, at most every
    /// [`SWEEP_EVERY`].
    fn sweep(&mut self, now: Instant) {
        if self
            .swept
            .is_some_and(|at| now.saturating_duration_since(at) < SWEEP_EVERY)
        {
            return;
        }
        self.swept = Some(now);
        for group in self.unshown.values_mut() {
            group.retain(|_, u| now.saturating_duration_since(u.written.at) < KEPT);
        }
        self.unshown.retain(|_, group| !group.is_empty());
        for list in self.echoes.values_mut() {
            list.retain(|e| {
                now.saturating_duration_since(e.at) < KEPT
                    && e.shown
                        .is_none_or(|at| now.saturating_duration_since(at) < ECHO_AFTER_SHOWN)
            });
        }
        self.echoes.retain(|_, list| !list.is_empty());
        for list in self.read.values_mut() {
            list.retain(|(_, flag)| flag.strong_count() > 0);
        }
        self.read.retain(|_, list| !list.is_empty());
        // A burst of writes gives its memory back once it is shown.
        shrink(&mut self.unshown);
        for group in self.unshown.values_mut() {
            shrink(group);
        }
        shrink(&mut self.echoes);
        shrink(&mut self.sending);
        shrink(&mut self.read);
    }
}

/// Gives back what `map` holds beyond four times what it needs.
fn shrink<K: std::hash::Hash + Eq, V>(map: &mut HashMap<K, V>) {
    if map.capacity() > 64 && map.len() * 4 < map.capacity() {
        map.shrink_to_fit();
    }
}

/// A resourceVersion as the ledger compares it: a number, or `None`.
pub(crate) fn version_of(resource_version: Option<&str>) -> Option<u64> {
    resource_version.and_then(|v| v.parse().ok())
}

/// What one watch event shows of an object.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Shown<'a> {
    pub(crate) group: &'a str,
    pub(crate) resource: &'a str,
    pub(crate) namespace: Option<&'a str>,
    pub(crate) name: &'a str,
    /// Its resourceVersion, if it is a number.
    pub(crate) version: Option<u64>,
    pub(crate) uid: Option<&'a str>,
    /// The event deleted it.
    pub(crate) deleted: bool,
}

impl<'a> Shown<'a> {
    /// What an event that applied (or, if `deleted`, deleted) an object of
    /// `group`'s `resource` with `meta` shows: the one place an object's
    /// metadata is read for the ledger. `None` for an object without a name.
    pub(crate) fn of(
        (group, resource): (&'a str, &'a str),
        meta: &'a ObjectMeta,
        deleted: bool,
    ) -> Option<Self> {
        Some(Self {
            group,
            resource,
            namespace: meta.namespace.as_deref(),
            name: meta.name.as_deref()?,
            version: version_of(meta.resource_version.as_deref()),
            uid: meta.uid.as_deref(),
            deleted,
        })
    }
}

/// How long a cluster's reconciles waited for watches to show what their
/// controllers wrote, and how often they gave up and read through the API
/// instead ([`Cluster::read_your_writes`](crate::Cluster::read_your_writes)).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
#[non_exhaustive]
pub struct WriteWaits {
    /// Times a controller held the cluster's next reconciles for watches
    /// (its own, or those of clusters its reconciles wrote to) to show its
    /// writes.
    pub waits: u64,
    /// The time those waits took, in seconds.
    pub waited_seconds: f64,
    /// Waits that ran out of time: the objects of the controller's own type
    /// were then read through the API for their next reconcile.
    pub timeouts: u64,
    /// Writes recorded through this cluster's client, by reconciles of
    /// controllers that read their writes.
    pub writes: u64,
}

/// The writes of one API server's reconciles that its watches have not
/// shown yet. Shared by the namespaces of one host, whose watches are the
/// host's; each write names the namespace's cluster that made it. Each
/// logical cluster of a host split by annotation has its own.
#[derive(Debug, Default)]
pub(crate) struct Writes {
    ledger: Mutex<Ledger>,
    /// Whether anything is remembered: if not, a watch event costs one load.
    tracked: AtomicUsize,
    shown: Notify,
    hasher: std::hash::RandomState,
    waits: AtomicU64,
    waited_micros: AtomicU64,
    timeouts: AtomicU64,
    writes: AtomicU64,
}

impl Writes {
    fn key(&self, group: &str, resource: &str, namespace: Option<&str>, name: &str) -> u64 {
        self.hasher.hash_one((group, resource, namespace, name))
    }

    fn key_of(&self, id: &ObjectId) -> u64 {
        self.key(&id.group, &id.resource, id.namespace.as_deref(), &id.name)
    }

    fn recount(&self, ledger: &Ledger) {
        self.tracked
            .store(usize::from(!ledger.is_empty()), Ordering::Release);
    }

    /// Whether anything is remembered: else a watch event need not be
    /// looked at.
    pub(crate) fn is_tracking(&self) -> bool {
        self.tracked.load(Ordering::Acquire) > 0
    }

    /// Notes that `writer` writes `id` now, until the guard is dropped.
    fn sending(self: &Arc<Self>, id: ObjectId, writer: Arc<str>) -> Sending {
        let key = self.key_of(&id);
        let mut ledger = lock(&self.ledger);
        let list = ledger.sending.entry(key).or_default();
        match list.iter_mut().find(|(i, w, _)| *i == id && *w == writer) {
            Some(entry) => entry.2 += 1,
            None => list.push((id.clone(), writer.clone(), 1)),
        }
        self.recount(&ledger);
        Sending {
            writes: self.clone(),
            key,
            id,
            writer,
        }
    }

    /// Records `written`, replacing what its writer wrote of the object
    /// through the same cluster's client before.
    pub(crate) fn record(&self, written: Written) {
        let key = self.key_of(&written.id);
        let echo = Echo {
            id: written.id.clone(),
            version: written.version,
            uid: written.uid.clone(),
            gone: written.gone,
            writer: written.writer.clone(),
            at: written.at,
            shown: None,
        };
        let group = (written.writer.clone(), written.cluster.clone());
        let unshown = Unshown {
            written: Arc::new(written),
            vanished: false,
        };
        let mut ledger = lock(&self.ledger);
        ledger.sweep(Instant::now());
        ledger
            .unshown
            .entry(group)
            .or_default()
            .insert(key, unshown);
        let list = ledger.echoes.entry(key).or_default();
        list.retain(|e| !(e.id == echo.id && e.writer == echo.writer));
        list.push(echo);
        self.recount(&ledger);
        drop(ledger);
        self.writes.fetch_add(1, Ordering::Relaxed);
    }

    /// Watches `written`'s object, just read through the API, for a
    /// deletion: the flag is set when a watch shows one.
    pub(crate) fn watch_deletion(&self, written: &Written) -> Arc<AtomicBool> {
        let flag = Arc::new(AtomicBool::new(false));
        let mut ledger = lock(&self.ledger);
        ledger
            .read
            .entry(self.key_of(&written.id))
            .or_default()
            .push((written.id.clone(), Arc::downgrade(&flag)));
        self.recount(&ledger);
        flag
    }

    /// Wakes those who wait if a watch event shows an unshown write, notes
    /// a deletion of an object written, forgets a write remembered for its
    /// echo that the event replaces, and notes when its echo came.
    pub(crate) fn shown(&self, shown: &Shown<'_>) {
        if !self.is_tracking() {
            return;
        }
        let key = self.key(shown.group, shown.resource, shown.namespace, shown.name);
        let now = Instant::now();
        let mut ledger = lock(&self.ledger);
        let mut woken = false;
        for group in ledger.unshown.values_mut() {
            let Some(unshown) = group.get_mut(&key) else {
                continue;
            };
            if !unshown.written.id.is(shown) {
                continue;
            }
            woken |= shows(&unshown.written, shown);
            if shown.deleted && same_uid(unshown.written.uid.as_deref(), shown.uid) {
                unshown.vanished = true;
            }
        }
        if shown.deleted
            && let Some(list) = ledger.read.remove(&key)
        {
            let (deleted, others): (Vec<_>, Vec<_>) =
                list.into_iter().partition(|(id, _)| id.is(shown));
            for (_, flag) in deleted {
                if let Some(flag) = flag.upgrade() {
                    flag.store(true, Ordering::Release);
                }
            }
            if !others.is_empty() {
                ledger.read.insert(key, others);
            }
        }
        if let Some(list) = ledger.echoes.get_mut(&key) {
            list.retain_mut(|echo| {
                if !echo.id.is(shown) {
                    return true;
                }
                let echoed = echoes(echo, shown);
                if echoed {
                    echo.shown.get_or_insert(now);
                }
                echoed
            });
            if list.is_empty() {
                ledger.echoes.remove(&key);
            }
        }
        ledger.sweep(now);
        self.recount(&ledger);
        drop(ledger);
        if woken {
            self.shown.notify_waiters();
        }
    }

    /// Wakes those who wait: a watch listed again, and its store may show
    /// any write now.
    pub(crate) fn relisted(&self) {
        if self.is_tracking() {
            self.shown.notify_waiters();
        }
    }

    /// Whether the change `shown` only echoes a write of `writer`: the
    /// object is as that write left it (or deleted by it), or `writer` is
    /// writing it now and has no answer yet. An echo told by its version is
    /// told once.
    pub(crate) fn take_echo(&self, shown: &Shown<'_>, writer: &str) -> bool {
        if !self.is_tracking() {
            return false;
        }
        let key = self.key(shown.group, shown.resource, shown.namespace, shown.name);
        let mut ledger = lock(&self.ledger);
        let sending = ledger
            .sending
            .get(&key)
            .is_some_and(|list| list.iter().any(|(id, w, _)| id.is(shown) && &**w == writer));
        if sending {
            return true;
        }
        let Some(list) = ledger.echoes.get_mut(&key) else {
            return false;
        };
        let Some(at) = list
            .iter()
            .position(|e| e.id.is(shown) && &*e.writer == writer && echoes(e, shown))
        else {
            return false;
        };
        list.swap_remove(at);
        if list.is_empty() {
            ledger.echoes.remove(&key);
        }
        self.recount(&ledger);
        true
    }

    /// The writes of `writer` through `cluster`'s client that no store has
    /// shown, to be checked against the stores (out of this lock). Forgets
    /// those whose object a watch showed deleted since.
    pub(crate) fn unshown(&self, writer: &str, cluster: &ClusterName) -> Vec<Arc<Written>> {
        if !self.is_tracking() {
            return Vec::new();
        }
        let mut ledger = lock(&self.ledger);
        let group = (Arc::<str>::from(writer), cluster.clone());
        let Some(unshown) = ledger.unshown.get_mut(&group) else {
            return Vec::new();
        };
        unshown.retain(|_, u| !u.vanished);
        let found = unshown.values().map(|u| u.written.clone()).collect();
        if unshown.is_empty() {
            ledger.unshown.remove(&group);
            self.recount(&ledger);
        }
        found
    }

    /// Forgets `done`, writes the stores show (or no watch holds), unless
    /// written again since.
    pub(crate) fn settle(&self, done: &[Arc<Written>]) {
        if done.is_empty() {
            return;
        }
        let mut ledger = lock(&self.ledger);
        for written in done {
            let group = (written.writer.clone(), written.cluster.clone());
            let key = self.key_of(&written.id);
            let Some(unshown) = ledger.unshown.get_mut(&group) else {
                continue;
            };
            if unshown
                .get(&key)
                .is_some_and(|u| Arc::ptr_eq(&u.written, written))
            {
                unshown.remove(&key);
            }
            if unshown.is_empty() {
                ledger.unshown.remove(&group);
            }
        }
        self.recount(&ledger);
    }

    /// Takes out `writes`, which a wait gave up on, and wakes the other
    /// waits to look again.
    pub(crate) fn give_up(&self, writes: &[Arc<Written>]) {
        self.settle(writes);
        self.shown.notify_waiters();
    }

    /// Completes when a watch next shows an unshown write; enable it before
    /// looking, so a write shown in between is not missed.
    pub(crate) fn shown_next(&self) -> tokio::sync::futures::Notified<'_> {
        self.shown.notified()
    }

    /// Counts a wait for watches to show writes.
    pub(crate) fn waited(&self, took: Duration, timed_out: bool) {
        self.waits.fetch_add(1, Ordering::Relaxed);
        self.waited_micros
            .fetch_add(took.as_micros() as u64, Ordering::Relaxed);
        if timed_out {
            self.timeouts.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// What the waits and writes came to so far.
    pub(crate) fn stats(&self) -> WriteWaits {
        WriteWaits {
            waits: self.waits.load(Ordering::Relaxed),
            waited_seconds: self.waited_micros.load(Ordering::Relaxed) as f64 / 1e6,
            timeouts: self.timeouts.load(Ordering::Relaxed),
            writes: self.writes.load(Ordering::Relaxed),
        }
    }

    /// Whether anything is remembered (1) or not (0).
    #[cfg(test)]
    pub(crate) fn tracked(&self) -> usize {
        self.tracked.load(Ordering::Acquire)
    }
}

/// A write on its way, noted in its cluster's writes until answered.
pub(crate) struct Sending {
    writes: Arc<Writes>,
    key: u64,
    id: ObjectId,
    writer: Arc<str>,
}

impl Drop for Sending {
    fn drop(&mut self) {
        let mut ledger = lock(&self.writes.ledger);
        if let Some(list) = ledger.sending.get_mut(&self.key) {
            if let Some(at) = list
                .iter()
                .position(|(id, w, _)| *id == self.id && *w == self.writer)
            {
                list[at].2 -= 1;
                if list[at].2 == 0 {
                    list.swap_remove(at);
                }
            }
            if list.is_empty() {
                ledger.sending.remove(&self.key);
            }
        }
        self.writes.recount(&ledger);
    }
}

fn same_uid(written: Option<&str>, shown: Option<&str>) -> bool {
    match (written, shown) {
        (Some(written), Some(shown)) => written == shown,
        _ => true,
    }
}

/// Whether the event `shown` shows `written`, or something later.
fn shows(written: &Written, shown: &Shown<'_>) -> bool {
    let same_object = same_uid(written.uid.as_deref(), shown.uid);
    if written.gone {
        // Deleted, or made anew under the name since.
        return shown.deleted || !same_object;
    }
    // Deleted or replaced after the write, or a version at least as late.
    shown.deleted || !same_object || shown.version.is_none_or(|v| v >= written.version)
}

/// Whether the event `shown` is the one `echo`'s write makes.
fn echoes(echo: &Echo, shown: &Shown<'_>) -> bool {
    if echo.gone {
        shown.deleted && same_uid(echo.uid.as_deref(), shown.uid)
    } else {
        !shown.deleted && shown.version == Some(echo.version)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn written(writer: &str, version: u64) -> Written {
        Written {
            id: ObjectId {
                group: String::new(),
                resource: "configmaps".into(),
                namespace: Some("default".into()),
                name: "child".into(),
            },
            version,
            uid: Some("u1".into()),
            gone: false,
            labels: BTreeMap::new(),
            writer: writer.into(),
            cluster: "east".into(),
            at: Instant::now(),
        }
    }

    fn shown(version: u64, deleted: bool) -> Shown<'static> {
        Shown {
            group: "",
            resource: "configmaps",
            namespace: Some("default"),
            name: "child",
            version: Some(version),
            uid: Some("u1"),
            deleted,
        }
    }

    fn east() -> ClusterName {
        "east".into()
    }

    #[tokio::test]
    async fn a_write_is_unshown_for_its_writer_and_cluster_until_settled() {
        let writes = Writes::default();
        writes.record(written("parents", 12));
        writes.record(written("others", 12));
        let unshown = writes.unshown("parents", &east());
        assert_eq!(unshown.len(), 1);
        assert!(writes.unshown("parents", &"west".into()).is_empty());
        writes.settle(&unshown);
        assert!(writes.unshown("parents", &east()).is_empty());
        assert_eq!(writes.unshown("others", &east()).len(), 1, "theirs stays");
    }

    #[tokio::test]
    async fn a_write_made_again_is_not_settled_by_a_look_at_the_first() {
        let writes = Writes::default();
        writes.record(written("parents", 12));
        let first = writes.unshown("parents", &east());
        writes.record(written("parents", 14));
        writes.settle(&first);
        let again = writes.unshown("parents", &east());
        assert_eq!(again.len(), 1);
        assert_eq!(again[0].version, 14);
    }

    #[tokio::test]
    async fn an_event_that_shows_a_write_wakes_those_who_wait() {
        let writes = Writes::default();
        writes.record(written("parents", 12));
        let shown_next = writes.shown_next();
        tokio::pin!(shown_next);
        shown_next.as_mut().enable();
        writes.shown(&shown(11, false));
        let early = tokio::time::timeout(Duration::from_millis(50), shown_next.as_mut()).await;
        assert!(early.is_err(), "an older version shows nothing");
        writes.shown(&shown(13, false));
        tokio::time::timeout(Duration::from_secs(5), shown_next)
            .await
            .expect("woken");
    }

    #[tokio::test]
    async fn an_object_deleted_after_its_write_leaves_nothing_to_wait_for() {
        let writes = Writes::default();
        writes.record(written("parents", 12));
        writes.shown(&shown(13, true));
        assert!(writes.unshown("parents", &east()).is_empty());
    }

    #[tokio::test]
    async fn the_event_of_an_own_write_is_its_writers_echo_once() {
        let writes = Writes::default();
        writes.record(written("parents", 12));
        writes.shown(&shown(12, false));
        assert!(!writes.take_echo(&shown(12, false), "others"));
        assert!(writes.take_echo(&shown(12, false), "parents"));
        assert!(!writes.take_echo(&shown(12, false), "parents"), "told once");
        // Someone else's change replaces a write's echo.
        writes.record(written("parents", 20));
        writes.shown(&shown(21, false));
        assert!(!writes.take_echo(&shown(21, false), "parents"));
        writes.settle(&writes.unshown("parents", &east()));
        assert_eq!(writes.tracked(), 0, "nothing left to remember");
    }

    #[tokio::test]
    async fn a_change_while_the_writer_awaits_its_answer_is_its_echo() {
        let writes = Arc::new(Writes::default());
        let id = written("parents", 0).id;
        let sending = writes.sending(id, "parents".into());
        assert!(writes.take_echo(&shown(12, false), "parents"));
        assert!(!writes.take_echo(&shown(12, false), "others"));
        drop(sending);
        assert!(!writes.take_echo(&shown(12, false), "parents"));
        assert_eq!(writes.tracked(), 0);
    }

    #[tokio::test]
    async fn a_deletion_is_echoed_by_its_delete_event() {
        let writes = Writes::default();
        let mut deleted = written("parents", 12);
        deleted.gone = true;
        writes.record(deleted);
        assert!(!writes.take_echo(&shown(15, false), "parents"));
        assert!(writes.take_echo(&shown(16, true), "parents"));
    }

    #[tokio::test(start_paused = true)]
    async fn what_is_remembered_goes_in_time() {
        let writes = Writes::default();
        writes.record(written("stopped", 3));
        writes.shown(&shown(1, false));
        tokio::time::advance(KEPT).await;
        // Any later event sweeps.
        writes.shown(&shown(2, false));
        assert_eq!(writes.tracked(), 0);
    }
}
