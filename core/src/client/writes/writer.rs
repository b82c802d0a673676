//! A controller that reads its own writes, as its reconciles see it.

use std::{
    collections::{HashMap, HashSet},
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use tokio::time::Instant;

use crate::{cluster_name::ClusterName, panic::lock};

/// How long after a wait for a cluster's watches ran out the controller
/// does not wait for them again: a watch that lags or fails there would
/// otherwise hold every reconcile it writes for the whole wait.
pub(crate) const COOLING: Duration = Duration::from_secs(30);

/// A controller that reads its own writes, as its reconciles write: its
/// name, and which clusters' next reconciles may have writes to wait for.
///
/// The runner asks it about each key it is about to start, and only a
/// cluster marked [held](Self::holds) costs more than one load: a
/// cluster is marked when a reconcile's write through a client is
/// recorded (the reconciled key's cluster, and the cluster written to),
/// with the other clusters a reconcile there wrote to (a hub's keys
/// writing to members), whose watches its next reconcile waits for too;
/// the runner lets the mark go once nothing it marks is unshown.
#[derive(Debug)]
pub(crate) struct Writer {
    pub(crate) name: Arc<str>,
    held: Mutex<Held>,
    /// How many clusters are marked: none, and asking takes no lock.
    marked: AtomicUsize,
    /// Where a wait for the watches ran out lately, and when.
    timed_out: Mutex<HashMap<ClusterName, Instant>>,
    /// The resources (group, plural) of each cluster whose writes no watch
    /// there could show, told once.
    uncovered: Mutex<HashSet<(ClusterName, String, String)>>,
}

/// The clusters marked, each with the mark's number (a later write marks
/// it anew) and the other clusters its reconciles wrote to; only clusters
/// the controller [serves](Writer::serve) are marked.
#[derive(Debug, Default)]
struct Held {
    clusters: HashMap<ClusterName, (u64, HashSet<ClusterName>)>,
    served: HashSet<ClusterName>,
    next: u64,
}

impl Held {
    fn mark(&mut self, cluster: &ClusterName) -> Option<&mut HashSet<ClusterName>> {
        if !self.served.contains(cluster) {
            return None;
        }
        self.next += 1;
        let entry = self.clusters.entry(cluster.clone()).or_default();
        entry.0 = self.next;
        Some(&mut entry.1)
    }
}

impl Writer {
    pub(crate) fn new(name: Arc<str>) -> Self {
        Self {
            name,
            held: Mutex::default(),
            marked: AtomicUsize::new(0),
            timed_out: Mutex::default(),
            uncovered: Mutex::default(),
        }
    }

    fn recount(&self, held: &Held) {
        self.marked.store(held.clusters.len(), Ordering::Release);
    }

    /// The controller queues keys in `cluster` from now on: writes marked
    /// from now on mark it; if `unshown` then finds writes of this
    /// controller made before in its ledger, its first key looks for them
    /// (it is marked).
    pub(crate) fn serve(&self, cluster: &ClusterName, unshown: impl FnOnce() -> bool) {
        lock(&self.held).served.insert(cluster.clone());
        // Asked once served: a write recorded since is marked by `wrote`.
        if unshown() {
            let mut held = lock(&self.held);
            held.mark(cluster);
            self.recount(&held);
        }
    }

    /// A reconcile of a key in `origin` wrote to `target` (the same cluster,
    /// or another), and the write is recorded: both are marked, if served.
    pub(crate) fn wrote(&self, origin: &ClusterName, target: &ClusterName) {
        let mut held = lock(&self.held);
        held.mark(target);
        if let Some(away) = held.mark(origin)
            && target != origin
        {
            away.insert(target.clone());
        }
        self.recount(&held);
    }

    /// Whether `origin`'s next reconcile may have writes to wait for: the
    /// mark, and the other clusters its reconciles wrote to. `None` (one
    /// load) if no cluster is marked.
    pub(crate) fn holds(&self, origin: &ClusterName) -> Option<(u64, Vec<ClusterName>)> {
        if self.marked.load(Ordering::Acquire) == 0 {
            return None;
        }
        lock(&self.held)
            .clusters
            .get(origin)
            .map(|(mark, away)| (*mark, away.iter().cloned().collect()))
    }

    /// Nothing marked `origin` waits any longer: the mark goes, unless a
    /// write marked it again since it was read (`mark`).
    pub(crate) fn release(&self, origin: &ClusterName, mark: u64) {
        let mut held = lock(&self.held);
        if held.clusters.get(origin).is_some_and(|(m, _)| *m == mark) {
            held.clusters.remove(origin);
            self.recount(&held);
        }
    }

    /// `target` shows what reconciles in `origin` wrote there (or left),
    /// as read under `origin`'s `mark`: a write marking it since keeps it.
    pub(crate) fn settled(&self, origin: &ClusterName, target: &ClusterName, mark: u64) {
        if let Some((now, away)) = lock(&self.held).clusters.get_mut(origin)
            && *now == mark
        {
            away.remove(target);
        }
    }

    /// A wait for `cluster`'s watches to show this controller's writes ran
    /// out: its writes there are not waited for again for a while.
    pub(crate) fn gave_up_on(&self, cluster: &ClusterName) {
        let mut timed_out = lock(&self.timed_out);
        let now = Instant::now();
        timed_out.retain(|_, at| now.saturating_duration_since(*at) < COOLING);
        timed_out.insert(cluster.clone(), now);
    }

    /// Whether a wait for `cluster`'s watches ran out lately.
    pub(crate) fn is_cooling(&self, cluster: &ClusterName) -> bool {
        lock(&self.timed_out)
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
        let first = lock(&self.uncovered).insert(key);
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
        lock(&self.timed_out).remove(cluster);
        lock(&self.uncovered).retain(|(told, _, _)| told != cluster);
        let mut held = lock(&self.held);
        held.served.remove(cluster);
        held.clusters.remove(cluster);
        for (_, away) in held.clusters.values_mut() {
            away.remove(cluster);
        }
        self.recount(&held);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_served_cluster_is_held_from_a_write_until_released_with_its_latest_mark() {
        let writer = Writer::new("parents".into());
        let (hub, east) = (ClusterName::from("hub"), ClusterName::from("east"));
        writer.wrote(&hub, &east);
        assert!(
            writer.holds(&hub).is_none(),
            "a cluster not served is not marked"
        );
        writer.serve(&hub, || true);
        let (served, _) = writer.holds(&hub).expect("marked: writes made before");
        writer.release(&hub, served);
        writer.serve(&east, || false);
        assert!(
            writer.holds(&hub).is_none(),
            "nothing written, nothing held"
        );
        writer.wrote(&hub, &east);
        let (first, away) = writer.holds(&hub).unwrap();
        assert_eq!(away, [ClusterName::from("east")]);
        assert!(
            writer.holds(&east).is_some(),
            "the cluster written to is held too"
        );
        // A write marks it again after the runner read the mark: that
        // runner's settling and release leave the new mark in place.
        writer.wrote(&hub, &east);
        writer.settled(&hub, &east, first);
        writer.release(&hub, first);
        let (second, away) = writer.holds(&hub).expect("written again since");
        assert_eq!(
            away,
            [ClusterName::from("east")],
            "settled under an old mark: kept"
        );
        writer.settled(&hub, &east, second);
        writer.release(&hub, second);
        assert!(writer.holds(&hub).is_none());
        writer.forget(&east);
        assert!(writer.holds(&east).is_none());
        writer.wrote(&hub, &east);
        assert!(writer.holds(&east).is_none(), "east left: not marked again");
        let (third, _) = writer.holds(&hub).unwrap();
        writer.release(&hub, third);
        assert_eq!(
            writer.marked.load(Ordering::Acquire),
            0,
            "asking takes no lock"
        );
    }
}
