//! Status gathered from every cluster: a parent whose status holds one
//! entry per cluster, read from the parent's children there (the
//! hub-and-members shape).
//!
//! [`Gather`] reads the parent's [`Children`] (as
//! [`Children::owned`] finds them) in each cluster their
//! [`Watch`](crate::controller::Watch) selects, and writes one
//! [`ClusterEntry`] per cluster into a field of the parent's status
//! (`status.clusters` by default): what [`Read`] found in the child there
//! (a condition by type, or a field by a JSONPath selector), when the
//! cluster last answered, its health, and whether it is `stale`. Then:
//!
//! - it writes with server-side apply of the status subresource, under a
//!   field manager of its own, setting only its field (and those given to
//!   [`write_with`](Gather::write_with)): other managers' status fields
//!   stay, but a field this manager applied before and leaves out now is
//!   removed, so do not give the reconciler's own applies the same
//!   [`manager`](Gather::manager). The apply is forced: a field given to
//!   `write_with` (a `phase`, say) is taken from any manager that set it.
//!   The parent's CRD needs the status subresource (`subresources:
//!   status`), else every write fails with [`Error::Apply`] (a `404`);
//! - a cluster that leaves the fleet leaves the status; a cluster cut off
//!   (still engaged, or [set aside](crate::FleetConfig::set_aside_after)),
//!   or whose children's watch is not synced (a `403`, say), keeps its last
//!   value, marked `stale`, with the time it last answered, which never
//!   moves forward while it stays stale;
//! - after a restart, the entries of clusters not engaged yet are kept,
//!   marked `stale`, for the [`startup_grace`](Gather::startup_grace)
//!   (60 s by default);
//! - a parent is written at most once per
//!   [`min_interval`](Gather::min_interval) (1 s by default): a write that
//!   would come sooner is put off, and [`Gathered::action`] asks for the
//!   reconcile again when it may be made;
//! - nothing is written when nothing but the time of a cluster that
//!   answers would change. The fields given to `write_with` are compared
//!   as the server stores them, without nulls; a field the parent's schema
//!   prunes (one it does not declare) never compares equal and would be
//!   written once per interval: do not give such a field.
//!
//! Wire [`changes`](Gather::changes) to the controller's
//! [`reconcile_all_on`](crate::Controller::reconcile_all_on): a cluster's
//! health changes without any watch event.
//!
//! ```no_run
//! use std::time::Duration;
//!
//! use k8s_openapi::api::batch::v1::Job;
//! use kube::runtime::watcher;
//! use kube_multicluster::{
//!     Action, Controller, Fleet, ObjectRequest,
//!     controller::{ClusterSelector, Watch},
//!     gather::{Gather, Read},
//!     ownership::{Children, PARENT_UID_LABEL},
//! };
//! # use kube::CustomResource;
//! # use schemars::JsonSchema;
//! # use serde::{Deserialize, Serialize};
//! # #[derive(CustomResource, Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
//! # #[kube(group = "example.com", version = "v1", kind = "Batch", namespaced, status = "BatchStatus")]
//! # pub struct BatchSpec {}
//! # #[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
//! # pub struct BatchStatus {}
//! use tower::BoxError;
//!
//! # async fn example(fleet: Fleet) -> Result<(), BoxError> {
//! // Parents: `Batch`es in the hub; children: their Jobs in the members.
//! let jobs = Watch::new(watcher::Config::default().labels(PARENT_UID_LABEL))
//!     .in_clusters(ClusterSelector::Provided);
//! let gather = Gather::new(&fleet, Children::<Job>::new(&fleet, jobs.clone()), Read::condition("Complete"))
//!     .manager("batch-status")
//!     .min_interval(Duration::from_secs(2));
//! let controller = Controller::<Batch>::new(&fleet, watcher::Config::default())
//!     .clusters(ClusterSelector::Local)
//!     .owns_across::<Job>(jobs)
//!     .reconcile_all_on(gather.changes(Duration::from_secs(1)));
//! let reconcile = move |request: ObjectRequest<Batch>| {
//!     let gather = gather.clone();
//!     async move {
//!         // ... make the Jobs ...
//!         let gathered = gather.write(&request).await?;
//!         Ok::<_, BoxError>(gathered.merged(Action::await_change()))
//!     }
//! };
//! controller.run(tower::service_fn(reconcile)).await?;
//! # Ok(())
//! # }
//! ```
//!
//! Every cluster's entry, written as `status.clusters` (with
//! [`Read::condition`]):
//!
//! ```json
//! [ { "cluster": "member-1", "child": "hello",
//!     "condition": { "type": "Complete", "status": "True", "reason": "Done",
//!                    "lastTransitionTime": "2025-01-01T12:00:00Z" },
//!     "lastSeen": "2025-01-01T12:00:03Z", "health": "Healthy", "stale": false },
//!   { "cluster": "member-2", "child": "hello",
//!     "condition": { "type": "Complete", "status": "False" },
//!     "lastSeen": "2025-01-01T11:58:41Z", "health": "Unreachable", "stale": true },
//!   { "cluster": "member-3", "message": "no child in this cluster",
//!     "lastSeen": "2025-01-01T12:00:03Z", "health": "Healthy", "stale": false } ]
//! ```

