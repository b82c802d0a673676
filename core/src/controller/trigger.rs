//! What turns a watched type's changes in one cluster into requests.

use std::{collections::HashMap, sync::Arc, time::Duration};

use futures::{
    StreamExt,
    stream::{self, BoxStream},
};
use kube::{Resource, ResourceExt};
use tokio::time::Instant;

use super::{ClusterSelector, watch::Resolved};
use crate::{
    cache::{Change, Sealed, SharedWatch, TypeInfo, WatchProbe, Watchable},
    client::{Shown, Writes},
    cluster::Cluster,
    cluster_name::ClusterName,
    panic::contain,
    queue::Lane,
    reason::ReconcileReason,
    request::{McRequest, ObjectKey},
};

/// A watched type of a controller: where its changes come from, and how each
/// becomes requests.
pub(crate) trait Trigger: Send + Sync {
    /// Starts or finds the watch in `cluster`.
    fn start(&self, cluster: &Cluster) -> Started;

    /// The clusters this watch is limited to; `None` for the controller's.
    fn clusters(&self) -> Option<&ClusterSelector>;

    /// Whether this watch runs in `cluster`: where its own selection says,
    /// or else where the controller's, `controller`, does.
    fn runs_in(&self, cluster: &ClusterName, controller: &ClusterSelector) -> bool {
        self.clusters().unwrap_or(controller).selects(cluster)
    }

    /// The requests for every object the watch in `cluster` holds now,
    /// filters aside.
    fn known(&self, cluster: &Cluster) -> Vec<McRequest>;

    /// The resource the watch reads, for its RBAC rules.
    fn watched(&self) -> Watched;

    /// The requests in `joined`, a cluster that has just joined, that the
    /// objects the watch in `source` holds now make: for a trigger whose
    /// mapper names objects in other clusters
    /// ([`Controller::watches_across`](super::Controller::watches_across)).
    fn joined(&self, _joined: &ClusterName, _source: &Cluster) -> Vec<McRequest> {
        Vec::new()
    }
}

/// A resource a controller reads or writes, as RBAC rules name it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Watched {
    /// A resource known when the controller is built.
    Resource { group: String, plural: String },
    /// A kind whose resource each cluster's discovery finds.
    Discovered { group: String, kind: String },
}

impl Watched {
    /// What type information `dyntype` of `T` names.
    pub(crate) fn of<T: Resource<DynamicType: TypeInfo>>(dyntype: &T::DynamicType) -> Self {
        match dyntype.to_discover() {
            Some((group, kind, _)) => Self::Discovered {
                group: group.to_owned(),
                kind: kind.to_owned(),
            },
            None => Self::Resource {
                group: T::group(dyntype).into_owned(),
                plural: T::plural(dyntype).into_owned(),
            },
        }
    }
}

/// A trigger's watch in one cluster, running, and how to subscribe to it.
pub(crate) struct Started {
    pub(crate) watch: Arc<dyn WatchProbe>,
    /// The requests the watch makes in this cluster: first one per object
    /// in the store when subscribing, then one per change. Called once the
    /// controller serves the cluster, so that nothing piles up unread while
    /// another of its watches there cannot sync; with the controller's name
    /// if it tells the echoes of its own writes (see [`Echoes`]).
    pub(crate) subscribe: Box<dyn FnOnce(Option<Arc<str>>) -> BoxStream<'static, Triggered> + Send>,
}

/// A request a trigger made, the lane it waits in, and why.
pub(crate) type Triggered = (Dest, Lane, ReconcileReason);

/// Where a trigger's request goes.
#[derive(Clone, Debug)]
pub(crate) enum Dest {
    /// To one object in one cluster.
    One(McRequest),
    /// To an object of this key in every cluster the selection picks,
    /// among those engaged when the request is taken in.
    Across(ClusterSelector, ObjectKey),
}

type Mapper<T> = Arc<dyn Fn(&ClusterName, &Change<T>) -> Vec<McRequest> + Send + Sync>;
/// Names objects to reconcile in every cluster of a selection.
pub(crate) type KeyMapper<T> = Arc<dyn Fn(&ClusterName, &T) -> Vec<ObjectKey> + Send + Sync>;
/// Makes a fresh filter per cluster stream, since a filter may keep state
/// (a predicate remembers what it saw of each object).
pub(crate) type FilterFactory<T> =
    Arc<dyn Fn() -> Box<dyn FnMut(&Change<T>) -> bool + Send> + Send + Sync>;

