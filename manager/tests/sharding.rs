//! Three replicas sharding nine clusters, on a real API server: each
//! cluster run by one replica, a dead replica's clusters taken over within
//! the bound, a joining replica taking only its share, and no two replicas
//! ever running a cluster at once.
//!
//! Test timings: a lease of 4 s, a renew deadline of 3 s, a retry period
//! of 1 s (up to 1.2 s with jitter). The nine clusters are nine names for
//! one API server, which also holds the Leases.

mod support;

use std::{collections::BTreeMap, time::Duration};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{Client, runtime::watcher};
use kube_fleet::{Controller, Fleet, provider::ProgrammaticProvider};
use kube_fleet_envtest::Envtest;
use kube_fleet_manager::{Error, Manager, Ownership, ShardStatus, Sharding};
use support::{PATIENCE, Records, assert_no_overlap, config_maps};
use tokio::{sync::oneshot, task::JoinHandle, time::Instant};

const LEASE: Duration = Duration::from_secs(4);
const RENEW_DEADLINE: Duration = Duration::from_secs(3);
const RETRY: Duration = Duration::from_secs(1);
const CLUSTERS: usize = 9;

struct Replica {
    name: String,
    status: ShardStatus,
    stop: Option<oneshot::Sender<()>>,
    run: JoinHandle<Result<(), Error>>,
}

impl Replica {
    fn start(name: &str, client: &Client, records: &Records) -> Self {
        let fleet = Fleet::new();
        let (provider, clusters) = ProgrammaticProvider::new();
        for i in 0..CLUSTERS {
            clusters.add(format!("c{i}"), client.clone());
        }
        let sharding = Sharding::new("test-shards")
            .namespace("default")
            .identity(name)
            .client(client.clone())
            .lease_duration(LEASE)
            .renew_deadline(RENEW_DEADLINE)
            .retry_period(RETRY);
        let status = sharding.status();
        let (stop, stopped) = oneshot::channel::<()>();
        let manager = Manager::new(&fleet)
            .provider(provider)
            .sharding(sharding)
            .graceful_shutdown_on(async move {
                let _ = stopped.await;
            })
            .controller(
                Controller::<ConfigMap>::new(
                    &fleet,
                    watcher::Config::default().labels("sharded=true"),
                )
                .named("echo"),
                records.reconciler(name, Duration::from_millis(20), Duration::from_millis(300)),
            );
        let run = tokio::spawn(async move {
            let result = manager.run().await;
            drop(clusters);
            result
        });
        Self {
            name: name.to_owned(),
            status,
            stop: Some(stop),
            run,
        }
    }
}

/// Who owns each cluster, by the replicas' own word.
fn owners(replicas: &[&Replica]) -> BTreeMap<String, Vec<String>> {
    let mut owners: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for replica in replicas {
        for cluster in replica.status.owned() {
            owners
                .entry(cluster.to_string())
                .or_default()
                .push(replica.name.clone());
        }
    }
    owners
}

