//! Shard coverage under faults, on a real API server: replicas killed,
//! frozen and flapping (their link to the Leases' API server hung, or cut
//! and restored again and again) never run a cluster two at a time, leave
//! none unowned past the bound `Coverage` documents, and say so in their
//! coverage; a replica that flaps moves its clusters away once and back
//! once, and a rolling restart moves each at most twice.
//!
//! Test timings: a lease of 4 s, a renew deadline of 3 s, a retry period
//! of 1 s (up to 1.2 s with jitter), a request timeout of 1.5 s. The
//! clusters are names for one API server, which also holds the Leases;
//! each replica reaches the Leases through a link of its own.

mod support;

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{Arc, Mutex},
    time::Duration,
};

use kube_multicluster_envtest::{Envtest, FaultyLink};
use kube_multicluster_manager::{Ownership, ShardStatus, Sharding};
use support::{
    LEASE, PATIENCE, RENEW_DEADLINE, RETRY, Records, Replica, assert_no_overlap, config_maps,
    lease_params,
};
use tokio::{sync::oneshot, task::JoinHandle, time::Instant};

const REJOIN: Duration = Duration::from_secs(8);
const CLUSTERS: usize = 12;

/// How long a cluster may be without an owner: from the end of its
/// owner's last stretch (its renew deadline, if it died) until another
/// replica takes its shard: the lease duration less the renew deadline,
/// and two rounds of a retry period (with jitter) and a request's
/// timeout. With a second to spare for the test machine.
fn bound() -> Duration {
    let round = RETRY.mul_f64(1.2) + Duration::from_millis(1500);
    LEASE - RENEW_DEADLINE + round * 2 + Duration::from_secs(1)
}

fn clusters() -> Vec<String> {
    (0..CLUSTERS).map(|i| format!("w{i}")).collect()
}

/// A replica that reaches the Leases through a link of its own.
struct Linked {
    replica: Replica,
    link: FaultyLink,
}

impl std::ops::Deref for Linked {
    type Target = Replica;

    fn deref(&self) -> &Replica {
        &self.replica
    }
}

impl Linked {
    /// Replica `name` of the set `set`, offered every cluster.
    fn start(set: &str, name: &str, env: &Envtest, records: &Records) -> Self {
        let cluster = &env.clusters()[0];
        let link = cluster.link().expect("a link");
        let sharding = Sharding::new(set)
            .lease(lease_params(name, link.client()))
            .rejoin_after(REJOIN);
        let replica = Replica::start(
            sharding,
            name,
            &clusters(),
            &cluster.client(),
            "covered",
            records,
        );
        Self { replica, link }
    }
}

