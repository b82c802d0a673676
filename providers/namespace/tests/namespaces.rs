//! Namespaces of a real API server as clusters: engaged as they come,
//! disengaged as they go, each blind to the others, all over one watch.

use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::{
    Api, Client,
    api::{DeleteParams, ObjectMeta, PostParams},
    runtime::watcher,
};
use kube_multicluster::{Action, Controller, Fleet, McRequest, ObjectRequest};
use kube_multicluster_envtest::Envtest;
use kube_multicluster_provider_namespace::NamespaceProvider;
use tokio::sync::mpsc;
use tower::BoxError;

const PATIENCE: Duration = Duration::from_secs(60);

async fn namespace(client: &Client, name: &str) {
    let namespace = Namespace {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .unwrap();
}

async fn config_map(client: &Client, namespace: &str, name: &str) {
    let config_map = ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    };
    Api::<ConfigMap>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &config_map)
        .await
        .unwrap();
}

/// How many watches of ConfigMaps the API server serves now, by its own
/// `apiserver_longrunning_requests` metric.
async fn config_map_watches(client: &Client) -> u64 {
    let request = http::Request::get("/metrics").body(Vec::new()).unwrap();
    let metrics = client.request_text(request).await.expect("GET /metrics");
    kube_multicluster_envtest::watches_served(&metrics, "configmaps")
}

fn run(provider: NamespaceProvider) -> (Fleet, mpsc::UnboundedReceiver<McRequest>) {
    let fleet = Fleet::new();
    let (tx, rx) = mpsc::unbounded_channel();
    let controller = Controller::<ConfigMap>::new(&fleet, watcher::Config::default());
    tokio::spawn(controller.run(tower::service_fn(
        move |request: ObjectRequest<ConfigMap>| {
            let _ = tx.send(request.request);
            async { Ok::<_, BoxError>(Action::await_change()) }
        },
    )));
    tokio::spawn({
        let fleet = fleet.clone();
        async move { fleet.run(provider).await }
    });
    (fleet, rx)
}

