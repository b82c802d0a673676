//! Deleting a parent's children in every engaged cluster: each delete
//! conditional on the child's UID, clusters that give no answer or whose
//! children are not known yet skipped and reported, not waited for.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    fmt,
    sync::{Arc, Mutex},
    time::Duration,
};

use kube::{
    Resource, ResourceExt,
    api::{DeleteParams, Preconditions},
};
use serde::de::DeserializeOwned;
use tower::BoxError;

use crate::{
    cache::{WatchState, Watchable},
    cluster_name::ClusterName,
    fleet::Fleet,
    fleetwide::{FleetStore, InCluster, for_each_cluster},
    panic::lock,
    request::{McRequest, ObjectKey},
};

/// The parents whose children a cleanup or sweep had to skip, by the
/// cluster skipped; for each, whether that cluster gave no answer (asked
/// about again every time) rather than having children not known yet
/// (asked about once its watch has synced).
pub(super) type Pending = Arc<Mutex<HashMap<ClusterName, HashMap<McRequest, bool>>>>;

/// What [`Children::delete`](super::Children::delete) did.
#[derive(Debug, Default)]
#[non_exhaustive]
pub struct Deleted {
    /// The children deleted (or found gone already), each as the request
    /// for it in its cluster.
    pub deleted: Vec<McRequest>,
    /// The clusters skipped, and why (see the [module docs](crate::ownership) for when
    /// they are swept).
    pub skipped: Vec<(ClusterName, String)>,
}

impl Deleted {
    /// Notes that `cluster` was skipped for `why`: one entry per cluster,
    /// with every cause.
    pub(super) fn skip(&mut self, cluster: &ClusterName, why: String) {
        match self.skipped.iter_mut().find(|(c, _)| c == cluster) {
            Some((_, causes)) => {
                causes.push_str("; ");
                causes.push_str(&why);
            }
            None => self.skipped.push((cluster.clone(), why)),
        }
    }
}

/// Records that `cluster` was skipped for `parent` (`Some(unanswered)`),
/// or clears that (`None`). Whether it is news: the cluster newly gives
/// no answer for this parent.
pub(super) fn record(
    pending: &Pending,
    cluster: &ClusterName,
    parent: &McRequest,
    skipped: Option<bool>,
) -> bool {
    let mut pending = lock(pending);
    match skipped {
        Some(unanswered) => {
            let entry = pending
                .entry(cluster.clone())
                .or_default()
                .entry(parent.clone())
                .or_default();
            let news = unanswered && !*entry;
            *entry |= unanswered;
            news
        }
        None => {
            if let Some(parents) = pending.get_mut(cluster) {
                parents.remove(parent);
                if parents.is_empty() {
                    pending.remove(cluster);
                }
            }
            false
        }
    }
}

/// What a cleanup works with: the fleet, the store of children, how many
/// clusters it deletes in at once, and what was skipped.
pub(super) struct Cleanup<'a, C: Watchable> {
    pub(super) fleet: &'a Fleet,
    pub(super) store: &'a FleetStore<C>,
    pub(super) concurrency: usize,
    pub(super) pending: &'a Pending,
}

