//! End to end: a controller that labels every ConfigMap of a fleet once.
//!
//! ```text
//! cargo bench --bench end_to_end                 # 10 clusters x 1,000 ConfigMaps
//! cargo bench --bench end_to_end -- 4 500        # other sizes: clusters, objects each
//! cargo bench --bench end_to_end -- 10 1000 16    # at most 16 reconciles at once
//! cargo bench --bench end_to_end -- 10 1000 0     # no limit (the default is 64 per cluster)
//! cargo bench --bench end_to_end -- --http1       # kube's own client, HTTP/1.1
//! cargo bench --bench end_to_end -- --any         # lists from the API servers' caches, streamed
//! cargo bench --bench end_to_end -- --any --paged # the same, but API servers that refuse streaming
//! cargo bench --bench end_to_end -- 10 1000 16 --one-server # the N clusters on one API server
//! cargo bench --bench end_to_end -- 10 1000 16 --as-user    # set up as a user sets it up
//! cargo bench --bench end_to_end -- --kube-client # engaged with finished kube::Clients
//! cargo bench --bench end_to_end -- --unbudgeted  # no request budget (RequestBudget::UNLIMITED)
//! cargo bench --bench end_to_end -- --queue-metrics # the queue's per-cluster metrics counted
//! cargo bench --bench end_to_end -- --no-read-your-writes # the controller does not read its writes
//! cargo bench --bench end_to_end -- 10 1000 16 --staggered  # one cluster busy at a time
//! cargo bench --bench end_to_end -- 10 1000 16 --in-turn    # the queue's Sharing::InTurn
//! ```
//!
//! N envtest API servers (one etcd) each hold M ConfigMaps with one data key.
//! One controller watches ConfigMaps in every cluster; its reconciler patches
//! a label onto each ConfigMap that lacks it, and does nothing once it is
//! there. Measured from the OS (`/proc`), from the first engage until every
//! ConfigMap has been patched:
//!
//! - wall time;
//! - this process's CPU seconds, and per reconcile;
//! - this process's peak resident memory (`VmHWM`, reset after the set-up),
//!   and its resident memory above the level before the fleet was engaged,
//!   per cached object and per engaged cluster;
//! - the CPU the API servers and etcd spent meanwhile, and per patched
//!   object; and the same above what they spend at rest (measured over
//!   three seconds before the first engage), which is what serving the
//!   controller cost them.
//!
//! With `--one-server`, the N clusters are N namespaces of one API server,
//! each engaged as a cluster of its own (`Fleet::engage_view`, as the
//! namespace provider does, over one shared watch): the same objects and
//! patches on one server instead of N, which tells what the servers cost
//! from how many of them there are.
//!
//! With `--staggered`, the clusters are engaged one at a time, each once
//! the one before is done, so that one API server is busy at a time (as a
//! first-in, first-out queue over a backlog of all clusters keeps them):
//! the same servers, client and work as the default, spread over time
//! instead of over the servers at once.
//!
//! With `--as-user`, the controller is set up as a user's would be: each
//! cluster's client built from the `kube::Config` its kubeconfig file gives,
//! through envtest's proxy (the address users are given), and a
//! label-selected watch of all namespaces (a selector every ConfigMap
//! passes, `!bench.kube-multicluster.dev/skip`, so the same objects are watched).
//!
//! Otherwise the controller reaches the API servers past envtest's in-process fault
//! proxy, so that the proxy's work is not counted as ours, with clients from
//! `kube_multicluster::client::cluster_client` (one HTTP/2 connection per cluster)
//! unless `--http1` asks for kube's own; `--kube-client` engages finished
//! `kube::Client`s from `kube_multicluster::client::client` instead, which the
//! fleet wraps in a request queue of its own.

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::{
    Api, ResourceExt,
    api::{ObjectMeta, Patch, PatchParams, PostParams},
    runtime::watcher,
};
use kube_multicluster::envtest::Envtest;
use kube_multicluster::{
    Action, Controller, Fleet, ObjectRequest,
    cache::{HostCache, HostView},
    controller::DEFAULT_CLUSTER_CONCURRENCY,
    provider::ProgrammaticProvider,
};
use tower::{BoxError, service_fn};

mod os;
mod setup;

use os::{cpu_seconds, reset_peak, status_kib};

const LABEL: &str = "bench.kube-multicluster.dev/seen";

