//! Sharding a fleet's clusters across replicas: the settings, the hash that
//! assigns clusters, and what a replica owns.

use std::{
    collections::VecDeque,
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use kube_multicluster::{ClusterName, controller::ClusterSelector};
use tokio::time::Instant;

use crate::{error::Error, timing::LeaseParams};

/// Sharding for a [`Manager`](crate::Manager): the clusters its providers
/// offer are split across the replicas that share the name, each cluster
/// run by one replica at a time.
///
/// Each replica announces itself with a Lease `<name>-member-<hash>`
/// renewed every retry period. Clusters are hashed onto a fixed number of
/// [shards](Self::shards) (64 by default; [`shard_of`](Self::shard_of) says
/// which), and a shard goes to the live replica that ranks first for it by
/// rendezvous (highest random weight) hashing of the shard's number and the
/// replicas' names. So when a replica joins, only the shards it now ranks
/// first for move (about 1/N of them, with their clusters), and when one
/// leaves, only its shards move. Before it runs a shard's clusters, a
/// replica takes the shard's Lease `<name>-shard-<number>` (the fence), and
/// holds every reconcile in those clusters to its renew deadline, as
/// [`LeaderElection`](crate::LeaderElection) does for the whole process. A
/// shard that moves has its clusters disengaged on its old replica, their
/// reconciles stopped, and its fence released before the new replica may
/// take it; a replica that dies holds its fences until they expire. So a
/// cluster is never reconciled by two replicas at once. If
/// [`Manager::run`](crate::Manager::run)'s future is dropped, the replica's
/// reconciles stop at once and its stretches of ownership end there; its
/// Leases are left to expire, but for hand-overs already under way.
///
/// Only a shard that holds a cluster some provider offers has a Lease
/// (while a [hub](Self::hub) is offered, every shard), so
/// each retry period the coordination cluster sees one write per replica
/// and per occupied shard, however many clusters there are, plus the
/// writes of shards taken and handed over: 34 a second for four replicas
/// at the default 64 shards and retry period of 2 s. More shards spread
/// clusters more evenly across replicas and cost more writes. Every replica
/// of a set must be given the same number: a replica that sees a live one
/// announcing another number, or a replica of a release that fenced each
/// cluster with its own Lease, runs nothing, and says so, until it is gone.
///
/// Leases do not pile up: a replica that stops gracefully deletes its own
/// Lease, a Lease that has run out for ten times its duration (on the
/// observer's clock) is deleted by a live replica that sees it, at the
/// version it saw, unless it fences a shard that holds an offered cluster,
/// and a shard whose last cluster a provider removes has its Lease deleted
/// by the replica that ran it, once its reconciles have ended.
///
/// The Leases record a holder as the [identity](LeaseParams::identity), `_` and a
/// nonce drawn afresh each time the manager runs; the hash ranks replicas
/// by the identity alone. A replica restarted with its identity is given
/// the same shards, once its previous run's Leases have run out: it
/// holds a Lease only under its own whole holder string, so two processes
/// given one identity never both run a cluster.
///
/// Sharding replaces leader election: a manager takes one or the other
/// (both is an [`Error::Invalid`]), and without either every replica runs
/// every cluster. All clusters the providers offer are sharded, the local
/// one too, but for [hubs](Self::hub), which every replica runs with their
/// keys sharded.
///
/// Timings are those of leader election (lease 15 s, renew deadline 10 s,
/// retry 2 s by default). When a replica dies, its clusters run elsewhere
/// within the lease duration, two retry periods and the time the new
/// replica's watches take to sync.
///
/// A replica whose Lease ran out without its leaving, and that then renews
/// again, ranks for shards only once it has stayed for
/// [`rejoin_after`](Self::rejoin_after), so a replica that flaps does not
/// pull its shards back and forth. Every replica measures how the set
/// covers the shards from the Leases it lists ([`ShardStatus::coverage`],
/// exported as gauges to alert on; see the operations guide, "Coverage you
/// can alert on").
///
/// The Leases live in the cluster of [`client`](LeaseParams::client) (default:
/// the local one), in [`namespace`](LeaseParams::namespace) (default: the
/// client's own). Each replica lists them every retry period and renews its
/// own and its shards'.
///
/// ```
/// use kube_multicluster_manager::{LeaseParams, Sharding};
///
/// let sharding = Sharding::new("my-operator")
///     .lease(LeaseParams::default().namespace("operators").identity("replica-0"))
///     .shards(128);
/// assert!(sharding.validate().is_ok());
/// assert!(sharding.shard_of("east") < 128);
/// ```
#[derive(Clone)]
pub struct Sharding {
    pub(crate) name: String,
    pub(crate) lease: LeaseParams,
    pub(crate) shards: u32,
    pub(crate) status: ShardStatus,
    /// The hub clusters: run by every replica, their keys sharded.
    pub(crate) hubs: Option<ClusterSelector>,
    /// How long a replica back from a lapse waits before it ranks again;
    /// `None`: twice the lease duration.
    pub(crate) rejoin_after: Option<Duration>,
}

impl std::fmt::Debug for Sharding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sharding")
            .field("name", &self.name)
            .field("lease", &self.lease)
            .field("shards", &self.shards)
            .field("hubs", &self.hubs.is_some())
            .field("rejoin_after", &self.rejoin_wait())
            .finish_non_exhaustive()
    }
}

