//! Mixed sharding on a real API server: members sharded by cluster, a hub
//! run by every replica with its keys sharded by key over the same shard
//! Leases. No key, of the hub or a member, is reconciled by two replicas at
//! once; every parent in the hub is served; a killed replica's share of both
//! moves within the Lease timing.
//!
//! Test timings: a lease of 4 s, a renew deadline of 3 s, a retry period of
//! 1 s. The hub and the nine members are ten names for one API server, which
//! also holds the Leases.

mod support;

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{Client, runtime::watcher};
use kube_fleet::{
    Controller, Fleet, ObjectRequest,
    controller::ClusterSelector,
    provider::{ProgrammaticHandle, ProgrammaticProvider},
};
use kube_fleet_envtest::Envtest;
use kube_fleet_manager::{Error, Manager, ShardStatus, Sharding};
use support::{PATIENCE, Records, assert_no_overlap, config_maps};
use tokio::{task::JoinHandle, time::Instant};

const LEASE: Duration = Duration::from_secs(4);
const RENEW_DEADLINE: Duration = Duration::from_secs(3);
const RETRY: Duration = Duration::from_secs(1);
const MEMBERS: usize = 9;
const PARENTS: usize = 60;
const HUB: &str = "hub";

struct Replica {
    status: ShardStatus,
    run: JoinHandle<Result<(), Error>>,
    /// Keeps its provider's stream open.
    _clusters: ProgrammaticHandle,
}

/// What a span is recorded under: a hub's key, or a member cluster.
fn what(request: &ObjectRequest<ConfigMap>) -> String {
    if request.cluster.name().as_str() == HUB {
        format!("{HUB}/{}", request.request.name)
    } else {
        request.cluster.name().to_string()
    }
}

fn start(name: &str, client: &Client, records: &Records) -> Replica {
    let fleet = Fleet::new();
    let (provider, handle) = ProgrammaticProvider::new();
    handle.engage(HUB, client.clone());
    for i in 0..MEMBERS {
        handle.engage(format!("m{i}"), client.clone());
    }
    let sharding = Sharding::new("mixed")
        .namespace("default")
        .identity(name)
        .client(client.clone())
        .shards(16)
        .hub(ClusterSelector::matching(|cluster| cluster.as_str() == HUB))
        .lease_duration(LEASE)
        .renew_deadline(RENEW_DEADLINE)
        .retry_period(RETRY);
    let status = sharding.status();
    let manager = Manager::new(&fleet)
        .provider(provider)
        .sharding(sharding)
        .controller(
            Controller::<ConfigMap>::new(&fleet, watcher::Config::default().labels("parent=true"))
                .named("fan-out"),
            records.reconciler_by(
                name,
                Duration::from_millis(20),
                Duration::from_millis(300),
                what,
            ),
        );
    Replica {
        status,
        run: tokio::spawn(manager.run()),
        _clusters: handle,
    }
}

/// The replica that last started a reconcile of each key or member.
fn runners(records: &Records, since: Instant) -> BTreeMap<String, BTreeSet<String>> {
    let mut runners: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for span in records.all().into_iter().filter(|s| s.start >= since) {
        runners
            .entry(span.cluster)
            .or_default()
            .insert(span.replica);
    }
    runners
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hub_keys_and_members_are_sharded_and_a_dead_replicas_share_of_both_moves() {
    let env = Envtest::start(1).await.expect("envtest");
    let client = env.clusters()[0].client();
    config_maps(client.clone(), "parent", PARENTS).await;
    let records = Records::default();
    let replicas = ["replica-a", "replica-b", "replica-c"];
    let mut running: Vec<Replica> = replicas
        .iter()
        .map(|name| start(name, &client, &records))
        .collect();

    // Every parent in the hub, and every member, is served.
    let began = Instant::now();
    let deadline = began + PATIENCE * 2;
    let served = loop {
        let runners = runners(&records, began);
        let parents = runners.keys().filter(|k| k.starts_with("hub/")).count();
        let members = runners.keys().filter(|k| !k.starts_with("hub/")).count();
        if parents == PARENTS && members == MEMBERS {
            break runners;
        }
        assert!(
            Instant::now() < deadline,
            "{parents} of {PARENTS} parents and {members} of {MEMBERS} members served"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // Settled: each hub key and member runs on one replica, and every
    // replica runs some of both.
    tokio::time::sleep(LEASE).await;
    let settled = Instant::now();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let steady = runners(&records, settled);
    for (what, by) in &steady {
        assert_eq!(by.len(), 1, "{what} runs on {by:?}");
    }
    for replica in replicas {
        let mine: Vec<_> = steady
            .iter()
            .filter(|(_, by)| by.contains(replica))
            .map(|(what, _)| what.as_str())
            .collect();
        assert!(
            mine.iter().any(|w| w.starts_with("hub/")),
            "{replica} runs no hub key: {steady:?}"
        );
        assert!(
            running[replicas.iter().position(|r| *r == replica).unwrap()]
                .status
                .owned()
                .iter()
                .all(|c| c.as_str() != HUB),
            "the hub is not owned as a cluster"
        );
    }
    assert_eq!(served.len(), PARENTS + MEMBERS);

    // Kill c: its Leases stop being renewed.
    let c_share: Vec<String> = steady
        .iter()
        .filter(|(_, by)| by.contains("replica-c"))
        .map(|(what, _)| what.clone())
        .collect();
    assert!(!c_share.is_empty());
    let c = running.pop().unwrap();
    c.run.abort();
    let killed = Instant::now();
    let _ = c.run.await;
    // Its share of hub keys and members runs elsewhere within the bound:
    // the lease, two retry periods (with jitter) and a second to sync.
    let bound = LEASE + RETRY.mul_f64(2.0 * 1.2) + Duration::from_secs(1);
    let deadline = killed + PATIENCE;
    let mut moves = Vec::new();
    for what in &c_share {
        let first = loop {
            let moved = records
                .all()
                .into_iter()
                .filter(|s| s.cluster == *what && s.replica != "replica-c" && s.start >= killed)
                .map(|s| s.start)
                .min();
            if let Some(first) = moved {
                break first;
            }
            assert!(Instant::now() < deadline, "{what} never moved");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert!(
            first - killed <= bound,
            "{what} moved after {:?}, beyond {bound:?}",
            first - killed
        );
        moves.push(first - killed);
    }
    moves.sort();
    let hub_keys = c_share.iter().filter(|w| w.starts_with("hub/")).count();
    println!(
        "replica-c ran {hub_keys} hub keys and {} members; they moved within {:?} to {:?}",
        c_share.len() - hub_keys,
        moves.first(),
        moves.last()
    );
    for span in records
        .all()
        .into_iter()
        .filter(|s| s.replica == "replica-c")
    {
        assert!(span.start < killed, "replica-c ran once dropped: {span:?}");
    }
    // Never two replicas at once, on a hub key or in a member.
    assert_no_overlap(&records.all());
    for replica in running {
        replica.run.abort();
    }
}