/// Waits until every cluster is owned by exactly one of `replicas`, each
/// sees them all and ranks them all, and each says every shard is covered.
async fn settled(replicas: &[&Linked]) -> BTreeMap<String, String> {
    let deadline = Instant::now() + PATIENCE * 2;
    let mut names: Vec<String> = replicas.iter().map(|r| r.name.clone()).collect();
    names.sort();
    loop {
        let mut owners: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for replica in replicas {
            for cluster in replica.status.owned() {
                owners
                    .entry(cluster.to_string())
                    .or_default()
                    .push(replica.name.clone());
            }
        }
        let agreed = replicas
            .iter()
            .all(|r| r.status.replicas() == names && r.status.owned() == r.status.assigned());
        let covered = replicas.iter().all(|r| {
            let c = r.status.coverage();
            c.unowned.is_empty() && c.misplaced.is_empty() && c.clusters_unowned == 0
        });
        if agreed && covered && owners.len() == CLUSTERS && owners.values().all(|o| o.len() == 1) {
            return owners
                .into_iter()
                .map(|(c, mut o)| (c, o.remove(0)))
                .collect();
        }
        let coverage: Vec<_> = replicas.iter().map(|r| r.status.coverage()).collect();
        assert!(
            Instant::now() < deadline,
            "not settled: {owners:?}, coverage: {coverage:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The coverage every live replica reported, sampled while faults ran.
#[derive(Debug, Default)]
struct Samples {
    /// The longest gap any replica reported.
    longest: Duration,
    /// The most clusters any replica reported unowned at once.
    most_unowned: usize,
    /// Whether any replica reported a shard misplaced.
    misplaced: bool,
}

/// Samples the coverage of `statuses` every 100 ms until told to stop.
fn sample(statuses: Arc<Mutex<Vec<ShardStatus>>>) -> (oneshot::Sender<()>, JoinHandle<Samples>) {
    let (stop, mut stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let mut samples = Samples::default();
        loop {
            for status in statuses.lock().unwrap().iter() {
                let coverage = status.coverage();
                samples.longest = samples.longest.max(coverage.unowned_for());
                samples.most_unowned = samples.most_unowned.max(coverage.clusters_unowned);
                samples.misplaced |= !coverage.misplaced.is_empty();
            }
            tokio::select! {
                _ = &mut stopped => return samples,
                () = tokio::time::sleep(Duration::from_millis(100)) => {}
            }
        }
    });
    (stop, task)
}

/// Each cluster's stretches of ownership, of every replica, in order.
fn stretches(histories: &[(String, Vec<Ownership>)]) -> BTreeMap<String, Vec<(String, Ownership)>> {
    let mut by_cluster: BTreeMap<String, Vec<(String, Ownership)>> = BTreeMap::new();
    for (replica, history) in histories {
        for stretch in history {
            by_cluster
                .entry(stretch.cluster.to_string())
                .or_default()
                .push((replica.clone(), stretch.clone()));
        }
    }
    for stretches in by_cluster.values_mut() {
        stretches.sort_by_key(|(_, s)| s.from);
    }
    by_cluster
}

/// Asserts, for each cluster between `from` and `to`, that no two
/// stretches of ownership overlap (one still open ends at its renew
/// deadline) and that no gap between them is longer than `bound`; returns
/// the longest gap.
fn assert_covered(histories: &[(String, Vec<Ownership>)], from: Instant, to: Instant) -> Duration {
    let bound = bound();
    let mut longest = Duration::ZERO;
    for (cluster, stretches) in stretches(histories) {
        let mut covered_until = from;
        let mut last: Option<&(String, Ownership)> = None;
        for stretch @ (replica, s) in &stretches {
            let end = s.until.unwrap_or(s.deadline);
            if end <= from || s.from >= to {
                last = Some(stretch);
                continue;
            }
            if let Some((before, b)) = last {
                let before_end = b.until.unwrap_or(b.deadline);
                assert!(
                    before_end <= s.from,
                    "{before} and {replica} both owned {cluster}: {b:?} and {s:?}"
                );
            }
            let gap = s.from.saturating_duration_since(covered_until);
            longest = longest.max(gap);
            assert!(
                gap <= bound,
                "{cluster} had no owner for {gap:?} (bound {bound:?}) before {replica} took it: {stretches:?}"
            );
            covered_until = covered_until.max(end);
            last = Some(stretch);
        }
        let gap = to.saturating_duration_since(covered_until);
        longest = longest.max(gap);
        assert!(
            gap <= bound,
            "{cluster} had no owner for {gap:?} at the end (bound {bound:?}): {stretches:?}"
        );
    }
    longest
}

/// How long after `at` the last cluster was owned again: the latest
/// start, of each cluster's first stretch that runs past `at`.
fn owned_again(histories: &[(String, Vec<Ownership>)], at: Instant) -> Duration {
    stretches(histories)
        .into_values()
        .map(|stretches| {
            let first = stretches
                .iter()
                .map(|(_, s)| s)
                .find(|s| s.until.unwrap_or(s.deadline) > at)
                .expect("owned again");
            first.from.saturating_duration_since(at)
        })
        .max()
        .unwrap_or_default()
}

/// How many times each cluster changed hands after `from`.
fn moves_after(histories: &[(String, Vec<Ownership>)], from: Instant) -> BTreeMap<String, usize> {
    stretches(histories)
        .into_iter()
        .map(|(cluster, stretches)| {
            let owners: Vec<&String> = stretches
                .iter()
                .filter(|(_, s)| s.until.unwrap_or(s.deadline) > from)
                .map(|(replica, _)| replica)
                .collect();
            let moves = owners.windows(2).filter(|w| w[0] != w[1]).count();
            (cluster, moves)
        })
        .collect()
}

fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()))
        .with_test_writer()
        .try_init();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_frozen_and_flapping_replicas_leave_no_cluster_owned_twice_or_unowned_past_the_bound()
 {
    init_tracing();
    let env = Envtest::start(1).await.expect("envtest");
    config_maps(env.clusters()[0].client(), "covered", 2).await;
    let records = Records::default();
    let set = "coverage";
    let mut a = Linked::start(set, "replica-a", &env, &records);
    let mut b = Linked::start(set, "replica-b", &env, &records);
    let mut c = Linked::start(set, "replica-c", &env, &records);
    let statuses = Arc::new(Mutex::new(vec![
        a.status.clone(),
        b.status.clone(),
        c.status.clone(),
    ]));
    let before = settled(&[&a, &b, &c]).await;
    println!("three replicas: {before:?}");
    let began = Instant::now();
    let (stop_sampling, sampling) = sample(statuses.clone());
    let mut histories = Vec::new();

    // Kill c: the others see its Leases run out and take its clusters; the
    // gap shows in their coverage meanwhile.
    let of_c = before.values().filter(|o| *o == "replica-c").count();
    statuses.lock().unwrap().pop();
    histories.push(c.replica.kill().await);
    let after_kill = settled(&[&a, &b]).await;
    println!("after replica-c was killed: {after_kill:?}");
    for (cluster, owner) in &before {
        if owner != "replica-c" {
            assert_eq!(
                &after_kill[cluster], owner,
                "{cluster} moved though its owner lived"
            );
        }
    }

    // Freeze b (every request to the Leases hangs) past its Lease: a takes
    // its clusters; once b answers again, it waits before it ranks, then
    // gets them back.
    let of_b: Vec<String> = after_kill
        .iter()
        .filter(|(_, o)| *o == "replica-b")
        .map(|(c, _)| c.clone())
        .collect();
    b.link.hang();
    let frozen = Instant::now();
    let deadline = frozen + PATIENCE;
    while !of_b
        .iter()
        .all(|c| a.status.owned().iter().any(|o| o.as_str() == c))
    {
        assert!(
            Instant::now() < deadline,
            "replica-a never took replica-b's clusters"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!(
        "replica-a took replica-b's clusters {:?} after the freeze",
        frozen.elapsed()
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    b.link.restore();
    let thawed = Instant::now();
    let after_freeze = settled(&[&a, &b]).await;
    let back = thawed.elapsed();
    println!("replica-b's clusters back {back:?} after it answered again");
    assert_eq!(
        after_freeze, after_kill,
        "the clusters went back to their owners"
    );
    assert!(
        back >= REJOIN.saturating_sub(RETRY),
        "replica-b ranked again after only {back:?}"
    );

    // Flap b: cut off for 8 s, then answering for 3 s, three times. Its
    // clusters move to a once, and come back once it has answered on time
    // for the rejoin wait, not at each lapse.
    let flapping = Instant::now();
    for _ in 0..3 {
        b.link.cut_off();
        tokio::time::sleep(Duration::from_secs(8)).await;
        b.link.restore();
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
    let after_flap = settled(&[&a, &b]).await;
    assert_eq!(
        after_flap, after_kill,
        "the clusters went back to their owners"
    );
    let _ = stop_sampling.send(());
    let samples = sampling.await.expect("sampling");
    let ended = Instant::now();

    // The Leases' API server out of reach of every replica past their
    // Leases: nothing can run meanwhile. Once it is back each replica
    // holds the other back for the rejoin wait, but ranks itself, so every
    // cluster is owned again within the bound, and in the end by its
    // owner.
    a.link.cut_off();
    b.link.cut_off();
    tokio::time::sleep(LEASE + RETRY * 2).await;
    a.link.restore();
    b.link.restore();
    let restored = Instant::now();
    let after_outage = settled(&[&a, &b]).await;
    assert_eq!(
        after_outage, after_kill,
        "the clusters went back to their owners"
    );

    histories.push(a.replica.stop().await);
    histories.push(b.replica.stop().await);
    let again = owned_again(&histories, restored);
    println!("every cluster owned again {again:?} after the Leases' server was back");
    assert!(
        again <= bound(),
        "owned again after {again:?} (bound {:?})",
        bound()
    );
    let longest = assert_covered(&histories, began, ended);
    println!("the longest a cluster went without an owner: {longest:?}");
    assert_no_overlap(&records.all());

    let moves = moves_after(&histories, flapping);
    println!("moves while replica-b flapped: {moves:?}");
    for cluster in &of_b {
        assert!(
            moves[cluster] <= 2,
            "{cluster} moved {} times while replica-b flapped",
            moves[cluster]
        );
    }
    println!("coverage sampled: {samples:?}");
    assert!(
        samples.most_unowned >= 1,
        "no replica reported the gaps of the kill, freeze or flaps: {samples:?}"
    );
    assert!(
        samples.most_unowned <= of_c.max(of_b.len()),
        "more clusters reported unowned than any replica held: {samples:?}"
    );
    assert!(
        samples.longest <= bound(),
        "a replica reported a gap of {:?} (bound {:?})",
        samples.longest,
        bound()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_moves_each_cluster_at_most_twice() {
    init_tracing();
    let env = Envtest::start(1).await.expect("envtest");
    config_maps(env.clusters()[0].client(), "covered", 2).await;
    let records = Records::default();
    let set = "rolling";
    let names = ["replica-0", "replica-1", "replica-2"];
    let mut replicas: Vec<Linked> = names
        .iter()
        .map(|name| Linked::start(set, name, &env, &records))
        .collect();
    let before = settled(&replicas.iter().collect::<Vec<_>>()).await;
    let began = Instant::now();
    let statuses = Arc::new(Mutex::new(
        replicas
            .iter()
            .map(|r| r.status.clone())
            .collect::<Vec<_>>(),
    ));
    let (stop_sampling, sampling) = sample(statuses.clone());
    let mut histories = Vec::new();
    for i in 0..replicas.len() {
        let mut old = replicas.remove(i);
        histories.push(old.replica.stop().await);
        // A new pod takes a few seconds to start: long enough for the
        // others to take its shards.
        tokio::time::sleep(RETRY * 3).await;
        replicas.insert(i, Linked::start(set, names[i], &env, &records));
        statuses.lock().unwrap()[i] = replicas[i].status.clone();
        let now = settled(&replicas.iter().collect::<Vec<_>>()).await;
        assert_eq!(now, before, "a restarted replica runs the clusters it ran");
    }
    let ended = Instant::now();
    let _ = stop_sampling.send(());
    let samples = sampling.await.expect("sampling");
    println!("coverage sampled: {samples:?}");
    // Each restarted replica ranks first for its shards at once, and sees
    // them held by others until they hand them over.
    assert!(
        samples.misplaced,
        "no hand-over was reported misplaced: {samples:?}"
    );
    assert!(
        samples.longest <= bound(),
        "a replica reported a gap of {:?} (bound {:?})",
        samples.longest,
        bound()
    );
    for mut replica in replicas {
        histories.push(replica.replica.stop().await);
    }
    let longest = assert_covered(&histories, began, ended);
    println!("the longest a cluster went without an owner: {longest:?}");
    assert_no_overlap(&records.all());
    let moves = moves_after(&histories, began);
    println!("moves in a rolling restart: {moves:?}");
    let owners: BTreeSet<&String> = before.values().collect();
    assert_eq!(
        owners.len(),
        names.len(),
        "each replica ran some: {before:?}"
    );
    for (cluster, moves) in moves {
        assert!(
            moves <= 2,
            "{cluster} moved {moves} times in a rolling restart"
        );
    }
}
