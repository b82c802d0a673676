//! Rate limits, alone and in a controller, on paused time.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::watcher;
use kube_fleet::{Action, Controller, Fleet, McRequest};
use kube_fleet_layers::rate_limit::{RateLimitLayer, TokenBucket};
use tokio::time::Instant;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tower::{BoxError, Service, ServiceBuilder, ServiceExt, service_fn};

type Log = Arc<Mutex<Vec<(String, Duration)>>>;

/// A reconciler that logs which cluster it ran for and when.
fn logging(
    log: Log,
    started: Instant,
) -> impl Service<McRequest, Response = Action, Error = BoxError, Future: Send + 'static>
+ Clone
+ Send
+ 'static {
    service_fn(move |request: McRequest| {
        log.lock()
            .unwrap()
            .push((request.cluster.to_string(), started.elapsed()));
        async { Ok::<_, BoxError>(Action::await_change()) }
    })
}

async fn call(service: &mut (impl Service<McRequest, Error = BoxError> + Clone), cluster: &str) {
    service
        .clone()
        .oneshot(McRequest::new(cluster, Some("ns"), "x"))
        .await
        .map(|_| ())
        .unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_bucket_allows_its_burst_then_its_rate() {
    let log = Log::default();
    let mut service = ServiceBuilder::new()
        .layer(RateLimitLayer::shared(TokenBucket::new(2.0, 3)))
        .service(logging(log.clone(), Instant::now()));
    for _ in 0..5 {
        call(&mut service, "a").await;
    }
    let times: Vec<_> = log
        .lock()
        .unwrap()
        .iter()
        .map(|(_, t)| t.as_millis())
        .collect();
    assert_eq!(times, [0, 0, 0, 500, 1000]);
}

#[tokio::test(start_paused = true)]
async fn clones_of_a_bucket_share_one_budget() {
    let log = Log::default();
    let bucket = TokenBucket::new(1.0, 1);
    let started = Instant::now();
    let mut first = ServiceBuilder::new()
        .layer(RateLimitLayer::shared(bucket.clone()))
        .service(logging(log.clone(), started));
    let mut second = ServiceBuilder::new()
        .layer(RateLimitLayer::shared(bucket))
        .service(logging(log.clone(), started));
    call(&mut first, "a").await;
    call(&mut second, "a").await;
    let times: Vec<_> = log
        .lock()
        .unwrap()
        .iter()
        .map(|(_, t)| t.as_secs())
        .collect();
    assert_eq!(times, [0, 1]);
}

#[tokio::test(start_paused = true)]
async fn a_cluster_out_of_budget_never_holds_back_another() {
    let log = Log::default();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let service = ServiceBuilder::new()
        .layer(RateLimitLayer::per_cluster(1.0, 1))
        .service(logging(log.clone(), Instant::now()));
    let controller = Controller::<ConfigMap>::new(&Fleet::new(), watcher::Config::default())
        .reconcile_on(UnboundedReceiverStream::new(rx))
        .run(service);
    for i in 0..10 {
        tx.send(McRequest::new("busy", Some("ns"), format!("obj-{i}")))
            .unwrap();
    }
    tx.send(McRequest::new("quiet", Some("ns"), "only"))
        .unwrap();
    let task = tokio::spawn(controller);
    tokio::time::sleep(Duration::from_millis(100)).await;
    {
        let log = log.lock().unwrap();
        let quiet: Vec<_> = log.iter().filter(|(c, _)| c == "quiet").collect();
        assert_eq!(quiet.len(), 1, "the quiet cluster ran at once: {log:?}");
        assert_eq!(log.iter().filter(|(c, _)| c == "busy").count(), 1);
    }
    tokio::time::sleep(Duration::from_secs(10)).await;
    let busy: Vec<_> = log
        .lock()
        .unwrap()
        .iter()
        .filter(|(c, _)| c == "busy")
        .map(|(_, t)| t.as_secs())
        .collect();
    assert_eq!(busy, (0..10).collect::<Vec<_>>(), "one per second");
    task.abort();
}

#[tokio::test(start_paused = true)]
async fn a_waiting_request_holds_no_concurrency_slot() {
    let log = Log::default();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    // The limit's documented place: outside a concurrency limit of one.
    let service = ServiceBuilder::new()
        .layer(RateLimitLayer::per_cluster(1.0, 1))
        .concurrency_limit(1)
        .service(logging(log.clone(), Instant::now()));
    let controller = Controller::<ConfigMap>::new(&Fleet::new(), watcher::Config::default())
        .reconcile_on(UnboundedReceiverStream::new(rx))
        .run(service);
    for i in 0..3 {
        tx.send(McRequest::new("busy", Some("ns"), format!("obj-{i}")))
            .unwrap();
    }
    let task = tokio::spawn(controller);
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Two busy requests now wait for tokens; the quiet cluster still gets the slot.
    tx.send(McRequest::new("quiet", Some("ns"), "only"))
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let quiet: Vec<_> = log
        .lock()
        .unwrap()
        .iter()
        .filter(|(c, _)| c == "quiet")
        .map(|(_, t)| t.as_millis())
        .collect();
    assert_eq!(quiet.len(), 1, "the quiet cluster was not held back");
    assert!(quiet[0] < 200, "{quiet:?}");
    task.abort();
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_wait_gives_its_token_back() {
    let log = Log::default();
    let started = Instant::now();
    let mut service = ServiceBuilder::new()
        .layer(RateLimitLayer::shared(TokenBucket::new(1.0, 1)))
        .service(logging(log.clone(), started));
    call(&mut service, "a").await; // uses the only token
    // The next request reserves the token due in one second, then is dropped.
    let waiting = service
        .ready()
        .await
        .unwrap()
        .call(McRequest::new("b", Some("ns"), "x"));
    drop(waiting);
    call(&mut service, "c").await;
    let times: Vec<_> = log
        .lock()
        .unwrap()
        .iter()
        .map(|(c, t)| (c.clone(), t.as_secs()))
        .collect();
    assert_eq!(times, [("a".to_owned(), 0), ("c".to_owned(), 1)]);
}

#[test]
fn an_absurdly_low_rate_waits_at_most_a_year_instead_of_panicking() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    runtime.block_on(async {
        let bucket = TokenBucket::new(1e-300, 1);
        assert!(bucket.reserve().is_zero());
        assert_eq!(bucket.reserve(), Duration::from_secs(365 * 24 * 60 * 60));
    });
}
