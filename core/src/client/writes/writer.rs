//! A controller that reads its own writes, as its reconciles see it.

use std::{
    collections::{HashMap, HashSet},
    sync::{
        Arc, Mutex, MutexGuard,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use tokio::time::Instant;

use crate::cluster_name::ClusterName;

/// How long after a wait for a cluster's watches ran out the controller
/// does not wait for them again: a watch that lags or fails there would
/// otherwise hold every reconcile it writes for the whole wait.
pub(crate) const COOLING: Duration = Duration::from_secs(30);

/// A controller that reads its own writes, as its reconciles write: its
/// name, and the clusters its reconciles of keys in one cluster wrote to
/// in others (a hub's keys writing to members), whose watches the next
/// reconcile in the first must wait for too.
#[derive(Debug)]
pub(crate) struct Writer {
    pub(crate) name: Arc<str>,
    away: Mutex<HashMap<ClusterName, HashSet<ClusterName>>>,
    /// How many origins `away` has: none, and a dispatch takes no lock.
    origins: AtomicUsize,
    /// Where a wait for the watches ran out lately, and when.
    timed_out: Mutex<HashMap<ClusterName, Instant>>,
    /// The resources (group, plural) of each cluster whose writes no watch
    /// there could show, told once.
    uncovered: Mutex<HashSet<(ClusterName, String, String)>>,
}

impl Writer {
    pub(crate) fn new(name: Arc<str>) -> Self {
        Self {
            name,
            away: Mutex::default(),
            origins: AtomicUsize::new(0),
            timed_out: Mutex::default(),
            uncovered: Mutex::default(),
        }
    }

    fn away(&self) -> MutexGuard<'_, HashMap<ClusterName, HashSet<ClusterName>>> {
        self.away.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A reconcile of a key in `origin` wrote to `target`.
    pub(crate) fn wrote_away(&self, origin: &ClusterName, target: &ClusterName) {
        let mut away = self.away();
        if !away
            .get(origin)
            .is_some_and(|targets| targets.contains(target))
        {
            away.entry(origin.clone())
                .or_default()
                .insert(target.clone());
            self.origins.store(away.len(), Ordering::Release);
        }
    }

    /// The other clusters reconciles of keys in `origin` wrote to.
    pub(crate) fn away_from(&self, origin: &ClusterName) -> Vec<ClusterName> {
        if self.origins.load(Ordering::Acquire) == 0 {
            return Vec::new();
        }
        self.away()
            .get(origin)
            .map(|targets| targets.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// `target` shows what reconciles in `origin` wrote there (or left).
    pub(crate) fn settled(&self, origin: &ClusterName, target: &ClusterName) {
        let mut away = self.away();
        if let Some(targets) = away.get_mut(origin) {
            targets.remove(target);
            if targets.is_empty() {
                away.remove(origin);
            }
        }
        self.origins.store(away.len(), Ordering::Release);
    }

    fn timed_out(&self) -> MutexGuard<'_, HashMap<ClusterName, Instant>> {
        self.timed_out.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A wait for `cluster`'s watches to show this controller's writes ran
    /// out: its writes there are not waited for again for a while.
    pub(crate) fn gave_up_on(&self, cluster: &ClusterName) {
        let mut timed_out = self.timed_out();
        let now = Instant::now();
        timed_out.retain(|_, at| now.saturating_duration_since(*at) < COOLING);
        timed_out.insert(cluster.clone(), now);
    }

    /// Whether a wait for `cluster`'s watches ran out lately.
    pub(crate) fn is_cooling(&self, cluster: &ClusterName) -> bool {
        self.timed_out()
            .get(cluster)
            .is_some_and(|at| at.elapsed() < COOLING)
    }

    /// A write of this controller to `cluster` was of `written`'s
    /// resource, which no watch there holds: logged at `INFO` the
    /// first time for each cluster and resource, as read-your-writes does
    /// not cover it.
    pub(crate) fn uncovered(&self, cluster: &ClusterName, written: &super::Written) {
        let id = &written.id;
        let key = (cluster.clone(), id.group.clone(), id.resource.clone());
        let first = self
            .uncovered
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key);
        if first {
            let resource = if id.group.is_empty() {
                id.resource.clone()
            } else {
                format!("{}.{}", id.resource, id.group)
            };
            tracing::info!(
                controller = %self.name,
                %cluster,
                resource,
                "read-your-writes cannot cover this controller's writes of {resource} in this \
                 cluster: no watch there holds them, so its next reconcile may not see \
                 them in a cache. Watch the type there to cover them (`Controller::owns`, \
                 `watches` or `owns_across`), or read such objects through the API. \
                 Told once per controller, cluster and resource."
            );
        }
    }

    /// Forgets `cluster`, which left: as an origin and as a target.
    pub(crate) fn forget(&self, cluster: &ClusterName) {
        self.timed_out().remove(cluster);
        self.uncovered
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|(told, _, _)| told != cluster);
        let mut away = self.away();
        away.remove(cluster);
        away.retain(|_, targets| {
            targets.remove(cluster);
            !targets.is_empty()
        });
        self.origins.store(away.len(), Ordering::Release);
    }
}
