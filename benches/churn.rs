//! Memory across engage/disengage cycles: whether what a cluster costs
//! comes back when it leaves.
//!
//! ```text
//! cargo bench --bench churn                          # 4000 cycles, 10 clusters at a time
//! cargo bench --bench churn -- 2000                  # other counts
//! cargo bench --bench churn -- --objects 500         # 500 ConfigMaps in each cluster's cache
//! MALLOC_ARENA_MAX=1 cargo bench --bench churn       # glibc with one malloc arena
//! ```
//!
//! One real API server (envtest) whose `default` namespace holds 20
//! ConfigMaps (or `--objects`); one controller watches ConfigMaps in every
//! cluster. Each
//! cycle engages ten clusters under new names, each with its own client
//! (`kube_multicluster::client::cluster_client`),
//! waits until the controller serves them, and disengages them. The
//! process's resident memory is read after a first round of cycles (the
//! baseline: the runtime, TLS and allocator have warmed up) and after each
//! thousand cycles, two seconds after the last disengage.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::watcher;
use kube_multicluster::envtest::Envtest;
use kube_multicluster::{Action, Controller, Fleet, ObjectRequest, provider::ProgrammaticProvider};
use tower::{BoxError, service_fn};

mod os;
mod setup;

use os::resident_bytes;

const AT_ONCE: usize = 10;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let (mut cycles, mut objects) = (4000, 20);
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--objects" => objects = args.next().and_then(|n| n.parse().ok()).unwrap_or(objects),
            other => cycles = other.parse().unwrap_or(cycles),
        }
    }
    println!(
        "MALLOC_ARENA_MAX={}; {objects} ConfigMaps; {AT_ONCE} clusters a cycle",
        std::env::var("MALLOC_ARENA_MAX").unwrap_or_else(|_| "(unset)".into())
    );
    let env = Envtest::start(1).await?;
    let cluster = &env.clusters()[0];
    setup::fill(cluster.client(), objects).await?;
    let config = setup::direct_config(cluster).await?;

    // Every cluster is a name for one API server, on purpose.
    let fleet = Fleet::with_config(kube_multicluster::FleetConfig {
        duplicates: kube_multicluster::Duplicates::Ignore,
        ..kube_multicluster::FleetConfig::default()
    });
    let (provider, handle) = ProgrammaticProvider::new();
    tokio::spawn({
        let fleet = fleet.clone();
        async move { fleet.run(provider).await }
    });
    let controller = Controller::<ConfigMap>::new(&fleet, watcher::Config::default());
    let status = controller.status();
    tokio::spawn(
        controller.run(service_fn(|_: ObjectRequest<ConfigMap>| async {
            Ok::<_, BoxError>(Action::await_change())
        })),
    );

    let mut next = 0usize;
    let mut cycle = async || -> Result<(), BoxError> {
        let names: Vec<String> = (0..AT_ONCE)
            .map(|i| format!("cluster-{}", next * AT_ONCE + i))
            .collect();
        next += 1;
        for name in &names {
            handle.engage(
                name.as_str(),
                kube_multicluster::client::cluster_client(config.clone())?,
            );
        }
        while status.clusters().iter().filter(|c| c.serving).count() < AT_ONCE {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        for name in &names {
            handle.disengage(name.as_str());
        }
        while !status.clusters().is_empty() || !fleet.clusters().is_empty() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Ok(())
    };
    let settled = async || {
        tokio::time::sleep(Duration::from_secs(2)).await;
        resident_bytes()
    };
    let mib = |bytes: u64| bytes as f64 / 1048576.0;

    for _ in 0..100 {
        cycle().await?;
    }
    let baseline = settled().await;
    println!("after 100 cycles (baseline): {:.1} MiB", mib(baseline));
    let began = Instant::now();
    for done in 1..=cycles {
        cycle().await?;
        if done % 1000 == 0 || done == cycles {
            let now = settled().await;
            println!(
                "after {} more cycles ({:.0?}): {:.1} MiB, {:+.1}% of the baseline",
                done,
                began.elapsed(),
                mib(now),
                (now as f64 / baseline as f64 - 1.0) * 100.0
            );
        }
    }
    Ok(())
}
