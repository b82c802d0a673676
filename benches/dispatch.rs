//! Dispatch: how fast requests go from the queue to a reconciler.
//!
//! ```text
//! cargo bench --bench dispatch                 # 5 rounds
//! cargo bench --bench dispatch -- --rounds 9
//! ```
//!
//! One real cluster (an envtest API server) is engaged so that each request
//! reads its object from a synced watch; the requests themselves are fed in
//! memory through `Controller::reconcile_on`, all distinct, to a no-op
//! reconciler. Three stacks are measured: the bare reconciler (`run`: each
//! request with its cluster and its object from the controller's own
//! watch; `Typed`, and `Unread` with read-your-writes turned off), the same with every admission check of the queue on (a
//! controller-wide concurrency limit, the per-cluster fair share, a shared
//! and a per-cluster token bucket, all generous enough never to hold a key
//! back), and the reconciler in the recommended stack (`RecommendedLayer`:
//! trace, metrics following the fleet, panic catch, timeout, retry), and
//! that stack with the queue's per-cluster workqueue metrics counted
//! (`Counted`: `Controller::queue_metrics`, as the manager takes them).
//! kube-runtime's own `applier` runs the same keys in the same process as
//! the baseline (a no-op reconciler over a store holding their objects, at
//! most 64 reconciles at once, as ours by default in one cluster).
//!
//! - throughput: 200,000 requests queued at once, reconciles per second;
//! - latency: 20,000 requests fed at 10,000 per second, enqueue-to-start
//!   time of each (p50, p99).
//!
//! Single runs on a small machine move by half, so the stacks and the
//! applier take turns: each round runs every one of them once, starting
//! from a different one each round, and the summary gives each figure's
//! median over the rounds with its least and most. A stack's ratio to the
//! applier is taken within each round (the same machine state), then its
//! median.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::{
    controller::{Action as KubeAction, Config as ApplierConfig, applier},
    reflector::{ObjectRef, store::Writer},
    watcher,
};
use kube_multicluster::envtest::Envtest;
use kube_multicluster::layers::{
    metrics::{ReconcileMetrics, WorkqueueMetrics},
    recommended::RecommendedLayer,
};
use kube_multicluster::{
    Action, Controller, Fleet, McRequest, ObjectRequest,
    controller::{Config, DEFAULT_CLUSTER_CONCURRENCY},
    queue::TokenBucket,
};
use prometheus_client::registry::Registry;
use std::convert::Infallible;
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tower::{BoxError, ServiceBuilder, service_fn};

mod setup;

const CLUSTER: &str = "bench";

/// When each request was sent and how many started, shared with the reconciler.
struct Clock {
    base: Instant,
    sent: Vec<AtomicU64>,
    latency: Vec<AtomicU64>,
    started: AtomicUsize,
}

impl Clock {
    fn new(n: usize) -> Arc<Self> {
        Arc::new(Self {
            base: Instant::now(),
            sent: (0..n).map(|_| AtomicU64::new(0)).collect(),
            latency: (0..n).map(|_| AtomicU64::new(0)).collect(),
            started: AtomicUsize::new(0),
        })
    }

    fn now(&self) -> u64 {
        self.base.elapsed().as_nanos() as u64
    }

    fn start(&self, request: &McRequest) {
        self.start_named(&request.name);
    }

    fn start_named(&self, name: &str) {
        let i: usize = name[4..].parse().expect("obj-<n>");
        let waited = self.now() - self.sent[i].load(Ordering::Relaxed);
        self.latency[i].store(waited, Ordering::Relaxed);
        self.started.fetch_add(1, Ordering::Relaxed);
    }
}

#[derive(Clone, Copy, Debug)]
enum Stack {
    Admission,
    Typed,
    /// `Typed`, its controller not reading its own writes
    /// (`Config::read_your_writes(false)`).
    Unread,
    Recommended,
    /// The recommended stack, with the queue's per-cluster workqueue
    /// metrics counted (`Controller::queue_metrics`).
    Counted,
    /// kube-runtime's own `applier`, fed the same keys, over a store that
    /// holds their objects.
    KubeRuntime,
}

/// Where the requests go: a controller's `reconcile_on`, or the applier's
/// queue.
enum Feed {
    Keys(mpsc::UnboundedSender<McRequest>),
    Refs(mpsc::UnboundedSender<Result<ObjectRef<ConfigMap>, Infallible>>),
}