impl Sharding {
    /// Sharding among the replicas named `name`.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            lease: LeaseParams::default(),
            shards: DEFAULT_SHARDS,
            status: ShardStatus::default(),
            hubs: None,
            rejoin_after: None,
        }
    }

    /// How long a replica that was counted gone without leaving (its Lease
    /// ran out) and is back waits before it ranks for shards again
    /// (default twice the [lease duration](LeaseParams::lease_duration),
    /// 30 s; set before or after [`lease`](Self::lease)).
    ///
    /// Meanwhile the others keep running its shards, and it runs none, so
    /// a replica whose renews are late, then on time, then late (a
    /// starved node, a flaky network) moves its shards away once and back
    /// once it has been on time for this long, not at every lapse: each
    /// lapse starts the wait over. A replica that stops gracefully deletes
    /// its Lease and, restarted, ranks at once; so in a rolling restart of
    /// replicas with stable [identities](LeaseParams::identity) (a
    /// StatefulSet's pod names) each shard moves at most twice, away from
    /// its replica and back. A replica never holds itself back, only the
    /// others do: its own view of a lapse may differ from theirs (they may
    /// have missed it, forgotten its Lease, or lapsed too, as when the
    /// Leases' API server was out of reach of all), and one that held
    /// itself back while the others ranked it would leave its shards
    /// unrun. Meanwhile it takes only shards no one holds, and waits for
    /// the others' until they hand them over.
    ///
    /// ```
    /// use std::time::Duration;
    /// use kube_multicluster_manager::Sharding;
    ///
    /// let sharding = Sharding::new("my-operator").rejoin_after(Duration::from_secs(60));
    /// assert!(sharding.validate().is_ok());
    /// ```
    pub fn rejoin_after(mut self, wait: Duration) -> Self {
        self.rejoin_after = Some(wait);
        self
    }

    /// The wait of [`rejoin_after`](Self::rejoin_after), its default resolved.
    pub(crate) fn rejoin_wait(&self) -> Duration {
        self.rejoin_after
            .unwrap_or(self.lease.timings.lease_duration * 2)
    }

    /// Where the shards' Leases are kept and how they are held (default
    /// [`LeaseParams::default`]).
    pub fn lease(mut self, lease: LeaseParams) -> Self {
        self.lease = lease;
        self
    }

    /// Hub clusters: those `clusters` selects are run by every replica,
    /// and their objects' keys are sharded instead, over the same shards:
    /// a key in a hub runs on the replica that holds the Lease of
    /// [`shard_of_key`](Self::shard_of_key). Members are sharded by
    /// cluster as before. So a controller of parents in a hub that fans out
    /// to members has each parent served by one replica, while every
    /// replica runs its share of the members.
    ///
    /// Every replica engages the hubs and watches them whole; a replica
    /// skips the hub keys of shards it does not hold (the reconcile
    /// returns [`Action::await_change`](kube_multicluster::Action::await_change)
    /// without running) and, in a round in which it takes shards, queues
    /// every key its controllers know again, so those of its new shards
    /// run. While a hub is offered every shard has a Lease. Every replica
    /// must name the same hubs: one that sees a live replica that does not
    /// shard hubs by key (or does where it does not) runs nothing until they
    /// agree. A replica engages only the members it runs, so children in
    /// members are best written by a controller of the members (see the
    /// operations guide, "A hub sharded by key").
    ///
    /// ```
    /// use kube_multicluster::{ClusterName, controller::ClusterSelector};
    /// use kube_multicluster_manager::Sharding;
    ///
    /// let sharding = Sharding::new("my-operator")
    ///     .hub(ClusterSelector::matching(|name| *name == ClusterName::local()));
    /// assert!(sharding.shard_of_key(Some("default"), "parent-1") < 64);
    /// ```
    pub fn hub(mut self, clusters: ClusterSelector) -> Self {
        self.hubs = Some(clusters);
        self
    }

    /// The shard a key of a [hub](Self::hub) cluster falls in: that of
    /// `namespace/name` (`name` for a cluster-scoped object).
    pub fn shard_of_key(&self, namespace: Option<&str>, name: &str) -> u32 {
        key_shard(namespace, name, self.shards)
    }

    /// How many shards the clusters are hashed onto (default 64, at most
    /// 4096): each is fenced by one Lease, renewed every retry period while
    /// it holds a cluster. Every replica of the set must be given the same
    /// number.
    pub fn shards(mut self, shards: u32) -> Self {
        self.shards = shards;
        self
    }

    /// The shard `cluster` falls in, of [`shards`](Self::shards): its Lease
    /// is `<name>-shard-<shard>`.
    pub fn shard_of(&self, cluster: &str) -> u32 {
        shard_of(cluster, self.shards)
    }

    /// A live view of the clusters this replica owns, for logs, health
    /// checks and tests; the same handle before and while the manager runs.
    pub fn status(&self) -> ShardStatus {
        self.status.clone()
    }

    /// Checks the name and the timings, as [`LeaderElection::validate`](crate::LeaderElection::validate).
    pub fn validate(&self) -> Result<(), Error> {
        let what = format!("sharding {:?}", self.name);
        let valid_name = !self.name.is_empty()
            && self.name.len() <= 63
            && self
                .name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            && self.name.starts_with(|c: char| c.is_ascii_alphanumeric())
            && self.name.ends_with(|c: char| c.is_ascii_alphanumeric());
        if !valid_name {
            return Err(Error::Invalid {
                what,
                reason: "the name labels and starts the Leases' names: at most 63 lower-case letters, digits and '-', starting and ending with a letter or digit".into(),
            });
        }
        if !(1..=MAX_SHARDS).contains(&self.shards) {
            return Err(Error::Invalid {
                what,
                reason: format!(
                    "the number of shards ({}) must be from 1 to {MAX_SHARDS}",
                    self.shards
                ),
            });
        }
        self.lease.timings.validate(&what)
    }
}

