//! The loop of a sharded replica: announces it, watches the others, and
//! engages in the fleet the clusters it ranks first for and holds the
//! Lease of.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    sync::{Arc, Mutex},
    time::Duration,
};

use futures::{StreamExt, future::join_all, stream::BoxStream};
use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, Client, api::ListParams};
use kube_fleet::{ClusterName, Fleet, provider::ClusterEvent};
use tokio::{sync::watch, time::Instant};

use crate::{
    Error,
    election::{Timings, stopped},
    gate::Validity,
    lease::{Holder, LeaseLock},
    shard::{ShardStatus, owner, short_hash},
};

const SET_LABEL: &str = "kube-fleet.dev/shards";
const KIND_LABEL: &str = "kube-fleet.dev/lease";
const CLUSTER_ANNOTATION: &str = "kube-fleet.dev/cluster";

/// The clusters' validities, which the reconciles' gate reads.
pub(crate) type Shards = Arc<Mutex<HashMap<ClusterName, Arc<Validity>>>>;

/// A cluster this replica runs.
struct Owned {
    validity: Arc<Validity>,
    until: Instant,
}

/// A replica's Lease as last seen, and since when unchanged.
struct Seen {
    record: (Option<String>, Option<i32>, Option<String>),
    at: Instant,
}

pub(crate) struct Sharder {
    fleet: Fleet,
    leases: Api<Lease>,
    client: Client,
    namespace: String,
    set: String,
    identity: String,
    timings: Timings,
    shards: Shards,
    status: ShardStatus,
    me: LeaseLock,
    /// Until when this replica counts itself live: its own Lease renewed.
    me_until: Option<Instant>,
    replicas: HashMap<String, Seen>,
    /// The live replicas, once a list of the Leases has been read.
    live: Option<Vec<String>>,
    fences: HashMap<ClusterName, LeaseLock>,
    offered: HashMap<ClusterName, ClusterEvent>,
    owned: HashMap<ClusterName, Owned>,
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
        let me = LeaseLock::new(
            client.clone(),
            &namespace,
            &format!("{set}-replica-{}", short_hash(&identity)),
            &identity,
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
        }
    }

    /// Runs until `stop`, then gives every cluster up and leaves.
    pub(crate) async fn run(
        mut self,
        mut providers: BoxStream<'static, ClusterEvent>,
        mut stop: watch::Receiver<bool>,
    ) -> Result<(), Error> {
        tracing::info!(shards = %self.set, identity = %self.identity, namespace = %self.namespace, "sharding");
        let mut next = Instant::now();
        let mut offers_open = true;
        loop {
            tokio::select! {
                biased;
                _ = stopped(&mut stop) => break,
                event = providers.next(), if offers_open => match event {
                    Some(event) => {
                        if self.offer(event).await {
                            next = Instant::now();
                        }
                    }
                    None => offers_open = false,
                },
                _ = tokio::time::sleep_until(next) => {
                    let start = Instant::now();
                    self.round().await;
                    next = start + self.timings.retry_period;
                }
            }
        }
        self.leave().await;
        Ok(())
    }

    /// Takes in a provider's event; true if a round should run now.
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
                    self.give_up(vec![name.clone()], true).await;
                }
                self.fences.remove(&name);
                false
            }
        }
    }

    /// One pass: renew its own Lease, read the others', renew the
    /// clusters it runs, give up those it should not run, take those it
    /// should.
    async fn round(&mut self) {
        let timeout = self.timings.request_timeout();
        let start = Instant::now();
        match tokio::time::timeout(timeout, self.me.try_acquire_or_renew()).await {
            Ok(Ok(Holder::Me)) => self.me_until = Some(start + self.timings.renew_deadline),
            Ok(Ok(Holder::Other(other))) => {
                tracing::error!(identity = %self.identity, %other, "this replica's Lease is held by another: is the identity used twice?");
            }
            Ok(Err(error)) => tracing::warn!(%error, "renewing this replica's Lease"),
            Err(_) => tracing::warn!(?timeout, "renewing this replica's Lease: no answer in time"),
        }
        self.read_leases(timeout).await;
        self.renew_owned(timeout).await;

        let alive = self.me_until.is_some_and(|until| Instant::now() < until);
        let Some(live) = self.live.clone().filter(|_| alive) else {
            self.status.set_assigned(Vec::new());
            if !alive && !self.owned.is_empty() {
                tracing::warn!("this replica's own Lease is not renewed: giving its clusters up");
                let all: Vec<ClusterName> = self.owned.keys().cloned().collect();
                self.give_up(all, true).await;
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
            self.give_up(leaving, true).await;
        }
        self.take(wanted, timeout).await;
    }

    /// Lists the set's Leases: which replicas live, and every cluster
    /// Lease's record, so that one whose holder died is known to have
    /// expired as soon as it has.
    async fn read_leases(&mut self, timeout: Duration) {
        let selector = format!("{SET_LABEL}={}", self.set);
        let listed = tokio::time::timeout(
            timeout,
            self.leases.list(&ListParams::default().labels(&selector)),
        )
        .await;
        let list = match listed {
            Ok(Ok(list)) => list,
            Ok(Err(error)) => {
                tracing::warn!(%error, "listing the replicas' Leases");
                return;
            }
            Err(_) => {
                tracing::warn!(?timeout, "listing the replicas' Leases: no answer in time");
                return;
            }
        };
        let now = Instant::now();
        let mut names = HashSet::new();
        for lease in &list.items {
            let labels = lease.metadata.labels.as_ref();
            let kind = labels.and_then(|l| l.get(KIND_LABEL)).map(String::as_str);
            let name = lease.metadata.name.clone().unwrap_or_default();
            match kind {
                Some("replica") => {
                    let spec = lease.spec.clone().unwrap_or_default();
                    let record = (
                        spec.holder_identity.clone(),
                        spec.lease_duration_seconds,
                        spec.renew_time.as_ref().map(|t| t.0.to_string()),
                    );
                    let at = match self.replicas.get(&name) {
                        Some(seen) if seen.record == record => seen.at,
                        _ => now,
                    };
                    names.insert(name.clone());
                    self.replicas.insert(name, Seen { record, at });
                }
                Some("cluster") => {
                    let cluster = lease
                        .metadata
                        .annotations
                        .as_ref()
                        .and_then(|a| a.get(CLUSTER_ANNOTATION));
                    if let Some(cluster) = cluster.map(|c| ClusterName::new(c.as_str()))
                        && self.offered.contains_key(&cluster)
                    {
                        self.fence(&cluster).saw(lease, now);
                    }
                }
                _ => {}
            }
        }
        self.replicas.retain(|name, _| names.contains(name));
        let mut live: Vec<String> = self
            .replicas
            .values()
            .filter_map(|seen| {
                let (holder, seconds, _) = &seen.record;
                let holder = holder.as_ref().filter(|h| !h.is_empty())?;
                let lasts = Duration::from_secs(seconds.unwrap_or(0).max(0) as u64);
                (seen.at + lasts > now).then(|| holder.clone())
            })
            .collect();
        if !live.contains(&self.identity) {
            live.push(self.identity.clone());
        }
        live.sort();
        live.dedup();
        tracing::debug!(listed = list.items.len(), ?live, "replicas");
        self.status.set_replicas(live.clone());
        self.live = Some(live);
    }

    /// Renews the Lease of every cluster it runs, all at once; a cluster
    /// whose Lease was not renewed within the renew deadline is given up.
    async fn renew_owned(&mut self, timeout: Duration) {
        let owned: HashSet<&ClusterName> = self.owned.keys().collect();
        let attempts = self
            .fences
            .iter_mut()
            .filter(|(cluster, _)| owned.contains(cluster))
            .map(|(cluster, lock)| async move {
                let start = Instant::now();
                let result = tokio::time::timeout(timeout, lock.try_acquire_or_renew()).await;
                (cluster.clone(), start, result)
            });
        let results = join_all(attempts).await;
        let mut lost = Vec::new();
        let mut held_but_late = Vec::new();
        let now = Instant::now();
        for (cluster, start, result) in results {
            let Some(owned) = self.owned.get_mut(&cluster) else {
                continue;
            };
            let renewed = matches!(result, Ok(Ok(Holder::Me)));
            if now >= owned.until {
                // Its reconciles stopped at the deadline: give it up, even
                // if this late renew went through.
                if renewed {
                    held_but_late.push(cluster);
                } else {
                    lost.push(cluster);
                }
            } else if renewed {
                owned.until = start + self.timings.renew_deadline;
                owned.validity.open_until(owned.until);
                self.status.renewed(&cluster, owned.until);
            } else if let Ok(Ok(Holder::Other(holder))) = result {
                tracing::error!(%cluster, %holder, "another replica holds this cluster's Lease");
                lost.push(cluster);
            } else {
                tracing::warn!(%cluster, result = ?result.map(|r| r.map(|_| ())), "renewing the cluster's Lease");
            }
        }
        if !lost.is_empty() {
            tracing::warn!(clusters = ?lost, "the clusters' Leases were not renewed in time: giving them up");
            self.give_up(lost, false).await;
        }
        if !held_but_late.is_empty() {
            self.give_up(held_but_late, true).await;
        }
    }

    /// Tries to take the Lease of each wanted cluster, all at once, and
    /// engages those it takes.
    async fn take(&mut self, wanted: Vec<ClusterName>, timeout: Duration) {
        let now = Instant::now();
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
    /// ended their Leases are released (if `release`) for the next owner.
    async fn give_up(&mut self, clusters: Vec<ClusterName>, release: bool) {
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
            drained.push(owned.validity);
        }
        let drain = join_all(drained.iter().map(|validity| validity.drained()));
        if tokio::time::timeout(self.timings.renew_deadline, drain)
            .await
            .is_err()
        {
            // Another replica must not start while they might run: the
            // Leases are left to expire rather than released.
            tracing::warn!(clusters = ?clusters, "reconciles still running after the renew deadline: their Leases are left to expire");
            return;
        }
        if !release {
            return;
        }
        let timeout = self.timings.request_timeout();
        let set: HashSet<&ClusterName> = clusters.iter().collect();
        let releases = self
            .fences
            .iter_mut()
            .filter(|(cluster, _)| set.contains(cluster))
            .map(|(cluster, lock)| async move {
                match tokio::time::timeout(timeout, lock.release()).await {
                    Ok(Ok(())) => {}
                    Ok(Err(error)) => {
                        tracing::warn!(%cluster, %error, "releasing the cluster's Lease")
                    }
                    Err(_) => {
                        tracing::warn!(%cluster, "releasing the cluster's Lease: no answer in time")
                    }
                }
            });
        join_all(releases).await;
    }

    /// Gives every cluster up and releases this replica's own Lease, so
    /// that the others take its clusters at once.
    async fn leave(&mut self) {
        let all: Vec<ClusterName> = self.owned.keys().cloned().collect();
        self.give_up(all, true).await;
        let timeout = self.timings.request_timeout();
        match tokio::time::timeout(timeout, self.me.release()).await {
            Ok(Ok(())) => tracing::info!(identity = %self.identity, "left the shards"),
            Ok(Err(error)) => tracing::warn!(%error, "releasing this replica's Lease"),
            Err(_) => tracing::warn!("releasing this replica's Lease: no answer in time"),
        }
    }

    /// The lock on `cluster`'s Lease.
    fn fence(&mut self, cluster: &ClusterName) -> &mut LeaseLock {
        self.fences.entry(cluster.clone()).or_insert_with(|| {
            LeaseLock::new(
                self.client.clone(),
                &self.namespace,
                &format!("{}-cluster-{}", self.set, short_hash(cluster.as_str())),
                &self.identity,
                self.timings.lease_duration,
            )
            .with_metadata(
                labels(&self.set, "cluster"),
                BTreeMap::from([(CLUSTER_ANNOTATION.to_owned(), cluster.to_string())]),
            )
        })
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