pub(crate) struct WatchTrigger<T: Watchable> {
    /// The watch, as the controller was told it.
    pub(crate) watch: Resolved<T>,
    pub(crate) mapper: Mapper<T>,
    /// A change passes only if every filter passes it.
    pub(crate) filters: Vec<FilterFactory<T>>,
    /// The kind of a related type (owned or watched); `None` for the
    /// controller's own type.
    pub(crate) related: Option<Arc<str>>,
    /// For a trigger that makes requests in other clusters: the clusters,
    /// and what it asks for there. Its `mapper` then makes none.
    pub(crate) across: Option<(ClusterSelector, KeyMapper<T>)>,
}

impl<T: Watchable> WatchTrigger<T> {
    /// [`Trigger::start`], also handing back the watch itself, typed: the
    /// controller reads each reconcile's object from it.
    pub(crate) fn start_typed(&self, cluster: &Cluster) -> (Arc<SharedWatch<T>>, Started) {
        let watch = self.watch.watch_in(cluster);
        let subscribe = {
            let (watch, name) = (watch.clone(), cluster.name().clone());
            let (mapper, filters) = (self.mapper.clone(), self.filters.clone());
            let (related, across) = (self.related.clone(), self.across.clone());
            let writes = cluster.cache().writes().clone();
            move |writer: Option<Arc<str>>| {
                let echoes = writer.map(|writer| Echoes::new::<T>(writes, writer, watch.dyntype()));
                requests(&watch, name, mapper, across, &filters, related, echoes)
            }
        };
        let started = Started {
            watch: watch.clone(),
            subscribe: Box::new(subscribe),
        };
        (watch, started)
    }
}

impl<T: Watchable> Trigger for WatchTrigger<T> {
    fn start(&self, cluster: &Cluster) -> Started {
        self.start_typed(cluster).1
    }

    fn clusters(&self) -> Option<&ClusterSelector> {
        self.watch.clusters()
    }

    fn known(&self, cluster: &Cluster) -> Vec<McRequest> {
        let watch = self.watch.watch_in(cluster);
        let name = cluster.name();
        watch
            .store()
            .state()
            .into_iter()
            .filter_map(|object| {
                contained(name, "mapper", || {
                    (self.mapper)(name, &Change::Listed(object))
                })
            })
            .flatten()
            .collect()
    }

    fn watched(&self) -> Watched {
        Watched::of::<T>(self.watch.dyntype())
    }

    fn joined(&self, joined: &ClusterName, source: &Cluster) -> Vec<McRequest> {
        let Some((to, keys)) = &self.across else {
            return Vec::new();
        };
        if !to.selects(joined) {
            return Vec::new();
        }
        let name = source.name();
        self.watch
            .watch_in(source)
            .store()
            .state()
            .into_iter()
            .filter_map(|object| contained(name, "mapper", || keys(name, &object)))
            .flatten()
            .map(|key| key.in_cluster(joined.clone()))
            .collect()
    }
}

/// How a controller that reads its own writes tells a change that only
/// echoes one of them: the object is as its write left it.
pub(crate) struct Echoes {
    writes: Arc<Writes>,
    writer: Arc<str>,
    group: String,
    resource: String,
    kind: Arc<str>,
}

impl Echoes {
    fn new<T: Resource>(writes: Arc<Writes>, writer: Arc<str>, dyntype: &T::DynamicType) -> Self {
        Self {
            writes,
            writer,
            group: T::group(dyntype).into_owned(),
            resource: T::plural(dyntype).into_owned(),
            kind: T::kind(dyntype).into(),
        }
    }

    /// Whether `change` only echoes the controller's own write.
    fn echoes<T: Resource>(&self, change: &Change<T>) -> bool {
        let (object, deleted) = match change {
            Change::Listed(_) => return false,
            Change::Applied(object) => (object, false),
            Change::Deleted(object) => (object, true),
        };
        let Some(shown) = Shown::of((&self.group, &self.resource), object.meta(), deleted) else {
            return false;
        };
        self.writes.take_echo(&shown, &self.writer)
    }
}

