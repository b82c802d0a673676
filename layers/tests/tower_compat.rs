//! tower's own middleware in a controller's stack, each doing its job.
//! (`ConcurrencyLimitLayer` is shown in the core crate's runner tests:
//! `pulls_a_key_only_when_the_service_is_ready`.)

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::Duration,
};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::watcher;
use kube_multicluster::{
    Action, Controller, Fleet, McRequest, ObjectRequest, controller::Config, queue::Backoff,
};
use kube_multicluster_layers::retry::TransientErrors;
use tokio::{sync::mpsc, time::Instant};
use tokio_stream::wrappers::UnboundedReceiverStream;
use tower::{
    BoxError, Service, ServiceBuilder, load_shed::error::Overloaded, retry::RetryLayer, service_fn,
};

fn key(name: &str) -> McRequest {
    McRequest::new("c", Some("ns"), name)
}

#[path = "../../tests/support/empty_api.rs"]
mod empty_api;

/// Runs a controller with `service`, fed `requests` for cluster "c", whose
/// API server holds no ConfigMaps: the service sees each request's key.
/// Backoff without jitter.
fn run<S>(service: S, requests: &[McRequest]) -> tokio::task::JoinHandle<()>
where
    S: Service<McRequest, Response = Action> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
{
    let (tx, rx) = mpsc::unbounded_channel();
    for request in requests {
        tx.send(request.clone()).unwrap();
    }
    let fleet = Fleet::new();
    fleet.engage("c", empty_api::empty_api_client());
    let no_jitter = Backoff {
        jitter: 0.0,
        ..Backoff::default()
    };
    let controller = Controller::<ConfigMap>::new(&fleet, watcher::Config::default())
        .with_config(Config::default().backoff(no_jitter))
        .reconcile_on(UnboundedReceiverStream::new(rx))
        .run(tower::ServiceExt::map_request(
            service,
            |request: ObjectRequest<ConfigMap>| request.request,
        ));
    tokio::spawn(async move {
        let _keep_open = tx;
        controller.await.unwrap();
    })
}

async fn until(what: &str, condition: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(3600);
    while !condition() {
        assert!(Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

struct DropFlag(Arc<AtomicBool>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

#[tokio::test(start_paused = true)]
async fn timeout_cancels_a_stuck_reconcile_and_the_key_runs_again_after_its_backoff() {
    let calls = Arc::new(Mutex::new(Vec::new()));
    let cancelled = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let service = ServiceBuilder::new()
        .timeout(Duration::from_secs(1))
        .service(service_fn({
            let (calls, cancelled) = (calls.clone(), cancelled.clone());
            move |_: McRequest| {
                let first = {
                    let mut calls = calls.lock().unwrap();
                    calls.push(started.elapsed());
                    calls.len() == 1
                };
                let guard = DropFlag(cancelled.clone());
                async move {
                    let _guard = guard;
                    if first {
                        std::future::pending::<()>().await;
                    }
                    Ok::<_, BoxError>(Action::await_change())
                }
            }
        }));
    let task = run(service, &[key("stuck")]);
    until("a second run", || calls.lock().unwrap().len() == 2).await;
    assert!(
        cancelled.load(Ordering::SeqCst),
        "the stuck run was dropped"
    );
    let calls = calls.lock().unwrap().clone();
    // One second of timeout, then the first backoff step.
    assert_eq!(calls[1] - calls[0], Duration::from_millis(1005));
    task.abort();
}

#[tokio::test(start_paused = true)]
async fn tower_rate_limit_behind_a_buffer_paces_reconciles() {
    let times = Arc::new(Mutex::new(Vec::new()));
    let started = Instant::now();
    let service = ServiceBuilder::new()
        .buffer(16)
        .rate_limit(2, Duration::from_secs(1))
        .service(service_fn({
            let times = times.clone();
            move |_: McRequest| {
                times.lock().unwrap().push(started.elapsed());
                async { Ok::<_, BoxError>(Action::await_change()) }
            }
        }));
    let keys: Vec<_> = (0..6).map(|i| key(&i.to_string())).collect();
    let task = run(service, &keys);
    until("all six", || times.lock().unwrap().len() == 6).await;
    let seconds: Vec<_> = times.lock().unwrap().iter().map(|t| t.as_secs()).collect();
    assert_eq!(seconds, [0, 0, 1, 1, 2, 2]);
    task.abort();
}

#[tokio::test(start_paused = true)]
async fn load_shed_rejects_work_beyond_capacity_and_the_queue_retries_it() {
    let done = Arc::new(AtomicUsize::new(0));
    let shed = Arc::new(AtomicUsize::new(0));
    let inner = ServiceBuilder::new()
        .load_shed()
        .concurrency_limit(1)
        .service(service_fn({
            let done = done.clone();
            move |_: McRequest| {
                let done = done.clone();
                async move {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    done.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, BoxError>(Action::await_change())
                }
            }
        }));
    // Counts the rejections on their way to the queue.
    let service = ServiceBuilder::new()
        .map_err({
            let shed = shed.clone();
            move |error: BoxError| {
                if error.is::<Overloaded>() {
                    shed.fetch_add(1, Ordering::SeqCst);
                }
                error
            }
        })
        .service(inner);
    let keys: Vec<_> = (0..5).map(|i| key(&i.to_string())).collect();
    let task = run(service, &keys);
    until("all five done", || done.load(Ordering::SeqCst) == 5).await;
    assert!(shed.load(Ordering::SeqCst) > 0, "some work was shed");
    task.abort();
}

#[tokio::test(start_paused = true)]
async fn retry_layer_retries_a_conflict_within_the_same_reconcile() {
    let calls = Arc::new(Mutex::new(Vec::new()));
    let started = Instant::now();
    let service = ServiceBuilder::new()
        .layer(RetryLayer::new(TransientErrors::new(3)))
        .service(service_fn({
            let calls = calls.clone();
            move |_: McRequest| {
                let first = {
                    let mut calls = calls.lock().unwrap();
                    calls.push(started.elapsed());
                    calls.len() == 1
                };
                async move {
                    if first {
                        let conflict = kube::core::Status::failure("conflict", "Conflict")
                            .with_code(409)
                            .boxed();
                        return Err::<Action, BoxError>(Box::new(kube::Error::Api(conflict)));
                    }
                    Ok(Action::await_change())
                }
            }
        }));
    let task = run(service, &[key("contended")]);
    until("retried", || calls.lock().unwrap().len() == 2).await;
    tokio::time::sleep(Duration::from_secs(60)).await;
    let calls = calls.lock().unwrap().clone();
    assert_eq!(
        calls.len(),
        2,
        "the retry succeeded, so the queue had nothing to redo"
    );
    let gap = calls[1] - calls[0];
    assert!(
        gap >= Duration::from_millis(50) && gap <= Duration::from_millis(100),
        "{gap:?}"
    );
    task.abort();
}
