//! The panic-catching layer, alone.

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    task::{Context, Poll},
};

use kube_multicluster::{Action, McRequest};
use kube_multicluster_layers::catch_panic::{CatchPanicLayer, Panicked};
use tower::{BoxError, Service, ServiceBuilder, ServiceExt, service_fn};

fn request(name: &str) -> McRequest {
    McRequest::new("c", Some("ns"), name)
}

#[tokio::test]
async fn a_panic_while_reconciling_becomes_a_panicked_error() {
    let mut service = ServiceBuilder::new()
        .layer(CatchPanicLayer::new())
        .service(service_fn(|request: McRequest| async move {
            if request.name == "bad" {
                panic!("bad object {}", request.name);
            }
            Ok::<_, BoxError>(Action::await_change())
        }));
    let error = service
        .ready()
        .await
        .unwrap()
        .call(request("bad"))
        .await
        .unwrap_err();
    let panicked = error.downcast_ref::<Panicked>().expect("a Panicked error");
    assert_eq!(panicked.message(), "bad object bad");
    // The same service goes on serving.
    let action = service.ready().await.unwrap().call(request("good")).await;
    assert_eq!(action.unwrap(), Action::await_change());
}

/// A service that panics in `call` itself, not in its future.
#[derive(Clone)]
struct PanicsInCall(Arc<AtomicUsize>);

impl Service<McRequest> for PanicsInCall {
    type Response = Action;
    type Error = BoxError;
    type Future = std::future::Ready<Result<Action, BoxError>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _request: McRequest) -> Self::Future {
        if self.0.fetch_add(1, Ordering::SeqCst) == 0 {
            panic!("{}", String::from("first call"));
        }
        std::future::ready(Ok(Action::requeue(std::time::Duration::from_secs(1))))
    }
}

#[tokio::test]
async fn a_panic_in_call_becomes_an_error_too() {
    let mut service = ServiceBuilder::new()
        .layer(CatchPanicLayer::new())
        .service(PanicsInCall(Arc::default()));
    let error = service
        .ready()
        .await
        .unwrap()
        .call(request("x"))
        .await
        .unwrap_err();
    assert_eq!(
        error.downcast_ref::<Panicked>().unwrap().message(),
        "first call"
    );
    assert!(
        service
            .ready()
            .await
            .unwrap()
            .call(request("x"))
            .await
            .is_ok()
    );
}

#[tokio::test]
async fn ordinary_errors_pass_through_unchanged() {
    let service = ServiceBuilder::new()
        .layer(CatchPanicLayer::new())
        .service(service_fn(|_: McRequest| async {
            Err::<Action, BoxError>("conflict".into())
        }));
    let error = service.oneshot(request("x")).await.unwrap_err();
    assert!(error.downcast_ref::<Panicked>().is_none());
    assert_eq!(error.to_string(), "conflict");
}
