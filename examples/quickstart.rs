//! One reconciler across a fleet of clusters that join and leave.
//!
//! ```text
//! cargo run --example quickstart                          # a local fleet of real API servers
//! cargo run --example quickstart -- --run-for 20          # ... that stops by itself
//! cargo run --example quickstart -- --kubeconfig ~/.kube/config   # every context of a kubeconfig
//! cargo run --example quickstart -- --endpoints 0.0.0.0:9090      # health and metrics elsewhere
//! cargo run --example quickstart -- --kubeconfig FILE --leader-election quickstart
//! ```
//!
//! With `--leader-election NAME`, replicas share the Lease `NAME` in the
//! local cluster (in a pod, its own; outside, `KUBECONFIG`'s current
//! context), and only the leader reconciles.
//!
//! One [`Manager`] runs the provider, the controller and the HTTP endpoints
//! (`/healthz`, `/readyz`, `/metrics`, on `127.0.0.1:8080` by default) under
//! one shutdown signal.
//!
//! The reconciler labels each ConfigMap marked `kube-multicluster.dev/quickstart=true`
//! with the name of the cluster it lives in, and logs one line per reconcile.
//!
//! With no arguments it starts three clusters (real `kube-apiserver`s on one
//! etcd), creates some marked ConfigMaps in each, and, while it runs, adds a
//! fourth cluster and removes the first. With `--kubeconfig` it engages one
//! cluster per context, named `path+context`, follows the file as it changes
//! (contexts added, removed or changed), and touches only ConfigMaps you mark:
//! `kubectl label configmap NAME kube-multicluster.dev/quickstart=true`.
//! Ctrl-C shuts it down gracefully.

use std::{error::Error, net::SocketAddr, path::PathBuf, time::Duration};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api, Client, Config,
    api::{ObjectMeta, Patch, PatchParams, PostParams},
    config::Kubeconfig,
    runtime::watcher,
};
use kube_multicluster::envtest::Envtest;
use kube_multicluster::layers::{metrics::ReconcileMetrics, recommended::RecommendedLayer};
use kube_multicluster::manager::{LeaderElection, Manager};
use kube_multicluster::providers::file::FileProvider;
use kube_multicluster::{
    Action, Controller, Fleet, ObjectRequest,
    client::ClusterClient,
    controller,
    provider::{ProgrammaticHandle, ProgrammaticProvider, kubeconfig::KubeconfigPolicy},
};
use tower::{BoxError, ServiceBuilder, service_fn};

const MARK: &str = "kube-multicluster.dev/quickstart";
const CLUSTER_LABEL: &str = "kube-multicluster.dev/cluster";

/// Labels a ConfigMap with its cluster's name; the same code for every cluster.
///
/// The controller hands it the cluster and the object from its own watch
/// (`None` once deleted, or no longer marked); the recommended stack's span
/// puts the controller, cluster, namespace, name and reason on every line
/// logged here.
async fn reconcile(request: ObjectRequest<ConfigMap>) -> Result<Action, BoxError> {
    let (cluster, request, object) = (request.cluster, request.request, request.object);
    // The controller's own watch there, read by type: every marked ConfigMap.
    let marked = cluster.store::<ConfigMap>().map_or(0, |store| store.len());
    tracing::info!(exists = object.is_some(), marked, "reconcile");
    let Some(config_map) = object else {
        return Ok(Action::await_change()); // deleted or unmarked: nothing to clean up
    };
    let want = label_value(cluster.name().as_str());
    let has = config_map
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(CLUSTER_LABEL));
    if has != Some(&want) {
        let namespace = request.namespace.as_deref().unwrap_or("default");
        let patch = serde_json::json!({ "metadata": { "labels": { CLUSTER_LABEL: want } } });
        Api::<ConfigMap>::namespaced(cluster.client(), namespace)
            .patch(
                &request.name,
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await?;
    }
    Ok(Action::requeue(Duration::from_secs(300)))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    // Coloured on a terminal only: a file or a pipe gets plain text.
    tracing_subscriber::fmt()
        .with_env_filter(
            std::env::var("RUST_LOG")
                .unwrap_or_else(|_| "kube_multicluster=info,quickstart=info".into()),
        )
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()))
        .init();
    let args = Args::parse()?;

    let fleet = Fleet::new();
    let mut manager = Manager::new(&fleet)
        .endpoints(args.endpoints)
        .graceful_shutdown_on(shutdown_signal(args.run_for));
    if let Some(lease) = &args.leader_election {
        if args.kubeconfig.is_none() {
            return Err("--leader-election needs --kubeconfig: the local fleet has no cluster of its own to hold the Lease".into());
        }
        manager = manager.leader_election(LeaderElection::new(lease));
    }
    // Either every context of a kubeconfig file, named `path+context` and
    // followed as the file changes (yours, so trusted as kubectl trusts it:
    // exec plugins and all), or a local fleet driven from code.
    let clusters = match &args.kubeconfig {
        Some(path) => {
            // The provider waits for a file that is not there yet; a
            // mistyped path is better told at once.
            std::fs::metadata(path).map_err(|e| format!("--kubeconfig {}: {e}", path.display()))?;
            let files = FileProvider::new([path]).policy(KubeconfigPolicy::trusted());
            let problems = files.problems();
            manager = manager.provider(files);
            // Contexts that cannot be used are logged as they are found;
            // this says once which ones they were.
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_secs(2)).await;
                for (source, problem) in problems.current() {
                    tracing::warn!(%source, %problem, "not engaged");
                }
            });
            None
        }
        None => {
            let (provider, clusters) = ProgrammaticProvider::new();
            manager = manager.provider(provider);
            Some(clusters)
        }
    };

    // In each cluster the controller starts its watch and serves the
    // cluster once it has synced, so a reconcile never reads a half-filled
    // cache, and a cluster that does not answer holds up no other. The type
    // and its watch are named once, here.
    let marked = watcher::Config::default().labels(&format!("{MARK}=true"));
    // Reconciles by cluster and result, served on /metrics with the
    // fleet's and the queue's gauges.
    let metrics = ReconcileMetrics::new(manager.registry()).follow(&fleet);
    let stack = ServiceBuilder::new()
        .layer(RecommendedLayer::new().metrics(metrics))
        .service(service_fn(reconcile));
    // At most 16 reconciles at once, 20 per second in any one cluster.
    let limits = controller::Config::default()
        .concurrency(16)
        .cluster_rate_limit(20.0, 40);
    let manager = manager.controller(
        Controller::<ConfigMap>::new(&fleet, marked)
            .named("quickstart")
            .with_config(limits),
        stack,
    );

    // The local fleet, if any, runs until the manager stops.
    let _local_fleet = match clusters {
        Some(clusters) => Some(local_fleet(clusters).await?),
        None => None,
    };
    tracing::info!(endpoints = %args.endpoints, "try: curl http://{}/readyz", args.endpoints);
    manager.run().await?;
    tracing::info!("stopped");
    Ok(())
}