mod entry;
mod error;
mod grace;
mod limit;
mod read;

pub use entry::{ChildCondition, ClusterEntry, entries_schema};
pub use error::Error;
pub use read::Read;

use std::{
    collections::{HashMap, HashSet},
    time::Duration,
};

use futures::Stream;
use k8s_openapi::{apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp};
use kube::{
    Resource, ResourceExt,
    api::{Patch, PatchParams},
};
use serde::Serialize;
use serde_json::{Map, Value, json};

use self::{grace::StartupGrace, limit::WriteLimit, read::Found};
use crate::{
    action::Action,
    cache::{WatchState, Watchable},
    cluster_name::ClusterName,
    fleet::Fleet,
    fleetwide::FleetStore,
    health::ClusterHealth,
    object_request::ObjectRequest,
    ownership::Children,
    request::McRequest,
};

/// The field manager a [`Gather`] writes as unless
/// [`manager`](Gather::manager) says otherwise.
pub const FIELD_MANAGER: &str = crate::prefixed!("gather");

/// The status field a [`Gather`] writes unless [`field`](Gather::field)
/// says otherwise.
pub const FIELD: &str = "clusters";

/// The shortest time between two writes of one parent unless
/// [`min_interval`](Gather::min_interval) says otherwise.
pub const MIN_INTERVAL: Duration = Duration::from_secs(1);

/// How long after a [`Gather`] is made the entries of clusters not engaged
/// yet are kept, unless [`startup_grace`](Gather::startup_grace) says
/// otherwise.
pub const STARTUP_GRACE: Duration = Duration::from_secs(60);

/// The message of an entry whose cluster's children have not been listed.
const NOT_LISTED: &str = "its children are not listed yet";

/// A stale entry's time moves only by more than this: it is computed
/// again at each reconcile from how long the cluster has been down.
const SEEN_JITTER: Duration = Duration::from_secs(2);

/// Writes into each parent's status one entry per cluster, read from its
/// children of type `C`: see the [module docs](self). Cheap to clone; the
/// clones share the write limit.
pub struct Gather<C: Watchable> {
    children: Children<C>,
    fleet: Fleet,
    read: Read,
    manager: String,
    field: String,
    local_name: String,
    limit: WriteLimit,
    grace: StartupGrace,
}

impl<C: Watchable> Clone for Gather<C> {
    fn clone(&self) -> Self {
        Self {
            children: self.children.clone(),
            fleet: self.fleet.clone(),
            read: self.read.clone(),
            manager: self.manager.clone(),
            field: self.field.clone(),
            local_name: self.local_name.clone(),
            limit: self.limit.clone(),
            grace: self.grace.clone(),
        }
    }
}

impl<C: Watchable> std::fmt::Debug for Gather<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gather")
            .field("read", &self.read)
            .field("manager", &self.manager)
            .field("field", &self.field)
            .field("min_interval", &self.limit.interval())
            .field("startup_grace", &self.grace.grace())
            .finish()
    }
}

/// What [`Gather::write`] did: the entries, and whether they were written.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Gathered {
    /// Every cluster's entry, as written (or as they would be, if the write
    /// was put off), sorted by cluster.
    pub entries: Vec<ClusterEntry>,
    /// Whether the status was written.
    pub written: bool,
    /// The write was put off by the rate limit, for this long: reconcile
    /// again then ([`action`](Self::action) asks for it).
    pub deferred: Option<Duration>,
}