/// The requests that the changes `watch` reports make in the cluster `name`.
fn requests<T: Watchable>(
    watch: &Arc<SharedWatch<T>>,
    name: ClusterName,
    mapper: Mapper<T>,
    across: Option<(ClusterSelector, KeyMapper<T>)>,
    filters: &[FilterFactory<T>],
    related: Option<Arc<str>>,
    echoes: Option<Echoes>,
) -> BoxStream<'static, Triggered> {
    let mut filters: Vec<_> = filters.iter().map(|make| make()).collect();
    watch
        .subscribe()
        .flat_map(move |change| {
            let echo = echoes.as_ref().is_some_and(|echoes| echoes.echoes(&change));
            let lane = match change {
                Change::Listed(_) => Lane::Listed,
                Change::Applied(_) | Change::Deleted(_) if echo => Lane::Echoed,
                Change::Applied(_) | Change::Deleted(_) => Lane::Changed,
            };
            // Every filter sees every change, so stateful ones stay current.
            let passed = contained(&name, "filter", || {
                filters
                    .iter_mut()
                    .fold(true, |keep, filter| filter(&change) & keep)
            });
            let requests: Option<Vec<Dest>> = match (passed, &across) {
                (Some(true), None) => contained(&name, "mapper", || mapper(&name, &change))
                    .map(|requests| requests.into_iter().map(Dest::One).collect()),
                (Some(true), Some((to, keys))) => {
                    contained(&name, "mapper", || keys(&name, change.object())).map(|keys| {
                        keys.into_iter()
                            .map(|key| Dest::Across(to.clone(), key))
                            .collect()
                    })
                }
                _ => None,
            };
            let reason = match (&related, lane) {
                (_, Lane::Listed) => ReconcileReason::Listed,
                (_, Lane::Echoed) => ReconcileReason::OwnWrite {
                    kind: echoes.as_ref().map(|e| e.kind.clone()).unwrap_or_default(),
                },
                (Some(kind), Lane::Changed) => {
                    ReconcileReason::RelatedObjectUpdated { kind: kind.clone() }
                }
                (None, Lane::Changed) => ReconcileReason::ObjectUpdated,
            };
            let requests = requests.unwrap_or_default().into_iter();
            stream::iter(requests.map(move |request| (request, lane, reason.clone())))
        })
        .boxed()
}

/// Runs user code (a filter, a mapper) so that a panic in it loses this
/// change, not the controller.
fn contained<R>(cluster: &ClusterName, what: &str, f: impl FnOnce() -> R) -> Option<R> {
    contain(f)
        .map_err(|message| {
            tracing::error!(%cluster, what, %message, "a watch {what} panicked; the change is skipped");
        })
        .ok()
}

/// The request for the object itself.
pub(crate) fn for_self<K: Resource>(cluster: &ClusterName, change: &Change<K>) -> Vec<McRequest> {
    vec![McRequest::for_object(
        cluster.clone(),
        change.object().as_ref(),
    )]
}

/// A mapper to the owners of kind `kind` (`api_version`) named in an
/// object's owner references, in the same cluster (and namespace, for a
/// namespaced owner).
pub(crate) fn for_owners<T: Resource>(
    kind: String,
    api_version: String,
    namespaced: bool,
) -> impl Fn(&ClusterName, &Change<T>) -> Vec<McRequest> + Send + Sync + 'static {
    // An owner found by discovery may be referred to at any version.
    let any_version = crate::cache::stand_in::group_of_any_version(&api_version);
    let same_type =
        move |owner: &k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference| {
            owner.kind == kind
                && match &any_version {
                    Some(group) => {
                        owner.api_version.rsplit_once('/').map_or("", |(g, _)| g) == group
                    }
                    None => owner.api_version == api_version,
                }
        };
    move |cluster, change| {
        let object = change.object();
        let namespace = if namespaced { object.namespace() } else { None };
        object
            .owner_references()
            .iter()
            .filter(|owner| same_type(owner))
            .map(|owner| McRequest {
                cluster: cluster.clone(),
                namespace: namespace.clone(),
                name: owner.name.clone(),
            })
            .collect()
    }
}

/// How long a predicate remembers an object it has not seen, as kube's
/// predicates do: an entry unseen for this long is dropped, so memory follows
/// the objects that exist.
pub(crate) const PREDICATE_MEMORY: Duration = Duration::from_secs(60 * 60);

/// An object as a predicate remembers it: by name and UID, so that an object
/// deleted and created again under the same name is a new object.
#[derive(PartialEq, Eq, Hash)]
struct Seen {
    namespace: Option<String>,
    name: String,
    uid: Option<String>,
}