/// Shards when none are given: at a retry period of 2 s, at most 32 Lease
/// writes a second for the shards, and about 16 shards per replica with
/// four replicas.
const DEFAULT_SHARDS: u32 = 64;

const MAX_SHARDS: u32 = 4096;

/// The shard of `cluster`, of `shards`.
pub(crate) fn shard_of(cluster: &str, shards: u32) -> u32 {
    (fnv(cluster.bytes()) % u64::from(shards.max(1))) as u32
}

/// The shard of the key `namespace/name` in a hub, of `shards`.
pub(crate) fn key_shard(namespace: Option<&str>, name: &str, shards: u32) -> u32 {
    match namespace {
        Some(namespace) => shard_of(&format!("{namespace}/{name}"), shards),
        None => shard_of(name, shards),
    }
}

/// The name a shard is ranked by.
pub(crate) fn shard_key(shard: u32) -> String {
    format!("shard-{shard}")
}

/// The rank of `replica` for `item` (a shard's key): of the live replicas,
/// the one with the highest rank runs it.
pub(crate) fn rank(item: &str, replica: &str) -> u64 {
    // Both names with a separator no name holds.
    fnv(item.bytes().chain([0]).chain(replica.bytes()))
}

/// The owner of `item` among `replicas`: the highest rank, the greater
/// name on a tie.
pub(crate) fn owner<'a>(
    item: &str,
    replicas: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    replicas
        .into_iter()
        .max_by_key(|replica| (rank(item, replica), *replica))
}

