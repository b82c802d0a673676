//! Ten thousand clusters in one process: time to all synced, memory at the
//! peak of the engage storm and after, tasks, sockets, idle CPU, what the API
//! servers spend, and whether any of them answered 429.
//!
//! ```text
//! cargo bench --bench fleet_scale                    # 10,000 clusters over four API servers
//! cargo bench --bench fleet_scale -- 2000            # other counts
//! cargo bench --bench fleet_scale -- --servers 2     # over two API servers
//! cargo bench --bench fleet_scale -- --lists 16      # at most 16 initial lists at once
//! cargo bench --bench fleet_scale -- --lists 0       # no bound on initial lists
//! cargo bench --bench fleet_scale -- --idle 120      # idle CPU over 120 s (default 20)
//! cargo bench --bench fleet_scale -- --keep-alive 0  # never ask a silent cluster (default: after 10 s)
//! cargo bench --bench fleet_scale -- 2000 --objects 100 --size 2048  # 100 ConfigMaps of 2 KiB each
//! cargo bench --bench fleet_scale -- 2000 --objects 100 --size 2048 --budget 400  # a cache budget of 400 MiB
//! ```
//!
//! With a cache budget (`FleetConfig::cache_budget`), the bytes the caches
//! hold as the budget counts them are sampled every 20 ms; clusters the
//! budget leaves out wait for room, and the storm is over once no more
//! cluster is served for ten seconds.
//!
//! Real API servers (envtest), each with 20 ConfigMaps (`--objects`) in its
//! `default` namespace, each value a few bytes (`--size` pads it); every cluster is a name for one of them, taken in turn, with
//! its own client (`kube_multicluster::client::cluster_client` on the server's kubeconfig, so its
//! own connection), engaged through a `ProgrammaticProvider`. One typed
//! controller watches ConfigMaps in `default` in every cluster. One
//! cluster is engaged and served first (the baseline: runtime, TLS and
//! allocator warmed up); then the rest all at once. The engage storm's peak
//! is the process's `VmHWM` since the baseline; steady figures are taken ten
//! seconds after the controller serves every cluster and has reconciled
//! every object once; idle CPU over the twenty seconds after that. The API servers' (and etcd's) CPU from
//! `/proc`; their 429 answers from their own `apiserver_request_total`.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{Client, Config, runtime::watcher};
use kube_multicluster::envtest::Envtest;
use kube_multicluster::{
    Action, Controller, Fleet, ObjectRequest, controller::Watch, provider::ProgrammaticProvider,
};
use tower::{BoxError, service_fn};

mod os;
mod setup;

use os::{cpu_seconds, open_sockets, reset_peak, resident_bytes, status_kib};

fn alive_tasks() -> usize {
    tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks()
}

fn mib(bytes: f64) -> f64 {
    bytes / 1048576.0
}

