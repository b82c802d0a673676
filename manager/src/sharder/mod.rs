//! The loop of a sharded replica: announces it, watches the others, and
//! engages in the fleet the clusters of the shards it ranks first for and
//! holds the Leases of.
//!
//! One file on purpose: it is one state machine, `Sharder`, whose two
//! halves share every field. A round (`round`, `read_leases`) decides from
//! the Leases which shards this replica holds, and the offers (`offer`,
//! `run_cluster`, `stop_cluster`) engage or stop clusters by what the last
//! round decided; each half reads what the other writes (the shards owned,
//! their fences, the clusters offered). Split by half, both files would
//! write the same fields. What stands apart does: the fences renewed with
//! each round (`fences`).

mod coverage;
mod fences;
mod rejoins;

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    sync::Arc,
    time::Duration,
};

use futures::{FutureExt, StreamExt, future::join_all, stream::BoxStream};
use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, Client, api::ListParams};
use kube_multicluster::{ClusterName, Fleet, provider::ClusterEvent};
use tokio::{sync::watch, task::JoinHandle, time::Instant};
use tokio_util::sync::CancellationToken;

use crate::{
    error::Error,
    gate::{Hubs, Shards, Validity, lock},
    lease::{Holder, LeaseLock, Observed, holder_for, identity_of},
    shard::{ShardStatus, owner, shard_key, shard_of, short_hash},
    timing::Timings,
};
use coverage::{Fenced, Gaps};
use fences::renew_fences;
pub(crate) use rejoins::Rejoins;

const SET_LABEL: &str = kube_multicluster::prefixed!("shards");
const KIND_LABEL: &str = kube_multicluster::prefixed!("lease");
/// On a shard's Lease: its number.
const SHARD_ANNOTATION: &str = kube_multicluster::prefixed!("shard");
/// On a replica's and a shard's Lease: how many shards the replica counts.
const COUNT_ANNOTATION: &str = kube_multicluster::prefixed!("shard-count");

/// Provider events this close together start one round.
const DEBOUNCE: Duration = Duration::from_millis(100);

/// A replica Lease that has run out for this many times its duration is
/// deleted: its replica is gone, not merely slow.
const FORGOTTEN_AFTER: u32 = 10;

/// A shard this replica runs.
struct Owned {
    validity: Arc<Validity>,
    until: Instant,
    /// When the last renew of its Lease that went through began.
    renewed: Instant,
    /// The offered clusters in it, each engaged in the fleet.
    clusters: HashSet<ClusterName>,
}

/// What becomes of a shard's Lease when this replica stops running the
/// shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fence {
    /// Left to run out: the replica no longer knows that it holds it.
    Expire,
    /// Released once the reconciles there have ended, for the next owner
    /// to take at once.
    Release,
    /// Deleted once the reconciles there have ended: no provider offers a
    /// cluster in the shard.
    Delete,
}

pub(crate) struct Sharder {
    fleet: Fleet,
    leases: Api<Lease>,
    client: Client,
    namespace: String,
    set: String,
    /// How many shards the clusters are hashed onto.
    count: u32,
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
    /// The live replicas that rank for shards, once a list of the Leases
    /// has been read.
    live: Option<Vec<String>>,
    /// Other replicas back from a lapse, not ranked yet.
    rejoins: Rejoins,
    /// The shards without a live owner, since when.
    gaps: Gaps,
    /// A live replica that counts another number of shards (or of a
    /// release that fenced each cluster), and its count, as last listed:
    /// while there is one, this replica runs nothing.
    disagrees: Option<(String, String)>,
    /// Whether the last list showed this replica's own Lease under this
    /// run's holder: a list served after its own write, which shows any
    /// replica that wrote before it, as that replica's lists show this one.
    listed: bool,
    fences: HashMap<u32, LeaseLock>,
    offered: HashMap<ClusterName, ClusterEvent>,
    owned: HashMap<u32, Owned>,
    /// Shards given up whose reconciles are draining and whose Leases are
    /// then released or deleted, off the loop; not taken again until done.
    ending: HashMap<u32, JoinHandle<()>>,
    /// Leases of the set that fence nothing offered, as last listed: once
    /// run out for long, nobody will release or delete them but this.
    strays: HashMap<String, Observed>,
    /// The hub clusters, run here whatever the shards, and the validity of
    /// each shard held, for their keys.
    hubs: Option<Hubs>,
    /// The hub clusters offered now.
    hubs_offered: HashSet<ClusterName>,
    /// Bumped each round this replica takes shards while a hub is offered:
    /// its controllers queue every key again, so the hub keys of the new
    /// shards run.
    taken: watch::Sender<u64>,
}

