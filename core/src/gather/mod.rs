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
//!   [`write_with`](Gather::write_with)): other writers' status fields stay;
//! - a cluster that leaves the fleet leaves the status; a cluster cut off
//!   (still engaged, or [set aside](crate::FleetConfig::set_aside_after))
//!   keeps its last value, marked `stale`, with the time it last answered;
//! - a parent is written at most once per
//!   [`min_interval`](Gather::min_interval) (1 s by default): a write that
//!   would come sooner is put off, and [`Gathered::action`] asks for the
//!   reconcile again when it may be made;
//! - nothing is written when nothing but the time of a cluster that
//!   answers would change.
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
mod limit;
mod read;

pub use entry::{ChildCondition, ClusterEntry, entries_schema};
pub use error::Error;
pub use read::Read;

use std::{
    collections::{BTreeMap, HashMap},
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

use self::{limit::WriteLimit, read::Found};
use crate::{
    action::Action,
    cache::{WatchState, Watchable},
    cluster_name::ClusterName,
    fleet::Fleet,
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
    /// answer (or whose children are not listed yet) keeping the entry the
    /// parent's status has.
    pub fn entries<P: Resource<DynamicType = ()> + Serialize>(
        &self,
        parent: &ObjectRequest<P>,
    ) -> Vec<ClusterEntry> {
        let previous = parent
            .object
            .as_deref()
            .map(|object| self.written(object))
            .unwrap_or_default();
        let status = self.fleet.status();
        let stores: HashMap<ClusterName, WatchState> =
            self.children.store().clusters().into_iter().collect();
        // The clusters read: those engaged that the watch selects, and
        // those set aside (cut off, not gone) that it would.
        let health: BTreeMap<ClusterName, ClusterHealth> = status
            .health
            .into_iter()
            .filter(|(name, _)| {
                stores.contains_key(name)
                    || (status.set_aside.contains(name) && self.children.store().reads(name))
            })
            .collect();
        let children = self.children.owned(parent);
        let now = Timestamp::now();
        let mut entries = Vec::with_capacity(health.len());
        for (name, health) in health {
            let shown = self.shown(&name);
            let last = previous.iter().find(|entry| entry.cluster == shown);
            // Not answering: unreachable, set aside and settling, or any
            // state to come but those two.
            let stale = !matches!(
                health,
                ClusterHealth::Healthy | ClusterHealth::Degraded { .. }
            );
            let mut entry = ClusterEntry::new(shown, state_of(&health), stale);
            let child = children.iter().find(|child| child.cluster == name);
            let listed = stores.get(&name) == Some(&WatchState::Synced);
            match (child, last) {
                (Some(child), _) => self.read_into(&mut entry, child.object.as_ref()),
                (None, _) if listed && !stale => {
                    entry.message = Some("no child in this cluster".to_owned());
                }
                (None, Some(last)) => entry.read_as(last),
                (None, None) => {
                    entry.message = Some("its children are not listed yet".to_owned());
                }
            }
            entry.last_seen = if stale {
                last_answer(&health, last, now).map(Time)
            } else {
                Some(Time(now))
            };
            entries.push(entry);
        }
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
    /// them, by the same apply and the same field manager.
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
        let not_an_object = || Error::NotAnObject {
            parent: key.clone(),
        };
        let mut status = match serde_json::to_value(with(&entries)) {
            Ok(Value::Object(fields)) => fields,
            Ok(Value::Null) => Map::new(),
            _ => return Err(not_an_object()),
        };
        status.insert(
            self.field.clone(),
            serde_json::to_value(&entries).map_err(|_| not_an_object())?,
        );
        let mut gathered = Gathered {
            entries,
            written: false,
            deferred: None,
        };
        if self.shows(object, &status, &gathered.entries) {
            return Ok(gathered);
        }
        if let Err(wait) = self.limit.check(key) {
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
        api.patch_status(&key.name, &params, &Patch::Apply(&body))
            .await
            .map_err(|source| Error::Apply {
                parent: key.clone(),
                source: Box::new(source),
            })?;
        self.limit.wrote(key);
        gathered.written = true;
        Ok(gathered)
    }

    /// A signal for [`Controller::reconcile_all_on`](crate::Controller::reconcile_all_on):
    /// checks every `every` and yields when a cluster read joins or leaves
    /// or its health changes state (healthy, degraded, unreachable, ...),
    /// which no watch event tells.
    pub fn changes(&self, every: Duration) -> impl Stream<Item = ()> + Send + 'static {
        let (fleet, store) = (self.fleet.clone(), self.children.store().clone());
        let states = move || -> Vec<(ClusterName, &'static str)> {
            let status = fleet.status();
            let read: Vec<ClusterName> = store.clusters().into_iter().map(|(n, _)| n).collect();
            status
                .health
                .into_iter()
                .filter(|(name, _)| read.contains(name) || status.set_aside.contains(name))
                .map(|(name, health)| (name, health.state()))
                .collect()
        };
        futures::stream::unfold(None, move |last: Option<Vec<_>>| {
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
        let fields_shown = status.iter().all(|(field, value)| {
            *field == self.field || current.and_then(|c| c.get(field)) == Some(value)
        });
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

/// When a cluster that does not answer last did: from how long it has
/// been down, else as its last entry says. The last entry's time is kept
/// while the two agree, so that it does not move at every reconcile.
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
    let agree = |kept: &Timestamp| since.duration_since(*kept).unsigned_abs() <= SEEN_JITTER;
    Some(
        kept.filter(|kept| last.is_some_and(|l| l.stale) && agree(kept))
            .unwrap_or(since),
    )
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
        // It answered in between: the new time.
        assert_ne!(last_answer(&down(5), Some(&last), later), Some(first));
        // Set aside and answering, not read: the time written before.
        let settling = ClusterHealth::Healthy;
        assert_eq!(last_answer(&settling, Some(&last), later), Some(first));
        // A fresh entry's time is not compared; a stale one's is.
        let mut fresh = last.clone();
        fresh.stale = false;
        assert_eq!(fresh.compared().last_seen, None);
        assert_eq!(last.compared().last_seen, Some(Time(first)));
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
