//! What a controller knows of each cluster it serves: its watches there and
//! whether they have synced.

use std::{
    collections::HashMap,
    fmt,
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio::{sync::watch, time::Instant};

use super::{ClusterSelector, DEFAULT_SYNC_TIMEOUT};
use crate::{
    cache::{WatchProbe, WatchState, WatchStatus},
    cluster::Cluster,
    cluster_name::ClusterName,
    fleet::Fleet,
    panic::lock,
};

/// A controller's view of one cluster: whether it serves the cluster yet,
/// and each of its watches there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterStatus {
    /// The cluster.
    pub cluster: ClusterName,
    /// Whether every watch of the controller here has synced, so that its
    /// keys run. Once true it stays true for this engagement of the
    /// cluster, even if a watch fails later (the cache then lags until the
    /// watch recovers).
    pub serving: bool,
    /// The controller's watches in this cluster.
    pub watches: Vec<WatchStatus>,
}

impl ClusterStatus {
    /// The watches that are failing now.
    pub fn failing(&self) -> impl Iterator<Item = &WatchStatus> {
        self.watches
            .iter()
            .filter(|w| matches!(w.state, WatchState::Failing { .. }))
    }
}

impl fmt::Display for ClusterStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let serving = if self.serving { "serving" } else { "waiting" };
        write!(f, "cluster {:?} {serving}", self.cluster.as_str())?;
        for (i, watch) in self.watches.iter().enumerate() {
            f.write_str(if i == 0 { ": " } else { "; " })?;
            write!(f, "{watch}")?;
        }
        Ok(())
    }
}

/// A live view of a [`Controller`](super::Controller)'s clusters, from
/// [`Controller::status`](super::Controller::status): which it serves, and
/// for each the state of every watch it needs there (syncing, synced, or
/// failing and why). Cheap to clone; for logs, health checks and tests.
///
/// ```no_run
/// # async fn example(fleet: kube_multicluster::Fleet) {
/// use std::time::Duration;
/// use k8s_openapi::api::core::v1::ConfigMap;
/// use kube::runtime::watcher;
/// use kube_multicluster::{Action, Controller, ObjectRequest};
/// use tower::{BoxError, service_fn};
///
/// let controller = Controller::<ConfigMap>::new(&fleet, watcher::Config::default());
/// let status = controller.status();
/// tokio::spawn(controller.run(service_fn(|_: ObjectRequest<ConfigMap>| async {
///     Ok::<_, BoxError>(Action::await_change())
/// })));
/// if tokio::time::timeout(Duration::from_secs(60), status.synced()).await.is_err() {
///     for cluster in status.clusters().iter().filter(|c| !c.serving) {
///         eprintln!("{cluster}"); // cluster "east" waiting: v1 ConfigMap: failing: ...
///     }
/// }
/// # }
/// ```
#[derive(Clone)]
pub struct ControllerStatus {
    inner: Arc<Shared>,
}

struct Shared {
    fleet: Fleet,
    table: Mutex<Table>,
    changed: watch::Sender<u64>,
}

struct Table {
    selection: ClusterSelector,
    sync_timeout: Duration,
    clusters: HashMap<ClusterName, Served>,
}

struct Served {
    cluster: Cluster,
    since: Instant,
    serving: bool,
    watches: Vec<Arc<dyn WatchProbe>>,
}

impl fmt::Debug for ControllerStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.clusters()).finish()
    }
}

impl ControllerStatus {
    pub(crate) fn new(fleet: Fleet) -> Self {
        Self {
            inner: Arc::new(Shared {
                fleet,
                table: Mutex::new(Table {
                    selection: ClusterSelector::All,
                    sync_timeout: DEFAULT_SYNC_TIMEOUT,
                    clusters: HashMap::new(),
                }),
                changed: watch::Sender::new(0),
            }),
        }
    }

    fn changed(&self) {
        self.inner.changed.send_modify(|n| *n += 1);
    }

    /// Every cluster the controller has started on, by name.
    pub fn clusters(&self) -> Vec<ClusterStatus> {
        let table = lock(&self.inner.table);
        let mut clusters: Vec<_> = table
            .clusters
            .iter()
            .map(|(name, served)| status(name, served, table.sync_timeout))
            .collect();
        clusters.sort_by(|a, b| a.cluster.cmp(&b.cluster));
        clusters
    }