impl Sharder {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        fleet: Fleet,
        client: Client,
        namespace: String,
        set: String,
        count: u32,
        identity: String,
        timings: Timings,
        shards: Shards,
        status: ShardStatus,
        rejoins: Rejoins,
        (hubs, taken): (Option<Hubs>, watch::Sender<u64>),
    ) -> Self {
        let holder = holder_for(&identity);
        let me = LeaseLock::new(
            client.clone(),
            &namespace,
            &format!("{set}-member-{}", short_hash(&identity)),
            &holder,
            timings.lease_duration,
        )
        .with_metadata(
            labels(&set, "member"),
            BTreeMap::from([(COUNT_ANNOTATION.to_owned(), counted(count, hubs.is_some()))]),
        );
        Self {
            fleet,
            leases: Api::namespaced(client.clone(), &namespace),
            client,
            namespace,
            set,
            count,
            identity,
            holder,
            timings,
            shards,
            status,
            me,
            me_until: None,
            replicas: HashMap::new(),
            live: None,
            rejoins,
            gaps: Gaps::default(),
            disagrees: None,
            listed: false,
            fences: HashMap::new(),
            offered: HashMap::new(),
            owned: HashMap::new(),
            ending: HashMap::new(),
            strays: HashMap::new(),
            hubs,
            hubs_offered: HashSet::new(),
            taken,
        }
    }

    /// Whether `cluster` is a hub.
    fn is_hub(&self, cluster: &ClusterName) -> bool {
        self.hubs
            .as_ref()
            .is_some_and(|h| h.clusters.selects(cluster))
    }

    /// The shard of `cluster`.
    fn shard(&self, cluster: &ClusterName) -> u32 {
        shard_of(cluster.as_str(), self.count)
    }

    /// Runs until `stop`, then gives every shard up and leaves.
    pub(crate) async fn run(
        mut self,
        mut providers: BoxStream<'static, ClusterEvent>,
        stop: CancellationToken,
    ) -> Result<(), Error> {
        tracing::info!(shards = %self.set, count = self.count, holder = %self.holder, namespace = %self.namespace, "sharding");
        let mut next = Instant::now();
        let mut last = next;
        let mut early = false;
        let mut offers_open = true;
        loop {
            tokio::select! {
                biased;
                () = stop.cancelled() => break,
                // The timer before the providers: however many events they
                // send, the Leases are renewed on time.
                _ = tokio::time::sleep_until(next) => {
                    last = Instant::now();
                    self.round(std::mem::take(&mut early)).await;
                    next = last + self.timings.retry_period;
                    // A round that outlasted the retry period leaves the
                    // timer ready at once: take in what the providers sent
                    // meanwhile first, or a slow server would starve them.
                    while offers_open {
                        match providers.next().now_or_never() {
                            Some(Some(event)) => {
                                self.offer(event);
                            }
                            Some(None) => offers_open = false,
                            None => break,
                        }
                    }
                }
                event = providers.next(), if offers_open => match event {
                    Some(event) => {
                        if self.offer(event) {
                            // Events close together start one round, and
                            // a provider that never stops changing starts
                            // at most two per retry period.
                            let soon = (Instant::now() + DEBOUNCE)
                                .max(last + self.timings.retry_period / 2);
                            if soon < next {
                                next = soon;
                                early = true;
                            }
                        }
                    }
                    None => offers_open = false,
                },
            }
        }
        self.leave().await;
        Ok(())
    }

    /// Takes in a provider's event; true if a round should run soon: a
    /// shard may be taken, or given up.
    fn offer(&mut self, event: ClusterEvent) -> bool {
        let name = match &event {
            ClusterEvent::Engage { name, .. }
            | ClusterEvent::EngageView { name, .. }
            | ClusterEvent::Disengage { name } => name.clone(),
        };
        if self.is_hub(&name) {
            // Run here whatever the shards: engaged, or let go, at once.
            let first = match &event {
                ClusterEvent::Disengage { .. } => {
                    self.hubs_offered.remove(&name) && self.hubs_offered.is_empty()
                }
                _ => self.hubs_offered.insert(name.clone()) && self.hubs_offered.len() == 1,
            };
            engage(&self.fleet, event);
            if let Some(hubs) = &self.hubs {
                let mut held = lock(&hubs.shards);
                if self.hubs_offered.is_empty() {
                    held.clear();
                } else if first {
                    // The shards held already hold hub keys from now on.
                    for (shard, owned) in &self.owned {
                        held.insert(*shard, owned.validity.clone());
                    }
                    drop(held);
                    if !self.owned.is_empty() {
                        self.taken.send_modify(|n| *n += 1);
                    }
                }
            }
            // The first hub makes every shard wanted, the last one leaves
            // those without members to be deleted.
            return first;
        }
        match &event {
            ClusterEvent::Engage { name, .. } | ClusterEvent::EngageView { name, .. } => {
                let name = name.clone();
                let shard = self.shard(&name);
                self.offered.insert(name.clone(), event.clone());
                let Some(owned) = self.owned.get_mut(&shard) else {
                    return true;
                };
                // A cluster of a shard it runs: engaged at once, or anew
                // with its new client.
                if !owned.clusters.insert(name.clone()) {
                    engage(&self.fleet, event);
                    return false;
                }
                let (validity, until) = (owned.validity.clone(), owned.until);
                self.run_cluster(&name, &validity, Instant::now(), until);
                tracing::info!(cluster = %name, shard, "running the cluster");
                false
            }
            ClusterEvent::Disengage { name } => {
                let name = name.clone();
                let shard = self.shard(&name);
                self.offered.remove(&name);
                let Some(owned) = self.owned.get_mut(&shard) else {
                    return false;
                };
                if !owned.clusters.remove(&name) {
                    return false;
                }
                let (until, emptied) = (Instant::now().min(owned.until), owned.clusters.is_empty());
                // The shard's Lease stays held: no other replica runs the
                // cluster while its reconciles here stop.
                self.stop_cluster(&name, until);
                // A shard left empty has its Lease deleted in a round.
                emptied
            }
        }
    }

    /// Runs `cluster` from `from` under its shard's `validity`, good until
    /// `until`: its reconciles may run, and the fleet engages it as offered.
    fn run_cluster(
        &self,
        cluster: &ClusterName,
        validity: &Arc<Validity>,
        from: Instant,
        until: Instant,
    ) {
        lock(&self.shards).insert(cluster.clone(), validity.clone());
        self.status.took(cluster, from, until);
        if let Some(event) = self.offered.get(cluster).cloned() {
            engage(&self.fleet, event);
        }
    }

    /// Stops running `cluster`, its stretch of ownership ending at `until`:
    /// no reconcile starts there, and the fleet disengages it.
    fn stop_cluster(&self, cluster: &ClusterName, until: Instant) {
        lock(&self.shards).remove(cluster);
        self.status.gave_up(cluster, until);
        self.fleet.disengage(cluster);
    }

    /// The offered clusters, by shard: the shards that hold one are those
    /// with a Lease to take or keep.
    fn offered_by_shard(&self) -> HashMap<u32, HashSet<ClusterName>> {
        let mut by_shard: HashMap<u32, HashSet<ClusterName>> = HashMap::new();
        if !self.hubs_offered.is_empty() {
            // Keys of a hub fall in every shard.
            for shard in 0..self.count {
                by_shard.insert(shard, HashSet::new());
            }
        }
        for cluster in self.offered.keys() {
            by_shard
                .entry(self.shard(cluster))
                .or_default()
                .insert(cluster.clone());
        }
        by_shard
    }

    /// One pass: renew its own Lease, read the others', renew the shards
    /// it runs, give up those it should not run, take those it should, and
    /// delete the Leases of replicas gone for long. A round a provider's
    /// event brought forward (`early`) renews only the shards that need it.
    async fn round(&mut self, early: bool) {
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
                self.timings,
                early
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
        // No shard runs past this replica's own deadline: a replica of
        // another count or release, which no shard Lease fences from this
        // one, counts it gone once its own Lease runs out.
        let me_until = self.me_until.unwrap_or(start);
        for owned in self.owned.values_mut() {
            if owned.until > me_until {
                owned.until = me_until;
                owned.validity.open_until(me_until);
                self.status.renewed_all(&owned.clusters, me_until);
            }
        }
        // What the providers offer does not change during a round.
        let mut offered = self.offered_by_shard();
        match listed {
            Ok(Ok(list)) => self.read_leases(&list.items, &offered),
            Ok(Err(error)) => tracing::warn!(%error, "listing the replicas' Leases"),
            Err(_) => tracing::warn!(?timeout, "listing the replicas' Leases: no answer in time"),
        }
        for fence in [Fence::Expire, Fence::Release] {
            let shards: Vec<u32> = ended
                .iter()
                .filter(|(_, f)| *f == fence)
                .map(|(shard, _)| *shard)
                .collect();
            if !shards.is_empty() {
                tracing::warn!(
                    ?shards,
                    "the shards' Leases were not renewed in time: giving them up"
                );
                self.give_up(shards, fence).await;
            }
        }

        let alive = self.me_until.is_some_and(|until| Instant::now() < until);
        let Some(live) = self
            .live
            .clone()
            .filter(|_| alive && self.listed && self.disagrees.is_none())
        else {
            self.status.set_assigned(Vec::new());
            if !self.owned.is_empty() {
                if !alive {
                    tracing::warn!("this replica's own Lease is not renewed: giving its shards up");
                }
                let all: Vec<u32> = self.owned.keys().copied().collect();
                self.give_up(all, Fence::Release).await;
            }
            return;
        };
        let mine = |shard: u32| {
            owner(&shard_key(shard), live.iter().map(String::as_str))
                == Some(self.identity.as_str())
        };
        self.status.set_assigned(
            offered
                .iter()
                .filter(|(shard, _)| mine(**shard))
                .flat_map(|(_, clusters)| clusters.iter().cloned())
                .collect(),
        );
        let (moving, emptied): (Vec<u32>, Vec<u32>) = self
            .owned
            .keys()
            .copied()
            .filter(|shard| !offered.contains_key(shard) || !mine(*shard))
            .partition(|shard| offered.contains_key(shard));
        offered.retain(|shard, _| !self.owned.contains_key(shard) && mine(*shard));
        let wanted = offered;
        if !moving.is_empty() {
            tracing::info!(shards = ?moving, replicas = ?live, "handing shards over");
            self.give_up(moving, Fence::Release).await;
        }
        if !emptied.is_empty() {
            self.give_up(emptied, Fence::Delete).await;
        }
        self.take(wanted, timeout).await;
        self.forget_departed(timeout).await;
    }

    /// Takes in a list of the set's Leases: which replicas live and how
    /// many shards they count, and every Lease's record of a shard it may
    /// take, so that one whose holder died is known to have expired as
    /// soon as it has.
    fn read_leases(&mut self, leases: &[Lease], offered: &HashMap<u32, HashSet<ClusterName>>) {
        let now = Instant::now();
        let count = counted(self.count, self.hubs.is_some());
        let mut replicas = HashMap::new();
        let mut strays = HashMap::new();
        let mut earlier = None;
        // How each offered shard's Lease stands; those this replica runs
        // are known from its own writes.
        let mut fenced: HashMap<u32, Fenced> = self
            .owned
            .keys()
            .map(|shard| (*shard, Fenced::By(self.identity.clone())))
            .collect();
        for lease in leases {
            let name = lease.metadata.name.clone().unwrap_or_default();
            let labels = lease.metadata.labels.as_ref();
            let kind = labels.and_then(|l| l.get(KIND_LABEL)).map(String::as_str);
            let annotation = |key: &str| {
                lease
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(key))
                    .map(String::as_str)
            };
            match kind {
                Some("member") => {
                    let seen = Observed::of(lease, self.replicas.get(&name), now);
                    replicas.insert(name, seen);
                    continue;
                }
                // A replica of a release that fenced each cluster: it
                // counts this one among its peers and runs its own share,
                // so while it lives this replica runs nothing; once run
                // out, its Lease is swept.
                Some("replica") => {
                    let seen = Observed::of(lease, self.strays.get(&name), now);
                    if seen.runs_out() > now
                        && let Some(holder) = seen.holder()
                    {
                        earlier.get_or_insert_with(|| identity_of(holder).to_owned());
                    }
                    strays.insert(name, seen);
                    continue;
                }
                _ => {}
            }
            // A shard of this count that holds an offered cluster: its
            // Lease is one to take. The Lease of a shard it runs is known
            // from its own writes, which this list may predate.
            let shard = (kind == Some("shard") && annotation(COUNT_ANNOTATION) == Some(&count))
                .then(|| annotation(SHARD_ANNOTATION)?.parse::<u32>().ok())
                .flatten()
                .filter(|shard| offered.contains_key(shard));
            match shard {
                Some(shard) => {
                    if !self.owned.contains_key(&shard) {
                        let fence = self.fence(shard);
                        fence.saw(lease, now);
                        if let Some(seen) = fence.seen()
                            && let Some(holder) = seen.holder()
                        {
                            let stands = if seen.runs_out() > now {
                                Fenced::By(identity_of(holder).to_owned())
                            } else {
                                Fenced::RanOut(seen.runs_out())
                            };
                            fenced.insert(shard, stands);
                        }
                    }
                }
                // Any other Lease of the set: an empty shard's, another
                // count's, or one of a cluster from before shards.
                None => {
                    let seen = Observed::of(lease, self.strays.get(&name), now);
                    strays.insert(name, seen);
                }
            }
        }
        self.replicas = replicas;
        self.strays = strays;
        let mut listed = HashSet::new();
        for seen in self.replicas.values() {
            if let Some(holder) = seen.holder()
                && holder != self.holder
            {
                let identity = identity_of(holder);
                listed.insert(identity.to_owned());
                if identity != self.identity {
                    self.rejoins.saw(identity, seen.runs_out() > now, now);
                }
            }
        }
        self.rejoins.keep_only(&listed);
        let live: Vec<&Observed> = self
            .replicas
            .values()
            .filter(|seen| seen.runs_out() > now)
            .filter(|seen| seen.holder().is_some())
            .collect();
        self.listed = live
            .iter()
            .any(|seen| seen.holder() == Some(self.holder.as_str()));
        let disagrees = live
            .iter()
            .filter(|seen| seen.holder() != Some(self.holder.as_str()))
            .find(|seen| seen.annotation(COUNT_ANNOTATION) != Some(&count))
            .map(|seen| {
                (
                    identity_of(seen.holder().unwrap_or_default()).to_owned(),
                    seen.annotation(COUNT_ANNOTATION)
                        .unwrap_or("none")
                        .to_owned(),
                )
            })
            .or_else(|| earlier.map(|replica| (replica, "one per cluster".to_owned())));
        if disagrees.is_some() && disagrees != self.disagrees {
            let (replica, theirs) = disagrees.clone().unwrap_or_default();
            tracing::error!(
                %replica,
                shards = %theirs,
                mine = self.count,
                "a live replica of the set counts another number of shards, or shards hubs otherwise: this replica runs nothing until they agree"
            );
        }
        self.disagrees = disagrees;
        let mut live: Vec<String> = live
            .into_iter()
            .filter_map(|seen| seen.holder())
            .map(|holder| identity_of(holder).to_owned())
            .collect();
        if !live.contains(&self.identity) {
            live.push(self.identity.clone());
        }
        live.sort();
        live.dedup();
        // This replica ranks itself whatever the others make of it.
        let ranked: Vec<String> = live
            .iter()
            .filter(|replica| **replica == self.identity || self.rejoins.ranks(replica, now))
            .cloned()
            .collect();
        if ranked.len() < live.len() {
            let waiting: Vec<&String> = live.iter().filter(|r| !ranked.contains(r)).collect();
            tracing::debug!(?waiting, "replicas back from a lapse, not ranked yet");
        }
        tracing::debug!(listed = leases.len(), ?live, ?ranked, "replicas");
        self.status.set_replicas(live);
        let coverage = self.gaps.measure(offered, &fenced, &ranked, now);
        if !coverage.unowned.is_empty() || !coverage.misplaced.is_empty() {
            tracing::debug!(unowned = ?coverage.unowned, for_ = ?coverage.unowned_for(), misplaced = ?coverage.misplaced, "shards without a live owner or held by a replica that does not rank first");
        }
        self.status.set_coverage(coverage);
        self.live = Some(ranked);
    }

    /// Deletes the Leases of replicas, and those that fence nothing
    /// offered, that ran out long ago, on this replica's clock, each at the
    /// version seen: a replica that has come back, or a shard taken again,
    /// has written its Lease since, and keeps it.
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

/// What a replica's and a shard's Leases say it counts: the number of
/// shards, and whether it shards hubs by key. Replicas that say otherwise
/// run nothing beside each other: one that runs a hub as a cluster and one
/// that shards its keys would both run a hub key.
pub(super) fn counted(count: u32, hubs: bool) -> String {
    if hubs {
        format!("{count}, hubs by key")
    } else {
        count.to_string()
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
