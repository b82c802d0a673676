//! The per-cluster Leases a replica holds as fences: taken, renewed while
//! held, given up to another replica, and released when the replica leaves.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    time::Duration,
};

use futures::{FutureExt, StreamExt, future::join_all, stream::FuturesUnordered};
use kube_fleet::ClusterName;
use tokio::time::Instant;

use crate::{
    gate::Validity,
    lease::{Holder, LeaseLock},
    shard::{ShardStatus, short_hash},
    timing::Timings,
};

use super::{CLUSTER_ANNOTATION, Fence, Owned, Sharder, engage, labels};

impl Sharder {
    /// Tries to take the Lease of each wanted cluster, all at once, and
    /// engages those it takes.
    pub(super) async fn take(&mut self, wanted: Vec<ClusterName>, timeout: Duration) {
        let now = Instant::now();
        // A cluster given up is taken again only once its Lease was
        // released or deleted: before, this replica's own holder is on it.
        self.ending.retain(|_, end| !end.is_finished());
        let wanted: Vec<ClusterName> = wanted
            .into_iter()
            .filter(|cluster| !self.ending.contains_key(cluster))
            .collect();
        for cluster in &wanted {
            self.fence(cluster);
        }
        let wanted: HashSet<ClusterName> = wanted.into_iter().collect();
        let attempts = self
            .fences
            .iter_mut()
            .filter(|(cluster, lock)| wanted.contains(*cluster) && !lock.held_by_other(now))
            .map(|(cluster, lock)| async move {
                let start = Instant::now();
                let result = tokio::time::timeout(timeout, lock.try_acquire_or_renew()).await;
                (cluster.clone(), start, result)
            });
        let results = join_all(attempts).await;
        for (cluster, start, result) in results {
            match result {
                Ok(Ok(Holder::Me)) => {
                    let Some(event) = self.offered.get(&cluster).cloned() else {
                        continue;
                    };
                    let until = start + self.timings.renew_deadline;
                    let validity = Validity::closed();
                    validity.open_until(until);
                    self.shards
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(cluster.clone(), validity.clone());
                    self.owned
                        .insert(cluster.clone(), Owned { validity, until });
                    self.status.took(&cluster, Instant::now(), until);
                    tracing::info!(%cluster, "running the cluster");
                    engage(&self.fleet, event);
                }
                Ok(Ok(Holder::Other(_))) => {}
                Ok(Err(error)) => tracing::warn!(%cluster, %error, "taking the cluster's Lease"),
                Err(_) => {
                    tracing::warn!(%cluster, ?timeout, "taking the cluster's Lease: no answer in time")
                }
            }
        }
    }

    /// Stops running `clusters`: no reconcile starts there and running ones
    /// stop, the fleet disengages them, and once their reconciles have
    /// ended their Leases are released or deleted, as `fence` says.
    pub(super) async fn give_up(&mut self, clusters: Vec<ClusterName>, fence: Fence) {
        let mut drained = Vec::new();
        for cluster in &clusters {
            let Some(owned) = self.owned.remove(cluster) else {
                continue;
            };
            let until = Instant::now().min(owned.until);
            owned.validity.close();
            self.shards
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(cluster);
            self.status.gave_up(cluster, until);
            self.fleet.disengage(cluster);
            drained.push((cluster.clone(), owned.validity));
        }
        if fence == Fence::Expire {
            return;
        }
        // Each cluster's drain and Lease write go on off the loop, so that
        // slow reconciles or a slow server cost that cluster alone.
        let deadline = self.timings.renew_deadline;
        let timeout = self.timings.request_timeout();
        for (cluster, validity) in drained {
            let Some(mut lock) = self.fences.remove(&cluster) else {
                continue;
            };
            let name = cluster.clone();
            let end = tokio::spawn(async move {
                if tokio::time::timeout(deadline, validity.drained())
                    .await
                    .is_err()
                {
                    // Another replica must not start while they might run:
                    // the Lease is left to expire.
                    tracing::warn!(%cluster, "reconciles still running after the renew deadline: the cluster's Lease is left to expire");
                    return;
                }
                let (what, end) = match fence {
                    Fence::Delete => ("deleting", lock.delete().boxed()),
                    _ => ("releasing", lock.release().boxed()),
                };
                match tokio::time::timeout(timeout, end).await {
                    Ok(Ok(())) => {}
                    Ok(Err(error)) => {
                        tracing::warn!(%cluster, %error, "{what} the cluster's Lease")
                    }
                    Err(_) => {
                        tracing::warn!(%cluster, "{what} the cluster's Lease: no answer in time")
                    }
                }
            });
            self.ending.insert(name, end);
        }
    }

