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

#[tokio::test(start_paused = true)]
async fn queue_depths_and_engaged_clusters_are_read_at_each_scrape() {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::runtime::watcher;
    use kube_fleet::{Controller, Fleet, controller::Clusters};
    use kube_fleet_layers::metrics::{FleetCollector, QueueDepths};

    let mut registry = Registry::default();
    let fleet = Fleet::new();
    // The requests' cluster is in the fleet; the controller watches nothing
    // there (it selects only the local cluster), so an idle client will do.
    let (idle, _handle) = tower_test::mock::pair::<
        http::Request<kube::client::Body>,
        http::Response<kube::client::Body>,
    >();
    fleet.engage("east", kube::Client::new(idle, "default"));
    FleetCollector::register(&mut registry, fleet.clone());
    let depths = QueueDepths::register(&mut registry);
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let controller = Controller::<ConfigMap>::new(&fleet, watcher::Config::default())
        .clusters(Clusters::Local)
        .reconcile_on(tokio_stream::wrappers::UnboundedReceiverStream::new(rx));
    depths.add("widgets", controller.queue_depth());
    let service = ServiceBuilder::new()
        .concurrency_limit(1)
        .service(service_fn(|_: McRequest| async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            Ok::<_, BoxError>(Action::await_change())
        }));
    for i in 0..3 {
        tx.send(McRequest::new("east", Some("ns"), format!("k{i}")))
            .unwrap();
    }
    let task = tokio::spawn(controller.run(service));
    tokio::time::sleep(Duration::from_millis(100)).await;

    let mut text = String::new();
    encode(&mut text, &registry).unwrap();
    assert!(
        text.contains(r#"kube_fleet_queue_depth{controller="widgets"} 2"#),
        "{text}"
    );
    assert!(text.contains("kube_fleet_engaged_clusters 1"), "{text}");
    task.abort();
}
