//! Clusters joining and leaving a running controller, and the sync gate:
//! a cluster's keys wait until every watch of the controller there has
//! synced.

use std::sync::Arc;

use futures::{
    StreamExt,
    future::join_all,
    stream::{self},
};

use super::Runner;
use crate::{
    cache::{WatchState, Watchable},
    cluster::Cluster,
    cluster_name::ClusterName,
    controller::{
        ClusterSelector,
        trigger::{Dest, Trigger},
    },
    queue::Lane,
    reason::ReconcileReason,
};

/// What a served cluster's stream tells the runner.
pub(super) enum ClusterItem {
    /// Every watch of the controller there has synced: its keys may run.
    Synced,
    /// The sync timeout passed again without that.
    StillSyncing,
    /// The cluster answers again after it gave no answer.
    Answering,
    Request(Dest, Lane, ReconcileReason),
}

/// The clusters where the controller runs any watch: its own selection,
/// and those of its related watches that have their own.
pub(super) fn watched_anywhere(
    controller: &ClusterSelector,
    related: &[Arc<dyn Trigger>],
) -> ClusterSelector {
    let own: Vec<ClusterSelector> = related
        .iter()
        .filter_map(|trigger| trigger.clusters().cloned())
        .collect();
    if own.is_empty() {
        return controller.clone();
    }
    let controller = controller.clone();
    ClusterSelector::matching(move |name| {
        controller.selects(name) || own.iter().any(|clusters| clusters.selects(name))
    })
}

impl<K: Watchable> Runner<K> {
    /// Starts serving `cluster` if the controller selects it: subscribes to
    /// its triggers' watches there and holds its keys until they sync.
    pub(super) fn engage(&mut self, cluster: Cluster) {
        let name = cluster.name().clone();
        // A cluster that left already: the event that ended it follows.
        if !cluster.is_engaged()
            || self
                .engaged
                .get(&name)
                .is_some_and(|known| known.same_engagement(&cluster))
        {
            return;
        }
        self.unknown.remove(&name);
        self.misaddressed.retain(|(cluster, _)| *cluster != name);
        if self.engaged.insert(name.clone(), cluster.clone()).is_some() {
            // Replaced under the same name: runs against the old one stop.
            self.cancel_running(&name);
        }
        // A wait for the old one's watches ends for nothing.
        if self.catch_up.forget(&name) {
            self.queue.resume(&name);
        }
        self.controlled.remove(&name);
        // The controlled type is watched where the controller works; each
        // other type where its own selection, or else the controller's, says.
        let controlled = self.selection.selects(&name);
        let mut started = Vec::new();
        if controlled {
            let (watch, own) = self.own.start_typed(&cluster);
            self.controlled.insert(name.clone(), watch);
            started.push(own);
        }
        started.extend(
            self.related
                .iter()
                .filter(|trigger| trigger.runs_in(&name, &self.selection))
                .map(|trigger| trigger.start(&cluster)),
        );
        if started.is_empty() {
            // Held only if a run was interrupted before this event came.
            self.queue.unserve(&name);
            return;
        }
        let watches: Vec<_> = started.iter().map(|s| s.watch.clone()).collect();
        let recoveries = cluster.reachability().recoveries();
        self.status.start(cluster, watches.clone());
        if controlled {
            self.queue.hold(&name);
        } else {
            // Only related watches run here, and no key can be queued for
            // it: it takes no part in the queue's fair share.
            self.queue.unserve(&name);
        }
        if controlled {
            // Held with the cluster's other keys until its watches sync.
            self.joined(&name);
        }
        let synced = Box::pin(join_all(watches.iter().map(|w| w.synced())));
        let timeout = self.sync_timeout;
        let gate = stream::unfold(Some(synced), move |synced| async move {
            let mut synced = synced?;
            tokio::select! {
                _ = &mut synced => Some((ClusterItem::Synced, None)),
                () = tokio::time::sleep(timeout) => Some((ClusterItem::StillSyncing, Some(synced))),
            }
        });
        // Subscribed only once the cluster is served: nothing piles up unread
        // while one of the watches cannot sync.
        let subscribes: Vec<_> = started.into_iter().map(|s| s.subscribe).collect();
        let writer = self.writer().map(|writer| writer.name.clone());
        let requests = stream::once(async move {
            stream::select_all(
                subscribes
                    .into_iter()
                    .map(|subscribe| subscribe(writer.clone())),
            )
        })
        .flatten()
        .map(|(request, lane, reason)| ClusterItem::Request(request, lane, reason));
        // Its keys that failed for want of an answer run as soon as it
        // answers again, rather than after their backoff.
        let answering = stream::unfold(recoveries, |mut recoveries| async move {
            recoveries.changed().await.ok()?;
            Some((ClusterItem::Answering, recoveries))
        });
        // Replaces the stream of an earlier engagement of the same name.
        self.incoming.insert(
            name,
            stream::select(gate.chain(requests), answering).boxed(),
        );
    }

