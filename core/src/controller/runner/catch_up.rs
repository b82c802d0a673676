//! Reading the controller's own writes: a cluster whose watches have not
//! shown what the controller wrote there starts no reconcile until they
//! do, or until the wait runs out and the objects of the controller's own
//! type still not shown are read through the API.

use std::{
    collections::HashMap,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use futures::{StreamExt, future::BoxFuture, stream::FuturesUnordered};
use kube::Resource;
use tokio::time::Instant;

use crate::{
    cache::{Watchable, scoped},
    client::{Writer, Written},
    cluster::Cluster,
    cluster_name::ClusterName,
    request::McRequest,
};

/// A cluster's wait for watches, ended: which pause it ends, and the
/// objects read through the API because it ran out.
pub(super) struct Caught<K> {
    cluster: ClusterName,
    pause: u64,
    read: Vec<(McRequest, Read<K>)>,
}

/// An object of the controlled type read through the API after a wait for
/// its write to show ran out, for its key's next reconcile.
pub(super) struct Read<K> {
    /// As the API had it (`None`: not found).
    object: Option<Arc<K>>,
    /// The write the cache did not show.
    written: Arc<Written>,
    /// Set when a watch shows the object deleted since.
    deleted: Arc<AtomicBool>,
    at: Instant,
}

/// What the runner keeps to read its own writes.
pub(super) struct CatchUp<K: Watchable> {
    /// How long a cluster waits at most; `None`: the controller does not
    /// read its writes.
    bound: Option<Duration>,
    /// What its reconciles record their writes under.
    writer: Option<Arc<Writer>>,
    waits: FuturesUnordered<BoxFuture<'static, Caught<K>>>,
    /// The pause each waiting cluster is in.
    paused: HashMap<ClusterName, u64>,
    next_pause: u64,
    read: HashMap<McRequest, Read<K>>,
}

impl<K: Watchable> CatchUp<K> {
    pub(super) fn new(name: &Arc<str>, bound: Option<Duration>) -> Self {
        Self {
            bound,
            writer: bound.map(|_| Arc::new(Writer::new(name.clone()))),
            waits: FuturesUnordered::new(),
            paused: HashMap::new(),
            next_pause: 0,
            read: HashMap::new(),
        }
    }

    /// Forgets a cluster that left or was replaced: its wait ends for
    /// nothing, and what was read there goes. Whether it was paused.
    pub(super) fn forget(&mut self, name: &ClusterName) -> bool {
        self.read.retain(|key, _| key.cluster != *name);
        if let Some(writer) = &self.writer {
            writer.forget(name);
        }
        self.paused.remove(name).is_some()
    }

    /// The controller queues keys in `cluster` from now on: its first key
    /// looks for the controller's writes there made before, if any.
    pub(super) fn serve(&self, cluster: &Cluster) {
        if let Some(writer) = &self.writer {
            writer.serve(cluster.name(), || {
                let writes = cluster.cache().writes();
                !writes.unshown(&writer.name, cluster.name()).is_empty()
            });
        }
    }

    /// What a reconcile's writes are recorded under, if the controller
    /// reads its own writes.
    pub(super) fn writer(&self) -> Option<Arc<Writer>> {
        self.writer.clone()
    }

    /// The clusters whose watches have yet to show a write of the
    /// controller's that one of them holds, which the next reconcile in
    /// `name` waits for: `name` itself, and those its keys' reconciles wrote
    /// to, but for those where a wait ran out lately. Empty if none, or if
    /// the controller does not read its writes; without a lookup if no
    /// write marked `name` (see [`Writer::holds`]), and once none is
    /// unshown the mark goes.
    pub(super) fn awaiting(
        &self,
        engaged: &HashMap<ClusterName, Cluster>,
        name: &ClusterName,
    ) -> Vec<Cluster> {
        let Some(writer) = &self.writer else {
            return Vec::new();
        };
        let Some((mark, away)) = writer.holds(name) else {
            return Vec::new();
        };
        let mut awaiting = Vec::new();
        let mut unshown_anywhere = false;
        let mut look = |cluster: &Cluster| {
            let unshown = !unshown(cluster, writer).is_empty();
            unshown_anywhere |= unshown;
            if unshown && !writer.is_cooling(cluster.name()) {
                awaiting.push(cluster.clone());
            }
            unshown
        };
        if let Some(own) = engaged.get(name) {
            look(own);
        }
        for target in away {
            // Read before looking: a write marking it after the look keeps it.
            let marked = writer.holds(&target);
            if !engaged.get(&target).is_some_and(&mut look) {
                writer.settled(name, &target, mark);
                // Nothing through its client waits: its mark goes too (else a
                // cluster written to that has no keys of its own stays marked).
                if let Some((mark, away)) = marked
                    && away.is_empty()
                {
                    writer.release(&target, mark);
                }
            }
        }
        if !unshown_anywhere {
            writer.release(name, mark);
        }
        awaiting
    }

    /// Holds the keys of `paused` (the queue has paused it) until the
    /// watches of `targets` show the controller's writes there, reading
    /// objects of the controlled type (`dyntype`) through the API if they
    /// do not in time. `false` if it cannot wait (the controller does not
    /// read its writes): the cluster is to be resumed at once.
    pub(super) fn start(
        &mut self,
        paused: Cluster,
        targets: Vec<Cluster>,
        dyntype: K::DynamicType,
    ) -> bool {
        let (Some(bound), Some(writer)) = (self.bound, self.writer.clone()) else {
            return false;
        };
        self.next_pause += 1;
        let pause = self.next_pause;
        self.paused.insert(paused.name().clone(), pause);
        self.waits
            .push(wait((paused, pause), targets, writer, bound, dyntype));
        true
    }

    /// Each cluster whose watches caught up, or whose wait ran out, handed
    /// to `resume`. Whether any wait ended.
    pub(super) fn poll_caught_up(
        &mut self,
        cx: &mut Context<'_>,
        mut resume: impl FnMut(&ClusterName),
    ) -> bool {
        let mut progress = false;
        while let Poll::Ready(Some(caught)) = self.waits.poll_next_unpin(cx) {
            progress = true;
            if self.paused.get(&caught.cluster) != Some(&caught.pause) {
                // It left, or was replaced, meanwhile.
                continue;
            }
            self.paused.remove(&caught.cluster);
            if !caught.read.is_empty() {
                let now = Instant::now();
                self.read
                    .retain(|_, read| now.saturating_duration_since(read.at) < READ_KEPT);
                self.read.extend(caught.read);
            }
            resume(&caught.cluster);
        }
        progress
    }

    /// The object for `key`'s reconcile: the one read through the API
    /// after a wait ran out, unless the cache shows the write it waited
    /// for by now (or the read is old).
    pub(super) fn fresher(&mut self, key: &McRequest, cached: Option<Arc<K>>) -> Option<Arc<K>> {
        if self.read.is_empty() {
            return cached;
        }
        let Some(read) = self.read.remove(key) else {
            return cached;
        };
        if read.at.elapsed() >= READ_KEPT
            || read.deleted.load(Ordering::Acquire)
            || cache_shows(cached.as_deref(), &read.written)
        {
            cached
        } else {
            read.object
        }
    }
}

/// How long an object read through the API stands in for the cache's.
const READ_KEPT: Duration = Duration::from_secs(60);

/// Whether `cached` (the cache's copy, or none) shows `written`.
fn cache_shows<K: Resource>(cached: Option<&K>, written: &Written) -> bool {
    // A cached version it cannot read leaves the read standing.
    written.shown_by(cached.map(Resource::meta), false)
}

/// The writes of `writer` through `cluster`'s client that a synced watch
/// there holds and has yet to show; forgets the others, and tells (once)
/// of those no watch there could show. None once the cluster has left.
fn unshown(cluster: &Cluster, writer: &Writer) -> Vec<Arc<Written>> {
    let writes = cluster.cache().writes();
    let mut unshown = writes.unshown(&writer.name, cluster.name());
    if unshown.is_empty() {
        return unshown;
    }
    if !cluster.is_engaged() {
        writes.settle(&unshown);
        return Vec::new();
    }
    // Out of the writes' lock: the stores are read for each.
    let (waiting, done): (Vec<_>, Vec<_>) = unshown
        .drain(..)
        .partition(|written| cluster.cache().awaits(written));
    for written in &done {
        if !cluster.cache().holds_resource(written) {
            writer.uncovered(cluster.name(), written);
        }
    }
    writes.settle(&done);
    waiting
}

/// Holds `paused` until the watches of `targets` show `writer`'s writes
/// there, at most `bound`; then reads the objects of the controlled type
/// (`dyntype`) not shown through the API, for at most `bound` more.
fn wait<K: Watchable>(
    (paused, pause): (Cluster, u64),
    mut targets: Vec<Cluster>,
    writer: Arc<Writer>,
    bound: Duration,
    dyntype: K::DynamicType,
) -> BoxFuture<'static, Caught<K>> {
    Box::pin(async move {
        let started = Instant::now();
        let deadline = started + bound;
        let caught = |read| Caught {
            cluster: paused.name().clone(),
            pause,
            read,
        };
        let timed_out = loop {
            // A cluster that left has nothing more to show; if the paused
            // one left, nothing waits.
            if !paused.is_engaged() {
                return caught(Vec::new());
            }
            targets.retain(Cluster::is_engaged);
            if Instant::now() >= deadline {
                break true;
            }
            let ledgers: Vec<_> = targets
                .iter()
                .map(|cluster| cluster.cache().writes().clone())
                .collect();
            let mut woken: Vec<BoxFuture<'_, ()>> = Vec::new();
            for writes in &ledgers {
                let mut shown = Box::pin(writes.shown_next());
                shown.as_mut().enable();
                woken.push(Box::pin(shown));
            }
            woken.extend(
                targets
                    .iter()
                    .chain([&paused])
                    .map(|c| Box::pin(c.disengaged()) as BoxFuture<'_, ()>),
            );
            if targets.iter().all(|c| unshown(c, &writer).is_empty()) {
                break false;
            }
            let any = futures::future::select_all(woken);
            if tokio::time::timeout_at(deadline, any).await.is_err() {
                break true;
            }
        };
        let read = if timed_out {
            give_up::<K>(&targets, &writer, bound, &dyntype).await
        } else {
            Vec::new()
        };
        paused.cache().writes().waited(started.elapsed(), timed_out);
        caught(read)
    })
}

/// Gives up on `writer`'s writes that the watches of `targets` have not
/// shown: not waited for there for a while; the objects of the controlled
/// type (`dyntype`) among them read through the API, for at most `bound`.
async fn give_up<K: Watchable>(
    targets: &[Cluster],
    writer: &Writer,
    bound: Duration,
    dyntype: &K::DynamicType,
) -> Vec<(McRequest, Read<K>)> {
    let (group, resource) = (K::group(dyntype), K::plural(dyntype));
    let reads_until = Instant::now() + bound;
    let mut read = Vec::new();
    for cluster in targets {
        let given_up = unshown(cluster, writer);
        if given_up.is_empty() {
            continue;
        }
        writer.gave_up_on(cluster.name());
        let writes = cluster.cache().writes();
        writes.give_up(&given_up);
        for written in given_up
            .into_iter()
            .filter(|w| w.id.group == group && w.id.resource == resource)
        {
            let id = &written.id;
            // Watched before the read: a deletion after it is not missed.
            let deleted = writes.watch_deletion(&written);
            let got =
                scoped::get::<K>(cluster.client(), dyntype, id.namespace.as_deref(), &id.name);
            match tokio::time::timeout_at(reads_until, got).await {
                Ok(Ok(object)) => read.push((
                    McRequest::new(cluster.name().clone(), id.namespace.clone(), &id.name),
                    Read {
                        object: object.map(Arc::new),
                        written: written.clone(),
                        deleted,
                        at: Instant::now(),
                    },
                )),
                // Its reconcile reads the cache, as without the wait.
                Ok(Err(error)) => tracing::debug!(
                    cluster = %cluster.name(),
                    name = %id.name,
                    error = %crate::client::error_chain(&error),
                    "could not read an object through the API after its watch did not show a write"
                ),
                Err(_) => break,
            }
        }
        tracing::debug!(
            cluster = %cluster.name(),
            writer = %writer.name,
            "watches did not show the controller's writes in time; not waited for there for a while"
        );
    }
    read
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::ObjectMeta;

    use super::*;
    use crate::client::ObjectId;

    fn written(version: u64, gone: bool) -> Written {
        Written {
            id: ObjectId {
                group: String::new(),
                resource: "configmaps".into(),
                namespace: Some("default".into()),
                name: "c".into(),
            },
            version,
            uid: Some("u1".into()),
            gone,
            labels: BTreeMap::new(),
            writer: "parents".into(),
            cluster: "east".into(),
            at: Instant::now(),
        }
    }

    fn cached(uid: &str, version: u64) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                uid: Some(uid.into()),
                resource_version: Some(version.to_string()),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        }
    }

    #[test]
    fn the_read_stands_in_only_while_the_cache_does_not_show_the_write() {
        let update = written(10, false);
        assert!(!cache_shows(Some(&cached("u1", 9)), &update));
        assert!(cache_shows(Some(&cached("u1", 10)), &update));
        assert!(!cache_shows(None::<&ConfigMap>, &update), "not there yet");
        assert!(
            cache_shows(Some(&cached("u2", 3)), &update),
            "made anew since: the cache is later"
        );
        let deletion = written(10, true);
        assert!(cache_shows(None::<&ConfigMap>, &deletion));
        assert!(!cache_shows(Some(&cached("u1", 10)), &deletion));
    }
}
