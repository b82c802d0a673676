//! The children of parents in other clusters: finding, deleting and
//! sweeping them across the fleet.

use std::{
    collections::{HashMap, HashSet},
    fmt,
    sync::Arc,
    time::Duration,
};

use futures::StreamExt;

use kube::{Resource, ResourceExt};
use tower::BoxError;

use super::cleanup::{Cleanup, Deleted, Pending, Unknown};
use super::parent::{PARENT_ANNOTATION, ParentRef, key_names, request_key};
use crate::{
    cache::{WatchState, Watchable},
    cluster_name::ClusterName,
    controller::Watch,
    fleet::Fleet,
    fleetwide::{FleetStore, InCluster},
    object_request::ObjectRequest,
    panic::lock,
    request::McRequest,
};

/// How long [`Children::sweep`] and [`Children::release`] wait for each
/// cluster's deletes.
const SWEEP_TIMEOUT: Duration = Duration::from_secs(30);

/// The children of type `C` that parents in other clusters own, across
/// the fleet: see the [module docs](crate::ownership).
///
/// It reads them from a [`FleetStore`] of `C`, shared with the watch of a
/// controller that [`owns_across`](crate::Controller::owns_across) them with
/// the same [`Watch`]. Cheap to clone.
pub struct Children<C: Watchable> {
    pub(super) fleet: Fleet,
    pub(super) store: FleetStore<C>,
    pub(super) concurrency: usize,
    /// The parents whose children a cleanup or sweep had to skip, by the
    /// cluster skipped.
    /// For each, whether that cluster gave no answer (asked about again
    /// every time) rather than having children not known yet (asked about
    /// once its watch has synced).
    pub(super) pending: Pending,
}

impl<C: Watchable> Clone for Children<C> {
    fn clone(&self) -> Self {
        Self {
            fleet: self.fleet.clone(),
            store: self.store.clone(),
            concurrency: self.concurrency,
            pending: self.pending.clone(),
        }
    }
}

impl<C: Watchable> fmt::Debug for Children<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Children")
            .field("store", &self.store)
            .finish()
    }
}

