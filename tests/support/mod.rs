//! Helpers shared by the integration tests: a recording reconciler, waiting
//! for requests, and reading an API server's watch count.

#![allow(dead_code, unreachable_pub)]

use std::{collections::HashSet, time::Duration};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api, Client,
    api::{ObjectMeta, PostParams},
    runtime::watcher,
};
use kube_multicluster::envtest::{Envtest, TestCluster};
use kube_multicluster::{
    Action, Controller, Fleet, McRequest,
    cache::WatchState,
    controller::{ClusterStatus, ControllerStatus},
    provider::{ProgrammaticHandle, ProgrammaticProvider},
};
use tokio::{sync::mpsc, task::JoinHandle};
use tower::{BoxError, Service, service_fn};

/// How long a test waits for something that should happen.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// A reconciler that reports every request it gets and asks for nothing more.
pub fn recorder<R: Keyed>() -> (
    impl Service<R, Response = Action, Error = BoxError, Future: Send + 'static> + Send + 'static,
    mpsc::UnboundedReceiver<McRequest>,
) {
    let (tx, rx) = mpsc::unbounded_channel();
    let service = service_fn(move |request: R| {
        let tx = tx.clone();
        async move {
            let _ = tx.send(request.key());
            Ok::<_, BoxError>(Action::await_change())
        }
    });
    (service, rx)
}

/// A request a recorder can record: a plain key, or a controller's
/// `ObjectRequest` (recorded by its key).
pub trait Keyed: Send + 'static {
    fn key(self) -> McRequest;
}

impl Keyed for McRequest {
    fn key(self) -> McRequest {
        self
    }
}

impl<K: Send + Sync + 'static> Keyed for kube_multicluster::ObjectRequest<K> {
    fn key(self) -> McRequest {
        self.request
    }
}

/// Waits until every request in `wanted` has been seen, and returns all seen.
pub async fn expect_all(
    rx: &mut mpsc::UnboundedReceiver<McRequest>,
    wanted: impl IntoIterator<Item = McRequest>,
) -> Vec<McRequest> {
    let mut missing: HashSet<McRequest> = wanted.into_iter().collect();
    let mut seen = Vec::new();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !missing.is_empty() {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(request)) => {
                missing.remove(&request);
                seen.push(request);
            }
            Ok(None) => panic!("the reconciler is gone; still missing {missing:?}"),
            Err(_) => panic!("not reconciled within {PATIENCE:?}: {missing:?}; saw {seen:?}"),
        }
    }
    seen
}

/// Every request seen within `window`.
pub async fn drain_for(
    rx: &mut mpsc::UnboundedReceiver<McRequest>,
    window: Duration,
) -> Vec<McRequest> {
    let mut seen = Vec::new();
    let deadline = tokio::time::Instant::now() + window;
    while let Ok(Some(request)) = tokio::time::timeout_at(deadline, rx.recv()).await {
        seen.push(request);
    }
    seen
}

pub fn config_map(name: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        data: Some([("value".to_owned(), "1".to_owned())].into()),
        ..ConfigMap::default()
    }
}

pub async fn create_config_map(client: Client, name: &str) -> ConfigMap {
    Api::<ConfigMap>::default_namespaced(client)
        .create(&PostParams::default(), &config_map(name))
        .await
        .unwrap_or_else(|e| panic!("creating ConfigMap {name}: {e}"))
}

pub fn request(cluster: &str, name: &str) -> McRequest {
    McRequest::new(cluster, Some("default"), name)
}

/// How many watches of `resource` the API server is serving now, from its
/// own `apiserver_longrunning_requests` metric.
pub async fn watches_served(client: &Client, resource: &str) -> u64 {
    api_server_count(client, "apiserver_longrunning_requests", resource, "WATCH").await
}

/// How many LIST requests for `resource` the API server has answered since
/// it started, from its own `apiserver_request_total` metric.
pub async fn lists_served(client: &Client, resource: &str) -> u64 {
    api_server_count(client, "apiserver_request_total", resource, "LIST").await
}

/// How many streaming lists (watches with `sendInitialEvents`) of
/// `resource` the API server has completed since it started.
pub async fn streaming_lists_served(client: &Client, resource: &str) -> u64 {
    api_server_count(
        client,
        "apiserver_watch_list_duration_seconds_count",
        resource,
        "",
    )
    .await
}

/// How many times `resource` has been listed, in pages or by streaming.
pub async fn all_lists_served(client: &Client, resource: &str) -> u64 {
    lists_served(client, resource).await + streaming_lists_served(client, resource).await
}

/// The sum of the API server's `metric` series for `resource` and `verb`
/// (any verb for `""`).
async fn api_server_count(client: &Client, metric: &str, resource: &str, verb: &str) -> u64 {
    let request = http::Request::get("/metrics").body(Vec::new()).unwrap();
    let metrics = client.request_text(request).await.expect("GET /metrics");
    kube_multicluster::envtest::metric_sum(&metrics, metric, resource, verb)
}