impl Feed {
    fn send(&self, i: usize) {
        let name = format!("obj-{i}");
        let sent = match self {
            Self::Keys(tx) => tx
                .send(McRequest::new(CLUSTER, Some("default"), name))
                .is_ok(),
            Self::Refs(tx) => tx.send(Ok(ObjectRef::new(&name).within("default"))).is_ok(),
        };
        assert!(sent, "the consumer is gone");
    }
}

/// kube-runtime's applier with a no-op reconciler over a store of the `n`
/// objects the requests name.
fn kube_runtime_applier(n: usize, clock: Arc<Clock>) -> (tokio::task::JoinHandle<()>, Feed) {
    let mut writer = Writer::<ConfigMap>::default();
    writer.apply_watcher_event(&watcher::Event::Init);
    for i in 0..n {
        let object = ConfigMap {
            metadata: kube::api::ObjectMeta {
                name: Some(format!("obj-{i}")),
                namespace: Some("default".into()),
                ..Default::default()
            },
            ..ConfigMap::default()
        };
        writer.apply_watcher_event(&watcher::Event::InitApply(object));
    }
    writer.apply_watcher_event(&watcher::Event::InitDone);
    let (tx, rx) = mpsc::unbounded_channel();
    let applier = applier(
        move |object: Arc<ConfigMap>, _: Arc<()>| {
            let name = object.metadata.name.as_deref().unwrap_or_default();
            clock.start_named(name);
            futures::future::ready(Ok::<_, std::io::Error>(KubeAction::await_change()))
        },
        |_, _, _| KubeAction::await_change(),
        Arc::new(()),
        writer.as_reader(),
        UnboundedReceiverStream::new(rx),
        ApplierConfig::default().concurrency(DEFAULT_CLUSTER_CONCURRENCY as u16),
    );
    let task = tokio::spawn(applier.for_each(|_| async {}));
    (task, Feed::Refs(tx))
}

/// Runs one controller over `n` requests fed by `feed`; returns the wall time
/// until all have started and the clock.
async fn run(fleet: &Fleet, stack: Stack, n: usize, paced: bool) -> (Duration, Arc<Clock>) {
    let clock = Clock::new(n);
    if let Stack::KubeRuntime = stack {
        let (task, feed) = kube_runtime_applier(n, clock.clone());
        return feed_all(task, feed, clock, n, paced).await;
    }
    let (tx, rx) = mpsc::unbounded_channel();
    // Only the in-memory requests, none from the cluster's own ConfigMaps.
    let controller = Controller::<ConfigMap>::new(fleet, watcher::Config::default())
        .with_filter(|_| false)
        .reconcile_on(UnboundedReceiverStream::new(rx));
    let task = match stack {
        Stack::Admission => {
            let clock = clock.clone();
            let config = Config::default()
                .concurrency(1024)
                .rate_limit(TokenBucket::new(1e9, u32::MAX))
                .cluster_rate_limit(1e9, u32::MAX);
            tokio::spawn(controller.with_config(config).run(service_fn(
                move |request: ObjectRequest<ConfigMap>| {
                    clock.start(&request.request);
                    async { Ok::<_, BoxError>(Action::await_change()) }
                },
            )))
        }
        Stack::Typed | Stack::Unread => {
            let clock = clock.clone();
            let config = Config::default().read_your_writes(matches!(stack, Stack::Typed));
            tokio::spawn(controller.with_config(config).run(service_fn(
                move |request: ObjectRequest<ConfigMap>| {
                    clock.start(&request.request);
                    async { Ok::<_, BoxError>(Action::await_change()) }
                },
            )))
        }
        Stack::KubeRuntime => unreachable!("run above"),
        Stack::Recommended | Stack::Counted => {
            let controller = if let Stack::Counted = stack {
                let mut registry = Registry::default();
                WorkqueueMetrics::register(&mut registry).add(controller.queue_metrics());
                controller
            } else {
                controller
            };
            let clock = clock.clone();
            let service = ServiceBuilder::new()
                .layer(
                    RecommendedLayer::new()
                        .metrics(ReconcileMetrics::new(&mut Registry::default()).follow(fleet)),
                )
                .service(service_fn(move |request: ObjectRequest<ConfigMap>| {
                    clock.start(&request.request);
                    async { Ok::<_, BoxError>(Action::await_change()) }
                }));
            tokio::spawn(controller.run(service))
        }
    };
    feed_all(task, Feed::Keys(tx), clock, n, paced).await
}

