//! The per-shard Leases a replica holds as fences: taken, renewed while
//! held, given up to another replica, and released when the replica leaves.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    time::Duration,
};

use futures::{FutureExt, StreamExt, future::join_all, stream::FuturesUnordered};
use kube_multicluster::ClusterName;
use tokio::time::Instant;

use crate::{
    gate::{Validity, lock},
    lease::{Holder, LeaseLock},
    shard::ShardStatus,
    timing::Timings,
};

use super::{COUNT_ANNOTATION, Fence, Owned, SHARD_ANNOTATION, Sharder, labels};

impl Sharder {
    /// Tries to take the Lease of each wanted shard (with its offered
    /// clusters), all at once, and engages the clusters of those it takes.
    pub(super) async fn take(
        &mut self,
        mut wanted: HashMap<u32, HashSet<ClusterName>>,
        timeout: Duration,
    ) {
        let now = Instant::now();
        // A shard given up is taken again only once its Lease was released
        // or deleted: before, this replica's own holder is on it.
        self.ending.retain(|_, end| !end.is_finished());
        wanted.retain(|shard, _| !self.ending.contains_key(shard));
        for shard in wanted.keys() {
            self.fence(*shard);
        }
        let attempts = self
            .fences
            .iter_mut()
            .filter(|(shard, lock)| wanted.contains_key(*shard) && !lock.held_by_other(now))
            .map(|(shard, lock)| async move {
                let start = Instant::now();
                let result = tokio::time::timeout(timeout, lock.try_acquire_or_renew()).await;
                (*shard, start, result)
            });
        let results = join_all(attempts).await;
        let mut took = false;
        for (shard, start, result) in results {
            match result {
                Ok(Ok(Holder::Me)) => {
                    let clusters = wanted.remove(&shard).unwrap_or_default();
                    // No later than this replica's own deadline.
                    let until =
                        (start + self.timings.renew_deadline).min(self.me_until.unwrap_or(start));
                    let validity = Validity::closed();
                    validity.open_until(until);
                    let now = Instant::now();
                    for cluster in &clusters {
                        self.run_cluster(cluster, &validity, now, until);
                    }
                    if let Some(hubs) = &self.hubs
                        && !self.hubs_offered.is_empty()
                    {
                        lock(&hubs.shards).insert(shard, validity.clone());
                        took = true;
                    }
                    tracing::info!(shard, clusters = clusters.len(), "running the shard");
                    self.owned.insert(
                        shard,
                        Owned {
                            validity,
                            until,
                            renewed: start,
                            clusters,
                        },
                    );
                }
                Ok(Ok(Holder::Other(_))) => {}
                Ok(Err(error)) => tracing::warn!(shard, %error, "taking the shard's Lease"),
                Err(_) => {
                    tracing::warn!(
                        shard,
                        ?timeout,
                        "taking the shard's Lease: no answer in time"
                    )
                }
            }
        }
        if took {
            // The hub keys of the new shards run: every key again.
            self.taken.send_modify(|n| *n += 1);
        }
    }

    /// Stops running `shards`: no reconcile starts in their clusters and
    /// running ones stop, the fleet disengages the clusters, and once their
    /// reconciles have ended the shards' Leases are released or deleted, as
    /// `fence` says.
    pub(super) async fn give_up(&mut self, shards: Vec<u32>, fence: Fence) {
        let mut drained = Vec::new();
        for shard in shards {
            let Some(owned) = self.owned.remove(&shard) else {
                continue;
            };
            let until = Instant::now().min(owned.until);
            if let Some(hubs) = &self.hubs {
                lock(&hubs.shards).remove(&shard);
            }
            owned.validity.close();
            for cluster in &owned.clusters {
                self.stop_cluster(cluster, until);
            }
            drained.push((shard, owned.validity));
        }
        if fence == Fence::Expire {
            return;
        }
        // Each shard's drain and Lease write go on off the loop, so that
        // slow reconciles or a slow server cost that shard alone.
        let deadline = self.timings.renew_deadline;
        let timeout = self.timings.request_timeout();
        for (shard, validity) in drained {
            let Some(mut lock) = self.fences.remove(&shard) else {
                continue;
            };
            let end = tokio::spawn(async move {
                if tokio::time::timeout(deadline, validity.drained())
                    .await
                    .is_err()
                {
                    // Another replica must not start while they might run:
                    // the Lease is left to expire.
                    tracing::warn!(
                        shard,
                        "reconciles still running after the renew deadline: the shard's Lease is left to expire"
                    );
                    return;
                }
                let (what, end) = match fence {
                    Fence::Delete => ("deleting", lock.delete().boxed()),
                    _ => ("releasing", lock.release().boxed()),
                };
                match tokio::time::timeout(timeout, end).await {
                    Ok(Ok(())) => {}
                    Ok(Err(error)) => {
                        tracing::warn!(shard, %error, "{what} the shard's Lease")
                    }
                    Err(_) => {
                        tracing::warn!(shard, "{what} the shard's Lease: no answer in time")
                    }
                }
            });
            self.ending.insert(shard, end);
        }
    }