    /// The controller's view of the cluster `name`, if it has started there.
    pub fn cluster(&self, name: &str) -> Option<ClusterStatus> {
        let table = lock(&self.inner.table);
        let (name, served) = table.clusters.get_key_value(name)?;
        Some(status(name, served, table.sync_timeout))
    }

    /// The engaged clusters the controller selects but has not started on
    /// yet (it starts on each as the fleet tells it of the cluster, or as
    /// soon as it runs), by name.
    ///
    /// ```
    /// # use k8s_openapi::api::core::v1::ConfigMap;
    /// # use kube::runtime::watcher;
    /// # use kube_multicluster::{Controller, Fleet};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let fleet = Fleet::new();
    /// # let (idle, _) = tower_test::mock::pair::<http::Request<kube::client::Body>, http::Response<kube::client::Body>>();
    /// # let client = kube::Client::new(idle, "default");
    /// fleet.engage("east", client);
    /// let controller = Controller::<ConfigMap>::new(&fleet, watcher::Config::default());
    /// // Not running yet: it has started nowhere.
    /// assert_eq!(controller.status().not_started(), ["east"]);
    /// # }
    /// ```
    pub fn not_started(&self) -> Vec<ClusterName> {
        let engaged = self.inner.fleet.clusters();
        let table = lock(&self.inner.table);
        let mut waiting: Vec<ClusterName> = engaged
            .iter()
            .filter(|cluster| table.selection.selects(cluster.name()))
            .filter(|cluster| {
                !table
                    .clusters
                    .get(cluster.name())
                    .is_some_and(|served| served.cluster.same_engagement(cluster))
            })
            .map(|cluster| cluster.name().clone())
            .collect();
        waiting.sort();
        waiting
    }

    /// Whether the controller serves every engaged cluster it selects.
    pub fn is_synced(&self) -> bool {
        let engaged = self.inner.fleet.clusters();
        let table = lock(&self.inner.table);
        engaged
            .iter()
            .filter(|cluster| table.selection.selects(cluster.name()))
            .all(|cluster| {
                table
                    .clusters
                    .get(cluster.name())
                    .is_some_and(|served| served.serving && served.cluster.same_engagement(cluster))
            })
    }

    /// Completes once the controller serves every engaged cluster it
    /// selects (at once if it does). A cluster whose watches cannot sync
    /// keeps this waiting: bound it with a timeout and look at
    /// [`clusters`](Self::clusters) to see why.
    pub async fn synced(&self) {
        let mut changed = self.inner.changed.subscribe();
        while !self.is_synced() {
            if changed.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    pub(crate) fn configure(&self, selection: ClusterSelector, sync_timeout: Duration) {
        let mut table = lock(&self.inner.table);
        table.selection = selection;
        table.sync_timeout = sync_timeout;
    }

    /// The controller started its watches in `cluster`.
    pub(crate) fn start(&self, cluster: Cluster, watches: Vec<Arc<dyn WatchProbe>>) {
        let served = Served {
            cluster: cluster.clone(),
            since: Instant::now(),
            serving: false,
            watches,
        };
        lock(&self.inner.table)
            .clusters
            .insert(cluster.name().clone(), served);
        self.changed();
    }

    /// The controller's watches in `name` have synced.
    pub(crate) fn serve(&self, name: &ClusterName) {
        if let Some(served) = lock(&self.inner.table).clusters.get_mut(name) {
            served.serving = true;
        }
        self.changed();
    }

    /// The controller no longer works in `name`.
    pub(crate) fn remove(&self, name: &ClusterName) {
        lock(&self.inner.table).clusters.remove(name);
        self.changed();
    }
}

fn status(name: &ClusterName, served: &Served, sync_timeout: Duration) -> ClusterStatus {
    let overdue = !served.serving && served.since.elapsed() >= sync_timeout;
    let watches = served
        .watches
        .iter()
        .map(|watch| {
            let mut status = watch.status();
            // A watch waiting for the fleet's permit to list is late for
            // want of a turn, not failing.
            if overdue
                && status.state == WatchState::Syncing
                && !watch.has_synced()
                && !watch.is_queued()
            {
                status.state = WatchState::Failing {
                    reason: format!("not synced within {sync_timeout:?}"),
                };
            }
            status
        })
        .collect();
    ClusterStatus {
        cluster: name.clone(),
        serving: served.serving,
        watches,
    }
}
