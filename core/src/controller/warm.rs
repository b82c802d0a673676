//! Keeping a controller's watches synced where it does not run yet: a
//! standby replica's, so that it reconciles at once when it takes over.

use std::{
    collections::HashMap,
    fmt,
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use futures::{FutureExt, future::BoxFuture};

use super::{selector::ClusterSelector, trigger::Trigger, watch::Resolved};
use crate::{
    cache::{WatchProbe, Watchable},
    cluster::Cluster,
    cluster_name::ClusterName,
    fleet::{Fleet, FleetEvent},
};

/// The watches of a controller, kept running and synced in every engaged
/// cluster it would serve, without reconciling anything: see
/// [`Controller::warm_up`](crate::Controller::warm_up).
///
/// A future that runs until dropped. While it runs, each cluster the fleet
/// engages gets the controller's watches (its own type's where the
/// controller works, each related type's where that watch runs), and a
/// cluster that leaves loses them. These are the cache's shared watches:
/// when the controller itself starts, it finds them synced and serves each
/// cluster at once, its first reconciles reading from caches already full,
/// rather than after a list of every type in every cluster. They cost what
/// the controller's own watches cost (a connection's share, each object's
/// memory); the controller running beside them costs nothing more.
#[must_use = "a warm-up keeps watches only while it runs"]
pub struct WarmUp {
    run: BoxFuture<'static, ()>,
}

impl fmt::Debug for WarmUp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WarmUp").finish_non_exhaustive()
    }
}

impl Future for WarmUp {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.run.poll_unpin(cx)
    }
}

/// Starts a controller's watch in a cluster, handing back its handle.
type Start = Arc<dyn Fn(&Cluster) -> Arc<dyn WatchProbe> + Send + Sync>;

impl WarmUp {
    pub(super) fn new<K: Watchable>(
        fleet: Fleet,
        selection: ClusterSelector,
        own: Option<Resolved<K>>,
        related: Vec<Arc<dyn Trigger>>,
    ) -> Self {
        let own: Option<Start> = own.map(|own| {
            Arc::new(move |cluster: &Cluster| -> Arc<dyn WatchProbe> { own.watch_in(cluster) })
                as Start
        });
        Self {
            run: warm(fleet, selection, own, related).boxed(),
        }
    }
}

async fn warm(
    fleet: Fleet,
    selection: ClusterSelector,
    own: Option<Start>,
    related: Vec<Arc<dyn Trigger>>,
) {
    let subscription = fleet.subscribe();
    let mut events = subscription.events;
    let mut held: HashMap<ClusterName, Vec<Arc<dyn WatchProbe>>> = HashMap::new();
    let start = |cluster: &Cluster| -> Vec<Arc<dyn WatchProbe>> {
        // An engagement that ended already: its successor's event follows.
        if !cluster.is_engaged() {
            return Vec::new();
        }
        let name = cluster.name();
        let mut watches = Vec::new();
        if let Some(own) = &own
            && selection.selects(name)
        {
            watches.push(own(cluster));
        }
        watches.extend(
            related
                .iter()
                .filter(|trigger| trigger.runs_in(name, &selection))
                .map(|trigger| trigger.start(cluster).watch),
        );
        watches
    };
    let keep = |held: &mut HashMap<_, _>, cluster: &Cluster| {
        // The watches of a replaced engagement go with it.
        let watches = start(cluster);
        if watches.is_empty() {
            held.remove(cluster.name());
        } else {
            held.insert(cluster.name().clone(), watches);
        }
    };
    for cluster in subscription.clusters {
        keep(&mut held, &cluster);
    }
    while let Some(event) = events.recv().await {
        match event {
            FleetEvent::Engaged(cluster) => keep(&mut held, &cluster),
            FleetEvent::Disengaged(name) => {
                held.remove(&name);
            }
        }
    }
}
