//! The metrics layer, alone: counts by result and cluster, durations.

use std::time::Duration;

#[path = "../../tests/support/empty_api.rs"]
mod empty_api;

use kube_multicluster::{Action, McRequest};
use kube_multicluster_layers::{
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
        .layer(MetricsLayer::new(metrics.clone()).controller("widgets"))
        .layer(CatchPanicLayer::new())
        .service(service_fn(|request: McRequest| async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            match request.name.as_str() {
                "fails" => Err::<Action, BoxError>("no".into()),
                "panics" => panic!("bug"),
                "later" => Ok(Action::requeue(Duration::from_secs(60))),
                "again" => Ok(Action::requeue(Duration::ZERO)),
                _ => Ok(Action::await_change()),
            }
        }));
    for (cluster, name) in [
        ("east", "ok"),
        ("east", "ok"),
        ("east", "fails"),
        ("west", "panics"),
        ("west", "later"),
        ("west", "again"),
    ] {
        let _ = service
            .clone()
            .oneshot(McRequest::new(cluster, Some("ns"), name))
            .await;
    }
    assert_eq!(metrics.count("widgets", "east", "success"), 2);
    assert_eq!(metrics.count("widgets", "east", "error"), 1);
    assert_eq!(metrics.count("widgets", "west", "panic"), 1);
    // A panic is a failed reconcile too, as controller-runtime counts it.
    assert_eq!(metrics.count("widgets", "west", "error"), 1);
    assert_eq!(metrics.count("widgets", "west", "requeue_after"), 1);
    assert_eq!(metrics.count("widgets", "west", "requeue"), 1);
    assert_eq!(metrics.count("widgets", "west", "success"), 0);

    let mut text = String::new();
    encode(&mut text, &registry).unwrap();
    // Three reconciles in east, each 0.3 s: all in the 0.512 s bucket, none in 0.256 s.
    let bucket = |le: &str| {
        format!(
            r#"controller_runtime_reconcile_time_seconds_bucket{{le="{le}",controller="widgets",cluster="east"}}"#
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
    for series in [
        r#"controller_runtime_reconcile_total{controller="widgets",cluster="west",result="requeue_after"} 1"#,
        r#"controller_runtime_reconcile_errors_total{controller="widgets",cluster="east"} 1"#,
        r#"controller_runtime_reconcile_errors_total{controller="widgets",cluster="west"} 1"#,
        r#"controller_runtime_reconcile_panics_total{controller="widgets",cluster="west"} 1"#,
    ] {
        assert!(text.contains(series), "{series} missing in\n{text}");
    }
}

#[tokio::test(start_paused = true)]
async fn queue_depths_and_engaged_clusters_are_read_at_each_scrape() {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::runtime::watcher;
    use kube_multicluster::{Controller, Fleet, ObjectRequest};
    use kube_multicluster_layers::metrics::{FleetCollector, QueueDepths};

    let mut registry = Registry::default();
    let fleet = Fleet::new();
    // The requests' cluster is in the fleet; its API server holds nothing.
    fleet.engage("east", empty_api::empty_api_client());
    FleetCollector::register(&mut registry, fleet.clone());
    let depths = QueueDepths::register(&mut registry);
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let controller = Controller::<ConfigMap>::new(&fleet, watcher::Config::default())
        .named("widgets")
        .reconcile_on(tokio_stream::wrappers::UnboundedReceiverStream::new(rx));
    depths.add(controller.queue_depth());
    let service = ServiceBuilder::new()
        .concurrency_limit(1)
        .service(service_fn(|_: ObjectRequest<ConfigMap>| async {
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
        text.contains(r#"workqueue_depth{name="widgets",controller="widgets"} 2"#),
        "{text}"
    );
    assert!(
        text.contains("kube_multicluster_engaged_clusters 1"),
        "{text}"
    );
    task.abort();
}

/// Every series line of the registry that names a cluster.
fn cluster_series(registry: &Registry) -> Vec<String> {
    let mut text = String::new();
    encode(&mut text, registry).unwrap();
    text.lines()
        .filter(|line| !line.starts_with('#') && line.contains("cluster=\""))
        .map(str::to_owned)
        .collect()
}

/// Waits until each of `names` has been reconciled.
async fn wait_for(
    reconciled: &mut tokio::sync::mpsc::UnboundedReceiver<kube_multicluster::ClusterName>,
    names: std::collections::HashSet<kube_multicluster::ClusterName>,
) {
    let mut missing = names;
    tokio::time::timeout(Duration::from_secs(60), async {
        while !missing.is_empty() {
            missing.remove(&reconciled.recv().await.unwrap());
        }
    })
    .await
    .unwrap_or_else(|_| panic!("never reconciled in {} clusters", missing.len()));
}

#[tokio::test]
async fn series_of_clusters_that_left_are_dropped_and_the_count_returns_to_where_it_was() {
    use std::collections::HashSet;

    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::{
        Api,
        api::{ObjectMeta, PostParams},
        runtime::watcher,
    };
    use kube_multicluster::{ClusterName, Controller, Fleet, ObjectRequest};
    use kube_multicluster_envtest::Envtest;
    use kube_multicluster_layers::metrics::MetricsLayer;

    const NAMES: usize = 1500;
    const AT_ONCE: usize = 100;

    let env = Envtest::start(1).await.unwrap();
    let client = env.clusters()[0].client();
    let only = ConfigMap {
        metadata: ObjectMeta {
            name: Some("only".into()),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    };
    Api::<ConfigMap>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &only)
        .await
        .unwrap();

    let fleet = Fleet::new();
    let mut registry = Registry::default();
    let metrics = ReconcileMetrics::new(&mut registry).follow(&fleet);
    let (seen, mut reconciled) = tokio::sync::mpsc::unbounded_channel::<ClusterName>();
    let stack = ServiceBuilder::new()
        .layer(MetricsLayer::new(metrics.clone()))
        .service(service_fn(move |request: ObjectRequest<ConfigMap>| {
            let _ = seen.send(request.request.cluster.clone());
            async { Ok::<_, BoxError>(Action::await_change()) }
        }));
    let only_one = watcher::Config::default().fields("metadata.name=only");
    let controller = Controller::<ConfigMap>::new(&fleet, only_one).named("configmaps");
    let status = controller.status();
    let task = tokio::spawn(controller.run(stack));

    fleet.engage("stays", client.clone());
    wait_for(&mut reconciled, HashSet::from([ClusterName::new("stays")])).await;
    let before = cluster_series(&registry);
    assert!(!before.is_empty());

    for round in 0..NAMES / AT_ONCE {
        let names: HashSet<ClusterName> = (0..AT_ONCE)
            .map(|i| ClusterName::new(format!("passing-{round}-{i}")))
            .collect();
        for name in &names {
            fleet.engage(name.clone(), client.clone());
        }
        wait_for(&mut reconciled, names.clone()).await;
        for name in &names {
            fleet.disengage(name);
        }
    }

    tokio::time::timeout(Duration::from_secs(10), async {
        while metrics.clusters_recorded() > 1 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the series of departed clusters are dropped");
    assert_eq!(cluster_series(&registry), before);
    assert_eq!(fleet.clusters().len(), 1);
    assert_eq!(status.clusters().len(), 1, "the controller forgot them too");
    task.abort();
}

#[tokio::test]
async fn following_a_fleet_keeps_nothing_of_it_alive_once_both_are_dropped() {
    use kube_multicluster::Fleet;

    let (idle, mut handle) = tower_test::mock::pair::<
        http::Request<kube::client::Body>,
        http::Response<kube::client::Body>,
    >();
    // No identity read: the mock answers nothing, and must see no request.
    let fleet = Fleet::with_config(kube_multicluster::FleetConfig {
        duplicates: kube_multicluster::Duplicates::Ignore,
        ..kube_multicluster::FleetConfig::default()
    });
    fleet.engage("east", kube::Client::new(idle, "default"));
    let metrics = ReconcileMetrics::new(&mut Registry::default()).follow(&fleet);
    drop(metrics);
    drop(fleet);
    // The client's service goes with the fleet: its mock ends.
    let ended = tokio::time::timeout(Duration::from_secs(5), handle.next_request()).await;
    assert!(
        matches!(ended, Ok(None)),
        "the cluster's client was freed with the fleet"
    );
}
