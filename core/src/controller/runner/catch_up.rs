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
    waits: FuturesUnordered<BoxFuture<'static, Caught<K>>>,
    /// The pause each waiting cluster is in.
    paused: HashMap<ClusterName, u64>,
    next_pause: u64,
    /// Objects of the controlled type read through the API after a wait
    /// ran out (`None`: not found there), for their key's next reconcile.
    read: HashMap<McRequest, Option<Arc<K>>>,
}

impl<K: Watchable> CatchUp<K> {
    pub(super) fn new(bound: Option<Duration>) -> Self {
        Self {
            bound,
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
        self.paused.remove(name).is_some()
    }
}

impl<K: Watchable> Runner<K> {
    /// The name a reconcile's writes are recorded under, if the controller
    /// reads its own writes.
    pub(super) fn writer(&self) -> Option<Arc<str>> {
        self.catch_up.bound.map(|_| self.name.clone())
    }

    /// Waits for the watches of `cluster`, whose keys the queue holds, to
    /// show the controller's writes there.
    pub(super) fn catch_up(&mut self, cluster: Cluster) {
        let Some(bound) = self.catch_up.bound else {
            return;
        };
        let name = cluster.name();
        self.catch_up.next_pause += 1;
        let pause = self.catch_up.next_pause;
        self.catch_up.paused.insert(name.clone(), pause);
        let wait = wait(
            cluster,
            self.name.clone(),
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

/// The cluster `name`, if its watches have yet to show a write of the
/// controller `writer` that one of them holds.
pub(super) fn awaiting(
    engaged: &HashMap<ClusterName, Cluster>,
    writer: &str,
    name: &ClusterName,
) -> Option<Cluster> {
    let cluster = engaged.get(name)?;
    let cache = cluster.cache();
    cache
        .writes()
        .awaits(writer, |written| cache.awaits(written))
        .then(|| cluster.clone())
}

fn version<K: Resource>(object: Option<&K>) -> Option<u64> {
    object?.meta().resource_version.as_deref()?.parse().ok()
}

/// Waits until `cluster`'s watches show `writer`'s writes there, at most
/// `bound`; then reads the objects of the controlled type (`dyntype`) not
/// shown through the API.
fn wait<K: Watchable>(
    cluster: Cluster,
    writer: Arc<str>,
    bound: Duration,
    pause: u64,
    dyntype: K::DynamicType,
) -> BoxFuture<'static, Caught<K>> {
    Box::pin(async move {
        let writes = cluster.cache().writes().clone();
        let started = Instant::now();
        let deadline = started + bound;
        let caught = |read| Caught {
            cluster: cluster.name().clone(),
            pause,
            read,
        };
        loop {
            let shown = writes.shown_next();
            tokio::pin!(shown);
            shown.as_mut().enable();
            if !writes.awaits(&writer, |written| cluster.cache().awaits(written)) {
                writes.waited(started.elapsed(), false);
                return caught(Vec::new());
            }
            if tokio::time::timeout_at(deadline, shown).await.is_err() {
                break;
            }
        }
        let given_up = writes.give_up(&writer);
        writes.waited(started.elapsed(), true);
        let (group, resource) = (K::group(&dyntype), K::plural(&dyntype));
        let mut read = Vec::new();
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
        tracing::debug!(
            cluster = %cluster.name(),
            %writer,
            read = read.len(),
            "the cluster's watches did not show the controller's writes in time"
        );
        caught(read)
    })
}