    /// Queues, in `joined`, what every object that watches mapping across
    /// clusters hold now asks for there.
    fn joined(&mut self, joined: &ClusterName) {
        let mut requests = Vec::new();
        for source in self.engaged.values() {
            let name = source.name();
            if self.selection.selects(name) {
                requests.extend(self.own.joined(joined, source));
            }
            for trigger in &self.related {
                if trigger.runs_in(name, &self.selection) {
                    requests.extend(trigger.joined(joined, source));
                }
            }
        }
        for request in requests {
            self.accept(request, Lane::Listed, ReconcileReason::Listed);
        }
    }

    pub(super) fn disengage(&mut self, name: &ClusterName) {
        // The fleet ends an engagement before it says so. One that is still
        // live was learned from the fleet ahead of its own event: this event
        // ended an older one.
        if self.engaged.get(name).is_some_and(Cluster::is_engaged) {
            return;
        }
        self.engaged.remove(name);
        self.controlled.remove(name);
        if self.incoming.remove(name).is_some() {
            self.status.remove(name);
        }
        self.queue.purge(name);
        self.catch_up.forget(name);
        self.cancel_running(name);
    }

    pub(super) fn cancel_running(&self, cluster: &ClusterName) {
        for (key, abort) in &self.aborts {
            if key.cluster == *cluster {
                abort.abort();
            }
        }
    }

    pub(super) fn cluster_item(&mut self, name: ClusterName, item: ClusterItem) {
        match item {
            ClusterItem::Synced => {
                tracing::info!(controller = %self.name, cluster = %name, "watches synced; serving the cluster");
                self.queue.release(&name);
                self.status.serve(&name);
            }
            ClusterItem::Answering => {
                let woken = self.queue.answering(&name);
                if woken > 0 {
                    tracing::info!(controller = %self.name, cluster = %name, keys = woken, "the cluster answers again: its keys that failed for want of an answer run now");
                }
            }
            ClusterItem::StillSyncing => {
                if let Some(status) = self.status.cluster(name.as_str()) {
                    let failing = status
                        .watches
                        .iter()
                        .any(|w| matches!(w.state, WatchState::Failing { .. }));
                    if failing {
                        tracing::warn!(controller = %self.name, %status, "watches have not synced; the cluster's keys wait");
                    } else {
                        // Late for want of a permit to list: the fleet's
                        // lists in flight tell it, not one line per cluster.
                        tracing::debug!(controller = %self.name, %status, "watches wait to list; the cluster's keys wait");
                    }
                }
            }
            ClusterItem::Request(Dest::One(request), lane, reason) => {
                self.accept(request, lane, reason);
            }
            ClusterItem::Request(Dest::Across(to, key), lane, reason) => {
                self.accept_across(&to, &key, lane, &reason);
            }
        }
    }
}