/// Waits until every cluster is owned by exactly one of `replicas` and each
/// sees all of them live; returns the owners and when that was first seen.
async fn settled(replicas: &[&Replica]) -> (BTreeMap<String, String>, Instant) {
    let deadline = Instant::now() + PATIENCE;
    let names: Vec<String> = {
        let mut names: Vec<String> = replicas.iter().map(|r| r.name.clone()).collect();
        names.sort();
        names
    };
    loop {
        let owners = owners(replicas);
        let agreed = replicas
            .iter()
            .all(|r| r.status.replicas() == names && r.status.owned() == r.status.assigned());
        if agreed && owners.len() == CLUSTERS && owners.values().all(|o| o.len() == 1) {
            let single = owners
                .into_iter()
                .map(|(c, mut o)| (c, o.remove(0)))
                .collect();
            return (single, Instant::now());
        }
        let seen: Vec<Vec<String>> = replicas.iter().map(|r| r.status.replicas()).collect();
        assert!(
            Instant::now() < deadline,
            "not settled: {owners:?}, replicas seen: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Asserts that no two replicas' stretches of ownership of a cluster
/// overlap; a stretch still open ends at its renew deadline.
fn assert_no_overlapping_ownership(histories: &[(String, Vec<Ownership>)]) {
    for (i, (a, mine)) in histories.iter().enumerate() {
        for (b, theirs) in &histories[i + 1..] {
            for x in mine {
                for y in theirs.iter().filter(|y| y.cluster == x.cluster) {
                    let x_end = x.until.unwrap_or(x.deadline);
                    let y_end = y.until.unwrap_or(y.deadline);
                    assert!(
                        x_end <= y.from || y_end <= x.from,
                        "{a} and {b} both owned {}: {x:?} and {y:?}",
                        x.cluster
                    );
                }
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_split_nine_clusters_and_recover_from_a_dead_one() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()))
        .with_test_writer()
        .try_init();
    let env = Envtest::start(1).await.expect("envtest");
    let cluster = &env.clusters()[0];
    config_maps(cluster.client(), "sharded", 2).await;
    let client = cluster.client();
    let records = Records::default();

    let a = Replica::start("replica-a", &client, &records);
    let b = Replica::start("replica-b", &client, &records);
    let c = Replica::start("replica-c", &client, &records);
    let (before, _) = settled(&[&a, &b, &c]).await;
    println!("three replicas: {before:?}");
    for replica in [&a, &b, &c] {
        let share = before.values().filter(|o| **o == replica.name).count();
        assert!(share >= 1, "{} owns nothing of {before:?}", replica.name);
    }
    // Each cluster is reconciled, by its owner.
    let now = Instant::now();
    for (cluster, owner) in &before {
        let deadline = Instant::now() + PATIENCE;
        while !records
            .of(owner)
            .iter()
            .any(|s| s.cluster == *cluster && s.start >= now)
        {
            assert!(
                Instant::now() < deadline,
                "{owner} does not reconcile {cluster}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    // Kill c: no release, its Leases just stop being renewed.
    let orphans: Vec<String> = before
        .iter()
        .filter(|(_, o)| **o == "replica-c")
        .map(|(cluster, _)| cluster.clone())
        .collect();
    c.run.abort();
    let killed = Instant::now();
    let (after, _) = settled(&[&a, &b]).await;
    println!("after replica-c died: {after:?}");
    let c_history = c.status.history();
    for (cluster, owner) in &before {
        if owner != "replica-c" {
            assert_eq!(
                &after[cluster], owner,
                "{cluster} moved though its owner lived"
            );
        }
    }
    // Each orphan is reconciled by its new owner within the bound: the lease
    // duration, two retry periods (one to see the last renew, one to take
    // the Lease) and a second for the watch to sync.
    let bound = LEASE + RETRY.mul_f64(2.0 * 1.2) + Duration::from_secs(1);
    for cluster in &orphans {
        let owner = &after[cluster];
        let deadline = killed + PATIENCE;
        let first = loop {
            if let Some(span) = records
                .of(owner)
                .into_iter()
                .find(|s| s.cluster == *cluster && s.start >= killed)
            {
                break span.start;
            }
            assert!(
                Instant::now() < deadline,
                "{owner} never reconciled {cluster}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let moved = first - killed;
        println!("{cluster}: reconciled by {owner} {moved:?} after replica-c died");
        assert!(
            moved <= bound,
            "{cluster} moved in {moved:?} (bound {bound:?})"
        );
        // Not before c's Lease on it could have run out: its last renew was
        // at most a retry period before it died.
        assert!(
            moved >= LEASE - RETRY.mul_f64(1.2),
            "{cluster} moved too soon: {moved:?}"
        );
    }

    // A fourth replica joins: it takes some clusters, and only from others'
    // shares; no cluster moves between the old replicas.
    let d = Replica::start("replica-d", &client, &records);
    let (joined, _) = settled(&[&a, &b, &d]).await;
    println!("after replica-d joined: {joined:?}");
    let mut moved = 0;
    for (cluster, owner) in &joined {
        if *owner != after[cluster] {
            assert_eq!(owner, "replica-d", "{cluster} moved between old replicas");
            moved += 1;
        }
    }
    assert!(moved >= 1, "replica-d took nothing: {joined:?}");
    println!("{moved} of {CLUSTERS} clusters moved to replica-d");

    // Graceful stops release everything.
    let mut histories = vec![("replica-c".to_owned(), c_history)];
    for mut replica in [a, b, d] {
        let _ = replica.stop.take().expect("runs").send(());
        let ended = tokio::time::timeout(PATIENCE, &mut replica.run)
            .await
            .expect("stops")
            .expect("its task");
        assert!(ended.is_ok(), "{}: {ended:?}", replica.name);
        assert!(
            replica.status.owned().is_empty(),
            "{} owns after stopping",
            replica.name
        );
        histories.push((replica.name.clone(), replica.status.history()));
    }
    assert_no_overlapping_ownership(&histories);
    assert_no_overlap(&records.all());
}
