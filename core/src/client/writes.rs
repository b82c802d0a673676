//! What a controller wrote to one cluster and its watches have not shown
//! yet: read-your-writes and own-write echoes.
//!
//! A reconcile's write through its cluster's client is recorded with the
//! resourceVersion the API server gave it. Each watch of the cluster
//! crosses off the writes its events show. A controller holds the
//! cluster's next reconciles until its own writes are shown (see
//! `controller::Config::read_your_writes`), and tells the watch event that
//! only echoes its own write from a change made by someone else.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    hash::{BuildHasher, Hash},
    sync::{
        Arc, Mutex, MutexGuard,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    time::Duration,
};

use http::{Method, Request, Response};
use http_body_util::BodyExt;
use kube::client::Body;
use serde::Deserialize;
use tokio::{sync::Notify, time::Instant};
use tower::BoxError;

use super::cluster_client::AnyBody;
use crate::cluster_name::ClusterName;

/// How long an own write is remembered to tell its echo by, once recorded:
/// well past the time its event takes to arrive, however busy the watch.
const ECHO_KEPT: Duration = Duration::from_secs(60);

/// Past this many writes remembered for their echoes, those older than
/// [`ECHO_KEPT`] are forgotten at the next write.
const ECHOES_SWEPT_AT: usize = 1024;

/// An object of one cluster, by its resource rather than its kind: the one
/// a write names in its path and a watch of any version of it sees.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct ObjectId {
    pub(crate) group: String,
    pub(crate) resource: String,
    pub(crate) namespace: Option<String>,
    pub(crate) name: String,
}

/// A controller that reads its own writes, as its reconciles write: its
/// name, and the clusters its reconciles of keys in one cluster wrote to
/// in others (a hub's keys writing to members), whose watches the next
/// reconcile in the first must wait for too.
#[derive(Debug)]
pub(crate) struct Writer {
    pub(crate) name: Arc<str>,
    away: Mutex<HashMap<ClusterName, HashSet<ClusterName>>>,
    /// How many origins `away` has: none, and a dispatch takes no lock.
    origins: AtomicUsize,
}

impl Writer {
    pub(crate) fn new(name: Arc<str>) -> Self {
        Self {
            name,
            away: Mutex::default(),
            origins: AtomicUsize::new(0),
        }
    }

    fn away(&self) -> MutexGuard<'_, HashMap<ClusterName, HashSet<ClusterName>>> {
        self.away.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A reconcile of a key in `origin` wrote to `target`.
    pub(crate) fn wrote_away(&self, origin: &ClusterName, target: &ClusterName) {
        let mut away = self.away();
        if !away
            .get(origin)
            .is_some_and(|targets| targets.contains(target))
        {
            away.entry(origin.clone())
                .or_default()
                .insert(target.clone());
            self.origins.store(away.len(), Ordering::Release);
        }
    }

    /// The other clusters reconciles of keys in `origin` wrote to.
    pub(crate) fn away_from(&self, origin: &ClusterName) -> Vec<ClusterName> {
        if self.origins.load(Ordering::Acquire) == 0 {
            return Vec::new();
        }
        self.away()
            .get(origin)
            .map(|targets| targets.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// `target` shows what reconciles in `origin` wrote there (or left).
    pub(crate) fn settled(&self, origin: &ClusterName, target: &ClusterName) {
        let mut away = self.away();
        if let Some(targets) = away.get_mut(origin) {
            targets.remove(target);
            if targets.is_empty() {
                away.remove(origin);
            }
        }
        self.origins.store(away.len(), Ordering::Release);
    }

    /// Forgets `cluster`, which left: as an origin and as a target.
    pub(crate) fn forget(&self, cluster: &ClusterName) {
        let mut away = self.away();
        away.remove(cluster);
        away.retain(|_, targets| {
            targets.remove(cluster);
            !targets.is_empty()
        });
        self.origins.store(away.len(), Ordering::Release);
    }
}

/// A write the cluster's watches have not shown yet.
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
    pub(crate) at: Instant,
}

/// A write remembered until its watch event is told.
#[derive(Debug)]
struct Echo {
    version: u64,
    uid: Option<String>,
    gone: bool,
    writer: Arc<str>,
    at: Instant,
}

#[derive(Debug, Default)]
struct Ledger {
    unseen: HashMap<u64, Written>,
    echoes: HashMap<u64, (ObjectId, Echo)>,
    /// Writes sent and not answered yet, by object: their event may come
    /// before their answer.
    sending: HashMap<u64, (ObjectId, Arc<str>, usize)>,
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

/// How long a cluster's reconciles waited for its watches to show what
/// their controllers wrote, and how often they gave up and read through
/// the API instead
/// ([`Cluster::read_your_writes`](crate::Cluster::read_your_writes)).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
#[non_exhaustive]
pub struct WriteWaits {
    /// Times a controller held the cluster's next reconciles for its
    /// watches to show its writes.
    pub waits: u64,
    /// The time those waits took, in seconds.
    pub waited_seconds: f64,
    /// Waits that ran out of time: the controller's own object was then
    /// read through the API for its next reconcile.
    pub timeouts: u64,
    /// Writes recorded, by reconciles of controllers that read their
    /// writes.
    pub writes: u64,
}

/// The writes of one API server's reconciles that its watches have not
/// shown yet. Shared by the namespaces of one host, whose watches are
/// the host's.
#[derive(Debug, Default)]
pub(crate) struct Writes {
    ledger: Mutex<Ledger>,
    /// How many writes are unseen or remembered: none, and a watch event
    /// costs one load.
    tracked: AtomicUsize,
    shown: Notify,
    hasher: std::hash::RandomState,
    waits: AtomicU64,
    waited_micros: AtomicU64,
    timeouts: AtomicU64,
    writes: AtomicU64,
}

impl Writes {
    fn ledger(&self) -> MutexGuard<'_, Ledger> {
        self.ledger.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn key(&self, group: &str, resource: &str, namespace: Option<&str>, name: &str) -> u64 {
        self.hasher.hash_one((group, resource, namespace, name))
    }

