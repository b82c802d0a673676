//! Per-cluster cost: memory, tokio tasks, sockets and time to sync when
//! engaging many clusters that each watch ConfigMaps.
//!
//! ```text
//! cargo bench --bench per_cluster              # 100, then 1000 clusters
//! cargo bench --bench per_cluster -- 250       # other counts
//! cargo bench --bench per_cluster -- --empty   # watch a namespace with no objects
//! cargo bench --bench per_cluster -- --http1   # kube's own client, HTTP/1.1
//! cargo bench --bench per_cluster -- --bare    # no fleet: a client and a bare kube watcher each
//! cargo bench --bench per_cluster -- --any     # lists from the cache, streamed, not consistent
//! cargo bench --bench per_cluster -- --as-user # as a user sets it up (below)
//! cargo bench --bench per_cluster -- --kube-client # engaged with a finished kube::Client
//! ```
//!
//! Every cluster has a distinct name and its own client (from
//! `kube_multicluster::client::cluster_client`, which the fleet finishes with its
//! counting; with `--kube-client` a finished `kube::Client` from
//! `kube_multicluster::client::client`, which the fleet wraps; kube's own with
//! `--http1`), all pointing at one
//! real API server (envtest) whose `default` namespace holds 20 ConfigMaps.
//! One controller watches ConfigMaps in every cluster (in the `default`
//! namespace, or with `--empty` in one that holds none). One cluster is
//! engaged first; then the rest up to N. Measured after each step, two
//! seconds after the controller serves every cluster: the process's resident
//! memory, live tokio tasks and open sockets. The cost per cluster is the
//! difference between N clusters and one, divided by N − 1, so that what
//! the first cluster sets up once (TLS provider, runtime) is not counted.
//! Also the time from the first of the N − 1 engages until the controller
//! serves them all.
//!
//! `--as-user` sets the fleet up as a user's program would: each cluster's
//! `kube::Config` read from a kubeconfig file of its own (written once for
//! each), and a watch of all namespaces selecting the 20 ConfigMaps by their
//! label.
//!
//! `--bare` measures what the same watch costs with no fleet and no
//! controller: per cluster, a client and kube's own `watcher` feeding a
//! `reflector` store, as a kube-runtime program would hold them. The
//! difference to the default is what kube-multicluster itself adds.

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api, Client, Config,
    api::{ObjectMeta, PostParams},
    runtime::watcher,
};
use kube_multicluster::envtest::Envtest;
use kube_multicluster::{
    Action, Controller, Fleet, ObjectRequest, client::ClusterClient, controller::Watch,
    provider::ProgrammaticProvider,
};
use tower::{BoxError, service_fn};

mod os;
mod setup;

use os::{open_sockets, resident_bytes};

fn alive_tasks() -> usize {
    tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks()
}

/// What the process holds at one moment.
#[derive(Clone, Copy)]
struct Sample {
    memory: u64,
    tasks: usize,
    sockets: usize,
}

impl Sample {
    fn now() -> Self {
        Self {
            memory: resident_bytes(),
            tasks: alive_tasks(),
            sockets: open_sockets(),
        }
    }
}

struct Options {
    http1: bool,
    bare: bool,
    /// Watch with `any_semantic()` and `streaming_lists()`: the initial
    /// list streamed.
    any: bool,
    namespace: &'static str,
    /// Each cluster's config from its own kubeconfig file, and a
    /// label-selected watch of all namespaces.
    as_user: bool,
    /// Engage a finished `kube::Client`, not a `ClusterClient`.
    kube_client: bool,
}

impl Options {
    fn client(&self, config: &Config) -> Result<Client, BoxError> {
        setup::client(config.clone(), self.http1)
    }

    /// What each cluster is engaged with.
    fn engaged(&self, config: &Config) -> Result<ClusterClient, BoxError> {
        if self.http1 || self.kube_client {
            return Ok(self.client(config)?.into());
        }
        Ok(kube_multicluster::client::cluster_client(config.clone())?)
    }

    fn watcher(&self) -> watcher::Config {
        if self.any {
            // kube's own watcher streams only when told to; the fleet
            // streams either way, and shares one watch for both.
            watcher::Config::default().any_semantic().streaming_lists()
        } else {
            watcher::Config::default()
        }
    }
}

