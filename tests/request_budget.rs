//! Request budgets on real API servers: a reconciler stuck in a write loop
//! in one cluster is held to that cluster's budget, while another cluster's
//! reconciles keep their latency.

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use http::Method;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api,
    api::{ObjectMeta, Patch, PatchParams, PostParams},
    runtime::watcher,
};
use kube_multicluster::envtest::Envtest;
use kube_multicluster::layers::metrics::ClientMetrics;
use kube_multicluster::{
    Action, Controller, ObjectRequest,
    client::{RequestBudget, RequestStats},
};
use prometheus_client::{encoding::text::encode, registry::Registry};
use support::Running;
use tokio::sync::mpsc;
use tower::{BoxError, service_fn};

const LABEL: &str = "budget-test";

fn labelled(name: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(BTreeMap::from([(LABEL.to_owned(), "yes".to_owned())])),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    }
}

fn patches(stats: &RequestStats) -> u64 {
    stats
        .counts()
        .iter()
        .filter(|count| count.method == Method::PATCH)
        .map(|count| count.count)
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_loop_in_one_cluster_stays_within_its_budget_and_slows_no_other() {
    let env = Envtest::start(2).await.unwrap();
    let (spinning, calm) = (&env.clusters()[0], &env.clusters()[1]);
    let mut running = Running::new();
    let mut registry = Registry::default();
    ClientMetrics::register(&mut registry, running.fleet.clone());

    // Every reconcile writes its object and asks to run again at once: in
    // the spinning cluster, without end.
    let written = Arc::new(AtomicU64::new(0));
    let (done, mut reconciled) = mpsc::unbounded_channel::<(String, String)>();
    let reconcile = service_fn({
        let written = written.clone();
        move |request: ObjectRequest<ConfigMap>| {
            let (written, done) = (written.clone(), done.clone());
            async move {
                let api = Api::<ConfigMap>::default_namespaced(request.cluster.client());
                let n = written.fetch_add(1, Ordering::SeqCst);
                let patch = serde_json::json!({"data": {"written": n.to_string()}});
                api.patch(
                    &request.request.name,
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await?;
                let _ = done.send((
                    request.cluster.name().to_string(),
                    request.request.name.clone(),
                ));
                if request.request.name == "spin" {
                    return Ok::<_, BoxError>(Action::requeue(Duration::ZERO));
                }
                Ok(Action::await_change())
            }
        }
    });
    let controller =
        Controller::<ConfigMap>::new(&running.fleet, watcher::Config::default().labels(LABEL));
    running.spawn(controller, reconcile);
    let config = |cluster: &kube_multicluster::envtest::TestCluster| {
        kube::Config::try_from(cluster.kubeconfig().clone()).expect("a valid kubeconfig")
    };
    // Ten writes a second after five at once in the spinning cluster; the
    // default in the calm one.
    let budget = RequestBudget::DEFAULT.writes(10.0, 5);
    running.provider.engage(
        spinning.name(),
        kube_multicluster::client::cluster_client(config(spinning))
            .unwrap()
            .with_budget(budget),
    );
    running.provider.engage(
        calm.name(),
        kube_multicluster::client::cluster_client(config(calm)).unwrap(),
    );

    Api::<ConfigMap>::default_namespaced(spinning.client())
        .create(&PostParams::default(), &labelled("spin"))
        .await
        .unwrap();
    let spinning_cluster = loop {
        if let Some(cluster) = running.fleet.get(spinning.name()) {
            break cluster;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // Past the burst: the loop runs at its rate.
    tokio::time::sleep(Duration::from_secs(2)).await;

    let before = (Instant::now(), patches(spinning_cluster.requests()));
    // Meanwhile the calm cluster's objects are reconciled as soon as they
    // are made.
    let calm_api = Api::<ConfigMap>::default_namespaced(calm.client());
    let mut latencies = Vec::new();
    for i in 0..6 {
        let name = format!("calm-{i}");
        calm_api
            .create(&PostParams::default(), &labelled(&name))
            .await
            .unwrap();
        let created = Instant::now();
        loop {
            let (cluster, object) =
                tokio::time::timeout(Duration::from_secs(30), reconciled.recv())
                    .await
                    .expect("reconciles go on")
                    .unwrap();
            if cluster == calm.name() && object == name {
                break;
            }
        }
        latencies.push(created.elapsed());
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    let after = (Instant::now(), patches(spinning_cluster.requests()));

    let seconds = (after.0 - before.0).as_secs_f64();
    let spun = after.1 - before.1;
    // At ten a second, give or take a token at either end.
    assert!(
        spun as f64 <= seconds * 10.0 + 2.0,
        "{spun} writes in {seconds:.1} s, over a budget of ten a second"
    );
    assert!(
        spun as f64 >= seconds * 10.0 * 0.7,
        "{spun} writes in {seconds:.1} s: the loop did not run at its budget"
    );
    let slowest = latencies.iter().max().unwrap();
    assert!(
        *slowest < Duration::from_secs(1),
        "the calm cluster's reconciles took {latencies:?}"
    );

    // The waits are the spinning cluster's, and show under client-go's name.
    let waited: f64 = spinning_cluster
        .requests()
        .budget_waits()
        .iter()
        .filter(|wait| wait.method == Method::PATCH)
        .map(|wait| wait.sum)
        .sum();
    assert!(
        waited > seconds * 0.5,
        "waited {waited:.2} s in {seconds:.1} s"
    );
    let calm_cluster = running.fleet.get(calm.name()).unwrap();
    for wait in calm_cluster.requests().budget_waits() {
        assert_eq!(
            wait.buckets[0], wait.count,
            "the calm cluster waited: {wait:?}"
        );
    }
    let mut text = String::new();
    encode(&mut text, &registry).unwrap();
    let series = format!(
        r#"rest_client_rate_limiter_duration_seconds_count{{cluster="{}",verb="PATCH""#,
        spinning.name()
    );
    assert!(text.contains(&series), "{text}");
}