impl<C> Cleanup<'_, C>
where
    C: Watchable<DynamicType = ()> + serde::Serialize,
{
    pub(super) async fn delete_children(
        &self,
        parent: &McRequest,
        read: HashMap<ClusterName, WatchState>,
        children: Vec<InCluster<C>>,
        timeout: Duration,
        unknown: Unknown,
    ) -> Result<(Deleted, HashSet<ClusterName>), BoxError> {
        let mut deleted = Deleted::default();
        // Clusters whose children are not all known: reported, and recorded
        // below as `unknown` says.
        for cluster in self.fleet.clusters() {
            let name = cluster.name();
            if !self.store.reads(name) {
                continue;
            }
            match read.get(name) {
                None => deleted.skip(name, "not read yet".into()),
                Some(state) if *state != WatchState::Synced => {
                    deleted.skip(name, format!("its watch is {state}"))
                }
                Some(_) => {}
            }
        }
        let mut work: BTreeMap<ClusterName, Vec<Arc<C>>> = BTreeMap::new();
        for child in children {
            work.entry(child.cluster).or_default().push(child.object);
        }
        let mut clusters = Vec::new();
        work.retain(|name, _| match self.fleet.get(name) {
            Some(cluster) => {
                clusters.push(cluster);
                true
            }
            None => {
                deleted.skip(name, "not engaged".into());
                false
            }
        });
        let outcome = for_each_cluster(clusters, self.concurrency, timeout, |cluster| {
            let children = work.remove(cluster.name()).unwrap_or_default();
            async move {
                let mut gone = Vec::new();
                for child in children {
                    delete_one(&cluster, child.as_ref()).await?;
                    gone.push(ObjectKey::of(child.as_ref()));
                }
                Ok::<_, BoxError>(gone)
            }
        })
        .await;
        let mut failures = Vec::new();
        let mut unanswered = HashSet::new();
        for (cluster, result) in outcome.outcomes {
            match result {
                Ok(gone) => deleted
                    .deleted
                    .extend(gone.into_iter().map(|key| key.in_cluster(cluster.clone()))),
                Err(error) if unreachable(&*error) => {
                    unanswered.insert(cluster.clone());
                    deleted.skip(&cluster, error.to_string());
                }
                Err(error) => failures.push(format!("{cluster}: {error}")),
            }
        }
        // Every synced cluster that answered (or had nothing to delete) is
        // done for this parent; those that gave no answer wait for a sweep.
        let skipped: HashSet<&ClusterName> = deleted.skipped.iter().map(|(c, _)| c).collect();
        for (cluster, state) in &read {
            if *state == WatchState::Synced && !skipped.contains(cluster) {
                record(self.pending, cluster, parent, None);
            }
        }
        // Those that gave no answer, or whose children are not all known,
        // are asked about again once they are (see `sweeps`).
        // With `Unknown::Forget`, a cluster the store has not read yet is
        // still remembered: the controller may have listed its children
        // before the store followed it, and would not be told again.
        let mut recorded = false;
        let mut news = false;
        for (cluster, _) in &deleted.skipped {
            let answered = !unanswered.contains(cluster);
            let forget = answered && unknown == Unknown::Forget && read.contains_key(cluster);
            if self.fleet.get(cluster).is_some() && !forget {
                news |= record(self.pending, cluster, parent, Some(!answered));
                recorded = true;
            }
        }
        // Told once per parent and cluster: a cleanup retried while a
        // cluster stays down says nothing new.
        if news {
            tracing::warn!(parent = %parent, skipped = ?deleted.skipped, "children in clusters that are down are left for a sweep when they return");
        } else if recorded {
            tracing::debug!(parent = %parent, skipped = ?deleted.skipped, "children in clusters still down are left for a sweep when they return");
        } else if !deleted.skipped.is_empty() {
            tracing::debug!(parent = %parent, skipped = ?deleted.skipped, "clusters whose children are not known yet wake the parent once they are");
        }
        if failures.is_empty() {
            Ok((deleted, unanswered))
        } else {
            Err(format!("deleting children failed in {}", failures.join("; ")).into())
        }
    }
}

/// What a deletion does about a cluster whose children are not known yet.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Unknown {
    /// The parent is asked about again once the cluster's watch syncs.
    Remember,
    /// Nothing, once the store reads the cluster: the parent stays, and the
    /// cluster's children, once listed, wake it.
    Forget,
}

/// Deletes `child` in `cluster`, if it is still the same object.
async fn delete_one<C>(cluster: &crate::cluster::Cluster, child: &C) -> Result<(), BoxError>
where
    C: Resource<DynamicType = ()> + Clone + DeserializeOwned + fmt::Debug,
{
    let api = cluster.api_for::<C>(child.namespace().as_deref());
    let params = DeleteParams {
        preconditions: child.meta().uid.clone().map(|uid| Preconditions {
            uid: Some(uid),
            resource_version: None,
        }),
        ..DeleteParams::background()
    };
    match api.delete(&child.name_any(), &params).await {
        Ok(_) => Ok(()),
        // Gone already, or replaced by another object of that name.
        Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => Ok(()),
        Err(error) => Err(error.into()),
    }
}

/// Whether `error` says the server gave no answer (it is down, cut off, or
/// a gateway in front of it says so), rather than an answer that was an
/// error.
fn unreachable(error: &(dyn std::error::Error + 'static)) -> bool {
    crate::fleetwide::unanswered(error) || crate::client::is_unanswered(error)
}
