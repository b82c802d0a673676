//! The loop of a sharded replica: announces it, watches the others, and
//! engages in the fleet the clusters it ranks first for and holds the
//! Lease of.

mod fences;

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
    time::Duration,
};

use futures::{FutureExt, StreamExt, future::join_all, stream::BoxStream};
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
use fences::renew_fences;

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
