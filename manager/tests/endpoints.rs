//! `/healthz`, `/readyz` and `/metrics` of a running manager, read with a
//! real HTTP client, over controllers on real API servers.

mod support;

use std::time::Duration;

use hyper::StatusCode;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{CustomResource, CustomResourceExt, runtime::watcher};
use kube_multicluster::{Controller, Fleet, provider::ProgrammaticProvider};
use kube_multicluster_envtest::Envtest;
use kube_multicluster_layers::metrics::{MetricsLayer, ReconcileMetrics};
use kube_multicluster_manager::Manager;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use support::{
    PATIENCE, Records, config_maps,
    endpoints::{Endpoints, listener},
};
use tokio::sync::oneshot;
use tower::{BoxError, Layer, service_fn};

#[derive(CustomResource, Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[kube(group = "example.com", version = "v1", kind = "Widget", namespaced)]
struct WidgetSpec {
    size: u32,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoints_report_health_readiness_by_cluster_and_metrics() {
    let env = Envtest::start(2).await.expect("envtest");
    let (with, without) = (&env.clusters()[0], &env.clusters()[1]);
    with.install_crds([Widget::crd()]).await.expect("the CRD");
    for cluster in env.clusters() {
        config_maps(cluster.client(), "served", 2).await;
    }
    let fleet = Fleet::new();
    let (provider, clusters) = ProgrammaticProvider::new();
    let records = Records::default();
    let (listener, port) = listener();
    let (stop, stopped) = oneshot::channel::<()>();
    let mut manager = Manager::new(&fleet)
        .provider(provider)
        .endpoints_on(listener)
        .graceful_shutdown_on(async move {
            let _ = stopped.await;
        });
    let metrics = ReconcileMetrics::new(manager.registry()).follow(&fleet);
    let manager = manager
        .controller(
            Controller::<ConfigMap>::new(&fleet, watcher::Config::default().labels("served=true"))
                .named("configmaps"),
            MetricsLayer::new(metrics).layer(records.reconciler(
                "one",
                Duration::ZERO,
                Duration::from_secs(300),
            )),
        )
        .controller(
            Controller::<Widget>::new(&fleet, watcher::Config::default()).named("widgets"),
            service_fn(|_| async { Ok::<_, BoxError>(kube_multicluster::Action::await_change()) }),
        );
    let run = tokio::spawn(manager.run());
    let endpoints = Endpoints::new(port);

    let (status, body) = endpoints.get("/healthz").await.expect("/healthz answers");
    assert_eq!((status, body.as_str()), (StatusCode::OK, "ok\n"));
    let (status, _) = endpoints.get("/nothing").await.expect("answers");
    assert_eq!(status, StatusCode::NOT_FOUND);

    clusters.engage("cluster-0", with.client());
    clusters.engage("cluster-1", without.client());
    // Ready once both controllers serve what they can; cluster-1, with no
    // Widget CRD, is named but does not hold readiness back.
    let (_, body) = endpoints
        .readyz_until(|status, body| status == StatusCode::OK && body.contains("cannot sync"))
        .await;
    assert!(body.starts_with("ready\n"), "{body}");
    assert!(
        body.contains("controller configmaps: serving 2 of 2 clusters"),
        "{body}"
    );
    assert!(
        body.contains("controller widgets: serving 1 of 2 clusters"),
        "{body}"
    );
    let line = body
        .lines()
        .find(|line| line.contains("cannot sync"))
        .expect("a line for the cluster that cannot sync");
    assert!(
        line.contains("controller widgets") && line.contains("\"cluster-1\""),
        "{line}"
    );
    assert!(line.contains("Widget"), "the line names the type: {line}");
    assert!(
        !body.contains("\"cluster-0\""),
        "cluster-0 is served: {body}"
    );

    // Each ConfigMap was reconciled once, in each cluster.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while records.all().len() < 4 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "reconciles: {:?}",
            records.all()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (status, text) = endpoints.get("/metrics").await.expect("/metrics answers");
    assert_eq!(status, StatusCode::OK);
    assert!(
        text.contains("kube_multicluster_engaged_clusters 2"),
        "{text}"
    );
    for cluster in ["cluster-0", "cluster-1"] {
        // Each cluster's two keys were added and run once, and wait for
        // their requeue in 300 s: delayed, not ready, so not in the depth.
        // No Widget waits anywhere.
        for series in [
            format!(
                r#"workqueue_depth{{name="configmaps",controller="configmaps",cluster="{cluster}"}} 0"#
            ),
            format!(
                r#"workqueue_adds_total{{name="configmaps",controller="configmaps",cluster="{cluster}"}} 2"#
            ),
            format!(
                r#"workqueue_work_duration_seconds_count{{name="configmaps",controller="configmaps",cluster="{cluster}"}} 2"#
            ),
            format!(
                r#"workqueue_retries_total{{name="configmaps",controller="configmaps",cluster="{cluster}"}} 0"#
            ),
            format!(
                r#"workqueue_depth{{name="widgets",controller="widgets",cluster="{cluster}"}} 0"#
            ),
        ] {
            assert!(text.contains(&series), "{series} in {text}");
        }
        let series = format!(
            r#"controller_runtime_reconcile_total{{controller="configmaps",cluster="{cluster}",result="requeue_after"}} 2"#
        );
        assert!(text.contains(&series), "{series} in {text}");
        // The cluster's lists and watches, counted under its name.
        let requests =
            format!(r#"rest_client_requests_total{{cluster="{cluster}",code="200",method="GET""#);
        assert!(text.contains(&requests), "{requests} in {text}");
    }
    assert!(
        text.ends_with("# EOF\n"),
        "OpenMetrics text ends with # EOF"
    );

    let _ = stop.send(());
    let ended = tokio::time::timeout(PATIENCE, run).await.expect("stops");
    assert!(ended.expect("the manager's task").is_ok());
    // Closed once `run` has returned: the connection kept alive is not
    // answered, and the port is free for another manager.
    assert!(
        endpoints.get("/healthz").await.is_err(),
        "no endpoints after the stop"
    );
    std::net::TcpListener::bind(("127.0.0.1", port)).expect("the port is free again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strict_readiness_holds_the_process_unready_while_a_cluster_cannot_sync() {
    let env = Envtest::start(2).await.expect("envtest");
    let (with, without) = (&env.clusters()[0], &env.clusters()[1]);
    with.install_crds([Widget::crd()]).await.expect("the CRD");
    let fleet = Fleet::new();
    let (provider, clusters) = ProgrammaticProvider::new();
    let (listener, port) = listener();
    let manager = Manager::new(&fleet)
        .provider(provider)
        .endpoints_on(listener)
        .strict_readiness()
        .controller(
            Controller::<Widget>::new(&fleet, watcher::Config::default()).named("widgets"),
            service_fn(|_| async { Ok::<_, BoxError>(kube_multicluster::Action::await_change()) }),
        );
    let run = tokio::spawn(manager.run());
    let endpoints = Endpoints::new(port);
    clusters.engage("cluster-0", with.client());
    clusters.engage("cluster-1", without.client());

    endpoints
        .readyz_until(|_, body| body.contains("cannot sync"))
        .await;
    let (status, body) = endpoints.get("/readyz").await.expect("answers");
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(
        body.starts_with("not ready\n") && body.contains("\"cluster-1\""),
        "{body}"
    );

    // Without the cluster that cannot sync, the process is ready.
    clusters.disengage("cluster-1");
    let (_, body) = endpoints
        .readyz_until(|status, _| status == StatusCode::OK)
        .await;
    assert!(
        body.contains("controller widgets: serving 1 of 1 clusters"),
        "{body}"
    );
    run.abort();
}

#[tokio::test]
async fn an_address_in_use_is_named_in_the_error() {
    let (taken, port) = listener();
    let address = format!("127.0.0.1:{port}").parse().expect("an address");
    let fleet = Fleet::new();
    let error = Manager::new(&fleet)
        .endpoints(address)
        .run()
        .await
        .expect_err("the port is taken");
    let message = error.to_string();
    assert!(message.contains(&format!("127.0.0.1:{port}")), "{message}");
    drop(taken);
}
