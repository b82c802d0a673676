//! Sharding a large fleet across replicas: what the coordination cluster
//! pays in Lease writes, how many clusters move when a replica joins, and
//! how fast a killed replica's clusters run elsewhere.
//!
//! ```text
//! cargo bench --bench sharding                  # 2000 clusters over 4 replicas, 64 shards
//! cargo bench --bench sharding -- 500 3         # other counts
//! cargo bench --bench sharding -- --shards 128  # another number of shards
//! ```
//!
//! Two real API servers (envtest); the clusters are names for them, taken
//! in turn, each replica with its own fleet, its provider offering every
//! cluster, and one controller watching ConfigMaps. The first server holds
//! the Leases; its own request counter
//! (`apiserver_request_total{resource="leases"}`) is read before and after
//! a steady minute. Default timings: lease 15 s, renew deadline 10 s,
//! retry 2 s.

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{Client, runtime::watcher};
use kube_multicluster::envtest::Envtest;
use kube_multicluster::manager::{Error, LeaseParams, Manager, ShardStatus, Sharding};
use kube_multicluster::{Action, Controller, Fleet, ObjectRequest, provider::ProgrammaticProvider};
use tokio::{sync::oneshot, task::JoinHandle};
use tower::{BoxError, service_fn};

mod setup;

const SET: &str = "bench-shards";
const STEADY: Duration = Duration::from_secs(60);

/// The last reconcile of each cluster: by which replica, when.
type Last = Arc<Mutex<HashMap<String, (String, Instant)>>>;

struct Replica {
    name: String,
    status: ShardStatus,
    stop: Option<oneshot::Sender<()>>,
    run: JoinHandle<Result<(), Error>>,
}

fn start(
    name: &str,
    clusters: &[(String, Client)],
    leases: &Client,
    shards: u32,
    last: &Last,
) -> Replica {
    // Every cluster is a name for one API server, on purpose.
    let fleet = Fleet::with_config(kube_multicluster::FleetConfig {
        duplicates: kube_multicluster::Duplicates::Ignore,
        ..kube_multicluster::FleetConfig::default()
    });
    let (provider, handle) = ProgrammaticProvider::new();
    for (cluster, client) in clusters {
        handle.engage(cluster.as_str(), client.clone());
    }
    let sharding = Sharding::new(SET).shards(shards).lease(
        LeaseParams::default()
            .namespace("default")
            .identity(name)
            .client(leases.clone()),
    );
    let status = sharding.status();
    let (stop, stopped) = oneshot::channel::<()>();
    let replica = name.to_owned();
    let last = last.clone();
    let reconciler = service_fn(move |request: ObjectRequest<ConfigMap>| {
        let mut last = last.lock().unwrap_or_else(|e| e.into_inner());
        last.insert(
            request.cluster.name().to_string(),
            (replica.clone(), Instant::now()),
        );
        async { Ok::<_, BoxError>(Action::await_change()) }
    });
    let manager = Manager::new(&fleet)
        .provider(provider)
        .sharding(sharding)
        .graceful_shutdown_on(async move {
            let _ = stopped.await;
        })
        .controller(
            Controller::<ConfigMap>::new(&fleet, watcher::Config::default()).named("bench"),
            reconciler,
        );
    Replica {
        name: name.to_owned(),
        status,
        stop: Some(stop),
        run: tokio::spawn(manager.run()),
    }
}