/// Starts three local clusters, then adds a fourth and removes the first
/// while the controller runs.
async fn local_fleet(
    clusters: ProgrammaticHandle,
) -> Result<tokio::task::JoinHandle<()>, Box<dyn Error>> {
    tracing::info!("starting a local fleet of three API servers");
    let mut envtest = Envtest::start(3).await?;
    for cluster in envtest.clusters() {
        create_marked(cluster.client(), 3).await?;
        tracing::info!(cluster = cluster.name(), kubeconfig = %cluster.kubeconfig_path().display(), "cluster ready");
        clusters.engage(cluster.name(), fleet_client(cluster.kubeconfig())?);
    }
    Ok(tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(4)).await;
        match envtest.add_cluster("cluster-3").await {
            Ok(late) => {
                if let Err(error) = create_marked(late.client(), 2).await {
                    tracing::error!(%error, "creating ConfigMaps in cluster-3");
                }
                match fleet_client(late.kubeconfig()) {
                    Ok(client) => {
                        tracing::info!("a fourth cluster joins: cluster-3");
                        clusters.engage("cluster-3", client);
                    }
                    Err(error) => tracing::error!(%error, "a client for cluster-3"),
                }
            }
            Err(error) => tracing::error!(%error, "starting cluster-3"),
        }
        tokio::time::sleep(Duration::from_secs(4)).await;
        tracing::info!("cluster-0 leaves");
        clusters.disengage("cluster-0");
        // The fleet lives in this task until the program ends.
        std::future::pending::<()>().await;
    }))
}

/// A client for a local cluster from its kubeconfig, as for any other: one
/// HTTP/2 connection for all its watches and requests, finished by the
/// fleet as it engages the cluster.
fn fleet_client(kubeconfig: &Kubeconfig) -> Result<ClusterClient, Box<dyn Error>> {
    Ok(kube_multicluster::client::cluster_client(
        Config::try_from(kubeconfig.clone())?,
    )?)
}

async fn create_marked(client: Client, count: usize) -> Result<(), kube::Error> {
    let api = Api::<ConfigMap>::default_namespaced(client);
    for i in 0..count {
        let config_map = ConfigMap {
            metadata: ObjectMeta {
                name: Some(format!("app-{i}")),
                labels: Some([(MARK.to_owned(), "true".to_owned())].into()),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        };
        api.create(&PostParams::default(), &config_map).await?;
    }
    Ok(())
}

/// A cluster name as a label value: at most 63 characters of `[A-Za-z0-9._-]`,
/// starting and ending with a letter or digit.
fn label_value(name: &str) -> String {
    let cleaned: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-".contains(c) {
                c
            } else {
                '-'
            }
        })
        .take(63)
        .collect();
    cleaned
        .trim_matches(|c: char| !c.is_ascii_alphanumeric())
        .to_owned()
}

async fn shutdown_signal(run_for: Option<Duration>) {
    match run_for {
        Some(duration) => tokio::time::sleep(duration).await,
        None => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
    tracing::info!("shutting down");
}

struct Args {
    run_for: Option<Duration>,
    kubeconfig: Option<PathBuf>,
    endpoints: SocketAddr,
    leader_election: Option<String>,
}

impl Args {
    fn parse() -> Result<Self, Box<dyn Error>> {
        const USAGE: &str = "usage: quickstart [--run-for SECONDS] [--kubeconfig PATH] [--endpoints ADDRESS:PORT] [--leader-election LEASE]";
        let mut args = Self {
            run_for: None,
            kubeconfig: None,
            endpoints: SocketAddr::from(([127, 0, 0, 1], 8080)),
            leader_election: None,
        };
        let mut argv = std::env::args().skip(1);
        while let Some(flag) = argv.next() {
            let value = argv.next().ok_or(USAGE)?;
            match flag.as_str() {
                "--run-for" => {
                    let secs: f64 = value
                        .parse()
                        .map_err(|e| format!("--run-for takes seconds, got {value:?}: {e}"))?;
                    args.run_for = Some(Duration::from_secs_f64(secs));
                }
                "--kubeconfig" => args.kubeconfig = Some(value.into()),
                "--leader-election" => args.leader_election = Some(value),
                "--endpoints" => {
                    args.endpoints = value.parse().map_err(|e| {
                        format!("--endpoints takes ADDRESS:PORT, got {value:?}: {e}")
                    })?;
                }
                _ => return Err(USAGE.into()),
            }
        }
        Ok(args)
    }
}