/// A short, stable hexadecimal name for `text`, for Lease names.
pub(crate) fn short_hash(text: &str) -> String {
    format!("{:016x}", fnv(text.bytes()))
}

/// FNV-1a over `bytes`, then a finalizer so that inputs that differ in one
/// byte hash far apart.
fn fnv(bytes: impl IntoIterator<Item = u8>) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in bytes {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    mix(hash)
}

fn mix(mut x: u64) -> u64 {
    x ^= x >> 30;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// One stretch of time in which a replica ran a cluster: from when it took
/// the Lease of the cluster's shard (or, holding it, engaged the cluster)
/// until its reconciles there were stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ownership {
    /// The cluster.
    pub cluster: ClusterName,
    /// When the replica started to run it, its shard's Lease held.
    pub from: Instant,
    /// When its reconciles there were stopped; `None` while it runs it.
    pub until: Option<Instant>,
    /// While it runs it: the renew deadline as of the last renew of the
    /// shard's Lease, past which no reconcile of the replica runs there
    /// unless it renews again. A replica that died stopped there.
    pub deadline: Instant,
}

/// What a sharded replica owns now, and the last stretches of ownership
/// (up to 1024); see [`Sharding::status`].
#[derive(Debug, Clone, Default)]
pub struct ShardStatus {
    inner: Arc<Mutex<StatusInner>>,
}

#[derive(Debug, Default)]
struct StatusInner {
    replicas: Vec<String>,
    assigned: Vec<ClusterName>,
    history: VecDeque<Ownership>,
    coverage: Coverage,
}

/// How the set's replicas cover the shards, as one replica saw the set's
/// Leases in its last round ([`ShardStatus::coverage`]), and exported as
/// the gauges `kube_multicluster_shards_unowned`,
/// `kube_multicluster_shards_misplaced`,
/// `kube_multicluster_shards_unowned_clusters` and
/// `kube_multicluster_shards_unowned_seconds`.
///
/// Only shards that hold a cluster some provider offers count (with a
/// [hub](Sharding::hub) offered, every shard). Every replica measures it
/// from the Leases it lists anyway, so each tells the whole set's
/// coverage, not only its own; alert on the highest value any replica
/// reports.
///
/// A shard is unowned from when its Lease is released, deleted, or runs
/// out on this replica's clock, until a replica takes it: briefly at each
/// hand-over (up to a retry period and a request), and after a replica
/// dies without leaving, up to two rounds (each a retry period, its
/// jitter and a request's timeout) once its Lease has run out.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Coverage {
    /// The shards that hold an offered cluster.
    pub shards: usize,
    /// Those whose Lease no live replica holds: nobody runs their
    /// clusters.
    pub unowned: Vec<u32>,
    /// Those whose Lease is held by a replica that does not rank first for
    /// them among the replicas that rank: moving to another, or stuck.
    pub misplaced: Vec<u32>,
    /// The offered clusters in the unowned shards.
    pub clusters_unowned: usize,
    /// Since when the shard unowned the longest has been unowned, on this
    /// replica's clock: since its Lease was released or deleted, or ran
    /// out as this replica saw it (a dead holder's reconciles there stopped
    /// earlier, at its renew deadline).
    pub unowned_since: Option<Instant>,
    /// When the Leases this was measured from were listed; `None` before
    /// the first list.
    pub measured: Option<Instant>,
}