impl Gathered {
    /// Requeue when a write put off may be made; else await a change.
    pub fn action(&self) -> Action {
        self.deferred
            .map_or_else(Action::await_change, Action::requeue)
    }

    /// `action`, with the requeue a write put off needs: the sooner of the
    /// two.
    pub fn merged(&self, action: Action) -> Action {
        match (self.deferred, action.requeue_after()) {
            (Some(a), Some(b)) => Action::requeue(a.min(b)),
            (Some(a), None) => Action::requeue(a),
            (None, _) => action,
        }
    }
}

impl<C> Gather<C>
where
    C: Watchable<DynamicType = ()> + Serialize,
{
    /// Gathers what `read` finds in the children `children` finds in
    /// `fleet` (the fleet they were made with). Written
    /// as [`FIELD_MANAGER`] into `status.clusters`, at most once per second
    /// per parent.
    pub fn new(fleet: &Fleet, children: Children<C>, read: Read) -> Self {
        Self {
            fleet: fleet.clone(),
            children,
            read,
            manager: FIELD_MANAGER.to_owned(),
            field: FIELD.to_owned(),
            local_name: String::new(),
            limit: WriteLimit::new(MIN_INTERVAL),
            grace: StartupGrace::new(STARTUP_GRACE),
        }
    }

    /// Writes as the field manager `manager` (default [`FIELD_MANAGER`]).
    #[must_use]
    pub fn manager(mut self, manager: impl Into<String>) -> Self {
        self.manager = manager.into();
        self
    }

    /// Writes the entries into `status.<field>` (default [`FIELD`],
    /// `clusters`).
    #[must_use]
    pub fn field(mut self, field: impl Into<String>) -> Self {
        self.field = field.into();
        self
    }

    /// Writes each parent at most once per `interval` (default
    /// [`MIN_INTERVAL`], 1 s; zero for no limit).
    #[must_use]
    pub fn min_interval(mut self, interval: Duration) -> Self {
        self.limit = WriteLimit::new(interval);
        self
    }

    /// Keeps, for `grace` after this `Gather` is made (default
    /// [`STARTUP_GRACE`], 60 s), the entries a parent's status holds of
    /// clusters that are not engaged yet, marked `stale` and otherwise as
    /// they were: after a restart, parents are reconciled before the
    /// provider engages the clusters again, and an entry dropped then (of a
    /// cluster cut off, say) would be lost. A cluster read since the start
    /// that leaves the fleet leaves the status at once; after the grace,
    /// any cluster not engaged does.
    #[must_use]
    pub fn startup_grace(mut self, grace: Duration) -> Self {
        self.grace = StartupGrace::new(grace);
        self
    }

    /// Names the local cluster's entry `name` (by default its
    /// [`ClusterName`], which is empty).
    #[must_use]
    pub fn local_name(mut self, name: impl Into<String>) -> Self {
        self.local_name = name.into();
        self
    }

    /// The children read.
    pub fn children(&self) -> &Children<C> {
        &self.children
    }

    /// How many parents the write limit holds now: those written within
    /// the last interval.
    pub fn parents_held(&self) -> usize {
        self.limit.len()
    }

    /// Forgets the parent `parent` (gone): [`write`](Self::write) does it
    /// for a request with no object. Parents are forgotten anyway once
    /// their interval has passed.
    pub fn forget(&self, parent: &McRequest) {
        self.limit.forget(parent);
    }

    /// Every cluster's entry for the request's object now, sorted by
    /// cluster: read from the children's stores, a cluster that does not
    /// answer (or whose children are not listed) keeping the entry the
    /// parent's status has, marked `stale`. Within the
    /// [`startup_grace`](Self::startup_grace), the entries of clusters not
    /// engaged yet are kept too.
    pub fn entries<P: Resource<DynamicType = ()> + Serialize>(
        &self,
        parent: &ObjectRequest<P>,
    ) -> Vec<ClusterEntry> {
        let previous = parent
            .object
            .as_deref()
            .map(|object| self.written(object))
            .unwrap_or_default();
        let read = clusters_read(&self.fleet, self.children.store());
        let shown: Vec<String> = read.iter().map(|(name, ..)| self.shown(name)).collect();
        self.grace.read(shown.iter().map(String::as_str));
        let children = self.children.owned(parent);
        let now = Timestamp::now();
        let mut entries: Vec<ClusterEntry> = read
            .iter()
            .zip(shown)
            .map(|((name, health, watch), shown)| {
                let last = previous.iter().find(|entry| entry.cluster == shown);
                let child = children.iter().find(|child| child.cluster == *name);
                let child = child.map(|child| child.object.as_ref());
                self.entry(shown, health, watch.as_ref(), child, last, now)
            })
            .collect();
        let written: HashSet<String> = entries.iter().map(|e| e.cluster.clone()).collect();
        let kept = previous
            .into_iter()
            .filter(|entry| !written.contains(&entry.cluster) && self.grace.keeps(&entry.cluster));
        entries.extend(kept.map(|mut entry| {
            entry.stale = true;
            entry
        }));
        entries.sort_by(|a, b| a.cluster.cmp(&b.cluster));
        entries
    }

    /// Writes every cluster's entry into the status of the request's
    /// object, unless only the time of clusters that answer would change or
    /// the parent was written less than [`min_interval`](Self::min_interval)
    /// ago (then [`Gathered::deferred`] says for how long). A request with
    /// no object writes nothing, and the parent is forgotten.
    pub async fn write<P>(&self, parent: &ObjectRequest<P>) -> Result<Gathered, Error>
    where
        P: Resource<DynamicType = ()> + Serialize,
    {
        self.write_with(parent, |_| Map::new()).await
    }

    /// [`write`](Self::write), with the status fields `with` makes from the
    /// entries (a phase, a message, conditions: an object) applied beside
    /// them, by the same apply and the same field manager. Give only
    /// fields the parent's schema declares: one it prunes never shows as
    /// written, and is written again once per interval.
    pub async fn write_with<P, S>(
        &self,
        parent: &ObjectRequest<P>,
        with: impl FnOnce(&[ClusterEntry]) -> S,
    ) -> Result<Gathered, Error>
    where
        P: Resource<DynamicType = ()> + Serialize,
        S: Serialize,
    {
        let key = &parent.request;
        let Some(object) = parent.object.as_deref() else {
            self.forget(key);
            return Ok(Gathered {
                entries: Vec::new(),
                written: false,
                deferred: None,
            });
        };
        let entries = self.entries(parent);
        let serialize = |source| Error::Serialize {
            parent: key.clone(),
            source,
        };
        let mut status = match serde_json::to_value(with(&entries)).map_err(serialize)? {
            Value::Object(fields) => fields,
            Value::Null => Map::new(),
            _ => {
                return Err(Error::NotAnObject {
                    parent: key.clone(),
                });
            }
        };
        status.insert(
            self.field.clone(),
            serde_json::to_value(&entries).map_err(serialize)?,
        );
        let mut gathered = Gathered {
            entries,
            written: false,
            deferred: None,
        };
        if self.shows(object, &status, &gathered.entries) {
            return Ok(gathered);
        }
        if let Err(wait) = self.limit.reserve(key) {
            gathered.deferred = Some(wait);
            return Ok(gathered);
        }
        // As `apply::apply_status` does, for a parent of either scope.
        let api = parent.cluster.api_for::<P>(key.namespace.as_deref());
        let body = json!({
            "apiVersion": P::api_version(&()),
            "kind": P::kind(&()),
            "metadata": { "name": key.name },
            "status": status,
        });
        let params = PatchParams::apply(&self.manager).force();
        let patch = Patch::Apply(&body);
        if let Err(source) = api.patch_status(&key.name, &params, &patch).await {
            self.limit.release(key);
            return Err(Error::Apply {
                parent: key.clone(),
                source: Box::new(source),
            });
        }
        gathered.written = true;
        Ok(gathered)
    }

    /// A signal for [`Controller::reconcile_all_on`](crate::Controller::reconcile_all_on):
    /// checks every `every` and yields when a cluster read joins or leaves,
    /// its health changes state (healthy, degraded, unreachable, ...), its
    /// children's watch syncs or stops being synced, or the
    /// [`startup_grace`](Self::startup_grace) ends: what no watch event
    /// tells.
    pub fn changes(&self, every: Duration) -> impl Stream<Item = ()> + Send + 'static {
        let (fleet, store) = (self.fleet.clone(), self.children.store().clone());
        let grace = self.grace.clone();
        let states = move || {
            let read = clusters_read(&fleet, &store).into_iter();
            let read: Vec<(ClusterName, &'static str, bool)> = read
                .map(|(name, health, watch)| {
                    let synced = watch.as_ref().is_some_and(WatchState::is_synced);
                    (name, health.state(), synced)
                })
                .collect();
            (grace.is_over(), read)
        };
        futures::stream::unfold(None, move |last: Option<(bool, Vec<_>)>| {
            let states = states.clone();
            async move {
                let mut last = last;
                loop {
                    tokio::time::sleep(every).await;
                    let now = states();
                    let changed = last.as_ref().is_some_and(|last| *last != now);
                    last = Some(now);
                    if changed {
                        return Some(((), last));
                    }
                }
            }
        })
    }

    /// The entry `shown` of a cluster read, of health `health`, whose
    /// children's watch is in the state `watch` (`None` before it starts),
    /// where the parent's child is `child`; `last` is its entry as written.
    fn entry(
        &self,
        shown: String,
        health: &ClusterHealth,
        watch: Option<&WatchState>,
        child: Option<&C>,
        last: Option<&ClusterEntry>,
        now: Timestamp,
    ) -> ClusterEntry {
        // Not answering: unreachable, set aside and settling, or any state
        // to come but those two.
        let answers = matches!(
            health,
            ClusterHealth::Healthy | ClusterHealth::Degraded { .. }
        );
        let listed = watch.is_some_and(WatchState::is_synced);
        let stale = !answers || !listed;
        let mut entry = ClusterEntry::new(shown, state_of(health), stale);
        match (child, last) {
            (Some(child), _) => self.read_into(&mut entry, child),
            (None, _) if !stale => entry.message = Some("no child in this cluster".to_owned()),
            (None, Some(last)) => entry.read_as(last),
            (None, None) => entry.message = Some(NOT_LISTED.to_owned()),
        }
        if answers && !listed {
            // The cluster answers, its health says nothing wrong: say why
            // its entry is stale.
            entry.message = Some(match watch {
                Some(WatchState::Failing { reason }) => {
                    format!("its children are not read: {reason}")
                }
                _ => NOT_LISTED.to_owned(),
            });
        }
        entry.last_seen = if stale {
            last_answer(health, last, now).map(Time)
        } else {
            Some(Time(now))
        };
        entry
    }

    /// Reads `child` into `entry`.
    fn read_into(&self, entry: &mut ClusterEntry, child: &C) {
        entry.child = Some(child.name_any());
        match serde_json::to_value(child).map(|json| self.read.of(&json)) {
            Ok(Found::Condition(condition)) => entry.condition = Some(condition),
            Ok(Found::Value(value)) => entry.value = Some(value),
            Ok(Found::Nothing(why)) => entry.message = Some(why),
            Err(error) => entry.message = Some(format!("not read: {error}")),
        }
    }

    /// The entries `object`'s status holds now.
    fn written<P: Serialize>(&self, object: &P) -> Vec<ClusterEntry> {
        serde_json::to_value(object)
            .ok()
            .and_then(|mut json| {
                json.pointer_mut(&format!("/status/{}", self.field))
                    .map(Value::take)
            })
            .and_then(|entries| serde_json::from_value(entries).ok())
            .unwrap_or_default()
    }

    /// Whether `object`'s status shows `status` already, but for the time
    /// of clusters that answer.
    fn shows<P: Serialize>(
        &self,
        object: &P,
        status: &Map<String, Value>,
        entries: &[ClusterEntry],
    ) -> bool {
        let Ok(json) = serde_json::to_value(object) else {
            return false;
        };
        let current = json.get("status");
        let fields_shown = shows_fields(current, status, &self.field);
        let compared = |entries: &[ClusterEntry]| -> Vec<ClusterEntry> {
            entries.iter().map(ClusterEntry::compared).collect()
        };
        let has_field = current.is_some_and(|c| c.get(&self.field).is_some());
        fields_shown && has_field && compared(&self.written(object)) == compared(entries)
    }

    /// The name of `cluster`'s entry.
    fn shown(&self, cluster: &ClusterName) -> String {
        if cluster.is_local() {
            self.local_name.clone()
        } else {
            cluster.to_string()
        }
    }
}

