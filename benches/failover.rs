//! Failover under leader election, with the standby's watches warm or
//! cold: from the leader's death to the new leader's first reconcile, and
//! to every object reconciled.
//!
//! ```text
//! cargo bench --bench failover                    # 100 clusters x 100 objects, warm then cold
//! cargo bench --bench failover -- 20              # other cluster counts
//! cargo bench --bench failover -- --rounds 3      # each mode three times
//! ```
//!
//! Real API servers (envtest): four, each with 100 ConfigMaps in its
//! `default` namespace; every cluster is a name for one of them, taken in
//! turn, with its own client. Two managers run in this process under one
//! Lease (4 s, renewed every 1 s, a renew deadline of 3 s), each with its
//! own fleet of the same clusters and one controller of ConfigMaps. The
//! leader reconciles every object; once the standby has had 15 s to warm
//! up, the leader's task is aborted (no release: the Lease runs out, as
//! when a process dies). The standby is a warm standby
//! (`Config::warm_standby(true)`), or not.

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::watcher;
use kube_multicluster::envtest::Envtest;
use kube_multicluster::manager::{LeaderElection, LeaseParams, Manager};
use kube_multicluster::{
    Action, Controller, Duplicates, Fleet, ObjectRequest, controller::Config,
    provider::ProgrammaticProvider,
};
use tower::{BoxError, service_fn};

mod setup;

const OBJECTS: usize = 100;
const LEASE: Duration = Duration::from_secs(4);

/// What one replica reconciled: how many, and when the first.
#[derive(Default)]
struct Seen {
    count: AtomicUsize,
    first: Mutex<Option<Instant>>,
}

fn replica(
    name: &str,
    configs: &[(String, kube::Config)],
    lease_client: kube::Client,
    warm: bool,
    seen: Arc<Seen>,
) -> tokio::task::JoinHandle<()> {
    // Every cluster is a name for one of a few API servers, on purpose.
    let fleet = Fleet::with_config(kube_multicluster::FleetConfig {
        duplicates: Duplicates::Ignore,
        ..kube_multicluster::FleetConfig::default()
    });
    let (provider, handle) = ProgrammaticProvider::new();
    for (cluster, config) in configs {
        let client = kube_multicluster::client::cluster_client(config.clone()).expect("a client");
        handle.engage(cluster.as_str(), client);
    }
    let election = LeaderElection::new("failover").lease(
        LeaseParams::default()
            .namespace("default")
            .identity(name)
            .client(lease_client)
            .lease_duration(LEASE)
            .renew_deadline(Duration::from_secs(3))
            .retry_period(Duration::from_secs(1)),
    );
    let controller = Controller::<ConfigMap>::new(&fleet, watcher::Config::default())
        .with_config(Config::default().warm_standby(warm));
    let manager = Manager::new(&fleet)
        .provider(provider)
        .leader_election(election)
        .controller(
            controller,
            service_fn(move |_: ObjectRequest<ConfigMap>| {
                let seen = seen.clone();
                async move {
                    seen.first.lock().unwrap().get_or_insert_with(Instant::now);
                    seen.count.fetch_add(1, Ordering::Relaxed);
                    Ok::<_, BoxError>(Action::await_change())
                }
            }),
        );
    tokio::spawn(async move {
        let _keep = handle;
        let _ = manager.run().await;
    })
}

async fn until(what: &str, done: impl Fn() -> bool) {
    let waited = tokio::time::timeout(Duration::from_secs(300), async {
        while !done() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
    if waited.await.is_err() {
        panic!("{what}: not within 300 s");
    }
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let (mut clusters, mut rounds) = (100usize, 1usize);
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--rounds" => rounds = args.next().and_then(|n| n.parse().ok()).unwrap_or(rounds),
            "--bench" => {}
            other => clusters = other.parse().unwrap_or(clusters),
        }
    }
    let env = Envtest::start(4).await?;
    let mut servers = Vec::new();
    for cluster in env.clusters() {
        setup::fill(cluster.client(), OBJECTS).await?;
        servers.push(setup::direct_config(cluster).await?);
    }
    let configs: Vec<(String, kube::Config)> = (0..clusters)
        .map(|i| (format!("c{i:04}"), servers[i % servers.len()].clone()))
        .collect();
    let total = clusters * OBJECTS;
    let lease_client = env.clusters()[0].client();
    println!(
        "{clusters} clusters x {OBJECTS} objects over {} API servers; Lease {LEASE:?}",
        servers.len()
    );
    for round in 0..rounds {
        for warm in [true, false] {
            let (leader_seen, standby_seen) = (Arc::<Seen>::default(), Arc::<Seen>::default());
            let leader = replica(
                &format!("leader-{round}-{warm}"),
                &configs,
                lease_client.clone(),
                warm,
                leader_seen.clone(),
            );
            until("the leader reconciles every object", || {
                leader_seen.count.load(Ordering::Relaxed) >= total
            })
            .await;
            let standby = replica(
                &format!("standby-{round}-{warm}"),
                &configs,
                lease_client.clone(),
                warm,
                standby_seen.clone(),
            );
            tokio::time::sleep(Duration::from_secs(15)).await;
            assert_eq!(standby_seen.count.load(Ordering::Relaxed), 0);
            let died = Instant::now();
            leader.abort();
            until("the standby reconciles every object", || {
                standby_seen.count.load(Ordering::Relaxed) >= total
            })
            .await;
            let all = died.elapsed();
            let first = standby_seen.first.lock().unwrap().expect("reconciled") - died;
            println!(
                "{}: first reconcile {:.2} s after the leader died, all {total} after {:.2} s",
                if warm { "warm" } else { "cold" },
                first.as_secs_f64(),
                all.as_secs_f64()
            );
            standby.abort();
            // The next pair starts once this Lease has run out.
            tokio::time::sleep(LEASE + Duration::from_secs(1)).await;
        }
    }
    Ok(())
}