impl Coverage {
    /// How long the shard unowned the longest had been unowned when this
    /// was [measured](Self::measured); zero when every shard was owned. A
    /// replica that cannot list the Leases reports what it saw last, not a
    /// gap that grows on its own.
    pub fn unowned_for(&self) -> Duration {
        match (self.unowned_since, self.measured) {
            (Some(since), Some(measured)) => measured.saturating_duration_since(since),
            _ => Duration::ZERO,
        }
    }
}

const HISTORY: usize = 1024;

impl ShardStatus {
    fn lock(&self) -> MutexGuard<'_, StatusInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The clusters this replica runs now, by name.
    pub fn owned(&self) -> Vec<ClusterName> {
        let mut owned: Vec<ClusterName> = self
            .lock()
            .history
            .iter()
            .filter(|o| o.until.is_none())
            .map(|o| o.cluster.clone())
            .collect();
        owned.sort();
        owned
    }

    /// The live replicas this replica saw last, itself included, by
    /// identity.
    pub fn replicas(&self) -> Vec<String> {
        self.lock().replicas.clone()
    }

    /// The clusters whose shards this replica ranks first for among the
    /// live replicas, as of its last look: those it should run. They differ
    /// from [`owned`](Self::owned) while shards move, until the Lease of
    /// each is handed over.
    pub fn assigned(&self) -> Vec<ClusterName> {
        self.lock().assigned.clone()
    }

    /// The last stretches of ownership, oldest first.
    pub fn history(&self) -> Vec<Ownership> {
        self.lock().history.iter().cloned().collect()
    }

    /// How the set covers the shards, as this replica saw it last.
    pub fn coverage(&self) -> Coverage {
        self.lock().coverage.clone()
    }

    pub(crate) fn set_coverage(&self, coverage: Coverage) {
        self.lock().coverage = coverage;
    }

    pub(crate) fn set_replicas(&self, replicas: Vec<String>) {
        self.lock().replicas = replicas;
    }

    pub(crate) fn set_assigned(&self, mut assigned: Vec<ClusterName>) {
        assigned.sort();
        self.lock().assigned = assigned;
    }

    pub(crate) fn took(&self, cluster: &ClusterName, from: Instant, deadline: Instant) {
        let mut inner = self.lock();
        // Stretches that have ended go first when the history is full.
        while inner.history.len() >= HISTORY {
            match inner.history.iter().position(|o| o.until.is_some()) {
                Some(ended) => {
                    inner.history.remove(ended);
                }
                None => break,
            }
        }
        inner.history.push_back(Ownership {
            cluster: cluster.clone(),
            from,
            until: None,
            deadline,
        });
    }

    /// A shard's Lease was renewed: the new deadline of its `clusters`.
    pub(crate) fn renewed_all(
        &self,
        clusters: &std::collections::HashSet<ClusterName>,
        deadline: Instant,
    ) {
        for open in self
            .lock()
            .history
            .iter_mut()
            .filter(|o| o.until.is_none() && clusters.contains(&o.cluster))
        {
            open.deadline = deadline;
        }
    }

    /// The replica stopped at `until`: it owns nothing and sees no one.
    pub(crate) fn stopped(&self, until: Instant) {
        let mut inner = self.lock();
        inner.replicas.clear();
        inner.assigned.clear();
        inner.coverage = Coverage::default();
        for open in inner.history.iter_mut().filter(|o| o.until.is_none()) {
            open.until = Some(until.min(open.deadline));
        }
    }