/// Waits until every cluster is run by exactly one of `replicas`, each
/// seeing all of them; returns the owner of each cluster.
async fn settled(replicas: &[&Replica], clusters: usize) -> BTreeMap<String, String> {
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
        if agreed && owners.len() == clusters && owners.values().all(|o| o.len() == 1) {
            return owners
                .into_iter()
                .map(|(c, mut o)| (c, o.remove(0)))
                .collect();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The Lease requests the server has answered, by verb.
async fn lease_requests(client: &Client) -> Result<BTreeMap<String, f64>, BoxError> {
    let mut by_verb = BTreeMap::new();
    for (labels, value) in setup::request_totals(client).await? {
        if !labels.contains("resource=\"leases\"") {
            continue;
        }
        let Some(verb) = labels
            .split("verb=\"")
            .nth(1)
            .and_then(|rest| rest.split('"').next())
        else {
            continue;
        };
        *by_verb.entry(verb.to_owned()).or_insert(0.0) += value;
    }
    Ok(by_verb)
}

fn writes(counts: &BTreeMap<String, f64>) -> f64 {
    ["POST", "PUT", "PATCH", "DELETE"]
        .iter()
        .map(|verb| counts.get(*verb).copied().unwrap_or(0.0))
        .sum()
}

fn spread(owners: &BTreeMap<String, String>) -> BTreeMap<String, usize> {
    let mut per = BTreeMap::new();
    for owner in owners.values() {
        *per.entry(owner.clone()).or_insert(0) += 1;
    }
    per
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let (mut clusters, mut replicas, mut shards) = (2000usize, 4usize, 64u32);
    let mut numbers = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--shards" => shards = args.next().and_then(|n| n.parse().ok()).unwrap_or(shards),
            "--bench" => {}
            other => numbers.extend(other.parse::<usize>().ok()),
        }
    }
    if let Some(n) = numbers.first() {
        clusters = *n;
    }
    if let Some(n) = numbers.get(1) {
        replicas = *n;
    }
    println!("{clusters} clusters over {replicas} replicas, {shards} shards; two API servers");

    let env = Envtest::start(2).await?;
    let servers: Vec<Client> = env.clusters().iter().map(|c| c.client()).collect();
    for server in &servers {
        setup::fill(server.clone(), 1).await?;
    }
    let leases = servers[0].clone();
    let fleet: Vec<(String, Client)> = (0..clusters)
        .map(|i| {
            (
                format!("workload-{i:05}"),
                servers[i % servers.len()].clone(),
            )
        })
        .collect();
    let last: Last = Arc::default();

    let began = Instant::now();
    let mut running: Vec<Replica> = (0..replicas)
        .map(|i| start(&format!("replica-{i}"), &fleet, &leases, shards, &last))
        .collect();
    let owners = settled(&running.iter().collect::<Vec<_>>(), clusters).await;
    println!(
        "settled in {:.1?}: clusters per replica {:?}",
        began.elapsed(),
        spread(&owners)
    );

    // A steady minute: what the Leases cost the coordination cluster.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let before = lease_requests(&leases).await?;
    let steady_from = Instant::now();
    tokio::time::sleep(STEADY).await;
    let after = lease_requests(&leases).await?;
    let seconds = steady_from.elapsed().as_secs_f64();
    let delta: BTreeMap<String, f64> = after
        .iter()
        .map(|(verb, n)| (verb.clone(), n - before.get(verb).copied().unwrap_or(0.0)))
        .filter(|(_, n)| *n > 0.0)
        .collect();
    println!(
        "steady: {:.1} Lease writes a second on the coordination cluster ({:.1} requests in all; by verb over {seconds:.0} s: {delta:?})",
        writes(&delta) / seconds,
        delta.values().sum::<f64>() / seconds,
    );

    // A new replica joins.
    let joined_at = Instant::now();
    running.push(start("replica-new", &fleet, &leases, shards, &last));
    let joined = settled(&running.iter().collect::<Vec<_>>(), clusters).await;
    let moved = owners.iter().filter(|(c, o)| joined[*c] != **o).count();
    let to_new = owners
        .iter()
        .filter(|(c, o)| joined[*c] != **o && joined[*c] == "replica-new")
        .count();
    println!(
        "replica-new joined: {moved} of {clusters} clusters moved ({:.1}%; 1/N = {:.1}%), {to_new} to it, settled in {:.1?}; per replica {:?}",
        moved as f64 * 100.0 / clusters as f64,
        100.0 / running.len() as f64,
        joined_at.elapsed(),
        spread(&joined)
    );

    let owners = joined;

    // Kill one replica: no release, its Leases run out.
    let victim = running.remove(0);
    let orphans: Vec<String> = owners
        .iter()
        .filter(|(_, o)| **o == victim.name)
        .map(|(c, _)| c.clone())
        .collect();
    victim.run.abort();
    let killed = Instant::now();
    let mut firsts = loop {
        let last = last.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let firsts: Vec<Duration> = orphans
            .iter()
            .filter_map(|cluster| {
                let (by, at) = last.get(cluster)?;
                (*by != victim.name && *at >= killed).then(|| *at - killed)
            })
            .collect();
        if firsts.len() == orphans.len() {
            break firsts;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    firsts.sort();
    println!(
        "{} killed: its {} clusters reconciled elsewhere after {:.1?} (first) to {:.1?} (last), median {:.1?}",
        victim.name,
        orphans.len(),
        firsts[0],
        firsts[firsts.len() - 1],
        firsts[firsts.len() / 2],
    );
    let survivors = settled(&running.iter().collect::<Vec<_>>(), clusters).await;
    println!(
        "settled {:.1?} after the kill; per replica {:?}",
        killed.elapsed(),
        spread(&survivors)
    );
    let between = owners
        .iter()
        .filter(|(c, o)| **o != victim.name && survivors[*c] != **o)
        .count();
    println!("clusters moved between surviving replicas: {between}");

    for mut replica in running {
        let _ = replica.stop.take().map(|stop| stop.send(()));
        let _ = tokio::time::timeout(Duration::from_secs(30), replica.run).await;
    }
    Ok(())
}