    /// Gives every shard up and deletes this replica's own Lease, so that
    /// the others take its shards at once and no Lease is left behind.
    pub(super) async fn leave(&mut self) {
        // A shard nothing offered falls in any more is deleted, the others
        // (a hub's keys fall in every shard) released.
        let still = self.offered_by_shard();
        let (offered, empty): (Vec<u32>, Vec<u32>) = self
            .owned
            .keys()
            .copied()
            .partition(|shard| still.contains_key(shard));
        self.give_up(offered, Fence::Release).await;
        self.give_up(empty, Fence::Delete).await;
        // Every shard's Lease released (each end is bounded by the renew
        // deadline and a request timeout) before the replica's own goes.
        for (_, end) in self.ending.drain() {
            let _ = end.await;
        }
        // The hubs' reconciles have stopped with their shards.
        for hub in std::mem::take(&mut self.hubs_offered) {
            self.fleet.disengage(&hub);
        }
        let timeout = self.timings.request_timeout();
        match tokio::time::timeout(timeout, self.me.delete()).await {
            Ok(Ok(())) => tracing::info!(holder = %self.holder, "left the shards"),
            Ok(Err(error)) => tracing::warn!(%error, "deleting this replica's Lease"),
            Err(_) => tracing::warn!("deleting this replica's Lease: no answer in time"),
        }
    }

    /// The lock on `shard`'s Lease.
    pub(super) fn fence(&mut self, shard: u32) -> &mut LeaseLock {
        self.fences.entry(shard).or_insert_with(|| {
            LeaseLock::new(
                self.client.clone(),
                &self.namespace,
                &format!("{}-shard-{shard}", self.set),
                &self.holder,
                self.timings.lease_duration,
            )
            .with_metadata(
                labels(&self.set, "shard"),
                BTreeMap::from([
                    (SHARD_ANNOTATION.to_owned(), shard.to_string()),
                    (
                        COUNT_ANNOTATION.to_owned(),
                        super::counted(self.count, self.hubs.is_some()),
                    ),
                ]),
            )
        })
    }
}

/// Renews the Lease of every shard in `owned`, each on its own. A round a
/// provider's event brought forward (`early`) skips a shard renewed in the
/// last three quarters of a retry period that the next timed round can
/// still renew, with a request's timeout to spare, before its deadline.
/// Each renew is on its own: a shard's
/// validity moves on as soon as its own renew answers, from when that
/// renew began, whatever the others' answers do. Returns the shards to give
/// up: those another replica holds, and those whose renew answered past
/// their deadline.
pub(super) async fn renew_fences(
    fences: &mut HashMap<u32, LeaseLock>,
    owned: &mut HashMap<u32, Owned>,
    status: &ShardStatus,
    timings: Timings,
    early: bool,
) -> Vec<(u32, Fence)> {
    let timeout = timings.request_timeout();
    let now = Instant::now();
    let fresh = timings.retry_period.mul_f64(0.75);
    let skip = |owned: &Owned| {
        early
            && now.saturating_duration_since(owned.renewed) < fresh
            && now + timings.retry_period + timeout < owned.until
    };
    let mut renews: FuturesUnordered<_> = fences
        .iter_mut()
        .filter(|(shard, _)| owned.get(*shard).is_some_and(|owned| !skip(owned)))
        .map(|(shard, lock)| async move {
            let start = Instant::now();
            let result = tokio::time::timeout(timeout, lock.try_acquire_or_renew()).await;
            (*shard, start, result)
        })
        .collect();
    let mut ended = Vec::new();
    while let Some((shard, start, result)) = renews.next().await {
        let Some(owned) = owned.get_mut(&shard) else {
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
            ended.push((shard, fence));
        } else if renewed {
            owned.renewed = start;
            owned.until = start + timings.renew_deadline;
            owned.validity.open_until(owned.until);
            status.renewed_all(&owned.clusters, owned.until);
        } else if let Ok(Ok(Holder::Other(holder))) = result {
            tracing::error!(shard, %holder, "another replica holds this shard's Lease");
            ended.push((shard, Fence::Expire));
        } else {
            tracing::warn!(shard, result = ?result.map(|r| r.map(|_| ())), "renewing the shard's Lease");
        }
    }
    ended
}