    /// Gives every cluster up and deletes this replica's own Lease, so that
    /// the others take its clusters at once and no Lease is left behind.
    pub(super) async fn leave(&mut self) {
        let all: Vec<ClusterName> = self.owned.keys().cloned().collect();
        self.give_up(all, Fence::Release).await;
        // Every cluster's Lease released (each end is bounded by the renew
        // deadline and a request timeout) before the replica's own goes.
        for (_, end) in self.ending.drain() {
            let _ = end.await;
        }
        let timeout = self.timings.request_timeout();
        match tokio::time::timeout(timeout, self.me.delete()).await {
            Ok(Ok(())) => tracing::info!(holder = %self.holder, "left the shards"),
            Ok(Err(error)) => tracing::warn!(%error, "deleting this replica's Lease"),
            Err(_) => tracing::warn!("deleting this replica's Lease: no answer in time"),
        }
    }

    /// The lock on `cluster`'s Lease.
    pub(super) fn fence(&mut self, cluster: &ClusterName) -> &mut LeaseLock {
        self.fences.entry(cluster.clone()).or_insert_with(|| {
            LeaseLock::new(
                self.client.clone(),
                &self.namespace,
                &format!("{}-cluster-{}", self.set, short_hash(cluster.as_str())),
                &self.holder,
                self.timings.lease_duration,
            )
            .with_metadata(
                labels(&self.set, "cluster"),
                BTreeMap::from([(CLUSTER_ANNOTATION.to_owned(), cluster.to_string())]),
            )
        })
    }
}

/// Renews the Lease of every cluster in `owned`, each on its own: a
/// cluster's validity moves on as soon as its own renew answers, from when
/// that renew began, whatever the others' answers do. Returns the clusters
/// to give up: those another replica holds, and those whose renew answered
/// past their deadline.
pub(super) async fn renew_fences(
    fences: &mut HashMap<ClusterName, LeaseLock>,
    owned: &mut HashMap<ClusterName, Owned>,
    status: &ShardStatus,
    timings: Timings,
) -> Vec<(ClusterName, Fence)> {
    let timeout = timings.request_timeout();
    let mut renews: FuturesUnordered<_> = fences
        .iter_mut()
        .filter(|(cluster, _)| owned.contains_key(*cluster))
        .map(|(cluster, lock)| async move {
            let start = Instant::now();
            let result = tokio::time::timeout(timeout, lock.try_acquire_or_renew()).await;
            (cluster.clone(), start, result)
        })
        .collect();
    let mut ended = Vec::new();
    while let Some((cluster, start, result)) = renews.next().await {
        let Some(owned) = owned.get_mut(&cluster) else {
            continue;
        };
        let renewed = matches!(result, Ok(Ok(Holder::Me)));
        if Instant::now() >= owned.until {
            // Its reconciles stopped at the deadline: give it up, and
            // release it if this late renew went through.
            let fence = if renewed {
                Fence::Release
            } else {
                Fence::Expire
            };
            ended.push((cluster, fence));
        } else if renewed {
            owned.until = start + timings.renew_deadline;
            owned.validity.open_until(owned.until);
            status.renewed(&cluster, owned.until);
        } else if let Ok(Ok(Holder::Other(holder))) = result {
            tracing::error!(%cluster, %holder, "another replica holds this cluster's Lease");
            ended.push((cluster, Fence::Expire));
        } else {
            tracing::warn!(%cluster, result = ?result.map(|r| r.map(|_| ())), "renewing the cluster's Lease");
        }
    }
    ended
}
