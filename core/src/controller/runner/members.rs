//! The clusters a running controller knows: each engaged cluster, the
//! watches it runs there, and each served cluster's stream of what those
//! watches say (its sync first, then their requests). The sync gate is this
//! stream's first item: a cluster's keys wait until every watch of the
//! controller there has synced.

use std::{
    collections::HashMap,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use futures::{
    StreamExt,
    future::join_all,
    stream::{self, BoxStream},
};
use tokio::sync::mpsc;
use tokio_stream::StreamMap;

use crate::{
    cache::{SharedWatch, WatchProbe, Watchable},
    cluster::Cluster,
    cluster_name::ClusterName,
    controller::{
        ClusterSelector,
        trigger::{Dest, Trigger, WatchTrigger},
    },
    fleet::{Fleet, FleetEvent},
    queue::Lane,
    reason::ReconcileReason,
    request::McRequest,
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

/// A cluster the controller took in: what the runner does about it.
pub(super) struct Engaged {
    pub(super) name: ClusterName,
    /// It replaced an engagement of the same name, whose runs must stop.
    pub(super) replaced: bool,
    /// The watches started there, if any.
    pub(super) watches: Vec<Arc<dyn WatchProbe>>,
    /// The controlled type is watched there, so its keys may be queued.
    pub(super) controlled: bool,
}

/// Where the controller works, and what each cluster's watches say.
pub(super) struct Members<K: Watchable> {
    fleet: Fleet,
    /// The watch of the controlled type: the keys, and each reconcile's
    /// object.
    own: Arc<WatchTrigger<K>>,
    related: Vec<Arc<dyn Trigger>>,
    selection: ClusterSelector,
    sync_timeout: Duration,
    fleet_events: mpsc::UnboundedReceiver<FleetEvent>,
    /// Clusters engaged before the controller started; engaged on first poll.
    initial: Vec<Cluster>,
    /// Every engaged cluster the controller knows of, served or not.
    engaged: HashMap<ClusterName, Cluster>,
    /// The watch of the controlled type in each served cluster.
    controlled: HashMap<ClusterName, Arc<SharedWatch<K>>>,
    /// One stream per served cluster: its sync, then its triggers' requests.
    incoming: StreamMap<ClusterName, BoxStream<'static, ClusterItem>>,
}

impl<K: Watchable> Members<K> {
    /// Subscribes to `fleet` now, so that no cluster engaged from here on is
    /// missed.
    pub(super) fn new(
        fleet: Fleet,
        own: Arc<WatchTrigger<K>>,
        related: Vec<Arc<dyn Trigger>>,
        selection: ClusterSelector,
        sync_timeout: Duration,
    ) -> Self {
        let subscription = fleet.subscribe();
        Self {
            fleet,
            own,
            related,
            selection,
            sync_timeout,
            fleet_events: subscription.events,
            initial: subscription.clusters,
            engaged: HashMap::new(),
            controlled: HashMap::new(),
            incoming: StreamMap::new(),
        }
    }

    /// The clusters where the controller runs any watch: its own selection,
    /// and those of its related watches that have their own.
    pub(super) fn watched_anywhere(&self) -> ClusterSelector {
        let own: Vec<ClusterSelector> = self
            .related
            .iter()
            .filter_map(|trigger| trigger.clusters().cloned())
            .collect();
        if own.is_empty() {
            return self.selection.clone();
        }
        let controller = self.selection.clone();
        ClusterSelector::matching(move |name| {
            controller.selects(name) || own.iter().any(|clusters| clusters.selects(name))
        })
    }

    /// The clusters engaged before the controller started, once.
    pub(super) fn take_initial(&mut self) -> Vec<Cluster> {
        std::mem::take(&mut self.initial)
    }

    pub(super) fn poll_fleet(&mut self, cx: &mut Context<'_>) -> Poll<Option<FleetEvent>> {
        self.fleet_events.poll_recv(cx)
    }

    /// The next item of any served cluster's stream.
    pub(super) fn poll_item(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<(ClusterName, ClusterItem)>> {
        self.incoming.poll_next_unpin(cx)
    }

    pub(super) fn engaged(&self) -> &HashMap<ClusterName, Cluster> {
        &self.engaged
    }

    /// The fleet's cluster of that name, if the controller has not taken it
    /// in yet.
    pub(super) fn unseen_in_fleet(&self, name: &ClusterName) -> Option<Option<Cluster>> {
        if self.engaged.contains_key(name) {
            return None;
        }
        Some(self.fleet.get(name))
    }

    /// Whether the controller watches its type in `name`.
    pub(super) fn selects(&self, name: &ClusterName) -> bool {
        self.selection.selects(name)
    }

    /// The watch of the controlled type in `name`, if it is served.
    pub(super) fn controlled(&self, name: &ClusterName) -> Option<&Arc<SharedWatch<K>>> {
        self.controlled.get(name)
    }

    /// The served clusters.
    pub(super) fn served(&self) -> impl Iterator<Item = &ClusterName> {
        self.incoming.keys()
    }

    /// The dynamic type of the controlled objects.
    pub(super) fn dyntype(&self) -> K::DynamicType {
        self.own.watch.dyntype().clone()
    }

    /// Takes `cluster` in, if it is a new engagement, and starts the
    /// controller's watches there, subscribing to them once they sync;
    /// `writer` is the name the controller's writes are recorded under, for
    /// the watches that tell their echoes. `None` if there is nothing to do.
    pub(super) fn engage(
        &mut self,
        cluster: &Cluster,
        writer: Option<Arc<str>>,
    ) -> Option<Engaged> {
        let name = cluster.name().clone();
        // A cluster that left already: the event that ended it follows.
        if !cluster.is_engaged()
            || self
                .engaged
                .get(&name)
                .is_some_and(|known| known.same_engagement(cluster))
        {
            return None;
        }
        let replaced = self.engaged.insert(name.clone(), cluster.clone()).is_some();
        self.controlled.remove(&name);
        // The controlled type is watched where the controller works; each
        // other type where its own selection, or else the controller's, says.
        let controlled = self.selection.selects(&name);
        let mut started = Vec::new();
        if controlled {
            let (watch, own) = self.own.start_typed(cluster);
            self.controlled.insert(name.clone(), watch);
            started.push(own);
        }
        started.extend(
            self.related
                .iter()
                .filter(|trigger| trigger.runs_in(&name, &self.selection))
                .map(|trigger| trigger.start(cluster)),
        );
        let (watches, subscribes): (Vec<_>, Vec<_>) =
            started.into_iter().map(|s| (s.watch, s.subscribe)).unzip();
        if !watches.is_empty() {
            let synced = Box::pin(join_all(watches.iter().map(|w| w.synced())));
            let timeout = self.sync_timeout;
            let gate = stream::unfold(Some(synced), move |synced| async move {
                let mut synced = synced?;
                tokio::select! {
                    _ = &mut synced => Some((ClusterItem::Synced, None)),
                    () = tokio::time::sleep(timeout) => Some((ClusterItem::StillSyncing, Some(synced))),
                }
            });
            // Subscribed only once the cluster is served: nothing piles up
            // unread while one of the watches cannot sync.
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
            let recoveries = cluster.reachability().recoveries();
            let answering = stream::unfold(recoveries, |mut recoveries| async move {
                recoveries.changed().await.ok()?;
                Some((ClusterItem::Answering, recoveries))
            });
            // Replaces the stream of an earlier engagement of the same name.
            self.incoming.insert(
                name.clone(),
                stream::select(gate.chain(requests), answering).boxed(),
            );
        }
        Some(Engaged {
            name,
            replaced,
            watches,
            controlled,
        })
    }

    /// What every object that watches mapping across clusters hold now asks
    /// for in `joined`, a cluster just taken in.
    pub(super) fn joined(&self, joined: &ClusterName) -> Vec<McRequest> {
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
        requests
    }

    /// Lets `name` go, unless the cluster the controller knows by that name
    /// is still engaged (this event ended an older one). `Some(served)` if
    /// it went, saying whether it had been served.
    pub(super) fn disengage(&mut self, name: &ClusterName) -> Option<bool> {
        // The fleet ends an engagement before it says so. One that is still
        // live was learned from the fleet ahead of its own event.
        if self.engaged.get(name).is_some_and(Cluster::is_engaged) {
            return None;
        }
        self.engaged.remove(name);
        self.controlled.remove(name);
        Some(self.incoming.remove(name).is_some())
    }

    /// The request for every object of the controlled type in every cluster
    /// the controller works in.
    pub(super) fn everything(&self) -> Vec<McRequest> {
        self.engaged
            .values()
            .filter(|cluster| self.selection.selects(cluster.name()))
            .flat_map(|cluster| self.own.known(cluster))
            .collect()
    }

    /// The engaged clusters that `to` selects and where the controller
    /// watches its type.
    pub(super) fn across(&self, to: &ClusterSelector) -> Vec<ClusterName> {
        self.engaged
            .keys()
            .filter(|name| to.selects(name) && self.selection.selects(name))
            .cloned()
            .collect()
    }

    /// `key` as it may be queued, or why it may not: it must name the
    /// object the way the controller's watch keys it.
    pub(super) fn address(
        &self,
        mut key: McRequest,
    ) -> Result<McRequest, (McRequest, &'static str)> {
        let watch = &self.own.watch;
        if !watch.namespaced {
            // Cluster-scoped objects are keyed without one.
            key.namespace = None;
            return Ok(key);
        }
        let problem = match (&key.namespace, &watch.namespace) {
            (None, _) => {
                "names no namespace, but the controlled objects live in namespaces (it would read as deleted)"
            }
            (Some(asked), Some(watched)) if asked != watched => {
                "names a namespace outside the one the controller watches (it would read as deleted)"
            }
            _ => return Ok(key),
        };
        Err((key, problem))
    }
}