    fn recount(&self, ledger: &Ledger) {
        let tracked = ledger.unseen.len() + ledger.echoes.len() + ledger.sending.len();
        self.tracked.store(tracked, Ordering::Release);
    }

    /// Notes that `writer` writes `id` now, until the guard is dropped.
    fn sending(self: &Arc<Self>, id: ObjectId, writer: Arc<str>) -> Sending {
        let key = self.key(&id.group, &id.resource, id.namespace.as_deref(), &id.name);
        let mut ledger = self.ledger();
        let entry = ledger.sending.entry(key).or_insert((id, writer, 0));
        entry.2 += 1;
        self.recount(&ledger);
        Sending {
            writes: self.clone(),
            key,
        }
    }

    /// Whether any write is unseen or remembered: else a watch event need
    /// not be looked at.
    pub(crate) fn is_tracking(&self) -> bool {
        self.tracked.load(Ordering::Acquire) > 0
    }

    /// Records `written`, replacing what was recorded of its object.
    pub(crate) fn record(&self, written: Written) {
        let key = self.key(
            &written.id.group,
            &written.id.resource,
            written.id.namespace.as_deref(),
            &written.id.name,
        );
        let echo = Echo {
            version: written.version,
            uid: written.uid.clone(),
            gone: written.gone,
            writer: written.writer.clone(),
            at: written.at,
        };
        let mut ledger = self.ledger();
        let now = Instant::now();
        if ledger.echoes.len() >= ECHOES_SWEPT_AT {
            ledger
                .echoes
                .retain(|_, (_, echo)| now.saturating_duration_since(echo.at) < ECHO_KEPT);
        }
        if ledger.unseen.len() >= ECHOES_SWEPT_AT {
            ledger
                .unseen
                .retain(|_, written| now.saturating_duration_since(written.at) < ECHO_KEPT);
        }
        ledger.echoes.insert(key, (written.id.clone(), echo));
        ledger.unseen.insert(key, written);
        self.recount(&ledger);
        self.writes.fetch_add(1, Ordering::Relaxed);
    }

    /// Tells those who wait that a watch event shows an unseen write, and
    /// forgets a write remembered for its echo that the event replaces. A
    /// write is crossed off by [`awaits`](Self::awaits), which reads the
    /// stores: an event may come before the answer to its write.
    pub(crate) fn shown(&self, shown: &Shown<'_>) {
        if self.tracked.load(Ordering::Acquire) == 0 {
            return;
        }
        let key = self.key(shown.group, shown.resource, shown.namespace, shown.name);
        let mut ledger = self.ledger();
        let same = |id: &ObjectId| {
            id.group == shown.group
                && id.resource == shown.resource
                && id.namespace.as_deref() == shown.namespace
                && id.name == shown.name
        };
        let crossed = ledger
            .unseen
            .get(&key)
            .is_some_and(|written| same(&written.id) && shows(written, shown));
        if let Some((id, echo)) = ledger.echoes.get(&key)
            && same(id)
            && !echoes(echo, shown)
        {
            ledger.echoes.remove(&key);
        }
        self.recount(&ledger);
        drop(ledger);
        if crossed {
            self.shown.notify_waiters();
        }
    }