/// Waits for a reconcile of `name` in the cluster `cluster`, checking that
/// every reconcile meanwhile stays in its own namespace.
async fn reconciled(rx: &mut mpsc::UnboundedReceiver<McRequest>, cluster: &str, name: &str) {
    tokio::time::timeout(PATIENCE, async {
        while let Some(request) = rx.recv().await {
            assert_eq!(
                request.namespace.as_deref(),
                Some(request.cluster.as_str()),
                "{request:?} crossed namespaces"
            );
            if request.cluster.as_ref() == cluster && request.name == name {
                return;
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{cluster}/{name} not reconciled within {PATIENCE:?}"));
}

/// Waits for a reconcile of each `(cluster, name)`, in any order.
async fn reconciled_all(rx: &mut mpsc::UnboundedReceiver<McRequest>, wanted: &[(&str, &str)]) {
    let mut missing: std::collections::HashSet<(String, String)> = wanted
        .iter()
        .map(|(c, n)| ((*c).to_owned(), (*n).to_owned()))
        .collect();
    tokio::time::timeout(PATIENCE, async {
        while !missing.is_empty() {
            let request = rx.recv().await.unwrap();
            assert_eq!(
                request.namespace.as_deref(),
                Some(request.cluster.as_str()),
                "{request:?} crossed namespaces"
            );
            missing.remove(&(request.cluster.to_string(), request.name.clone()));
        }
    })
    .await
    .unwrap_or_else(|_| panic!("not reconciled within {PATIENCE:?}: {missing:?}"));
}

async fn until(what: &str, done: impl Fn() -> bool) {
    tokio::time::timeout(PATIENCE, async {
        while !done() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("not {what} within {PATIENCE:?}"));
}

#[tokio::test]
async fn namespaces_come_and_go_as_clusters_each_seeing_only_its_own() {
    let env = Envtest::start(1).await.unwrap();
    let admin = env.clusters()[0].client();
    for ns in ["alpha", "beta"] {
        let mut labelled = Namespace {
            metadata: ObjectMeta {
                name: Some(ns.to_owned()),
                labels: Some([("tenant".to_owned(), "true".to_owned())].into()),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        labelled.metadata.name = Some(ns.to_owned());
        Api::<Namespace>::all(admin.clone())
            .create(&PostParams::default(), &labelled)
            .await
            .unwrap();
        config_map(&admin, ns, &format!("{ns}-settings")).await;
    }
    // Not labelled: not a cluster.
    namespace(&admin, "outsider").await;
    config_map(&admin, "outsider", "outsider-settings").await;

    let provider = NamespaceProvider::new("host", admin.clone()).selector("tenant=true");
    let host = provider.host();
    let (fleet, mut reconciles) = run(provider);
    reconciled_all(
        &mut reconciles,
        &[("alpha", "alpha-settings"), ("beta", "beta-settings")],
    )
    .await;
    assert!(fleet.get("outsider").is_none());

    // Each cluster's store holds its own namespace's objects only.
    for ns in ["alpha", "beta"] {
        let store = fleet.get(ns).unwrap().store::<ConfigMap>().unwrap();
        let names: Vec<_> = store
            .state()
            .iter()
            .map(|cm| cm.metadata.name.clone().unwrap())
            .collect();
        assert_eq!(names, [format!("{ns}-settings")]);
    }
    assert_eq!(host.watch_count(), 1);

    // A namespace created while running engages; its client defaults to it.
    let mut gamma = Namespace::default();
    gamma.metadata.name = Some("gamma".to_owned());
    gamma.metadata.labels = Some([("tenant".to_owned(), "true".to_owned())].into());
    Api::<Namespace>::all(admin.clone())
        .create(&PostParams::default(), &gamma)
        .await
        .unwrap();
    until("gamma engaged", || fleet.get("gamma").is_some()).await;
    let client = fleet.get("gamma").unwrap().client();
    assert_eq!(client.default_namespace(), "gamma");
    Api::<ConfigMap>::default_namespaced(client)
        .create(
            &PostParams::default(),
            &ConfigMap {
                metadata: ObjectMeta {
                    name: Some("made-in-gamma".to_owned()),
                    ..ObjectMeta::default()
                },
                ..ConfigMap::default()
            },
        )
        .await
        .unwrap();
    reconciled(&mut reconciles, "gamma", "made-in-gamma").await;

    // Deleted: with no namespace controller it stays Terminating, and is
    // disengaged on its deletion timestamp.
    Api::<Namespace>::all(admin.clone())
        .delete("beta", &DeleteParams::default())
        .await
        .unwrap();
    until("beta disengaged", || fleet.get("beta").is_none()).await;
    let beta = Api::<Namespace>::all(admin.clone())
        .get("beta")
        .await
        .unwrap();
    assert!(
        beta.metadata.deletion_timestamp.is_some(),
        "beta is gone for good"
    );
    assert!(fleet.get("alpha").is_some() && fleet.get("gamma").is_some());
}

#[tokio::test]
async fn many_namespaces_share_one_watch_at_the_api_server() {
    namespaces_share_one_watch(60).await;
}

/// The same with a thousand namespaces; on demand:
/// `cargo test -p kube-multicluster-provider-namespace -- --ignored`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a thousand namespaces: run on demand"]
async fn a_thousand_namespaces_share_one_watch_at_the_api_server() {
    namespaces_share_one_watch(1000).await;
}

async fn namespaces_share_one_watch(namespaces: usize) {
    let env = Envtest::start(1).await.unwrap();
    let admin = env.clusters()[0].client();
    for i in 0..namespaces {
        let ns = format!("tenant-{i}");
        namespace(&admin, &ns).await;
        config_map(&admin, &ns, "settings").await;
    }
    let before = config_map_watches(&admin).await;
    let provider = NamespaceProvider::new("host", admin.clone());
    let host = provider.host();
    let (fleet, mut reconciles) = run(provider);
    let mut seen = std::collections::HashSet::new();
    tokio::time::timeout(PATIENCE, async {
        while seen.len() < namespaces {
            let request = reconciles.recv().await.unwrap();
            assert_eq!(request.namespace.as_deref(), Some(request.cluster.as_str()));
            if request.cluster.as_str().starts_with("tenant-") {
                seen.insert(request.cluster.to_string());
            }
        }
    })
    .await
    .expect("every namespace reconciled");
    // Plus default, kube-system, kube-public and kube-node-lease.
    assert!(fleet.clusters().len() >= namespaces);
    assert_eq!(host.watch_count(), 1);
    tokio::time::timeout(PATIENCE, async {
        while config_map_watches(&admin).await == before {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the watch served");
    assert_eq!(
        config_map_watches(&admin).await,
        before + 1,
        "{namespaces} namespaces, one watch"
    );
}