/// The clusters `store` reads, engaged or set aside (cut off, not gone),
/// each with its health and the state of its watch there (`None` while the
/// store has not started it), sorted by name.
fn clusters_read<C: Watchable>(
    fleet: &Fleet,
    store: &FleetStore<C>,
) -> Vec<(ClusterName, ClusterHealth, Option<WatchState>)> {
    let mut watches: HashMap<ClusterName, WatchState> = store.clusters().into_iter().collect();
    let health = fleet.status().health.into_iter();
    health
        .filter_map(|(name, health)| {
            let watch = watches.remove(&name);
            (watch.is_some() || store.reads(&name)).then_some((name, health, watch))
        })
        .collect()
}

/// Whether the status `current` shows the fields of `status` but `except`,
/// compared as the server stores them: without nulls, nor the objects that
/// held only nulls.
fn shows_fields(current: Option<&Value>, status: &Map<String, Value>, except: &str) -> bool {
    status.iter().all(|(field, value)| {
        field == except
            || without_nulls(current.and_then(|c| c.get(field))) == without_nulls(Some(value))
    })
}

/// `value` without the fields that are null, nor the objects left empty
/// by taking them out: what the API server stores of a field sent.
fn without_nulls(value: Option<&Value>) -> Option<Value> {
    match value? {
        Value::Null => None,
        Value::Object(fields) if !fields.is_empty() => {
            let kept: Map<String, Value> = fields
                .iter()
                .filter_map(|(name, value)| Some((name.clone(), without_nulls(Some(value))?)))
                .collect();
            (!kept.is_empty()).then_some(Value::Object(kept))
        }
        Value::Array(items) => Some(Value::Array(
            items
                .iter()
                .map(|item| without_nulls(Some(item)).unwrap_or(Value::Null))
                .collect(),
        )),
        other => Some(other.clone()),
    }
}

