use std::sync::{
    Arc, Mutex,
    atomic::{AtomicBool, AtomicUsize, Ordering},
};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::watcher;
use tokio::time::Instant;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tower::{ServiceBuilder, service_fn};

use crate::{
    controller::{Controller, Error},
    queue::Backoff,
};

#[path = "../../../../tests/support/empty_api.rs"]
mod empty_api;
use empty_api::empty_api_client;

/// The service of keys inside a controller's typed requests: these tests
/// are about keys, and every object is absent.
fn keys<S>(
    service: S,
) -> impl Service<ObjectRequest<ConfigMap>, Response = Action, Error = S::Error, Future: Send + 'static>
+ Send
+ 'static
where
    S: Service<McRequest, Response = Action> + Send + 'static,
    S::Future: Send + 'static,
{
    use tower::ServiceExt;
    service.map_request(|request: ObjectRequest<ConfigMap>| request.request)
}

use std::time::Duration;

use tokio::sync::mpsc;

use super::*;

/// A controller over an empty fleet, fed requests through a channel.
fn fed_controller() -> (Controller<ConfigMap>, mpsc::UnboundedSender<McRequest>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let fleet = Fleet::new();
    // The requests name cluster "c", which must be in the fleet.
    fleet.engage("c", empty_api_client());
    let no_jitter = Backoff {
        jitter: 0.0,
        ..Backoff::default()
    };
    let controller = Controller::<ConfigMap>::new(&fleet, watcher::Config::default())
        .with_config(Config::default().backoff(no_jitter))
        .reconcile_on(UnboundedReceiverStream::new(rx));
    (controller, tx)
}

fn key(name: &str) -> McRequest {
    McRequest::new("c", Some("ns"), name)
}