/// Per cluster, a client and a bare kube watcher filling a store.
async fn measure_bare(config: &Config, clusters: usize, options: &Options) -> Result<(), BoxError> {
    use futures::StreamExt;
    use kube::runtime::{WatchStreamExt, reflector};

    let synced = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    let mut watch = |client: Client| {
        let (store, writer) = reflector::store::<ConfigMap>();
        let api = Api::<ConfigMap>::namespaced(client, options.namespace);
        let events = kube::runtime::watcher(api, options.watcher())
            .default_backoff()
            .reflect(writer);
        let synced = synced.clone();
        tasks.push(tokio::spawn(async move {
            let _store = store;
            let mut events = std::pin::pin!(events);
            while let Some(event) = events.next().await {
                if matches!(event, Ok(watcher::Event::InitDone)) {
                    synced.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    };
    let served = async |n: usize| {
        while synced.load(Ordering::Relaxed) < n {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    };
    watch(options.client(config)?);
    served(1).await;
    let one = Sample::now();
    let began = Instant::now();
    for _ in 1..clusters {
        watch(options.client(config)?);
    }
    served(clusters).await;
    let synced = began.elapsed() - Duration::from_secs(2);
    let all = Sample::now();
    report(clusters, synced, one, all);
    for task in tasks {
        task.abort();
    }
    Ok(())
}

fn report(clusters: usize, synced: Duration, one: Sample, all: Sample) {
    let added = (clusters - 1).max(1) as f64;
    println!(
        "{clusters} clusters: the other {} synced in {synced:.2?}; memory +{:.1} MiB ({:.1} KiB per cluster); \
         tokio tasks +{} ({:.2} per cluster); sockets +{} ({:.2} per cluster)",
        clusters - 1,
        (all.memory as f64 - one.memory as f64) / 1048576.0,
        (all.memory as f64 - one.memory as f64) / added / 1024.0,
        all.tasks as i64 - one.tasks as i64,
        (all.tasks as f64 - one.tasks as f64) / added,
        all.sockets as i64 - one.sockets as i64,
        (all.sockets as f64 - one.sockets as f64) / added,
    );
}

async fn measure(
    config: &Config,
    kubeconfig: &str,
    clusters: usize,
    options: &Options,
) -> Result<(), BoxError> {
    if options.bare {
        return measure_bare(config, clusters, options).await;
    }
    // Every cluster is a name for one API server, on purpose.
    let fleet = Fleet::with_config(kube_multicluster::FleetConfig {
        duplicates: kube_multicluster::Duplicates::Ignore,
        ..kube_multicluster::FleetConfig::default()
    });
    let (provider, handle) = ProgrammaticProvider::new();
    let provider_task = tokio::spawn({
        let fleet = fleet.clone();
        async move { fleet.run(provider).await }
    });
    let watch = if options.as_user {
        Watch::new(
            options
                .watcher()
                .labels("bench.kube-multicluster.dev/per-cluster"),
        )
    } else {
        Watch::new(options.watcher()).in_namespace(options.namespace)
    };
    // A user's program reads each cluster's kubeconfig file.
    let files = std::env::temp_dir().join(format!("per-cluster-{}", std::process::id()));
    let client_of = async |i: usize| -> Result<ClusterClient, BoxError> {
        if !options.as_user {
            return options.engaged(config);
        }
        let path = files.join(format!("cluster-{i:04}.yaml"));
        std::fs::create_dir_all(&files)?;
        std::fs::write(&path, kubeconfig)?;
        let kubeconfig = kube::config::Kubeconfig::read_from(&path)?;
        let config = Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?;
        options.engaged(&config)
    };
    let controller = Controller::<ConfigMap>::new(&fleet, watch);
    let status = controller.status();
    let controller = tokio::spawn(controller.run(service_fn(
        |_: ObjectRequest<ConfigMap>| async { Ok::<_, BoxError>(Action::await_change()) },
    )));
    let served = async |n: usize| {
        while status.clusters().iter().filter(|c| c.serving).count() < n {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // Let the initial reconciles drain before reading memory and tasks.
        tokio::time::sleep(Duration::from_secs(2)).await;
    };

    handle.engage("cluster-0000", client_of(0).await?);
    served(1).await;
    let one = Sample::now();

    let began = Instant::now();
    for i in 1..clusters {
        handle.engage(format!("cluster-{i:04}"), client_of(i).await?);
    }
    served(clusters).await;
    let synced = began.elapsed() - Duration::from_secs(2);
    let all = Sample::now();

    report(clusters, synced, one, all);
    let _ = std::fs::remove_dir_all(&files);
    controller.abort();
    provider_task.abort();
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let counts: Vec<usize> = args.iter().filter_map(|a| a.parse().ok()).collect();
    let counts = if counts.is_empty() {
        vec![100, 1000]
    } else {
        counts
    };
    let options = Options {
        http1: args.iter().any(|a| a == "--http1"),
        bare: args.iter().any(|a| a == "--bare"),
        any: args.iter().any(|a| a == "--any"),
        as_user: args.iter().any(|a| a == "--as-user"),
        kube_client: args.iter().any(|a| a == "--kube-client"),
        namespace: if args.iter().any(|a| a == "--empty") {
            "empty"
        } else {
            "default"
        },
    };
    println!(
        "client: {}; watching ConfigMaps in namespace {:?}",
        match (options.http1, options.bare) {
            (true, false) => "kube's, HTTP/1.1",
            (false, false) => "kube_multicluster::client, HTTP/2",
            (true, true) => "kube's, HTTP/1.1, bare kube watchers (no fleet)",
            (false, true) => "kube_multicluster::client, HTTP/2, bare kube watchers (no fleet)",
        },
        options.namespace
    );
    if options.any {
        println!("lists from the API server's cache: streamed");
    }

    let env = Envtest::start(1).await?;
    let cluster = &env.clusters()[0];
    let api = Api::<ConfigMap>::default_namespaced(cluster.client());
    for i in 0..20 {
        let config_map = ConfigMap {
            metadata: ObjectMeta {
                name: Some(format!("cm-{i}")),
                labels: Some(
                    [(
                        "bench.kube-multicluster.dev/per-cluster".into(),
                        "yes".into(),
                    )]
                    .into(),
                ),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        };
        api.create(&PostParams::default(), &config_map).await?;
    }
    let config = setup::direct_config(cluster).await?;
    // JSON is YAML: a kubeconfig file either way.
    let kubeconfig = serde_json::to_string(&cluster.direct_kubeconfig())?;
    if options.as_user {
        println!(
            "each cluster's config from its own kubeconfig file; a label-selected watch of all namespaces"
        );
    }
    for clusters in counts {
        measure(&config, &kubeconfig, clusters, &options).await?;
    }
    Ok(())
}