/// Waits until `status` shows the cluster `name` failing, and returns it.
pub async fn failing(status: &ControllerStatus, name: &str, patience: Duration) -> ClusterStatus {
    tokio::time::timeout(patience, async {
        loop {
            if let Some(cluster) = status.cluster(name)
                && cluster.failing().next().is_some()
            {
                return cluster;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{name} never reported failing: {:?}", status.cluster(name)))
}

/// The reason the first failing watch of cluster `name` gives, once one
/// fails.
pub async fn failing_reason(status: &ControllerStatus, name: &str) -> String {
    let cluster = failing(status, name, PATIENCE).await;
    match &cluster.failing().next().expect("a failing watch").state {
        WatchState::Failing { reason } => reason.clone(),
        state => unreachable!("a failing watch in state {state:?}"),
    }
}

/// A client for `cluster` from its kubeconfig, as `kube_multicluster::client`
/// builds them: one HTTP/2 connection, through the cluster's fault proxy.
pub fn http2_client(cluster: &TestCluster) -> Client {
    let config = kube::Config::try_from(cluster.kubeconfig().clone()).expect("a valid kubeconfig");
    kube_multicluster::client::client(config).expect("a client")
}

/// [`http2_client`], for the fleet to finish (one request queue in front of
/// it, with the cluster's counting).
pub fn cluster_client(cluster: &TestCluster) -> kube_multicluster::client::ClusterClient {
    let config = kube::Config::try_from(cluster.kubeconfig().clone()).expect("a valid kubeconfig");
    kube_multicluster::client::cluster_client(config).expect("a client")
}

/// A fleet fed by a programmatic provider, with its task.
pub struct Running {
    pub fleet: Fleet,
    pub provider: ProgrammaticHandle,
    pub tasks: Vec<JoinHandle<()>>,
    /// The status of each controller spawned.
    pub statuses: Vec<ControllerStatus>,
}

impl Drop for Running {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl Running {
    pub fn new() -> Self {
        Self::with_config(kube_multicluster::FleetConfig::default())
    }

    /// As [`new`](Self::new), with a fleet made with `config`.
    pub fn with_config(config: kube_multicluster::FleetConfig) -> Self {
        let fleet = Fleet::with_config(config);
        let (provider, handle) = ProgrammaticProvider::new();
        let task = tokio::spawn({
            let fleet = fleet.clone();
            async move { fleet.run(provider).await }
        });
        Self {
            fleet,
            provider: handle,
            tasks: vec![task],
            statuses: Vec::new(),
        }
    }

    /// Engages every cluster of `env`, each through a client of its own
    /// that speaks HTTP/2, as providers build them.
    pub fn add_all(&self, env: &Envtest) {
        for cluster in env.clusters() {
            self.provider
                .engage(cluster.name(), cluster_client(cluster));
        }
    }

    /// Runs a ConfigMap controller with a recording reconciler.
    pub fn config_maps(&mut self) -> tokio::sync::mpsc::UnboundedReceiver<McRequest> {
        let (service, rx) = recorder();
        let controller = Controller::<ConfigMap>::new(&self.fleet, watcher::Config::default());
        self.spawn(controller, service);
        rx
    }

    pub fn spawn<K, S>(&mut self, controller: Controller<K>, service: S)
    where
        K: kube_multicluster::cache::Watchable,
        S: tower::Service<
                kube_multicluster::ObjectRequest<K>,
                Response = kube_multicluster::Action,
            > + Send
            + 'static,
        S::Future: Send + 'static,
        S::Error: Into<tower::BoxError>,
    {
        self.statuses.push(controller.status());
        let run = controller.run(service);
        self.tasks.push(tokio::spawn(async move {
            run.await.expect("controller runs");
        }));
    }

    /// Waits until every controller serves the cluster `name`.
    pub async fn wait_served(&self, name: &str) {
        tokio::time::timeout(PATIENCE, async {
            loop {
                let serving = self
                    .statuses
                    .iter()
                    .all(|s| s.cluster(name).is_some_and(|c| c.serving));
                if serving {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("cluster {name} not served within {PATIENCE:?}"));
    }
}

/// Waits up to a minute for `check` to hold, or fails the test naming `what`.
pub async fn eventually<F, Fut>(what: &str, check: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let waited = tokio::time::timeout(Duration::from_secs(60), async {
        while !check().await {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "timed out waiting for {what}");
}

/// What is logged at `WARN` and above on this thread (the test's runtime
/// has one), until the guard goes.
pub fn capture_warnings() -> (
    std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
    tracing::subscriber::DefaultGuard,
) {
    capture_logs(tracing::Level::WARN)
}

/// What is logged at `level` and above on this thread (the test's runtime
/// has one), until the guard goes.
pub fn capture_logs(
    level: tracing::Level,
) -> (
    std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
    tracing::subscriber::DefaultGuard,
) {
    #[derive(Clone)]
    struct Buffer(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
    impl std::io::Write for Buffer {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let buffer = Buffer(std::sync::Arc::default());
    let logs = buffer.0.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(level)
        .with_ansi(false)
        .with_writer(move || buffer.clone())
        .finish();
    (logs, tracing::subscriber::set_default(subscriber))
}

/// The lines logged so far that hold every one of `words`.
pub fn lines_with(logs: &std::sync::Mutex<Vec<u8>>, words: &[&str]) -> Vec<String> {
    String::from_utf8_lossy(&logs.lock().unwrap())
        .lines()
        .filter(|line| words.iter().all(|w| line.contains(w)))
        .map(str::to_owned)
        .collect()
}