async fn until(what: &str, condition: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(3600);
    while !condition() {
        assert!(Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

#[tokio::test(start_paused = true)]
async fn pulls_a_key_only_when_the_service_is_ready() {
    let (controller, requests) = fed_controller();
    let (running, most, done) = (
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
    );
    let service = ServiceBuilder::new()
        .concurrency_limit(2)
        .service(service_fn({
            let (running, most, done) = (running.clone(), most.clone(), done.clone());
            move |_: McRequest| {
                let (running, most, done) = (running.clone(), most.clone(), done.clone());
                async move {
                    let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    running.fetch_sub(1, Ordering::SeqCst);
                    done.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, BoxError>(Action::await_change())
                }
            }
        }));
    for i in 0..10 {
        requests.send(key(&i.to_string())).unwrap();
    }
    let started = Instant::now();
    let task = tokio::spawn(controller.run(keys(service)));
    until("all ran", || done.load(Ordering::SeqCst) == 10).await;
    assert_eq!(
        most.load(Ordering::SeqCst),
        2,
        "never more than the limit in flight"
    );
    assert!(started.elapsed() >= Duration::from_millis(500));
    task.abort();
}

#[tokio::test(start_paused = true)]
async fn an_error_sends_the_key_back_after_its_backoff_and_success_ends_it() {
    let (controller, requests) = fed_controller();
    let calls = Arc::new(Mutex::new(Vec::new()));
    let service = service_fn({
        let calls = calls.clone();
        move |_: McRequest| {
            let mut calls = calls.lock().unwrap();
            calls.push(Instant::now());
            let fail = calls.len() <= 3;
            async move {
                if fail {
                    Err::<Action, BoxError>("not yet".into())
                } else {
                    Ok(Action::await_change())
                }
            }
        }
    });
    requests.send(key("flaky")).unwrap();
    let task = tokio::spawn(controller.run(keys(service)));
    until("four calls", || calls.lock().unwrap().len() == 4).await;
    tokio::time::sleep(Duration::from_secs(60)).await;
    let calls = calls.lock().unwrap().clone();
    assert_eq!(calls.len(), 4, "no call after the success");
    let gaps: Vec<_> = calls.windows(2).map(|w| w[1] - w[0]).collect();
    let ms = Duration::from_millis;
    assert_eq!(gaps, [ms(5), ms(10), ms(20)]);
    task.abort();
}

#[tokio::test(start_paused = true)]
async fn a_panicking_reconcile_is_retried_and_other_keys_keep_running() {
    let (controller, requests) = fed_controller();
    let calls = Arc::new(Mutex::new(Vec::<String>::new()));
    let service = service_fn({
        let calls = calls.clone();
        move |request: McRequest| {
            let first = {
                let mut calls = calls.lock().unwrap();
                calls.push(request.name.clone());
                calls.iter().filter(|n| **n == request.name).count() == 1
            };
            async move {
                if request.name == "boom" && first {
                    panic!("reconcile bug");
                }
                Ok::<_, BoxError>(Action::await_change())
            }
        }
    });
    requests.send(key("boom")).unwrap();
    requests.send(key("fine")).unwrap();
    let task = tokio::spawn(controller.run(keys(service)));
    until("boom retried", || {
        calls
            .lock()
            .unwrap()
            .iter()
            .filter(|n| *n == "boom")
            .count()
            == 2
    })
    .await;
    tokio::time::sleep(Duration::from_secs(60)).await;
    let mut calls = calls.lock().unwrap().clone();
    calls.sort();
    assert_eq!(calls, ["boom", "boom", "fine"]);
    assert!(!task.is_finished(), "the controller keeps running");
    task.abort();
}

/// A service that panics in `poll_ready` or `call` the first time it
/// is asked to, and records the keys it is called with after that.
#[derive(Clone)]
struct PanicsOnce {
    in_poll_ready: bool,
    panicked: Arc<AtomicBool>,
    called: Arc<Mutex<Vec<String>>>,
}

impl Service<McRequest> for PanicsOnce {
    type Response = Action;
    type Error = BoxError;
    type Future = futures::future::Ready<Result<Action, BoxError>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        if self.in_poll_ready && !self.panicked.swap(true, Ordering::SeqCst) {
            panic!("poll_ready bug");
        }
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: McRequest) -> Self::Future {
        if !self.in_poll_ready && !self.panicked.swap(true, Ordering::SeqCst) {
            panic!("call bug");
        }
        self.called.lock().unwrap().push(request.name);
        futures::future::ready(Ok(Action::await_change()))
    }
}

#[tokio::test(start_paused = true)]
async fn a_panic_in_poll_ready_or_call_fails_one_key_and_the_controller_goes_on() {
    for in_poll_ready in [true, false] {
        let (controller, requests) = fed_controller();
        let service = PanicsOnce {
            in_poll_ready,
            panicked: Arc::default(),
            called: Arc::default(),
        };
        let called = service.called.clone();
        requests.send(key("first")).unwrap();
        requests.send(key("second")).unwrap();
        let task = tokio::spawn(controller.run(keys(service)));
        until("both keys ran", || called.lock().unwrap().len() == 2).await;
        tokio::time::sleep(Duration::from_secs(60)).await;
        let mut called = called.lock().unwrap().clone();
        called.sort();
        assert_eq!(called, ["first", "second"], "the failed key was retried");
        assert!(!task.is_finished(), "the controller keeps running");
        task.abort();
    }
}

/// A controller of cluster "c" in `fleet`, fed through a channel, that
/// counts the reconciles that start; the first one of key "hang" hangs.
fn counting_controller(
    fleet: &Fleet,
) -> (
    Controller<ConfigMap>,
    mpsc::UnboundedSender<McRequest>,
    Arc<AtomicUsize>,
) {
    let (tx, rx) = mpsc::unbounded_channel();
    let controller = Controller::<ConfigMap>::new(fleet, watcher::Config::default())
        .reconcile_on(UnboundedReceiverStream::new(rx));
    (controller, tx, Arc::default())
}

fn hangs_first(
    started: Arc<AtomicUsize>,
) -> impl Service<McRequest, Response = Action, Error = BoxError, Future: Send + 'static> + Send + 'static
{
    service_fn(move |request: McRequest| {
        let started = started.clone();
        async move {
            let n = started.fetch_add(1, Ordering::SeqCst);
            if request.name == "hang" && n == 0 {
                std::future::pending::<()>().await;
            }
            Ok::<_, BoxError>(Action::await_change())
        }
    })
}

#[tokio::test(start_paused = true)]
async fn a_run_cut_short_by_a_replacement_runs_again_against_the_new_cluster() {
    let fleet = Fleet::new();
    fleet.engage("c", empty_api_client());
    let (controller, requests, started) = counting_controller(&fleet);
    requests.send(key("hang")).unwrap();
    let task = tokio::spawn(controller.run(keys(hangs_first(started.clone()))));
    until("it runs", || started.load(Ordering::SeqCst) == 1).await;
    // The same name, another client: the running reconcile is cancelled
    // and the key runs again.
    fleet.engage("c", empty_api_client());
    until("it runs again", || started.load(Ordering::SeqCst) == 2).await;
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(started.load(Ordering::SeqCst), 2);
    task.abort();
}

#[tokio::test(start_paused = true)]
async fn a_key_of_a_disengaged_cluster_never_runs_in_a_successor_of_the_same_name() {
    let fleet = Fleet::new();
    fleet.engage("c", empty_api_client());
    let (controller, requests, started) = counting_controller(&fleet);
    requests.send(key("hang")).unwrap();
    let task = tokio::spawn(controller.run(keys(hangs_first(started.clone()))));
    until("it runs", || started.load(Ordering::SeqCst) == 1).await;
    // Both before the controller hears of either.
    fleet.disengage("c");
    fleet.engage("c", empty_api_client());
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(started.load(Ordering::SeqCst), 1, "purged, not resurrected");
    task.abort();
}

/// Replaces cluster "c" in the fleet from inside its first `poll_ready`,
/// so that the key the controller then takes belongs to a cluster that
/// has just been replaced, before the controller hears of it.
struct ReplacesOnReady {
    fleet: Fleet,
    replaced: bool,
    started: Arc<AtomicUsize>,
}

impl Service<McRequest> for ReplacesOnReady {
    type Response = Action;
    type Error = BoxError;
    type Future = futures::future::Ready<Result<Action, BoxError>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        if !std::mem::replace(&mut self.replaced, true) {
            self.fleet.engage("c", empty_api_client());
        }
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: McRequest) -> Self::Future {
        self.started.fetch_add(1, Ordering::SeqCst);
        futures::future::ready(Ok(Action::await_change()))
    }
}

#[tokio::test(start_paused = true)]
async fn a_key_taken_while_its_cluster_is_being_replaced_runs_against_the_new_one() {
    let fleet = Fleet::new();
    fleet.engage("c", empty_api_client());
    let (controller, requests, started) = counting_controller(&fleet);
    requests.send(key("x")).unwrap();
    let service = ReplacesOnReady {
        fleet: fleet.clone(),
        replaced: false,
        started: started.clone(),
    };
    let task = tokio::spawn(controller.run(keys(service)));
    until("it runs", || started.load(Ordering::SeqCst) == 1).await;
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(
        started.load(Ordering::SeqCst),
        1,
        "once, not lost, not twice"
    );
    task.abort();
}

/// Log lines written while the test runs, for checking what a user sees.
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Logs {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test(start_paused = true)]
async fn requests_for_a_cluster_outside_the_fleet_are_dropped_with_one_warning() {
    let logs = Logs::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer({
            let logs = logs.clone();
            move || logs.clone()
        })
        .with_max_level(tracing::Level::WARN)
        .with_ansi(false)
        .finish();
    let _logging = tracing::subscriber::set_default(subscriber);
    let (controller, requests) = fed_controller();
    let (service, calls) = {
        let calls = Arc::new(AtomicUsize::new(0));
        let counted = calls.clone();
        let service = service_fn(move |_: McRequest| {
            counted.fetch_add(1, Ordering::SeqCst);
            async { Ok::<_, BoxError>(Action::await_change()) }
        });
        (service, calls)
    };
    for name in ["a", "b", "c"] {
        requests
            .send(McRequest::new("nowhere", Some("ns"), name))
            .unwrap();
    }
    requests.send(key("known")).unwrap();
    let task = tokio::spawn(controller.run(keys(service)));
    until("the known cluster's key ran", || {
        calls.load(Ordering::SeqCst) == 1
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "none for the unknown cluster"
    );
    let logs = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    let warnings: Vec<_> = logs
        .lines()
        .filter(|l| l.contains("not in the fleet"))
        .collect();
    assert_eq!(warnings.len(), 1, "{logs}");
    assert!(warnings[0].contains("cluster://nowhere/ns/a"), "{logs}");
    task.abort();
}

/// A service that always fails with `error()`, recording when it runs.
fn always_failing(
    error: fn() -> BoxError,
) -> (
    impl Service<McRequest, Response = Action, Error = BoxError, Future: Send + 'static>
    + Send
    + 'static,
    Arc<Mutex<Vec<Instant>>>,
) {
    let calls = Arc::new(Mutex::new(Vec::new()));
    let recorded = calls.clone();
    let service = service_fn(move |_: McRequest| {
        recorded.lock().unwrap().push(Instant::now());
        async move { Err::<Action, BoxError>(error()) }
    });
    (service, calls)
}

#[tokio::test(start_paused = true)]
async fn a_terminal_error_is_not_retried_until_the_key_comes_again() {
    let (controller, requests) = fed_controller();
    let (service, calls) = always_failing(|| crate::error::TerminalError::new("bad spec").into());
    requests.send(key("broken")).unwrap();
    let task = tokio::spawn(controller.run(keys(service)));
    until("it ran", || calls.lock().unwrap().len() == 1).await;
    tokio::time::sleep(Duration::from_secs(3600)).await;
    assert_eq!(calls.lock().unwrap().len(), 1, "not retried");
    // A change brings it back.
    requests.send(key("broken")).unwrap();
    until("it ran again", || calls.lock().unwrap().len() == 2).await;
    task.abort();
}

#[tokio::test(start_paused = true)]
async fn the_error_policy_chooses_when_a_failed_key_runs_again() {
    let (controller, requests) = fed_controller();
    let controller = controller.error_policy(|request, error| {
        assert_eq!(error.to_string(), "throttled");
        match request.name.as_str() {
            "later" => Some(Action::requeue(Duration::from_secs(7))),
            "never" => Some(Action::await_change()),
            "boom" => panic!("policy bug"),
            _ => None,
        }
    });
    let (service, calls) = {
        let calls = Arc::new(Mutex::new(Vec::<(String, Instant)>::new()));
        let recorded = calls.clone();
        let service = service_fn(move |request: McRequest| {
            recorded
                .lock()
                .unwrap()
                .push((request.name, Instant::now()));
            async { Err::<Action, BoxError>("throttled".into()) }
        });
        (service, calls)
    };
    for name in ["later", "never", "boom", "default"] {
        requests.send(key(name)).unwrap();
    }
    let task = tokio::spawn(controller.run(keys(service)));
    tokio::time::sleep(Duration::from_secs(15)).await;
    task.abort();
    let calls = calls.lock().unwrap().clone();
    let times = |name: &str| -> Vec<Instant> {
        calls
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, t)| *t)
            .collect()
    };
    let later = times("later");
    assert_eq!(later.len(), 3, "at 0, 7 and 14 s");
    assert_eq!(later[1] - later[0], Duration::from_secs(7));
    assert_eq!(times("never").len(), 1);
    // A panicking policy, or none, means the backoff: many quick retries.
    assert!(times("boom").len() > 5);
    assert!(times("default").len() > 5);
}

