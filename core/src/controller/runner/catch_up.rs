//! Reading the controller's own writes: a cluster whose watches have not
//! shown what the controller wrote there starts no reconcile until they
//! do, or until the wait runs out and the objects of the controller's own
//! type still not shown are read through the API.

use std::{
    collections::HashMap,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use futures::{StreamExt, future::BoxFuture, stream::FuturesUnordered};
use kube::Resource;
use tokio::time::Instant;

use super::Runner;
use crate::{
    cache::{Watchable, scoped},
    client::Writer,
    cluster::Cluster,
    cluster_name::ClusterName,
    request::McRequest,
};

/// A cluster's wait for its watches, ended: which pause it ends, and the
/// objects read through the API because it ran out.
pub(super) struct Caught<K> {
    cluster: ClusterName,
    pause: u64,
    read: Vec<(McRequest, Option<Arc<K>>)>,
}

/// What the runner keeps to read its own writes.
pub(super) struct CatchUp<K: Watchable> {
    /// How long a cluster waits at most; `None`: the controller does not
    /// read its writes.
    pub(super) bound: Option<Duration>,
    /// What its reconciles record their writes under.
    writer: Option<Arc<Writer>>,
    waits: FuturesUnordered<BoxFuture<'static, Caught<K>>>,
    /// The pause each waiting cluster is in.
    paused: HashMap<ClusterName, u64>,
    next_pause: u64,
    /// Objects of the controlled type read through the API after a wait
    /// ran out (`None`: not found there), for their key's next reconcile.
    read: HashMap<McRequest, Option<Arc<K>>>,
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
}

impl<K: Watchable> Runner<K> {
    /// What a reconcile's writes are recorded under, if the controller
    /// reads its own writes.
    pub(super) fn writer(&self) -> Option<Arc<Writer>> {
        self.catch_up.writer.clone()
    }

    /// Waits for the watches of `clusters` (the first: the one whose keys
    /// the queue holds) to show the controller's writes there.
    pub(super) fn catch_up(&mut self, clusters: Vec<Cluster>) {
        let (Some(bound), Some(writer)) = (self.catch_up.bound, self.catch_up.writer.clone())
        else {
            return;
        };
        let name = clusters[0].name().clone();
        self.catch_up.next_pause += 1;
        let pause = self.catch_up.next_pause;
        self.catch_up.paused.insert(name.clone(), pause);
        let wait = wait(
            clusters,
            writer,
            bound,
            pause,
            self.own.watch.dyntype().clone(),
        );
        self.catch_up.waits.push(wait);
    }

    /// Resumes the clusters whose watches caught up, or whose wait ran out.
    pub(super) fn poll_caught_up(&mut self, cx: &mut Context<'_>) -> bool {
        let mut progress = false;
        while let Poll::Ready(Some(caught)) = self.catch_up.waits.poll_next_unpin(cx) {
            progress = true;
            if self.catch_up.paused.get(&caught.cluster) != Some(&caught.pause) {
                // It left, or was replaced, meanwhile.
                continue;
            }
            self.catch_up.paused.remove(&caught.cluster);
            self.catch_up.read.extend(caught.read);
            self.queue.resume(&caught.cluster);
        }
        progress
    }

    /// The object for `key`'s reconcile: the one read through the API
    /// after a wait ran out, unless the cache holds it as late.
    pub(super) fn fresher(&mut self, key: &McRequest, cached: Option<Arc<K>>) -> Option<Arc<K>> {
        let Some(read) = self.catch_up.read.remove(key) else {
            return cached;
        };
        match (version(cached.as_deref()), version(read.as_deref())) {
            (Some(cached_at), Some(read_at)) if cached_at >= read_at => cached,
            _ => read,
        }
    }
}

/// The clusters whose watches have yet to show a write of `writer` that
/// one of them holds, which the next reconcile in `name` waits for: `name`
/// itself, and those its keys' reconciles wrote to. Empty if none.
pub(super) fn awaiting(
    engaged: &HashMap<ClusterName, Cluster>,
    writer: Option<&Arc<Writer>>,
    name: &ClusterName,
) -> Vec<Cluster> {
    let Some(writer) = writer else {
        return Vec::new();
    };
    let Some(own) = engaged.get(name) else {
        return Vec::new();
    };
    let mut awaiting = Vec::new();
    if unshown(own, &writer.name) {
        awaiting.push(own.clone());
    }
    for target in writer.away_from(name) {
        match engaged.get(&target) {
            Some(cluster) if unshown(cluster, &writer.name) => {
                if awaiting.is_empty() {
                    // Paused under its own name.
                    awaiting.push(own.clone());
                }
                awaiting.push(cluster.clone());
            }
            _ => writer.settled(name, &target),
        }
    }
    awaiting
}

/// Whether `cluster`'s watches have yet to show a write of `writer`.
fn unshown(cluster: &Cluster, writer: &str) -> bool {
    let cache = cluster.cache();
    cache
        .writes()
        .awaits(writer, |written| cache.awaits(written))
}

fn version<K: Resource>(object: Option<&K>) -> Option<u64> {
    object?.meta().resource_version.as_deref()?.parse().ok()
}

/// Waits until the watches of `clusters` show `writer`'s writes there, at
/// most `bound`; then reads the objects of the controlled type
/// (`dyntype`) not shown through the API.
fn wait<K: Watchable>(
    clusters: Vec<Cluster>,
    writer: Arc<Writer>,
    bound: Duration,
    pause: u64,
    dyntype: K::DynamicType,
) -> BoxFuture<'static, Caught<K>> {
    Box::pin(async move {
        let started = Instant::now();
        let deadline = started + bound;
        let paused = clusters[0].name().clone();
        let ledgers: Vec<_> = clusters
            .iter()
            .map(|cluster| cluster.cache().writes().clone())
            .collect();
        let caught = |read| Caught {
            cluster: paused.clone(),
            pause,
            read,
        };
        loop {
            let mut shown: Vec<_> = ledgers
                .iter()
                .map(|writes| Box::pin(writes.shown_next()))
                .collect();
            for next in &mut shown {
                next.as_mut().enable();
            }
            if !clusters.iter().any(|c| unshown(c, &writer.name)) {
                ledgers[0].waited(started.elapsed(), false);
                return caught(Vec::new());
            }
            let any_shown = futures::future::select_all(shown);
            if tokio::time::timeout_at(deadline, any_shown).await.is_err() {
                break;
            }
        }
        ledgers[0].waited(started.elapsed(), true);
        let (group, resource) = (K::group(&dyntype), K::plural(&dyntype));
        let mut read = Vec::new();
        for cluster in &clusters {
            let given_up = cluster.cache().writes().give_up(&writer.name);
            for written in given_up
                .into_iter()
                .filter(|w| w.id.group == group && w.id.resource == resource)
            {
                let id = written.id;
                let got = scoped::get::<K>(
                    cluster.client(),
                    &dyntype,
                    id.namespace.as_deref(),
                    &id.name,
                );
                match got.await {
                    Ok(object) => read.push((
                        McRequest::new(cluster.name().clone(), id.namespace, id.name),
                        object.map(Arc::new),
                    )),
                    // Its reconcile reads the cache, as without the wait.
                    Err(error) => tracing::debug!(
                        cluster = %cluster.name(),
                        name = %id.name,
                        error = %crate::client::error_chain(&error),
                        "could not read an object through the API after its watch did not show a write"
                    ),
                }
            }
        }
        tracing::debug!(
            cluster = %paused,
            writer = %writer.name,
            read = read.len(),
            "the cluster's watches did not show the controller's writes in time"
        );
        caught(read)
    })
}
