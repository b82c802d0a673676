//! A cluster whose API server stops for a while under load: the keys that
//! failed while it gave no answer run as soon as it answers again, not
//! after their backoff.

mod support;

use std::{
    collections::BTreeMap,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api,
    api::{ListParams, Patch, PatchParams},
    runtime::watcher,
};
use kube_multicluster::envtest::Envtest;
use kube_multicluster::{Action, Controller, ObjectRequest, controller::Config, queue::Backoff};
use support::{Running, capture_warnings, create_config_map, lines_with};
use tower::BoxError;

const OBJECTS: usize = 40;
const ROUND: &str = "kube-multicluster.dev/round";

/// The round each ConfigMap of `api` was last reconciled in.
async fn rounds(api: &Api<ConfigMap>) -> Vec<u64> {
    api.list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter(|cm| {
            cm.metadata
                .name
                .as_deref()
                .is_some_and(|n| n.starts_with("cm-"))
        })
        .map(|cm| {
            cm.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(ROUND))
                .and_then(|r| r.parse().ok())
                .unwrap_or(0)
        })
        .collect()
}

/// Waits until every ConfigMap of `api` was reconciled in `round` or
/// later, and says how long that took.
async fn converged(api: &Api<ConfigMap>, round: u64) -> Duration {
    let began = Instant::now();
    let waited = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            let seen = rounds(api).await;
            if seen.len() == OBJECTS && seen.iter().all(|r| *r >= round) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    if waited.is_err() {
        panic!("round {round} not reached: {:?}", rounds(api).await);
    }
    began.elapsed()
}

#[tokio::test]
async fn keys_that_failed_while_their_cluster_was_down_run_as_soon_as_it_answers() {
    let (logs, _guard) = capture_warnings();
    let env = Envtest::start(2).await.unwrap();
    let (busy, down) = (&env.clusters()[0], &env.clusters()[1]);
    for cluster in env.clusters() {
        for i in 0..OBJECTS {
            create_config_map(cluster.client(), &format!("cm-{i}")).await;
        }
    }
    // Every reconcile writes the round it runs in and asks to run again in
    // a second: steady load on both clusters. A failure waits out a
    // backoff of twenty seconds at first, longer than the cluster is down,
    // so that only its return can make its keys run sooner.
    let round = Arc::new(AtomicU64::new(1));
    let reconcile = tower::service_fn({
        let round = round.clone();
        move |request: ObjectRequest<ConfigMap>| {
            let round = round.load(Ordering::SeqCst);
            async move {
                let namespace = request.request.namespace.as_deref().unwrap_or("default");
                let api: Api<ConfigMap> = Api::namespaced(request.cluster.client(), namespace);
                let patch = serde_json::json!({
                    "metadata": { "annotations": BTreeMap::from([(ROUND, round.to_string())]) }
                });
                api.patch(
                    &request.request.name,
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await?;
                Ok::<_, BoxError>(Action::requeue(Duration::from_secs(1)))
            }
        }
    });
    let backoff = Backoff {
        base: Duration::from_secs(20),
        max: Duration::from_secs(60),
        jitter: 0.0,
    };
    let mut running = Running::new();
    let controller = Controller::<ConfigMap>::new(&running.fleet, watcher::Config::default())
        .with_config(Config::default().backoff(backoff));
    running.spawn(controller, reconcile);
    running.add_all(&env);
    let (busy, down) = (
        Api::<ConfigMap>::default_namespaced(busy.client()),
        (down, Api::<ConfigMap>::default_namespaced(down.client())),
    );
    converged(&busy, 1).await;
    converged(&down.1, 1).await;

    // Down for six seconds under load: every key of the cluster fails
    // within a second, and backs off.
    down.0.stop();
    round.store(2, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(6)).await;
    converged(&busy, 2).await;
    // A cluster being down is told once, not once per failed request.
    let down_lines = lines_with(&logs, &["cluster-1", "does not answer"]);
    assert_eq!(down_lines.len(), 1, "{down_lines:#?}");
    let failures = lines_with(&logs, &["reconcile failed"]);
    assert!(failures.is_empty(), "{failures:#?}");
    let errors = lines_with(&logs, &["ERROR"]);
    assert!(errors.is_empty(), "{errors:#?}");
    down.0.restart().await.unwrap();
    // Measured from when the API server is ready again (it answered a
    // moment before).
    let took = converged(&down.1, 2).await;
    eprintln!("the cluster's keys converged {took:?} after its API server was ready again");
    // Their backoff alone would keep them waiting for about fifteen
    // seconds more.
    assert!(
        took < Duration::from_millis(2500),
        "the cluster's keys took {took:?} to run after it answered again"
    );
    let back = lines_with(&logs, &["cluster-1", "answers again"]);
    assert!(!back.is_empty(), "its return was not told");
}

#[tokio::test]
async fn a_key_that_fails_the_same_way_again_is_told_once() {
    let (logs, _guard) = capture_warnings();
    let env = Envtest::start(1).await.unwrap();
    create_config_map(env.clusters()[0].client(), "x").await;
    // Fails three times as a cluster that cannot be reached would, then
    // three times otherwise, then succeeds.
    let runs = Arc::new(AtomicU64::new(0));
    let reconcile = tower::service_fn({
        let runs = runs.clone();
        move |request: ObjectRequest<ConfigMap>| {
            let run = match request.request.name.as_str() {
                "x" => runs.fetch_add(1, Ordering::SeqCst),
                _ => u64::MAX,
            };
            async move {
                match run {
                    0..3 => Err::<Action, BoxError>("the parent waits for cluster m2".into()),
                    3..6 => Err("the parent waits for cluster m3".into()),
                    _ => Ok(Action::await_change()),
                }
            }
        }
    });
    let mut running = Running::new();
    let backoff = Backoff {
        base: Duration::from_millis(10),
        max: Duration::from_millis(10),
        jitter: 0.0,
    };
    let controller = Controller::<ConfigMap>::new(&running.fleet, watcher::Config::default())
        .with_config(Config::default().backoff(backoff));
    running.spawn(controller, reconcile);
    running.add_all(&env);
    tokio::time::timeout(Duration::from_secs(30), async {
        while runs.load(Ordering::SeqCst) < 7 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the key ran seven times");
    let told = lines_with(&logs, &["reconcile failed", "default/x"]);
    assert_eq!(told.len(), 2, "each error once: {told:#?}");
    assert!(
        told[0].contains("cluster m2") && told[1].contains("cluster m3"),
        "{told:#?}"
    );
}