/// The requests the servers have answered with 429.
async fn too_many(servers: &[Client]) -> Result<f64, BoxError> {
    let mut total = 0.0;
    for server in servers {
        total += setup::request_totals(server)
            .await?
            .iter()
            .filter(|(labels, _)| labels.contains("code=\"429\""))
            .map(|(_, value)| value)
            .sum::<f64>();
    }
    Ok(total)
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let (mut clusters, mut servers, mut lists) = (10_000usize, 4usize, None);
    let (mut idle_for, mut keep_alive) = (20u64, None);
    let (mut objects, mut size, mut budget) = (20usize, 0usize, None::<usize>);
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--servers" => servers = args.next().and_then(|n| n.parse().ok()).unwrap_or(servers),
            "--lists" => lists = args.next().and_then(|n| n.parse().ok()),
            "--idle" => idle_for = args.next().and_then(|n| n.parse().ok()).unwrap_or(idle_for),
            "--keep-alive" => keep_alive = args.next().and_then(|n| n.parse::<u64>().ok()),
            "--objects" => objects = args.next().and_then(|n| n.parse().ok()).unwrap_or(objects),
            "--size" => size = args.next().and_then(|n| n.parse().ok()).unwrap_or(size),
            "--budget" => {
                budget = args
                    .next()
                    .and_then(|n| n.parse::<usize>().ok())
                    .map(|mib| mib << 20)
            }
            "--bench" => {}
            other => clusters = other.parse().unwrap_or(clusters),
        }
    }
    let defaults = kube_multicluster::FleetConfig::default();
    let fleet = Fleet::with_config(kube_multicluster::FleetConfig {
        initial_lists: match lists {
            Some(0) => usize::MAX,
            Some(n) => n,
            None => defaults.initial_lists,
        },
        keep_alive: match keep_alive {
            Some(0) => None,
            Some(seconds) => Some(kube_multicluster::client::KeepAlive::new(
                Duration::from_secs(seconds),
                kube_multicluster::client::KeepAlive::DEFAULT.timeout(),
            )),
            None => defaults.keep_alive,
        },
        // Every cluster is a name for one of a few API servers, on purpose.
        duplicates: kube_multicluster::Duplicates::Ignore,
        cache_budget: budget,
        ..defaults.clone()
    });
    let bound = fleet.status().initial_lists.limit();
    println!(
        "{clusters} clusters over {servers} API servers, {objects} ConfigMaps each ({size} bytes of data); initial lists at once: {}",
        if lists == Some(0) {
            "no bound".to_owned()
        } else {
            bound.to_string()
        }
    );

    let env = Envtest::start(servers).await?;
    let admins: Vec<Client> = env.clusters().iter().map(|c| c.client()).collect();
    let mut configs: Vec<Config> = Vec::new();
    for (cluster, admin) in env.clusters().iter().zip(&admins) {
        setup::fill_sized(admin.clone(), objects, size).await?;
        configs.push(setup::direct_config(cluster).await?);
    }
    let pids = env.pids();
    let servers_cpu = || {
        pids.iter()
            .map(|p| cpu_seconds(&p.to_string()))
            .sum::<f64>()
    };

    let (provider, handle) = ProgrammaticProvider::new();
    tokio::spawn({
        let fleet = fleet.clone();
        async move { fleet.run(provider).await }
    });
    let controller = Controller::<ConfigMap>::new(
        &fleet,
        Watch::new(watcher::Config::default()).in_namespace("default"),
    );
    let status = controller.status();
    let depth = controller.queue_depth();
    let reconciles = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    tokio::spawn(controller.run(service_fn({
        let reconciles = reconciles.clone();
        move |_: ObjectRequest<ConfigMap>| {
            reconciles.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            async { Ok::<_, BoxError>(Action::await_change()) }
        }
    })));
    let serving = || status.clusters().iter().filter(|c| c.serving).count();

    handle.engage(
        "cluster-00000",
        kube_multicluster::client::cluster_client(configs[0].clone())?,
    );
    while serving() < 1 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let one = resident_bytes() as f64;
    let (tasks_one, sockets_one) = (alive_tasks(), open_sockets());
    let refused_before = too_many(&admins).await?;

    reset_peak();
    let (cpu_before, servers_before) = (cpu_seconds("self"), servers_cpu());
    let began = Instant::now();
    for i in 1..clusters {
        let config = configs[i % configs.len()].clone();
        handle.engage(
            format!("cluster-{i:05}"),
            kube_multicluster::client::cluster_client(config)?,
        );
    }
    let built = began.elapsed();
    let mut most_waiting = 0;
    let mut last_report = Instant::now();
    let (mut most_cached, mut served, mut progress) = (0usize, 0usize, Instant::now());
    loop {
        let lists = fleet.status().initial_lists;
        most_waiting = most_waiting.max(lists.waiting());
        most_cached = most_cached.max(lists.cached_bytes());
        let now_serving = serving();
        if now_serving > served {
            (served, progress) = (now_serving, Instant::now());
        }
        // With a budget, over once no more cluster is served for ten
        // seconds (the first of the storm served).
        if served == clusters
            || (budget.is_some() && served > 1 && progress.elapsed() >= Duration::from_secs(10))
        {
            break;
        }
        if last_report.elapsed() >= Duration::from_secs(10) {
            last_report = Instant::now();
            println!(
                "  {:.0?}: {} of {clusters} served, {:.0} MiB, lists {:?}",
                began.elapsed(),
                serving(),
                mib(resident_bytes() as f64),
                fleet.status().initial_lists
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let synced = progress - began;
    let expected = served * objects;
    while depth.get() > 0 || reconciles.load(std::sync::atomic::Ordering::Relaxed) < expected {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let drained = began.elapsed();
    let (storm_cpu, storm_servers) = (
        cpu_seconds("self") - cpu_before,
        servers_cpu() - servers_before,
    );
    tokio::time::sleep(Duration::from_secs(10)).await;
    let peak = status_kib("VmHWM:") as f64 * 1024.0;
    let steady = resident_bytes() as f64;
    let (tasks, sockets) = (alive_tasks(), open_sockets());
    let (cpu_idle, servers_idle, idle_from) = (cpu_seconds("self"), servers_cpu(), Instant::now());
    tokio::time::sleep(Duration::from_secs(idle_for)).await;
    let idle_seconds = idle_from.elapsed().as_secs_f64();
    let idle = (cpu_seconds("self") - cpu_idle) / idle_seconds;
    let servers_idle = (servers_cpu() - servers_idle) / idle_seconds;
    let refused = too_many(&admins).await? - refused_before;

    let added = (clusters - 1).max(1) as f64;
    println!("clients built for {} clusters in {built:.1?}", clusters - 1);
    println!(
        "{served} of {clusters} served {synced:.1?} after the first engage (at most {most_waiting} lists waiting); their {expected} first reconciles done after {drained:.1?}"
    );
    if let Some(budget) = budget {
        let lists = fleet.status().initial_lists;
        println!(
            "cache budget {:.0} MiB: cached at most {:.1} MiB, now {:.1} MiB; {} watches waiting for room",
            mib(budget as f64),
            mib(most_cached as f64),
            mib(lists.cached_bytes() as f64),
            lists.waiting_for_room().len()
        );
    }
    println!(
        "memory: one cluster {:.0} MiB; peak in the storm {:.0} MiB; steady {:.0} MiB ({:.1} KiB per cluster); peak / steady {:.2}",
        mib(one),
        mib(peak),
        mib(steady),
        (steady - one) / added / 1024.0,
        peak / steady
    );
    println!(
        "tasks +{} ({:.2} per cluster); sockets +{} ({:.2} per cluster)",
        tasks - tasks_one,
        (tasks - tasks_one) as f64 / added,
        sockets - sockets_one,
        (sockets - sockets_one) as f64 / added
    );
    println!(
        "CPU in the storm: controller {storm_cpu:.1} s, API servers and etcd {storm_servers:.1} s"
    );
    println!(
        "idle ({idle_for} s, keep-alive {:?}): controller {:.1} % of one core, API servers and etcd {:.1} %",
        fleet.config().keep_alive,
        idle * 100.0,
        servers_idle * 100.0
    );
    println!("429 answers from the API servers: {refused}");
    Ok(())
}
