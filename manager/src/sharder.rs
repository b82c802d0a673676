//! The loop of a sharded replica: announces it, watches the others, and
//! engages in the fleet the clusters it ranks first for and holds the
//! Lease of.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    sync::Arc,
    time::Duration,
};

use futures::{
    FutureExt, StreamExt,
    future::join_all,
    stream::{BoxStream, FuturesUnordered},
};
use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, Client, api::ListParams};
use kube_fleet::{ClusterName, Fleet, provider::ClusterEvent};
use tokio::{sync::watch, task::JoinHandle, time::Instant};

use crate::{
    error::Error,
    gate::{Shards, Validity},
    lease::{Holder, LeaseLock, Observed, holder_for, identity_of},
    shard::{ShardStatus, owner, short_hash},
    timing::{Timings, stopped},
};

const SET_LABEL: &str = "kube-fleet.dev/shards";
const KIND_LABEL: &str = "kube-fleet.dev/lease";
const CLUSTER_ANNOTATION: &str = "kube-fleet.dev/cluster";

/// Provider events this close together start one round.
const DEBOUNCE: Duration = Duration::from_millis(100);

/// A replica Lease that has run out for this many times its duration is
/// deleted: its replica is gone, not merely slow.
const FORGOTTEN_AFTER: u32 = 10;

/// A cluster this replica runs.
struct Owned {
    validity: Arc<Validity>,
    until: Instant,
}

/// What becomes of a cluster's Lease when this replica stops running the
/// cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fence {
    /// Left to run out: the replica no longer knows that it holds it.
    Expire,
    /// Released once the reconciles there have ended, for the next owner
    /// to take at once.
    Release,
    /// Deleted once the reconciles there have ended: the provider no longer
    /// offers the cluster.
    Delete,
}

pub(crate) struct Sharder {
    fleet: Fleet,
    leases: Api<Lease>,
    client: Client,
    namespace: String,
    set: String,
    /// The identity the hash ranks this replica by.
    identity: String,
    /// The identity and this run's nonce, as the Leases record it.
    holder: String,
    timings: Timings,
    shards: Shards,
    status: ShardStatus,
    me: LeaseLock,
    /// Until when this replica counts itself live: its own Lease renewed.
    me_until: Option<Instant>,
    /// The replicas' Leases as last listed, by name.
    replicas: HashMap<String, Observed>,
    /// The live replicas, once a list of the Leases has been read.
    live: Option<Vec<String>>,
    fences: HashMap<ClusterName, LeaseLock>,
    offered: HashMap<ClusterName, ClusterEvent>,
    owned: HashMap<ClusterName, Owned>,
    /// Clusters given up whose reconciles are draining and whose Leases are
    /// then released or deleted, off the loop; not taken again until done.
    ending: HashMap<ClusterName, JoinHandle<()>>,
    /// The Leases of clusters no provider offers now, as last listed: once
    /// run out for long, nobody will release or delete them but this.
    strays: HashMap<String, Observed>,
}

