//! The recommended stack, behind a per-cluster rate limit, against three real
//! clusters: a reconcile that fails on purpose and one that panics are backed
//! off, recover, and are counted.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api,
    api::{ObjectMeta, PostParams},
    runtime::watcher,
};
use kube_multicluster::{
    Action, Controller, Fleet, ObjectRequest, controller::Config, provider::ProgrammaticProvider,
};
use kube_multicluster_envtest::Envtest;
use kube_multicluster_layers::{
    metrics::{FleetCollector, QueueDepths, ReconcileMetrics},
    recommended::RecommendedLayer,
};
use prometheus_client::{encoding::text::encode, registry::Registry};
use tokio::time::Instant;
use tower::{BoxError, ServiceBuilder, service_fn};

type Attempts = Arc<Mutex<HashMap<String, Vec<Instant>>>>;

#[tokio::test]
async fn failures_and_panics_back_off_recover_and_are_counted() {
    let env = Envtest::start(3).await.unwrap();
    for cluster in env.clusters() {
        let api = Api::<ConfigMap>::default_namespaced(cluster.client());
        let mut names = vec!["steady"];
        match cluster.name() {
            "cluster-0" => names.push("flaky"),
            "cluster-1" => names.push("boom"),
            _ => {}
        }
        for name in names {
            let config_map = ConfigMap {
                metadata: ObjectMeta {
                    name: Some(name.into()),
                    ..ObjectMeta::default()
                },
                ..ConfigMap::default()
            };
            api.create(&PostParams::default(), &config_map)
                .await
                .unwrap();
        }
    }

    let mut registry = Registry::default();
    let metrics = ReconcileMetrics::new(&mut registry);
    let fleet = Fleet::new();
    FleetCollector::register(&mut registry, fleet.clone());
    let depths = QueueDepths::register(&mut registry);

    let attempts = Attempts::default();
    let reconcile = service_fn({
        let attempts = attempts.clone();
        move |request: ObjectRequest<ConfigMap>| {
            let key = request.request.to_string();
            let tries = {
                let mut attempts = attempts.lock().unwrap();
                let times = attempts.entry(key).or_default();
                times.push(Instant::now());
                times.len()
            };
            async move {
                assert!(request.object.is_some(), "the object comes from the cache");
                match request.request.name.as_str() {
                    "flaky" if tries <= 2 => Err::<Action, BoxError>("not yet".into()),
                    "boom" if tries == 1 => panic!("a bug on the first try"),
                    _ => Ok(Action::await_change()),
                }
            }
        }
    });
    let stack = ServiceBuilder::new()
        // Spans and metrics are labelled with the name the controller is given.
        .layer(RecommendedLayer::new().metrics(metrics.clone()))
        .service(reconcile);
    let controller = Controller::<ConfigMap>::new(&fleet, watcher::Config::default())
        .named("configmaps")
        .with_config(Config::default().cluster_rate_limit(50.0, 100));
    depths.add(controller.queue_depth());
    let controller = tokio::spawn(controller.run(stack));
    let (provider, clusters) = ProgrammaticProvider::new();
    let provider = tokio::spawn({
        let fleet = fleet.clone();
        async move { fleet.run(provider).await }
    });
    for cluster in env.clusters() {
        clusters.engage(cluster.name(), cluster.client());
    }

    let recovered = |name: &str, tries: usize| {
        attempts
            .lock()
            .unwrap()
            .get(name)
            .is_some_and(|t| t.len() >= tries)
    };
    tokio::time::timeout(Duration::from_secs(60), async {
        while !(recovered("cluster://cluster-0/default/flaky", 3)
            && recovered("cluster://cluster-1/default/boom", 2)
            && (0..3).all(|i| recovered(&format!("cluster://cluster-{i}/default/steady"), 1)))
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("every key reconciled, the failing ones after their retries");

    // Backoff: 5 ms after the first failure, 10 ms after the second.
    let flaky = attempts.lock().unwrap()["cluster://cluster-0/default/flaky"].clone();
    assert!(flaky[1] - flaky[0] >= Duration::from_millis(5), "{flaky:?}");
    assert!(
        flaky[2] - flaky[1] >= Duration::from_millis(10),
        "{flaky:?}"
    );

    // Metrics: failures and the panic counted where they happened, and the
    // recoveries as successes.
    assert_eq!(metrics.count("configmaps", "cluster-0", "error"), 2);
    assert!(metrics.count("configmaps", "cluster-0", "success") >= 2);
    assert_eq!(metrics.count("configmaps", "cluster-1", "panic"), 1);
    assert!(metrics.count("configmaps", "cluster-1", "success") >= 2);
    assert_eq!(metrics.count("configmaps", "cluster-2", "error"), 0);
    let mut text = String::new();
    encode(&mut text, &registry).unwrap();
    assert!(
        text.contains("kube_multicluster_engaged_clusters 3"),
        "{text}"
    );
    assert!(
        text.contains(r#"workqueue_depth{name="configmaps",controller="configmaps"}"#),
        "{text}"
    );
    assert!(
        !controller.is_finished(),
        "the controller survives the panic"
    );
    controller.abort();
    provider.abort();
}
