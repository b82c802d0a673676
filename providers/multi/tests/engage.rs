//! Providers added and removed while the fleet runs engage and disengage
//! their clusters under prefixed names, on real API servers.

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api,
    api::{ObjectMeta, PostParams},
    runtime::watcher,
};
use kube_multicluster::{
    Action, Controller, Fleet, McRequest, ObjectRequest, client, provider::ProgrammaticProvider,
};
use kube_multicluster_envtest::{Envtest, TestCluster};
use kube_multicluster_provider_multi::MultiProvider;
use tokio::sync::mpsc;
use tower::BoxError;

const PATIENCE: Duration = Duration::from_secs(30);

fn client_of(cluster: &TestCluster) -> kube::Client {
    let config = kube::Config::try_from(cluster.kubeconfig().clone()).unwrap();
    client::client(config).unwrap()
}

async fn create(cluster: &TestCluster, name: &str) {
    let config_map = ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    };
    Api::<ConfigMap>::default_namespaced(cluster.client())
        .create(&PostParams::default(), &config_map)
        .await
        .unwrap();
}

async fn reconciled(rx: &mut mpsc::UnboundedReceiver<McRequest>, cluster: &str, name: &str) {
    tokio::time::timeout(PATIENCE, async {
        while let Some(request) = rx.recv().await {
            if request.cluster.as_ref() == cluster && request.name == name {
                return;
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{cluster}/{name} not reconciled within {PATIENCE:?}"));
}

#[tokio::test]
async fn providers_added_after_start_engage_and_removed_ones_disengage() {
    let env = Envtest::start(2).await.unwrap();
    let (east, west) = (&env.clusters()[0], &env.clusters()[1]);
    create(east, "settings").await;
    create(west, "settings").await;

    let fleet = Fleet::new();
    let (multi, providers) = MultiProvider::new();
    let running = tokio::spawn({
        let fleet = fleet.clone();
        async move { fleet.run(multi).await }
    });
    let (tx, mut rx) = mpsc::unbounded_channel();
    let controller = Controller::<ConfigMap>::new(&fleet, watcher::Config::default());
    let status = controller.status();
    let controller = tokio::spawn(controller.run(tower::service_fn(
        move |request: ObjectRequest<ConfigMap>| {
            let _ = tx.send(request.request);
            async { Ok::<_, BoxError>(Action::await_change()) }
        },
    )));

    // Two providers that both call their cluster "edge".
    let (prod, prod_clusters) = ProgrammaticProvider::new();
    providers.add("prod", prod).unwrap();
    prod_clusters.engage("edge", client_of(east));
    reconciled(&mut rx, "prod#edge", "settings").await;

    let (lab, lab_clusters) = ProgrammaticProvider::new();
    providers.add("lab", lab).unwrap();
    lab_clusters.engage("edge", client_of(west));
    reconciled(&mut rx, "lab#edge", "settings").await;

    assert!(providers.remove("prod"));
    tokio::time::timeout(PATIENCE, async {
        while status.cluster("prod#edge").is_some() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("prod#edge disengaged");
    assert!(status.cluster("lab#edge").is_some(), "the other stays");
    controller.abort();
    running.abort();
}