impl Sharder {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        fleet: Fleet,
        client: Client,
        namespace: String,
        set: String,
        identity: String,
        timings: Timings,
        shards: Shards,
        status: ShardStatus,
    ) -> Self {
        let holder = holder_for(&identity);
        let me = LeaseLock::new(
            client.clone(),
            &namespace,
            &format!("{set}-replica-{}", short_hash(&identity)),
            &holder,
            timings.lease_duration,
        )
        .with_metadata(labels(&set, "replica"), BTreeMap::new());
        Self {
            fleet,
            leases: Api::namespaced(client.clone(), &namespace),
            client,
            namespace,
            set,
            identity,
            holder,
            timings,
            shards,
            status,
            me,
            me_until: None,
            replicas: HashMap::new(),
            live: None,
            fences: HashMap::new(),
            offered: HashMap::new(),
            owned: HashMap::new(),
            ending: HashMap::new(),
            strays: HashMap::new(),
        }
    }

    /// Runs until `stop`, then gives every cluster up and leaves.
    pub(crate) async fn run(
        mut self,
        mut providers: BoxStream<'static, ClusterEvent>,
        mut stop: watch::Receiver<bool>,
    ) -> Result<(), Error> {
        tracing::info!(shards = %self.set, holder = %self.holder, namespace = %self.namespace, "sharding");
        let mut next = Instant::now();
        let mut last = next;
        let mut offers_open = true;
        loop {
            tokio::select! {
                biased;
                _ = stopped(&mut stop) => break,
                // The timer before the providers: however many events they
                // send, the Leases are renewed on time.
                _ = tokio::time::sleep_until(next) => {
                    last = Instant::now();
                    self.round().await;
                    next = last + self.timings.retry_period;
                    // A round that outlasted the retry period leaves the
                    // timer ready at once: take in what the providers sent
                    // meanwhile first, or a slow server would starve them.
                    while offers_open {
                        match providers.next().now_or_never() {
                            Some(Some(event)) => {
                                self.offer(event).await;
                            }
                            Some(None) => offers_open = false,
                            None => break,
                        }
                    }
                }
                event = providers.next(), if offers_open => match event {
                    Some(event) => {
                        if self.offer(event).await {
                            // Events close together start one round, and
                            // a provider that never stops changing starts
                            // at most two per retry period: each round
                            // writes every Lease this replica holds.
                            let soon = (Instant::now() + DEBOUNCE)
                                .max(last + self.timings.retry_period / 2);
                            next = next.min(soon);
                        }
                    }
                    None => offers_open = false,
                },
            }
        }
        self.leave().await;
        Ok(())
    }

    /// Takes in a provider's event; true if a round should run soon.
    async fn offer(&mut self, event: ClusterEvent) -> bool {
        match &event {
            ClusterEvent::Engage { name, .. } | ClusterEvent::EngageView { name, .. } => {
                let name = name.clone();
                if self.owned.contains_key(&name) {
                    // A new client for a cluster it runs: engage it anew.
                    engage(&self.fleet, event.clone());
                }
                self.offered.insert(name, event);
                true
            }
            ClusterEvent::Disengage { name } => {
                let name = name.clone();
                self.offered.remove(&name);
                if self.owned.contains_key(&name) {
                    self.give_up(vec![name.clone()], Fence::Delete).await;
                }
                self.fences.remove(&name);
                false
            }
        }
    }

    /// One pass: renew its own Lease, read the others', renew the
    /// clusters it runs, give up those it should not run, take those it
    /// should, and delete the Leases of replicas gone for long.
    async fn round(&mut self) {
        let timeout = self.timings.request_timeout();
        let selector = format!("{SET_LABEL}={}", self.set);
        let list = ListParams::default().labels(&selector);
        let start = Instant::now();
        // All at once, each with its own timeout: a slow answer to one
        // delays none of the others.
        let (own, listed, ended) = tokio::join!(
            tokio::time::timeout(timeout, self.me.try_acquire_or_renew()),
            tokio::time::timeout(timeout, self.leases.list(&list)),
            renew_fences(
                &mut self.fences,
                &mut self.owned,
                &self.status,
                self.timings
            ),
        );
        match own {
            Ok(Ok(Holder::Me)) => self.me_until = Some(start + self.timings.renew_deadline),
            Ok(Ok(Holder::Other(other))) => {
                tracing::warn!(holder = %self.holder, %other, "this replica's Lease is held by an earlier run of this identity, or by another process given it: waiting for it to run out");
            }
            Ok(Err(error)) => tracing::warn!(%error, "renewing this replica's Lease"),
            Err(_) => tracing::warn!(?timeout, "renewing this replica's Lease: no answer in time"),
        }
        match listed {
            Ok(Ok(list)) => self.read_leases(&list.items),
            Ok(Err(error)) => tracing::warn!(%error, "listing the replicas' Leases"),
            Err(_) => tracing::warn!(?timeout, "listing the replicas' Leases: no answer in time"),
        }
        for fence in [Fence::Expire, Fence::Release] {
            let clusters: Vec<ClusterName> = ended
                .iter()
                .filter(|(_, f)| *f == fence)
                .map(|(cluster, _)| cluster.clone())
                .collect();
            if !clusters.is_empty() {
                tracing::warn!(
                    ?clusters,
                    "the clusters' Leases were not renewed in time: giving them up"
                );
                self.give_up(clusters, fence).await;
            }
        }

        let alive = self.me_until.is_some_and(|until| Instant::now() < until);
        let Some(live) = self.live.clone().filter(|_| alive) else {
            self.status.set_assigned(Vec::new());
            if !alive && !self.owned.is_empty() {
                tracing::warn!("this replica's own Lease is not renewed: giving its clusters up");
                let all: Vec<ClusterName> = self.owned.keys().cloned().collect();
                self.give_up(all, Fence::Release).await;
            }
            return;
        };
        let mine = |cluster: &ClusterName| {
            owner(cluster.as_str(), live.iter().map(String::as_str)) == Some(self.identity.as_str())
        };
        self.status
            .set_assigned(self.offered.keys().filter(|c| mine(c)).cloned().collect());
        let leaving: Vec<ClusterName> = self
            .owned
            .keys()
            .filter(|cluster| !self.offered.contains_key(*cluster) || !mine(cluster))
            .cloned()
            .collect();
        let wanted: Vec<ClusterName> = self
            .offered
            .keys()
            .filter(|cluster| !self.owned.contains_key(*cluster) && mine(cluster))
            .cloned()
            .collect();
        if !leaving.is_empty() {
            tracing::info!(clusters = ?leaving, replicas = ?live, "handing clusters over");
            self.give_up(leaving, Fence::Release).await;
        }
        self.take(wanted, timeout).await;
        self.forget_departed(timeout).await;
    }

    /// Takes in a list of the set's Leases: which replicas live, and every
    /// Lease's record of a cluster it may take, so that one whose holder
    /// died is known to have expired as soon as it has.
    fn read_leases(&mut self, leases: &[Lease]) {
        let now = Instant::now();
        let mut replicas = HashMap::new();
        let mut strays = HashMap::new();
        for lease in leases {
            let labels = lease.metadata.labels.as_ref();
            let kind = labels.and_then(|l| l.get(KIND_LABEL)).map(String::as_str);
            match kind {
                Some("replica") => {
                    let name = lease.metadata.name.clone().unwrap_or_default();
                    let seen = Observed::of(lease, self.replicas.get(&name), now);
                    replicas.insert(name, seen);
                }
                Some("cluster") => {
                    let cluster = lease
                        .metadata
                        .annotations
                        .as_ref()
                        .and_then(|a| a.get(CLUSTER_ANNOTATION));
                    // The Lease of a cluster it runs is known from its own
                    // writes, which this list may predate.
                    let cluster = cluster.map(|c| ClusterName::new(c.as_str()));
                    match cluster {
                        Some(cluster) if self.offered.contains_key(&cluster) => {
                            if !self.owned.contains_key(&cluster) {
                                self.fence(&cluster).saw(lease, now);
                            }
                        }
                        _ => {
                            let name = lease.metadata.name.clone().unwrap_or_default();
                            let seen = Observed::of(lease, self.strays.get(&name), now);
                            strays.insert(name, seen);
                        }
                    }
                }
                _ => {}
            }
        }
        self.replicas = replicas;
        self.strays = strays;
        let mut live: Vec<String> = self
            .replicas
            .values()
            .filter(|seen| seen.runs_out() > now)
            .filter_map(|seen| seen.holder())
            .map(|holder| identity_of(holder).to_owned())
            .collect();
        if !live.contains(&self.identity) {
            live.push(self.identity.clone());
        }
        live.sort();
        live.dedup();
        tracing::debug!(listed = leases.len(), ?live, "replicas");
        self.status.set_replicas(live.clone());
        self.live = Some(live);
    }

    /// Deletes the Leases of replicas, and of clusters no provider offers,
    /// that ran out long ago, on this replica's clock, each at the version
    /// seen: a replica that has come back, or a cluster taken again, has
    /// written its Lease since, and keeps it.
    async fn forget_departed(&mut self, timeout: Duration) {
        let now = Instant::now();
        let departed: Vec<(String, Observed)> = self
            .replicas
            .iter()
            .chain(&self.strays)
            .filter(|(_, seen)| seen.holder() != Some(self.holder.as_str()))
            .filter(|(_, seen)| now >= seen.runs_out() + seen.lasts() * FORGOTTEN_AFTER)
            .map(|(name, seen)| (name.clone(), seen.clone()))
            .collect();
        let leases = &self.leases;
        let deletes = departed.iter().map(|(name, seen)| async move {
            match tokio::time::timeout(timeout, leases.delete(name, &seen.delete_params())).await {
                Ok(Ok(_)) => {
                    tracing::info!(lease = %name, holder = ?seen.holder(), "deleted a Lease that ran out long ago");
                    true
                }
                // Gone already, or written since: either way not ours to delete.
                Ok(Err(kube::Error::Api(status))) if [404, 409].contains(&status.code) => true,
                Ok(Err(error)) => {
                    tracing::warn!(lease = %name, %error, "deleting a Lease that ran out long ago");
                    false
                }
                Err(_) => false,
            }
        });
        let done = join_all(deletes).await;
        for ((name, _), done) in departed.iter().zip(done) {
            if done {
                self.replicas.remove(name);
                self.strays.remove(name);
            }
        }
    }

    /// Tries to take the Lease of each wanted cluster, all at once, and
    /// engages those it takes.
    async fn take(&mut self, wanted: Vec<ClusterName>, timeout: Duration) {
        let now = Instant::now();
        // A cluster given up is taken again only once its Lease was
        // released or deleted: before, this replica's own holder is on it.
        self.ending.retain(|_, end| !end.is_finished());
        let wanted: Vec<ClusterName> = wanted
            .into_iter()
            .filter(|cluster| !self.ending.contains_key(cluster))
            .collect();
        for cluster in &wanted {
            self.fence(cluster);
        }
        let wanted: HashSet<ClusterName> = wanted.into_iter().collect();
        let attempts = self
            .fences
            .iter_mut()
            .filter(|(cluster, lock)| wanted.contains(*cluster) && !lock.held_by_other(now))
            .map(|(cluster, lock)| async move {
                let start = Instant::now();
                let result = tokio::time::timeout(timeout, lock.try_acquire_or_renew()).await;
                (cluster.clone(), start, result)
            });
        let results = join_all(attempts).await;
        for (cluster, start, result) in results {
            match result {
                Ok(Ok(Holder::Me)) => {
                    let Some(event) = self.offered.get(&cluster).cloned() else {
                        continue;
                    };
                    let until = start + self.timings.renew_deadline;
                    let validity = Validity::closed();
                    validity.open_until(until);
                    self.shards
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(cluster.clone(), validity.clone());
                    self.owned
                        .insert(cluster.clone(), Owned { validity, until });
                    self.status.took(&cluster, Instant::now(), until);
                    tracing::info!(%cluster, "running the cluster");
                    engage(&self.fleet, event);
                }
                Ok(Ok(Holder::Other(_))) => {}
                Ok(Err(error)) => tracing::warn!(%cluster, %error, "taking the cluster's Lease"),
                Err(_) => {
                    tracing::warn!(%cluster, ?timeout, "taking the cluster's Lease: no answer in time")
                }
            }
        }
    }

    /// Stops running `clusters`: no reconcile starts there and running ones
    /// stop, the fleet disengages them, and once their reconciles have
    /// ended their Leases are released or deleted, as `fence` says.
    async fn give_up(&mut self, clusters: Vec<ClusterName>, fence: Fence) {
        let mut drained = Vec::new();
        for cluster in &clusters {
            let Some(owned) = self.owned.remove(cluster) else {
                continue;
            };
            let until = Instant::now().min(owned.until);
            owned.validity.close();
            self.shards
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(cluster);
            self.status.gave_up(cluster, until);
            self.fleet.disengage(cluster);
            drained.push((cluster.clone(), owned.validity));
        }
        if fence == Fence::Expire {
            return;
        }
        // Each cluster's drain and Lease write go on off the loop, so that
        // slow reconciles or a slow server cost that cluster alone.
        let deadline = self.timings.renew_deadline;
        let timeout = self.timings.request_timeout();
        for (cluster, validity) in drained {
            let Some(mut lock) = self.fences.remove(&cluster) else {
                continue;
            };
            let name = cluster.clone();
            let end = tokio::spawn(async move {
                if tokio::time::timeout(deadline, validity.drained())
                    .await
                    .is_err()
                {
                    // Another replica must not start while they might run:
                    // the Lease is left to expire.
                    tracing::warn!(%cluster, "reconciles still running after the renew deadline: the cluster's Lease is left to expire");
                    return;
                }
                let (what, end) = match fence {
                    Fence::Delete => ("deleting", lock.delete().boxed()),
                    _ => ("releasing", lock.release().boxed()),
                };
                match tokio::time::timeout(timeout, end).await {
                    Ok(Ok(())) => {}
                    Ok(Err(error)) => {
                        tracing::warn!(%cluster, %error, "{what} the cluster's Lease")
                    }
                    Err(_) => {
                        tracing::warn!(%cluster, "{what} the cluster's Lease: no answer in time")
                    }
                }
            });
            self.ending.insert(name, end);
        }
    }

    /// Gives every cluster up and deletes this replica's own Lease, so that
    /// the others take its clusters at once and no Lease is left behind.
    async fn leave(&mut self) {
        let all: Vec<ClusterName> = self.owned.keys().cloned().collect();
        self.give_up(all, Fence::Release).await;
        // Every cluster's Lease released (each end is bounded by the renew
        // deadline and a request timeout) before the replica's own goes.
        for (_, end) in self.ending.drain() {
            let _ = end.await;
        }
        let timeout = self.timings.request_timeout();
        match tokio::time::timeout(timeout, self.me.delete()).await {
            Ok(Ok(())) => tracing::info!(holder = %self.holder, "left the shards"),
            Ok(Err(error)) => tracing::warn!(%error, "deleting this replica's Lease"),
            Err(_) => tracing::warn!("deleting this replica's Lease: no answer in time"),
        }
    }

    /// The lock on `cluster`'s Lease.
    fn fence(&mut self, cluster: &ClusterName) -> &mut LeaseLock {
        self.fences.entry(cluster.clone()).or_insert_with(|| {
            LeaseLock::new(
                self.client.clone(),
                &self.namespace,
                &format!("{}-cluster-{}", self.set, short_hash(cluster.as_str())),
                &self.holder,
                self.timings.lease_duration,
            )
            .with_metadata(
                labels(&self.set, "cluster"),
                BTreeMap::from([(CLUSTER_ANNOTATION.to_owned(), cluster.to_string())]),
            )
        })
    }
}

