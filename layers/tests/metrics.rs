//! The metrics layer, alone: counts by result and cluster, durations.

use std::time::Duration;

use kube_fleet::{Action, McRequest};
use kube_fleet_layers::{
    catch_panic::CatchPanicLayer,
    metrics::{MetricsLayer, ReconcileMetrics},
};
use prometheus_client::{encoding::text::encode, registry::Registry};
use tower::{BoxError, ServiceBuilder, ServiceExt, service_fn};

#[tokio::test(start_paused = true)]
async fn reconciles_are_counted_by_cluster_and_result_and_timed() {
    let mut registry = Registry::default();
    let metrics = ReconcileMetrics::new(&mut registry);
    let service = ServiceBuilder::new()
        .layer(MetricsLayer::new(metrics.clone(), "widgets"))
        .layer(CatchPanicLayer::new())
        .service(service_fn(|request: McRequest| async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            match request.name.as_str() {
                "fails" => Err::<Action, BoxError>("no".into()),
                "panics" => panic!("bug"),
                _ => Ok(Action::await_change()),
            }
        }));
    for (cluster, name) in [
        ("east", "ok"),
        ("east", "ok"),
        ("east", "fails"),
        ("west", "panics"),
    ] {
        let _ = service
            .clone()
            .oneshot(McRequest::new(cluster, Some("ns"), name))
            .await;
    }
    assert_eq!(metrics.count("widgets", "east", "success"), 2);
    assert_eq!(metrics.count("widgets", "east", "error"), 1);
    assert_eq!(metrics.count("widgets", "west", "panic"), 1);
    assert_eq!(metrics.count("widgets", "west", "success"), 0);

    let mut text = String::new();
    encode(&mut text, &registry).unwrap();
    // Three reconciles in east, each 0.3 s: all in the 0.512 s bucket, none in 0.256 s.
    let bucket = |le: &str| {
        format!(
            r#"kube_fleet_reconcile_duration_seconds_bucket{{le="{le}",controller="widgets",cluster="east"}}"#
        )
    };
    let value = |prefix: String| {
        text.lines()
            .find(|l| l.starts_with(&prefix))
            .unwrap_or_else(|| panic!("{prefix} missing in\n{text}"))
            .rsplit(' ')
            .next()
            .unwrap()
            .to_owned()
    };
    assert_eq!(value(bucket("0.256")), "0");
    assert_eq!(value(bucket("0.512")), "3");
}