    pub(crate) fn gave_up(&self, cluster: &ClusterName, until: Instant) {
        let mut inner = self.lock();
        if let Some(open) = inner
            .history
            .iter_mut()
            .rev()
            .find(|o| o.cluster == *cluster && o.until.is_none())
        {
            open.until = Some(until);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::{owner, shard_key, shard_of, short_hash};

    #[test]
    fn a_joining_replica_takes_only_clusters_from_others_and_about_its_share() {
        let clusters: Vec<String> = (0..3000).map(|i| format!("cluster-{i}")).collect();
        let three = ["replica-a", "replica-b", "replica-c"];
        let four = ["replica-a", "replica-b", "replica-c", "replica-d"];
        let before: HashMap<&str, &str> = clusters
            .iter()
            .map(|c| (c.as_str(), owner(c, three).unwrap()))
            .collect();
        let mut moved = 0;
        for cluster in &clusters {
            let now = owner(cluster, four).unwrap();
            if now != before[cluster.as_str()] {
                assert_eq!(now, "replica-d", "{cluster} moved between old replicas");
                moved += 1;
            }
        }
        // About a quarter: 750 expected.
        assert!((650..=850).contains(&moved), "{moved} of 3000 moved");
        // Balanced across the three before.
        for replica in three {
            let owned = before.values().filter(|o| **o == replica).count();
            assert!((900..=1100).contains(&owned), "{replica} owns {owned}");
        }
    }

    #[test]
    fn a_departing_replica_gives_only_its_own_clusters_away() {
        let clusters: Vec<String> = (0..300).map(|i| format!("c{i}")).collect();
        for cluster in &clusters {
            let before = owner(cluster, ["a", "b", "c"]).unwrap();
            let after = owner(cluster, ["a", "b"]).unwrap();
            if before != "c" {
                assert_eq!(before, after);
            }
        }
        assert_eq!(owner("x", []), None);
    }

    #[test]
    fn clusters_move_with_their_shards_and_a_joining_replica_takes_about_its_share() {
        let clusters: Vec<String> = (0..2000).map(|i| format!("workload-{i}")).collect();
        let owner_of = |cluster: &str, replicas: &[&'static str]| {
            owner(&shard_key(shard_of(cluster, 64)), replicas.iter().copied()).unwrap()
        };
        let three = ["replica-0", "replica-1", "replica-2"];
        let four = ["replica-0", "replica-1", "replica-2", "replica-3"];
        let mut moved = 0;
        let mut per_replica: HashMap<&str, usize> = HashMap::new();
        for cluster in &clusters {
            let before = owner_of(cluster, &three);
            let after = owner_of(cluster, &four);
            *per_replica.entry(after).or_default() += 1;
            if before != after {
                assert_eq!(after, "replica-3", "{cluster} moved between old replicas");
                moved += 1;
            }
        }
        // A quarter would be 500; shards move whole, 64 of them.
        assert!((300..=700).contains(&moved), "{moved} of 2000 moved");
        // Each of the four runs some, none more than twice its share.
        for replica in four {
            let owned = per_replica.get(replica).copied().unwrap_or(0);
            assert!((250..=1000).contains(&owned), "{replica} owns {owned}");
        }
        // Clusters spread over the shards.
        let mut per_shard = [0usize; 64];
        for cluster in &clusters {
            per_shard[shard_of(cluster, 64) as usize] += 1;
        }
        assert!(
            per_shard.iter().all(|n| (10..=60).contains(n)),
            "{per_shard:?}"
        );
        println!("moved {moved}, per replica {per_replica:?}");
    }

    #[test]
    fn lease_names_are_stable_and_short() {
        assert_eq!(short_hash("east"), short_hash("east"));
        assert_ne!(short_hash("east"), short_hash("west"));
        assert_eq!(
            short_hash("a/very/long/cluster/name/with+context").len(),
            16
        );
    }
}