/// Renews the Lease of every cluster in `owned`, each on its own: a
/// cluster's validity moves on as soon as its own renew answers, from when
/// that renew began, whatever the others' answers do. Returns the clusters
/// to give up: those another replica holds, and those whose renew answered
/// past their deadline.
async fn renew_fences(
    fences: &mut HashMap<ClusterName, LeaseLock>,
    owned: &mut HashMap<ClusterName, Owned>,
    status: &ShardStatus,
    timings: Timings,
) -> Vec<(ClusterName, Fence)> {
    let timeout = timings.request_timeout();
    let mut renews: FuturesUnordered<_> = fences
        .iter_mut()
        .filter(|(cluster, _)| owned.contains_key(*cluster))
        .map(|(cluster, lock)| async move {
            let start = Instant::now();
            let result = tokio::time::timeout(timeout, lock.try_acquire_or_renew()).await;
            (cluster.clone(), start, result)
        })
        .collect();
    let mut ended = Vec::new();
    while let Some((cluster, start, result)) = renews.next().await {
        let Some(owned) = owned.get_mut(&cluster) else {
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
            ended.push((cluster, fence));
        } else if renewed {
            owned.until = start + timings.renew_deadline;
            owned.validity.open_until(owned.until);
            status.renewed(&cluster, owned.until);
        } else if let Ok(Ok(Holder::Other(holder))) = result {
            tracing::error!(%cluster, %holder, "another replica holds this cluster's Lease");
            ended.push((cluster, Fence::Expire));
        } else {
            tracing::warn!(%cluster, result = ?result.map(|r| r.map(|_| ())), "renewing the cluster's Lease");
        }
    }
    ended
}

fn labels(set: &str, kind: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (SET_LABEL.to_owned(), set.to_owned()),
        (KIND_LABEL.to_owned(), kind.to_owned()),
    ])
}

fn engage(fleet: &Fleet, event: ClusterEvent) {
    match event {
        ClusterEvent::Engage { name, client } => {
            fleet.engage(name, client);
        }
        ClusterEvent::EngageView { name, view } => {
            fleet.engage_view(name, view);
        }
        ClusterEvent::Disengage { name } => {
            fleet.disengage(&name);
        }
    }
}