    /// Whether the change `shown` only echoes a write of `writer`: the
    /// object is as that write left it (or deleted by it).
    pub(crate) fn is_echo(&self, shown: &Shown<'_>, writer: &str) -> bool {
        if self.tracked.load(Ordering::Acquire) == 0 {
            return false;
        }
        let key = self.key(shown.group, shown.resource, shown.namespace, shown.name);
        let ledger = self.ledger();
        let same = |id: &ObjectId| {
            id.group == shown.group
                && id.resource == shown.resource
                && id.namespace.as_deref() == shown.namespace
                && id.name == shown.name
        };
        // Its answer not read yet: the change is taken for its echo.
        let sending = ledger
            .sending
            .get(&key)
            .is_some_and(|(id, by, _)| same(id) && &**by == writer);
        sending
            || ledger.echoes.get(&key).is_some_and(|(id, echo)| {
                same(id) && &*echo.writer == writer && echoes(echo, shown)
            })
    }

    /// Whether `writer` has writes the cluster's watches have yet to show,
    /// as `unshown` tells of each. Forgets the others, and others' writes
    /// older than [`ECHO_KEPT`] (whose controller has stopped, say).
    pub(crate) fn awaits(&self, writer: &str, unshown: impl Fn(&Written) -> bool) -> bool {
        if self.tracked.load(Ordering::Acquire) == 0 {
            return false;
        }
        let now = Instant::now();
        let mut ledger = self.ledger();
        let mut awaits = false;
        ledger.unseen.retain(|_, written| {
            if &*written.writer != writer {
                return now.saturating_duration_since(written.at) < ECHO_KEPT;
            }
            let keep = unshown(written);
            awaits |= keep;
            keep
        });
        self.recount(&ledger);
        awaits
    }

    /// Takes out `writer`'s unseen writes: its wait for them ran out.
    pub(crate) fn give_up(&self, writer: &str) -> Vec<Written> {
        let mut ledger = self.ledger();
        let mut given_up = Vec::new();
        ledger.unseen.retain(|_, written| {
            if &*written.writer == writer {
                given_up.push(written.clone());
                false
            } else {
                true
            }
        });
        self.recount(&ledger);
        given_up
    }

    /// Completes when a watch next shows an unseen write; enable it before
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