#[tokio::test(start_paused = true)]
async fn graceful_shutdown_lets_running_reconciles_finish_and_starts_no_new_ones() {
    let (signal, shutdown) = tokio::sync::oneshot::channel::<()>();
    let (controller, requests) = fed_controller();
    let controller = controller.graceful_shutdown_on(async move {
        let _ = shutdown.await;
    });
    let finished = Arc::new(Mutex::new(Vec::new()));
    let service = ServiceBuilder::new()
        .concurrency_limit(1)
        .service(service_fn({
            let finished = finished.clone();
            move |request: McRequest| {
                let finished = finished.clone();
                async move {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    finished.lock().unwrap().push(request.name);
                    Ok::<_, BoxError>(Action::await_change())
                }
            }
        }));
    requests.send(key("first")).unwrap();
    requests.send(key("second")).unwrap();
    let task = tokio::spawn(controller.run(keys(service)));
    tokio::time::sleep(Duration::from_millis(500)).await;
    signal.send(()).unwrap();
    let result: Result<(), Error> = task.await.unwrap();
    result.unwrap();
    assert_eq!(*finished.lock().unwrap(), ["first"]);
}

#[tokio::test(start_paused = true)]
async fn graceful_shutdown_cancels_reconciles_that_outlast_the_timeout() {
    let (controller, requests) = fed_controller();
    let controller = controller
        .graceful_shutdown_on(tokio::time::sleep(Duration::from_millis(100)))
        .with_config(Config::default().shutdown_timeout(Duration::from_secs(2)));
    let dropped = Arc::new(AtomicBool::new(false));
    let service = service_fn({
        let dropped = dropped.clone();
        move |_: McRequest| {
            let guard = DropFlag(dropped.clone());
            async move {
                let _guard = guard;
                tokio::time::sleep(Duration::from_secs(3600)).await;
                Ok::<_, BoxError>(Action::await_change())
            }
        }
    });
    requests.send(key("stuck")).unwrap();
    let started = Instant::now();
    controller.run(keys(service)).await.unwrap();
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(2100) && took < Duration::from_secs(3),
        "{took:?}"
    );
    tokio::task::yield_now().await;
    assert!(
        dropped.load(Ordering::SeqCst),
        "the stuck reconcile was cancelled"
    );
}

#[tokio::test(start_paused = true)]
async fn the_queue_depth_counts_keys_waiting_not_running() {
    let (controller, requests) = fed_controller();
    let depth = controller.queue_depth();
    let service = ServiceBuilder::new()
        .concurrency_limit(1)
        .service(service_fn(|_: McRequest| async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            Ok::<_, BoxError>(Action::await_change())
        }));
    for i in 0..5 {
        requests.send(key(&i.to_string())).unwrap();
    }
    let task = tokio::spawn(controller.run(keys(service)));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(depth.get(), 4, "one runs, four wait");
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(depth.get(), 0);
    task.abort();
}

struct DropFlag(Arc<AtomicBool>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}