/// `Healthy`, `Degraded`, `Unreachable`, `Settling`: the state, as a
/// status value.
fn state_of(health: &ClusterHealth) -> String {
    let state = health.state();
    let mut chars = state.chars();
    chars
        .next()
        .map(|first| first.to_ascii_uppercase().to_string() + chars.as_str())
        .unwrap_or_default()
}

/// When a cluster whose entry is stale last answered: from how long it has
/// been down, else as its last entry says. Once stale, the time never
/// moves forward (a controller started again counts a cluster it has not
/// heard from as down since its own start), and back only by more than
/// the jitter of computing it again, so that it does not move at every
/// reconcile.
fn last_answer(
    health: &ClusterHealth,
    last: Option<&ClusterEntry>,
    now: Timestamp,
) -> Option<Timestamp> {
    let kept = last.and_then(|l| l.last_seen.as_ref()).map(|t| t.0);
    let ClusterHealth::Unreachable { down_for, .. } = health else {
        return kept;
    };
    let since = now.checked_sub(*down_for).unwrap_or(now);
    match kept.filter(|_| last.is_some_and(|l| l.stale)) {
        Some(kept) => {
            let earlier_by = kept.duration_since(since);
            if earlier_by.is_positive() && earlier_by.unsigned_abs() > SEEN_JITTER {
                Some(since)
            } else {
                Some(kept)
            }
        }
        None => Some(since),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_put_off_asks_for_the_sooner_requeue() {
        let gathered = |deferred| Gathered {
            entries: Vec::new(),
            written: false,
            deferred,
        };
        let secs = Duration::from_secs;
        assert_eq!(gathered(None).action(), Action::await_change());
        assert_eq!(gathered(Some(secs(1))).action(), Action::requeue(secs(1)));
        assert_eq!(
            gathered(Some(secs(1))).merged(Action::requeue(secs(5))),
            Action::requeue(secs(1))
        );
        assert_eq!(
            gathered(None).merged(Action::requeue(secs(5))),
            Action::requeue(secs(5))
        );
        assert_eq!(
            gathered(Some(secs(9))).merged(Action::await_change()),
            Action::requeue(secs(9))
        );
    }

    #[test]
    fn a_stale_entrys_time_stays_put_while_the_cluster_stays_down() {
        let now = Timestamp::now();
        let down = |secs| ClusterHealth::Unreachable {
            down_for: Duration::from_secs(secs),
            cause: "refused".into(),
        };
        let first = last_answer(&down(30), None, now).unwrap();
        let mut last = ClusterEntry::new("a".into(), "Unreachable".into(), true);
        last.last_seen = Some(Time(first));
        // A moment later, computed again: the same time.
        let later = now.checked_add(Duration::from_millis(1500)).unwrap();
        assert_eq!(last_answer(&down(31), Some(&last), later), Some(first));
        // Computed from a later start (the controller's, when it has not
        // heard from the cluster since): still the same time.
        let restarted = now.checked_add(Duration::from_secs(600)).unwrap();
        assert_eq!(last_answer(&down(5), Some(&last), restarted), Some(first));
        // An earlier time, by more than the jitter: taken.
        let earlier = last_answer(&down(60), Some(&last), later).unwrap();
        assert!(earlier < first, "{earlier} < {first}");
        // An entry that was fresh: the time computed.
        let mut fresh = last.clone();
        fresh.stale = false;
        let fresh_down = last_answer(&down(5), Some(&fresh), restarted).unwrap();
        assert!(fresh_down > first);
        // Set aside and answering, not read: the time written before.
        let settling = ClusterHealth::Healthy;
        assert_eq!(last_answer(&settling, Some(&last), later), Some(first));
        // A fresh entry's time is not compared; a stale one's is.
        assert_eq!(fresh.compared().last_seen, None);
        assert_eq!(last.compared().last_seen, Some(Time(first)));
    }

    #[test]
    fn a_field_written_as_null_shows_as_the_server_stores_it() {
        let with = json!({
            "phase": "Done", "reason": null, "detail": { "note": null },
            "counts": { "ok": 1, "failed": null }, "clusters": [],
        });
        let Value::Object(with) = with else {
            unreachable!()
        };
        // What the server keeps of it: no nulls, no object left empty.
        let stored = json!({ "phase": "Done", "counts": { "ok": 1 }, "clusters": [] });
        assert!(shows_fields(Some(&stored), &with, "clusters"));
        let changed = json!({ "phase": "Running", "counts": { "ok": 1 } });
        assert!(!shows_fields(Some(&changed), &with, "clusters"));
        let missing = json!({ "phase": "Done" });
        assert!(!shows_fields(Some(&missing), &with, "clusters"));
        assert!(!shows_fields(None, &with, "clusters"));
        // A field this manager gave before and now gives as null is gone
        // from the status already once the server stores it.
        let Value::Object(none) = json!({ "phase": null }) else {
            unreachable!()
        };
        assert!(shows_fields(Some(&json!({})), &none, "clusters"));
    }

    #[tokio::test]
    async fn a_cluster_that_answers_but_whose_children_are_not_read_is_stale_and_says_why() {
        use k8s_openapi::api::core::v1::ConfigMap;
        use kube::runtime::watcher;

        let fleet = Fleet::new();
        let children = Children::<ConfigMap>::new(
            &fleet,
            crate::controller::Watch::new(watcher::Config::default()),
        );
        let gather = Gather::new(&fleet, children, Read::field(".data.value").unwrap());
        let mut child = ConfigMap::default();
        child.metadata.name = Some("c".into());
        child.data = Some([("value".to_owned(), "1".to_owned())].into());
        let degraded = ClusterHealth::Degraded {
            cause: "a watch fails".into(),
        };
        let forbidden = WatchState::Failing {
            reason: "403 forbidden".into(),
        };
        let now = Timestamp::now();
        let entry = gather.entry(
            "m".into(),
            &degraded,
            Some(&forbidden),
            Some(&child),
            None,
            now,
        );
        assert!(entry.stale);
        assert_eq!(entry.value, Some(json!("1")), "the last value held");
        assert_eq!(
            entry.message.as_deref(),
            Some("its children are not read: 403 forbidden")
        );
        let listing = gather.entry("m".into(), &ClusterHealth::Healthy, None, None, None, now);
        assert!(listing.stale);
        assert_eq!(listing.message.as_deref(), Some(NOT_LISTED));
        let synced = Some(&WatchState::Synced);
        let fresh = gather.entry("m".into(), &degraded, synced, Some(&child), None, now);
        assert!(!fresh.stale);
        assert_eq!(fresh.last_seen, Some(Time(now)));
    }

    #[test]
    fn a_state_is_written_capitalized() {
        assert_eq!(state_of(&ClusterHealth::Healthy), "Healthy");
        let down = ClusterHealth::Unreachable {
            down_for: Duration::ZERO,
            cause: String::new(),
        };
        assert_eq!(state_of(&down), "Unreachable");
    }
}