    /// How many writes are unseen or remembered for their echoes.
    #[cfg(test)]
    pub(crate) fn tracked(&self) -> usize {
        self.tracked.load(Ordering::Acquire)
    }
}

/// Whether the event `shown` shows `written`, or something later.
fn shows(written: &Written, shown: &Shown<'_>) -> bool {
    let same_object = match (&written.uid, shown.uid) {
        (Some(written), Some(shown)) => written == shown,
        _ => true,
    };
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
        shown.deleted
            && match (&echo.uid, shown.uid) {
                (Some(written), Some(shown)) => written == shown,
                _ => true,
            }
    } else {
        !shown.deleted && shown.version == Some(echo.version)
    }
}

/// The object `path` names, and the subresource if any: `None` for a
/// collection, a path outside the API, or a subresource other than
/// `status` and `scale` (which change the object's own version).
fn object_of(
    path: &str,
    created: bool,
) -> Option<(String, String, Option<String>, Option<String>)> {
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let (group, rest) = match segments.as_slice() {
        ["api", _version, rest @ ..] => ("", rest),
        ["apis", group, _version, rest @ ..] => (*group, rest),
        _ => return None,
    };
    let (namespace, rest): (Option<&str>, &[&str]) = match rest {
        // A namespace itself, or its subresource.
        ["namespaces", _] | ["namespaces", _, "status" | "finalize"] => (None, rest),
        ["namespaces", namespace, rest @ ..] => (Some(*namespace), rest),
        rest => (None, rest),
    };
    let (resource, name) = match rest {
        [resource] if created => (*resource, None),
        [resource, name] => (*resource, Some(*name)),
        [resource, name, "status" | "scale" | "finalize"] if !created => (*resource, Some(*name)),
        _ => return None,
    };
    Some((
        group.to_owned(),
        resource.to_owned(),
        namespace.map(str::to_owned),
        name.map(str::to_owned),
    ))
}

#[derive(Deserialize)]
struct Stored {
    #[serde(default)]
    kind: Option<String>,
    #[serde(default)]
    metadata: Option<StoredMeta>,
    #[serde(default)]
    details: Option<StatusDetails>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct StoredMeta {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    resource_version: Option<String>,
    #[serde(default)]
    uid: Option<String>,
    #[serde(default)]
    labels: Option<BTreeMap<String, String>>,
    #[serde(default)]
    deletion_timestamp: Option<serde::de::IgnoredAny>,
}

#[derive(Deserialize)]
struct StatusDetails {
    #[serde(default)]
    uid: Option<String>,
}

/// A write on its way, noted in its cluster's writes until answered.
struct Sending {
    writes: Arc<Writes>,
    key: u64,
}

impl Drop for Sending {
    fn drop(&mut self) {
        let mut ledger = self.writes.ledger();
        if let Some(entry) = ledger.sending.get_mut(&self.key) {
            entry.2 -= 1;
            if entry.2 == 0 {
                ledger.sending.remove(&self.key);
            }
        }
        self.writes.recount(&ledger);
    }
}

/// What a write request is, if it is one to record: its method and path.
pub(crate) struct Pending {
    method: Method,
    path: String,
    writer: Arc<str>,
    _sending: Option<Sending>,
}

/// The write `request` makes, to record once answered; `None` for a read,
/// a dry run, a collection's deletion or a subresource that is not the
/// object's. Note it as on its way with [`Prepared::sending`] before the
/// request is sent.
pub(crate) fn pending(request: &Request<Body>, writer: Arc<str>) -> Option<Prepared> {
    let method = request.method();
    if !matches!(
        *method,
        Method::POST | Method::PUT | Method::PATCH | Method::DELETE
    ) {
        return None;
    }
    if request.uri().query().is_some_and(|q| q.contains("dryRun=")) {
        return None;
    }
    let path = request.uri().path();
    let created = *method == Method::POST;
    let (group, resource, namespace, name) = object_of(path, created)?;
    // A create names its object in its body, unless the server does.
    let body = if name.is_none() {
        request.body().try_clone()
    } else {
        None
    };
    Some(Prepared {
        pending: Pending {
            method: method.clone(),
            path: path.to_owned(),
            writer,
            _sending: None,
        },
        id: (group, resource, namespace, name),
        body,
    })
}

/// A write about to be sent.
pub(crate) struct Prepared {
    pending: Pending,
    id: (String, String, Option<String>, Option<String>),
    body: Option<Body>,
}

impl Prepared {
    /// Notes the write in `writes` as on its way.
    pub(crate) async fn sending(self, writes: &Arc<Writes>) -> Pending {
        let Prepared {
            mut pending,
            id: (group, resource, namespace, name),
            body,
        } = self;
        let name = match (name, body) {
            (Some(name), _) => Some(name),
            (None, Some(body)) => body
                .collect_bytes()
                .await
                .ok()
                .and_then(|bytes| serde_json::from_slice::<Stored>(&bytes).ok())
                .and_then(|stored| stored.metadata?.name),
            (None, None) => None,
        };
        if let Some(name) = name {
            let id = ObjectId {
                group,
                resource,
                namespace,
                name,
            };
            pending._sending = Some(writes.sending(id, pending.writer.clone()));
        }
        pending
    }
}

impl Pending {
    /// Records the write `response` answers in `writes`, and gives the
    /// response back whole. Only a successful answer is read.
    pub(crate) async fn answered(
        self,
        response: Response<AnyBody>,
        writes: &Writes,
    ) -> Result<Response<AnyBody>, BoxError> {
        if !response.status().is_success() {
            return Ok(response);
        }
        let (parts, body) = response.into_parts();
        let bytes = body.collect().await?.to_bytes();
        if let Some(written) = self.written(&bytes) {
            writes.record(written);
        }
        // Recorded: its echo is told by its version from now on.
        drop(self);
        let body = http_body_util::Full::new(bytes)
            .map_err(|never: std::convert::Infallible| -> BoxError { match never {} })
            .boxed_unsync();
        Ok(Response::from_parts(parts, body))
    }

