//! The transient-error retry policy inside tower's `RetryLayer`.

use std::{
    collections::VecDeque,
    sync::{Arc, Mutex},
    time::Duration,
};

use kube::core::{Status, response::StatusDetails};
use kube_multicluster::{Action, McRequest};
use kube_multicluster_layers::retry::TransientErrors;
use tokio::time::Instant;
use tower::{BoxError, ServiceBuilder, ServiceExt, retry::RetryLayer, service_fn};

fn api_error(code: u16) -> BoxError {
    Box::new(kube::Error::Api(
        Status::failure("scripted", "Scripted")
            .with_code(code)
            .boxed(),
    ))
}

fn already_exists() -> BoxError {
    Box::new(kube::Error::Api(
        Status::failure("exists", "AlreadyExists")
            .with_code(409)
            .boxed(),
    ))
}

fn too_many_requests(retry_after_seconds: u32) -> BoxError {
    let details = StatusDetails {
        name: String::new(),
        group: String::new(),
        kind: String::new(),
        uid: String::new(),
        causes: Vec::new(),
        retry_after_seconds,
    };
    Box::new(kube::Error::Api(
        Status::failure("slow down", "TooManyRequests")
            .with_code(429)
            .with_details(details)
            .boxed(),
    ))
}

/// Answers each call with the next scripted result (success once the
/// script runs out) and returns the time of every call.
async fn run_script(
    policy: TransientErrors,
    script: Vec<BoxError>,
) -> (Result<Action, BoxError>, Vec<Duration>) {
    let script = Arc::new(Mutex::new(VecDeque::from(script)));
    let calls = Arc::new(Mutex::new(Vec::new()));
    let started = Instant::now();
    let service = ServiceBuilder::new()
        .layer(RetryLayer::new(policy))
        .service(service_fn({
            let (script, calls) = (script.clone(), calls.clone());
            move |_: McRequest| {
                calls.lock().unwrap().push(started.elapsed());
                let next = script.lock().unwrap().pop_front();
                async move {
                    match next {
                        Some(error) => Err(error),
                        None => Ok(Action::await_change()),
                    }
                }
            }
        }));
    let result = service.oneshot(McRequest::new("c", Some("ns"), "x")).await;
    let calls = calls.lock().unwrap().clone();
    (result, calls)
}

#[tokio::test(start_paused = true)]
async fn conflicts_server_errors_and_connection_errors_are_retried() {
    let script = vec![
        api_error(409),
        api_error(503),
        Box::new(kube::Error::Service("connection refused".into())) as BoxError,
    ];
    let (result, calls) = run_script(TransientErrors::new(3), script).await;
    assert!(result.is_ok());
    assert_eq!(calls.len(), 4);
    // Jittered exponential backoff from 50 ms: each wait at least as long as the base.
    let waits: Vec<_> = calls.windows(2).map(|w| w[1] - w[0]).collect();
    for (wait, base) in waits.iter().zip([50, 100, 200]) {
        assert!(*wait >= Duration::from_millis(base), "{waits:?}");
        assert!(*wait <= Duration::from_millis(base * 2), "{waits:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn too_many_requests_waits_as_long_as_the_server_asks() {
    let policy =
        TransientErrors::with_backoff(3, Duration::from_millis(50), Duration::from_secs(10));
    let (result, calls) = run_script(policy, vec![too_many_requests(7)]).await;
    assert!(result.is_ok());
    assert_eq!(calls[1] - calls[0], Duration::from_secs(7));
}

#[tokio::test(start_paused = true)]
async fn validation_permission_and_not_found_errors_are_not_retried() {
    for code in [400, 403, 404, 422, 501] {
        let (result, calls) = run_script(TransientErrors::new(3), vec![api_error(code)]).await;
        assert!(result.is_err(), "{code}");
        assert_eq!(calls.len(), 1, "{code} was retried");
    }
    let (_, calls) = run_script(TransientErrors::new(3), vec!["a bug".into()]).await;
    assert_eq!(calls.len(), 1, "an unknown error is not retried");
    let (_, calls) = run_script(TransientErrors::new(3), vec![already_exists()]).await;
    assert_eq!(calls.len(), 1, "AlreadyExists is a 409 that does not clear");
}

#[tokio::test(start_paused = true)]
async fn retries_are_bounded_and_the_last_error_comes_back() {
    let script = (0..10).map(|_| api_error(500)).collect();
    let (result, calls) = run_script(TransientErrors::new(2), script).await;
    assert_eq!(calls.len(), 3, "one try and two retries");
    let error = result.unwrap_err();
    let kube_error = error.downcast_ref::<kube::Error>().unwrap();
    assert!(matches!(kube_error, kube::Error::Api(status) if status.code == 500));
}

#[tokio::test(start_paused = true)]
async fn a_timeout_inside_the_retry_is_retried() {
    use tower::timeout::TimeoutLayer;

    let calls = Arc::new(Mutex::new(0));
    let service = ServiceBuilder::new()
        .layer(RetryLayer::new(TransientErrors::new(3)))
        .layer(TimeoutLayer::new(Duration::from_secs(1)))
        .service(service_fn({
            let calls = calls.clone();
            move |_: McRequest| {
                let first = {
                    let mut calls = calls.lock().unwrap();
                    *calls += 1;
                    *calls == 1
                };
                async move {
                    if first {
                        tokio::time::sleep(Duration::from_secs(60)).await;
                    }
                    Ok::<_, BoxError>(Action::await_change())
                }
            }
        }));
    let result = service.oneshot(McRequest::new("c", Some("ns"), "x")).await;
    assert!(result.is_ok());
    assert_eq!(*calls.lock().unwrap(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_retry_after_longer_than_the_longest_backoff_is_left_to_the_queue() {
    let policy =
        TransientErrors::with_backoff(3, Duration::from_millis(50), Duration::from_secs(2));
    let (result, calls) = run_script(policy, vec![too_many_requests(120)]).await;
    assert!(result.is_err());
    assert_eq!(calls.len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_transient_error_wrapped_by_another_is_still_recognised() {
    /// A reconciler's own error, with the API's as its source.
    #[derive(Debug, thiserror::Error)]
    #[error("reconcile of {0} failed")]
    struct Wrapped(McRequest, #[source] kube::Error);

    let wrapped: BoxError = Box::new(Wrapped(
        McRequest::new("c", Some("ns"), "x"),
        kube::Error::Api(
            Status::failure("busy", "ServiceUnavailable")
                .with_code(503)
                .boxed(),
        ),
    ));
    let (result, calls) = run_script(TransientErrors::new(3), vec![wrapped]).await;
    assert!(result.is_ok());
    assert_eq!(calls.len(), 2);
}

#[tokio::test(start_paused = true)]
async fn reconciles_failing_together_do_not_retry_in_lockstep() {
    use tower::retry::Policy;

    let policy = TransientErrors::new(3);
    let deadlines: Vec<_> = (0..8)
        .map(|_| {
            let mut clone = policy.clone();
            let mut result: Result<Action, BoxError> = Err(api_error(503));
            let sleep = clone
                .retry(&mut McRequest::new("c", Some("ns"), "x"), &mut result)
                .expect("retried");
            sleep.deadline()
        })
        .collect();
    let distinct: std::collections::HashSet<_> = deadlines.iter().collect();
    assert!(
        distinct.len() > 1,
        "every clone waits the same: {deadlines:?}"
    );
}