impl<C> Children<C>
where
    C: Watchable<DynamicType = ()> + serde::Serialize,
{
    /// The children of type `C`, watched as `watch` says (by default in
    /// every cluster). Give the controller's
    /// [`owns_across`](crate::Controller::owns_across) the same `Watch`,
    /// with [`Watch::in_clusters`] set: `owns_across` otherwise watches
    /// only the controller's own clusters. Panics if the watch is built
    /// wrong, as [`FleetStore::new`] does. Create it inside a tokio runtime.
    pub fn new(fleet: &Fleet, watch: impl Into<Watch>) -> Self {
        Self {
            fleet: fleet.clone(),
            store: FleetStore::<C>::new(fleet, watch),
            concurrency: 16,
            pending: Arc::default(),
        }
    }

    /// Deletes in at most `limit` clusters at once (default 16).
    #[must_use]
    pub fn concurrency(mut self, limit: usize) -> Self {
        self.concurrency = limit.max(1);
        self
    }

    /// The store the children are read from.
    pub fn store(&self) -> &FleetStore<C> {
        &self.store
    }

    /// Every child that names the request's object as its parent (by
    /// cluster, kind, namespace and name), with a UID that `uid` accepts,
    /// in every cluster the store reads. Read from the clusters' stores as
    /// they are now: a child that the controller has heard of is there.
    fn named_by<P: Resource<DynamicType = ()>>(
        &self,
        parent: &McRequest,
        uid: impl Fn(&str) -> bool,
    ) -> Vec<InCluster<C>> {
        let key = request_key::<P>(parent);
        // A cheap test before the parse: the parent's name is in its
        // children's annotation as it is, unless JSON escapes it (then the
        // annotation holds a backslash).
        let names = |child: &C| {
            child
                .annotations()
                .get(PARENT_ANNOTATION)
                .is_some_and(|value| value.contains(parent.name.as_str()) || value.contains('\\'))
        };
        self.store
            .list_where(names)
            .into_iter()
            .filter(|child| {
                ParentRef::of_child(child.object.as_ref())
                    .and_then(Result::ok)
                    .is_some_and(|named| named.key() == key && uid(&named.uid))
            })
            .collect()
    }

    /// Every child that names the request's object as its parent (by
    /// cluster, kind, namespace and name), whatever UID it names, in every
    /// cluster the store reads.
    pub fn of<P: Resource<DynamicType = ()>>(
        &self,
        parent: &ObjectRequest<P>,
    ) -> Vec<InCluster<C>> {
        self.named_by::<P>(&parent.request, |_| true)
    }

    /// The children of the request's object as it is now (the UID they
    /// name is its UID).
    pub fn owned<P: Resource<DynamicType = ()>>(
        &self,
        parent: &ObjectRequest<P>,
    ) -> Vec<InCluster<C>> {
        let Some(uid) = parent.object.as_ref().and_then(|p| p.meta().uid.clone()) else {
            return Vec::new();
        };
        self.named_by::<P>(&parent.request, |named| named == uid)
    }

    /// Deletes every child of the request's object, for its finalizer's
    /// cleanup, in every engaged cluster the store reads, bounded by
    /// `timeout` per cluster. A cluster the store has not read yet, whose
    /// watch has not synced, or that gives no answer is skipped and
    /// reported, not waited for (see the [module docs](crate::ownership) for how it is
    /// swept later), unless the parent stays (is not being deleted): then
    /// a cluster whose store holds its children and that gives no answer
    /// fails the call (for those in clusters not known yet, see
    /// [`release`](Self::release)). An error from a server that answers
    /// fails the call, to be retried.
    ///
    /// It deletes the children the clusters' stores hold. A child made a
    /// moment before the parent went may reach its store only after this
    /// read: the controller must
    /// [`owns_across`](crate::Controller::owns_across) the children with the
    /// same [`Watch`], so that the child wakes its gone parent, and call
    /// [`sweep`](Self::sweep) when the request's object is gone, which
    /// deletes it.
    pub async fn delete<P: Resource<DynamicType = ()>>(
        &self,
        parent: &ObjectRequest<P>,
        timeout: Duration,
    ) -> Result<Deleted, BoxError> {
        // The clusters' states before their children are read: a cluster
        // that syncs in between counts as not synced, not as holding none.
        let read = self.states();
        let children = self.of(parent);
        let (deleted, unanswered) = self
            .cleanup()
            .delete_children(&parent.request, read, children, timeout, Unknown::Remember)
            .await?;
        // A parent that stays (released by `finalize_if`, not deleted) does
        // not prove its children orphans by its absence: every cluster must
        // be reached before it lets them go.
        let staying = parent
            .object
            .as_ref()
            .is_some_and(|p| p.meta().deletion_timestamp.is_none());
        // Children that a cluster holds but could not delete (it gave no
        // answer) keep the finalizer. Those in clusters whose children are
        // not known yet are listed to the controller when they are, and
        // `release` deletes them then.
        let unreached: Vec<String> = deleted
            .skipped
            .iter()
            .filter(|(cluster, _)| unanswered.contains(cluster))
            .map(|(cluster, why)| format!("{}: {why}", crate::fleetwide::shown(cluster)))
            .collect();
        if staying && !unreached.is_empty() {
            return Err(format!(
                "{} stays, so its children must go from every cluster first; not reached: {}",
                parent.request,
                unreached.join("; ")
            )
            .into());
        }
        Ok(deleted)
    }

    /// Deletes the children of the request's parent key whose parent is
    /// gone: all of them when the request has no object, else those that
    /// name another UID (a parent deleted and made again). For the parent's
    /// reconcile; skips clusters as [`delete`](Self::delete) does, with a
    /// timeout of 30 s per cluster.
    pub async fn sweep<P: Resource<DynamicType = ()>>(
        &self,
        parent: &ObjectRequest<P>,
    ) -> Result<Deleted, BoxError> {
        let uid = parent.object.as_ref().and_then(|p| p.meta().uid.clone());
        let read = self.states();
        let orphans = self.named_by::<P>(&parent.request, |named| uid.as_deref() != Some(named));
        if !orphans.is_empty() {
            tracing::info!(parent = %parent.request, orphans = orphans.len(), "deleting children whose parent is gone");
        }
        self.cleanup()
            .delete_children(
                &parent.request,
                read,
                orphans,
                SWEEP_TIMEOUT,
                Unknown::Remember,
            )
            .await
            .map(|(deleted, _)| deleted)
    }

    /// Deletes every child of the request's object, which exists but is no
    /// longer the reconciler's (the `wanted` false of
    /// [`ObjectRequest::finalize_if`]: its label was removed, say). Call it
    /// on every run of the parent's reconcile that finds the object
    /// unwanted and without the finalizer (while the finalizer is there, its
    /// cleanup's [`delete`](Self::delete) does this): a child made a moment
    /// before the parent was released, or in a cluster whose children were
    /// not known yet, reaches its cluster's store after the cleanup read it,
    /// wakes its parent through
    /// [`owns_across`](crate::Controller::owns_across), and goes here.
    ///
    /// Skips clusters as [`sweep`](Self::sweep) does, without failing: one
    /// that gave no answer, or that the store has not read yet, is asked
    /// about again through [`sweeps`](Self::sweeps) (wire it); one whose
    /// watch has not synced lists its children to the controller once the
    /// controller serves it (every one of its watches there has synced),
    /// and each wakes its parent.
    ///
    /// It reads the stores: each call costs a pass over the children held,
    /// no API call unless a child is found.
    pub async fn release<P: Resource<DynamicType = ()>>(
        &self,
        parent: &ObjectRequest<P>,
    ) -> Result<Deleted, BoxError> {
        let read = self.states();
        let children = self.of(parent);
        if !children.is_empty() {
            tracing::info!(parent = %parent.request, children = children.len(), "deleting children of a released parent");
        }
        self.cleanup()
            .delete_children(
                &parent.request,
                read,
                children,
                SWEEP_TIMEOUT,
                Unknown::Forget,
            )
            .await
            .map(|(deleted, _)| deleted)
    }

    /// The requests of parents whose cleanup or sweep skipped a cluster
    /// that is still engaged, every `every`: give it to the parents'
    /// controller ([`Controller::reconcile_on`](crate::Controller::reconcile_on))
    /// so that a cluster that was down, and answers again without leaving
    /// the fleet, is swept. The parent's reconcile should call
    /// [`sweep`](Self::sweep) on every run (its children of an earlier UID
    /// go, and the record of each cluster it reaches is cleared). A parent
    /// is asked for until a cleanup or sweep reaches the cluster, or the
    /// cluster's watch has synced and holds no child naming it; a cluster
    /// that leaves is forgotten here (when it is engaged again its children
    /// are listed anew, and each wakes its parent). The record is in memory:
    /// after a restart every cluster is engaged anew, which covers it.
    pub fn sweeps(
        &self,
        every: Duration,
    ) -> impl futures::Stream<Item = McRequest> + Send + 'static {
        let (fleet, pending) = (self.fleet.clone(), self.pending.clone());
        let ticks = futures::stream::unfold((), move |()| async move {
            tokio::time::sleep(every).await;
            Some(((), ()))
        });
        let store = self.store.clone();
        ticks.flat_map(move |()| {
            let synced: HashMap<ClusterName, WatchState> = store.clusters().into_iter().collect();
            let mut pending = lock(&pending);
            pending.retain(|cluster, _| fleet.get(cluster).is_some());
            let mut requests = Vec::new();
            for (cluster, parents) in pending.iter_mut() {
                // A cluster whose children are not known: ask for the
                // parents it gave no answer for; the others wait for it.
                if synced.get(cluster) != Some(&WatchState::Synced) {
                    let unanswered = parents.iter().filter(|(_, unanswered)| **unanswered);
                    requests.extend(unanswered.map(|(parent, _)| parent.clone()));
                    continue;
                }
                let keys: HashSet<String> = store
                    .in_cluster(cluster.as_str())
                    .unwrap_or_default()
                    .iter()
                    .filter_map(|child| Some(ParentRef::of_child(child.as_ref())?.ok()?.key()))
                    .collect();
                // A parent with no child left there is done with it.
                parents.retain(|parent, _| keys.iter().any(|key| key_names(key, parent)));
                requests.extend(parents.keys().cloned());
            }
            pending.retain(|_, parents| !parents.is_empty());
            futures::stream::iter(requests)
        })
    }

    /// How many parents wait for a sweep of a cluster they skipped, counted
    /// once per parent and cluster, whether the cluster gave no answer or
    /// its children were not known yet.
    ///
    /// An entry goes at once when a cleanup, [`sweep`](Self::sweep) or
    /// [`release`](Self::release) of that parent reaches the cluster;
    /// otherwise on a tick of [`sweeps`](Self::sweeps) that finds the
    /// cluster gone from the fleet, or synced with no child naming the
    /// parent. So a cluster that answers again stays counted for up to one
    /// `sweeps` period.
    pub fn pending(&self) -> usize {
        let pending = lock(&self.pending);
        pending.values().map(HashMap::len).sum()
    }

    /// What deletes this parent's children, with this store and fleet.
    fn cleanup(&self) -> Cleanup<'_, C> {
        Cleanup {
            fleet: &self.fleet,
            store: &self.store,
            concurrency: self.concurrency,
            pending: &self.pending,
        }
    }

    /// The state of each cluster's watch of the children.
    fn states(&self) -> HashMap<ClusterName, WatchState> {
        self.store.clusters().into_iter().collect()
    }
}