    fn written(&self, bytes: &[u8]) -> Option<Written> {
        let created = self.method == Method::POST;
        let (group, resource, namespace, name) = object_of(&self.path, created)?;
        let stored: Stored = serde_json::from_slice(bytes).ok()?;
        let status = stored.kind.as_deref() == Some("Status");
        let meta = stored.metadata;
        let (version, uid, labels, still_there) = match (&meta, status) {
            (Some(meta), false) => (
                meta.resource_version.as_deref()?.parse().ok()?,
                meta.uid.clone(),
                meta.labels.clone().unwrap_or_default(),
                meta.deletion_timestamp.is_some(),
            ),
            // A deletion answered with a `Status`: the object is gone.
            _ if self.method == Method::DELETE => (
                0,
                stored.details.and_then(|d| d.uid),
                BTreeMap::new(),
                false,
            ),
            _ => return None,
        };
        let name = name.or_else(|| meta.as_ref().and_then(|m| m.name.clone()))?;
        let namespace = namespace.or_else(|| meta.as_ref().and_then(|m| m.namespace.clone()));
        // A deletion that left the object in place (finalizers, a grace
        // period) changed it, as an update does.
        let gone = self.method == Method::DELETE && !still_there;
        Some(Written {
            id: ObjectId {
                group,
                resource,
                namespace,
                name,
            },
            version,
            uid,
            gone,
            labels,
            writer: self.writer.clone(),
            at: Instant::now(),
        })
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

    #[tokio::test]
    async fn a_write_is_awaited_until_the_stores_show_it() {
        let writes = Writes::default();
        writes.record(written("parents", 12));
        assert!(writes.awaits("parents", |_| true));
        assert!(!writes.awaits("others", |_| true), "not theirs");
        // Shown, or held by no watch: forgotten.
        assert!(!writes.awaits("parents", |_| false));
        assert!(!writes.awaits("parents", |_| true));
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
    async fn the_event_of_an_own_write_is_its_writers_echo_until_replaced() {
        let writes = Writes::default();
        writes.record(written("parents", 12));
        writes.shown(&shown(12, false));
        assert!(writes.is_echo(&shown(12, false), "parents"));
        assert!(!writes.is_echo(&shown(12, false), "others"));
        // Someone else's change replaces it.
        writes.shown(&shown(13, false));
        assert!(!writes.is_echo(&shown(13, false), "parents"));
        // Shown in the stores: nothing is left to remember.
        assert!(!writes.awaits("parents", |_| false));
        assert_eq!(writes.tracked(), 0);
    }

    #[tokio::test]
    async fn a_deletion_is_echoed_by_its_delete_event() {
        let writes = Writes::default();
        let mut deleted = written("parents", 12);
        deleted.gone = true;
        writes.record(deleted);
        writes.shown(&shown(15, false));
        assert!(!writes.is_echo(&shown(15, false), "parents"));
        writes.record({
            let mut again = written("parents", 12);
            again.gone = true;
            again
        });
        assert!(writes.is_echo(&shown(16, true), "parents"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_writers_writes_are_awaited_until_given_up_and_others_forgotten_in_time() {
        let writes = Writes::default();
        writes.record(written("parents", 12));
        let mut other = written("stopped", 3);
        other.id.name = "other".into();
        writes.record(other);
        tokio::time::advance(ECHO_KEPT).await;
        assert!(writes.awaits("parents", |_| true));
        assert_eq!(writes.give_up("parents").len(), 1);
        assert!(!writes.awaits("parents", |_| true));
        assert!(!writes.awaits("stopped", |_| true), "forgotten");
    }

    #[test]
    fn paths_name_the_objects_written() {
        let of = |path, created| object_of(path, created);
        assert_eq!(
            of("/api/v1/namespaces/a/configmaps", true),
            Some(("".into(), "configmaps".into(), Some("a".into()), None))
        );
        assert_eq!(
            of("/apis/apps/v1/namespaces/a/deployments/b/scale", false),
            Some((
                "apps".into(),
                "deployments".into(),
                Some("a".into()),
                Some("b".into())
            ))
        );
        assert_eq!(
            of("/api/v1/namespaces/a", false),
            Some(("".into(), "namespaces".into(), None, Some("a".into())))
        );
        assert_eq!(
            of("/api/v1/namespaces/a/status", false),
            Some(("".into(), "namespaces".into(), None, Some("a".into())))
        );
        assert_eq!(
            of("/apis/example.com/v1/widgets/w", false),
            Some((
                "example.com".into(),
                "widgets".into(),
                None,
                Some("w".into())
            ))
        );
        assert_eq!(of("/api/v1/namespaces/a/pods/p/eviction", true), None);
        assert_eq!(of("/api/v1/namespaces/a/configmaps", false), None);
        assert_eq!(of("/version", false), None);
    }
}