/// Sends the `n` requests (in batches of 100 every 10 ms if `paced`) and
/// waits until all have started; returns how long that took.
async fn feed_all(
    task: tokio::task::JoinHandle<impl std::fmt::Debug + Send + 'static>,
    feed: Feed,
    clock: Arc<Clock>,
    n: usize,
    paced: bool,
) -> (Duration, Arc<Clock>) {
    let began = Instant::now();
    for i in 0..n {
        if paced && i % 100 == 0 && i > 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        clock.sent[i].store(clock.now(), Ordering::Relaxed);
        feed.send(i);
    }
    while clock.started.load(Ordering::Relaxed) < n {
        if task.is_finished() {
            panic!("the consumer ended early: {:?}", task.await);
        }
        assert!(
            began.elapsed() < Duration::from_secs(120),
            "stalled: {} of {n} started",
            clock.started.load(Ordering::Relaxed)
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let took = began.elapsed();
    task.abort();
    (took, clock)
}

/// One stack's figures, one per round.
#[derive(Default)]
struct Figures {
    rate: Vec<f64>,
    p50: Vec<f64>,
    p99: Vec<f64>,
}

/// The median, the least and the most of `values`.
fn spread(values: &[f64]) -> (f64, f64, f64) {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    let median = if n % 2 == 1 {
        sorted[n / 2]
    } else {
        (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
    };
    (median, sorted[0], sorted[n - 1])
}

/// The rounds asked for with `-- --rounds N`; 5 by default.
fn rounds() -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|arg| arg == "--rounds")
        .and_then(|i| args.get(i + 1))
        .map(|n| n.parse().expect("--rounds takes a number"))
        .filter(|&n: &usize| n > 0)
        .unwrap_or(5)
}

fn percentile(sorted: &[u64], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    Duration::from_nanos(sorted[i])
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let env = Envtest::start(1).await?;
    let fleet = Fleet::new();
    let config = setup::direct_config(&env.clusters()[0]).await?;
    let cluster = fleet.engage(CLUSTER, kube::Client::try_from(config)?);
    // The cache the object-loading layer reads from.
    let watch = cluster
        .cache()
        .watch::<ConfigMap>(&watcher::Config::default());
    watch.synced().await;

    let rounds = rounds();
    let stacks = [
        Stack::Recommended,
        Stack::Counted,
        Stack::Admission,
        Stack::Typed,
        Stack::Unread,
        Stack::KubeRuntime,
    ];
    let mut figures: Vec<Figures> = stacks.iter().map(|_| Figures::default()).collect();
    for round in 0..rounds {
        // Each round starts from another stack, so that no stack always
        // runs after the same work.
        for k in 0..stacks.len() {
            let i = (round + k) % stacks.len();
            let stack = stacks[i];
            let n = 200_000;
            let (took, _) = run(&fleet, stack, n, false).await;
            let rate = n as f64 / took.as_secs_f64();
            let n = 20_000;
            let (_, clock) = run(&fleet, stack, n, true).await;
            let mut latency: Vec<u64> = clock
                .latency
                .iter()
                .map(|l| l.load(Ordering::Relaxed))
                .collect();
            latency.sort_unstable();
            let (p50, p99) = (percentile(&latency, 0.5), percentile(&latency, 0.99));
            println!(
                "round {}: {stack:?}: {rate:.0} reconciles/s; enqueue-to-start at 10k/s: p50 {p50:.1?}  p99 {p99:.1?}",
                round + 1
            );
            let figures = &mut figures[i];
            figures.rate.push(rate);
            figures.p50.push(p50.as_secs_f64() * 1e6);
            figures.p99.push(p99.as_secs_f64() * 1e6);
        }
    }
    let applier = figures[stacks.len() - 1].rate.clone();
    println!("\nmedians of {rounds} rounds (min-max):");
    for (stack, figures) in stacks.iter().zip(&figures) {
        // Each round's ratio to the applier of the same round.
        let ratios: Vec<f64> = figures
            .rate
            .iter()
            .zip(&applier)
            .map(|(rate, applier)| rate / applier)
            .collect();
        let (rate, low, high) = spread(&figures.rate);
        let (ratio, ratio_low, ratio_high) = spread(&ratios);
        let (p50, _, _) = spread(&figures.p50);
        let (p99, p99_low, p99_high) = spread(&figures.p99);
        println!(
            "{stack:?}: {rate:.0} reconciles/s ({low:.0}-{high:.0}), {ratio:.2}x kube-runtime's applier ({ratio_low:.2}-{ratio_high:.2}), p50 {p50:.0} µs, p99 {p99:.0} µs ({p99_low:.0}-{p99_high:.0})"
        );
    }
    Ok(())
}