/// A filter that passes an applied object only when `property` changed since
/// the last time it passed, as kube's predicates do. Deletions always pass,
/// and so does an object recreated under the same name (another UID).
pub(crate) fn predicate_filter<K, P>(predicate: P) -> FilterFactory<K>
where
    K: Resource<DynamicType: TypeInfo> + 'static,
    P: Fn(&K) -> Option<u64> + Clone + Send + Sync + 'static,
{
    Arc::new(move || {
        let predicate = predicate.clone();
        let mut seen: HashMap<Seen, (u64, Instant)> = HashMap::new();
        let mut swept = Instant::now();
        Box::new(move |change: &Change<K>| {
            let now = Instant::now();
            if now.duration_since(swept) >= PREDICATE_MEMORY {
                seen.retain(|_, (_, at)| now.duration_since(*at) < PREDICATE_MEMORY);
                swept = now;
            }
            let object = change.object();
            let key = Seen {
                namespace: object.namespace(),
                name: object.name_any(),
                uid: object.meta().uid.clone(),
            };
            match change {
                Change::Deleted(_) => {
                    seen.remove(&key);
                    true
                }
                Change::Listed(_) | Change::Applied(_) => match predicate(object) {
                    Some(value) => seen
                        .insert(key, (value, now))
                        .is_none_or(|(before, _)| before != value),
                    None => true,
                },
            }
        })
    })
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::ObjectMeta;

    use super::*;

    fn config_map(name: &str, generation: i64) -> Arc<ConfigMap> {
        with_uid(name, generation, "uid-1")
    }

    fn with_uid(name: &str, generation: i64, uid: &str) -> Arc<ConfigMap> {
        Arc::new(ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                generation: Some(generation),
                uid: Some(uid.into()),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        })
    }

    fn generation(object: &ConfigMap) -> Option<u64> {
        object.metadata.generation.map(|g| g as u64)
    }

    #[test]
    fn a_predicate_passes_only_changes_of_its_value_and_every_deletion() {
        let mut filter = predicate_filter(generation)();
        assert!(filter(&Change::Applied(config_map("a", 1))), "first sight");
        assert!(
            !filter(&Change::Applied(config_map("a", 1))),
            "same generation"
        );
        assert!(
            filter(&Change::Applied(config_map("b", 1))),
            "another object"
        );
        assert!(
            filter(&Change::Applied(config_map("a", 2))),
            "new generation"
        );
        assert!(
            filter(&Change::Deleted(config_map("a", 2))),
            "deletions pass"
        );
        assert!(
            filter(&Change::Applied(config_map("a", 2))),
            "recreated after deletion"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_predicate_passes_an_object_recreated_under_the_same_name() {
        let mut filter = predicate_filter(generation)();
        assert!(filter(&Change::Listed(with_uid("a", 1, "first"))));
        // Deleted and created again while the watch was down: a relist sees
        // the same name and generation, but another object.
        assert!(filter(&Change::Listed(with_uid("a", 1, "second"))));
        assert!(!filter(&Change::Applied(with_uid("a", 1, "second"))));
    }

    #[tokio::test(start_paused = true)]
    async fn a_predicate_forgets_objects_it_has_not_seen_for_an_hour() {
        let mut filter = predicate_filter(generation)();
        assert!(filter(&Change::Applied(config_map("a", 1))));
        assert!(!filter(&Change::Applied(config_map("a", 1))));
        tokio::time::advance(PREDICATE_MEMORY).await;
        assert!(
            filter(&Change::Applied(config_map("a", 1))),
            "forgotten, so passed again"
        );
    }

    #[test]
    fn owners_of_the_controlled_kind_are_requested_in_the_child_cluster_and_namespace() {
        use k8s_openapi::{
            api::core::v1::Secret, apimachinery::pkg::apis::meta::v1::OwnerReference,
        };
        let owner = |kind: &str, api_version: &str, name: &str| OwnerReference {
            kind: kind.into(),
            api_version: api_version.into(),
            name: name.into(),
            ..OwnerReference::default()
        };
        let child = Arc::new(Secret {
            metadata: ObjectMeta {
                name: Some("child".into()),
                namespace: Some("ns".into()),
                owner_references: Some(vec![
                    owner("ConfigMap", "v1", "parent"),
                    owner("ConfigMap", "example.com/v1", "other-group"),
                    owner("Deployment", "apps/v1", "not-this-kind"),
                    owner("Node", "v1", "node-1"),
                ]),
                ..ObjectMeta::default()
            },
            ..Secret::default()
        });
        let cluster = ClusterName::new("east");
        let change = Change::Applied(child);
        assert_eq!(
            for_owners::<Secret>("ConfigMap".into(), "v1".into(), true)(&cluster, &change),
            [McRequest::new("east", Some("ns"), "parent")]
        );
        // An owner found by discovery matches at any version of its group.
        assert_eq!(
            for_owners::<Secret>("ConfigMap".into(), "example.com/*".into(), true)(
                &cluster, &change
            ),
            [McRequest::new("east", Some("ns"), "other-group")]
        );
        assert_eq!(
            for_owners::<Secret>("ConfigMap".into(), "*".into(), true)(&cluster, &change),
            [McRequest::new("east", Some("ns"), "parent")]
        );
        // A cluster-scoped owner is requested without a namespace.
        assert_eq!(
            for_owners::<Secret>("Node".into(), "v1".into(), false)(&cluster, &change),
            [McRequest::new("east", None::<String>, "node-1")]
        );
    }
}