fn servers_cpu(pids: &[u32]) -> f64 {
    pids.iter().map(|pid| cpu_seconds(&pid.to_string())).sum()
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let clusters = args.first().copied().unwrap_or(10);
    let objects = args.get(1).copied().unwrap_or(1_000);
    // The controller's default limit unless given; 0 for none.
    let concurrency = args.get(2).copied();
    let total = clusters * objects;
    let http1 = std::env::args().any(|a| a == "--http1");
    let finished = std::env::args().any(|a| a == "--kube-client");
    let paged = std::env::args().any(|a| a == "--paged");
    let any = std::env::args().any(|a| a == "--any");
    let one_server = std::env::args().any(|a| a == "--one-server");
    let as_user = std::env::args().any(|a| a == "--as-user");
    let staggered = std::env::args().any(|a| a == "--staggered");
    let in_turn = std::env::args().any(|a| a == "--in-turn");
    let read_your_writes = !std::env::args().any(|a| a == "--no-read-your-writes");

    let servers = if one_server { 1 } else { clusters };
    let mut env = Envtest::builder().clusters((0..servers).map(|i| format!("cluster-{i}")));
    if paged {
        env = env.apiserver_arg("--feature-gates=WatchList=false");
    }
    let env = env.start().await?;
    let mut direct = Vec::new();
    let mut engaged = Vec::new();
    for cluster in env.clusters() {
        let config = setup::direct_config(cluster).await?;
        engaged.push(setup::engaged(config.clone(), http1, finished)?);
        direct.push(setup::client(config, http1)?);
    }
    // With one server, each cluster is a namespace of it, viewed through
    // one shared host cache.
    let host = one_server.then(|| HostCache::new("host", direct[0].clone()));
    let views: Vec<HostView> = match &host {
        Some(host) => {
            let mut views = Vec::new();
            for i in 0..clusters {
                let namespace = format!("cluster-{i}");
                Api::<Namespace>::all(direct[0].clone())
                    .create(
                        &PostParams::default(),
                        &Namespace {
                            metadata: ObjectMeta {
                                name: Some(namespace.clone()),
                                ..ObjectMeta::default()
                            },
                            ..Namespace::default()
                        },
                    )
                    .await?;
                views.push(host.view(namespace));
            }
            views
        }
        None => Vec::new(),
    };
    if one_server {
        for view in &views {
            setup::fill(view.client(), objects).await?;
        }
    } else {
        for client in &direct {
            setup::fill(client.clone(), objects).await?;
        }
    }

    let patched = Arc::new(AtomicUsize::new(0));
    let reconciles = Arc::new(AtomicUsize::new(0));
    let reconcile = service_fn({
        let (patched, reconciles) = (patched.clone(), reconciles.clone());
        move |request: ObjectRequest<ConfigMap>| {
            let (patched, reconciles) = (patched.clone(), reconciles.clone());
            async move {
                reconciles.fetch_add(1, Ordering::Relaxed);
                let Some(config_map) = request.object else {
                    return Ok::<_, BoxError>(Action::await_change());
                };
                if config_map.labels().contains_key(LABEL) {
                    return Ok(Action::await_change());
                }
                let patch = serde_json::json!({ "metadata": { "labels": { LABEL: "yes" } } });
                Api::<ConfigMap>::default_namespaced(request.cluster.client())
                    .patch(
                        &config_map.name_any(),
                        &PatchParams::default(),
                        &Patch::Merge(&patch),
                    )
                    .await?;
                patched.fetch_add(1, Ordering::Relaxed);
                Ok(Action::await_change())
            }
        }
    });

    let fleet = if std::env::args().any(|a| a == "--unbudgeted") {
        Fleet::with_config(kube_multicluster::FleetConfig {
            request_budget: kube_multicluster::client::RequestBudget::UNLIMITED,
            ..kube_multicluster::FleetConfig::default()
        })
    } else {
        Fleet::new()
    };
    let (provider, handle) = ProgrammaticProvider::new();
    tokio::spawn({
        let fleet = fleet.clone();
        async move { fleet.run(provider).await }
    });
    let mut config =
        kube_multicluster::controller::Config::default().read_your_writes(read_your_writes);
    if in_turn {
        config = config.sharing(kube_multicluster::queue::Sharing::InTurn);
    }
    match concurrency {
        None => {}
        Some(0) => config = config.cluster_concurrency(usize::MAX),
        Some(limit) => config = config.concurrency(limit),
    }
    let mut watch = if any {
        watcher::Config::default().any_semantic()
    } else {
        watcher::Config::default()
    };
    if as_user {
        watch = watch.labels("!bench.kube-multicluster.dev/skip");
    }
    let controller = Controller::<ConfigMap>::new(&fleet, watch).with_config(config);
    // Counted per cluster, as the manager counts them.
    let mut registry = prometheus_client::registry::Registry::default();
    if std::env::args().any(|a| a == "--queue-metrics") {
        kube_multicluster::layers::metrics::WorkqueueMetrics::register(&mut registry)
            .add(controller.queue_metrics());
    }
    let controller = tokio::spawn(controller.run(reconcile));
    tokio::time::sleep(Duration::from_millis(200)).await;

    // What the API servers and etcd spend doing nothing: a fleet at rest
    // still takes CPU (leases, compaction, its own controllers).
    let pids = env.pids();
    let idle_began = (Instant::now(), servers_cpu(&pids));
    tokio::time::sleep(Duration::from_secs(3)).await;
    let idle = (servers_cpu(&pids) - idle_began.1) / idle_began.0.elapsed().as_secs_f64();

    // The set-up is done: measure from here.
    reset_peak();
    let (rss_before, cpu_before, servers_before) = (
        status_kib("VmRSS:"),
        cpu_seconds("self"),
        servers_cpu(&pids),
    );
    let began = Instant::now();
    // A user's clients: from each cluster's kubeconfig file, through the
    // proxy in front of its API server.
    let mut users = Vec::new();
    if as_user && !one_server {
        for cluster in env.clusters() {
            let kubeconfig = kube::config::Kubeconfig::read_from(cluster.kubeconfig_path())?;
            let config =
                kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?;
            users.push(setup::engaged(config, http1, finished)?);
        }
    }
    if one_server {
        for view in views {
            let name = view.namespace().to_owned();
            fleet.engage_view(name, view);
        }
    } else {
        let clients = if as_user { &users } else { &engaged };
        for (i, (cluster, client)) in env.clusters().iter().zip(clients).enumerate() {
            handle.engage(cluster.name(), client.clone());
            while staggered && patched.load(Ordering::Relaxed) < (i + 1) * objects {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    }
    while patched.load(Ordering::Relaxed) < total {
        assert!(
            began.elapsed() < Duration::from_secs(600),
            "stalled: {} of {total} patched",
            patched.load(Ordering::Relaxed)
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let wall = began.elapsed();
    let reconciled = reconciles.load(Ordering::Relaxed);
    let (cpu, servers) = (
        cpu_seconds("self") - cpu_before,
        servers_cpu(&pids) - servers_before,
    );
    // The watches deliver the patched versions a little later.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (rss_after, peak) = (status_kib("VmRSS:"), status_kib("VmHWM:"));
    let held = rss_after.saturating_sub(rss_before) * 1024;

    let limit = match concurrency {
        None => format!("at most {DEFAULT_CLUSTER_CONCURRENCY} at once per cluster"),
        Some(0) => "no limit".to_owned(),
        Some(limit) => format!("at most {limit} at once"),
    };
    let protocol = match (http1, in_turn) {
        (true, false) => "HTTP/1.1",
        (false, false) => "HTTP/2",
        (true, true) => "HTTP/1.1, clusters in turn",
        (false, true) => "HTTP/2, clusters in turn",
    };
    let lists = match (any, paged) {
        (false, _) => "consistent paged lists",
        (true, false) => "streaming lists",
        (true, true) => "paged lists from the cache (streaming refused)",
    };
    let placement = match (one_server, as_user, staggered) {
        (true, _, _) => "as namespaces of one API server",
        (false, true, _) => "one API server each, set up as a user's",
        (false, false, true) => "one API server each, engaged one after the other",
        (false, false, false) => "one API server each",
    };
    println!(
        "{clusters} clusters x {objects} ConfigMaps ({total} patched, {limit}, {protocol}, {lists}, {placement})"
    );
    println!("  wall time            {wall:.2?}");
    println!(
        "  controller CPU       {cpu:.2} s ({:.0} us per patched object, {reconciled} reconciles \
         until the last patch, {} with its echoes)",
        cpu * 1e6 / total as f64,
        reconciles.load(Ordering::Relaxed)
    );
    println!(
        "  read your writes     {}",
        if read_your_writes {
            "on (the default)"
        } else {
            "off"
        }
    );
    println!(
        "  peak RSS             {:.1} MiB (set-up included up to its level: {:.1} MiB)",
        peak as f64 / 1024.0,
        rss_before as f64 / 1024.0
    );
    println!(
        "  RSS held             {:.1} MiB: {:.0} B per cached object, {:.0} KiB per cluster",
        held as f64 / (1024.0 * 1024.0),
        held as f64 / total as f64,
        held as f64 / 1024.0 / clusters as f64
    );
    println!(
        "  API servers + etcd   {servers:.2} s CPU ({:.0} us per patched object); \
         above their idle {idle:.2} cores: {:.2} s ({:.0} us per patched object)",
        servers * 1e6 / total as f64,
        servers - idle * wall.as_secs_f64(),
        (servers - idle * wall.as_secs_f64()) * 1e6 / total as f64
    );
    controller.abort();
    Ok(())
}
