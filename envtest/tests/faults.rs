//! Network faults on demand: hung and cut-off clusters and links, against
//! real API servers.

use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api, Client, Config,
    api::{ListParams, ObjectMeta, PostParams, WatchEvent, WatchParams},
    config::KubeConfigOptions,
};
use kube_multicluster_envtest::{Envtest, TestCluster};

/// How long a request to a hung cluster is given to prove it gets no answer.
const HUNG: Duration = Duration::from_secs(2);
/// Generous for a request that should succeed, or fail, at once.
const PROMPT: Duration = Duration::from_secs(10);

fn config_maps(client: Client) -> Api<ConfigMap> {
    Api::default_namespaced(client)
}

async fn create_config_map(client: Client, name: &str) {
    let config_map = ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    };
    config_maps(client)
        .create(&PostParams::default(), &config_map)
        .await
        .expect("create config map");
}

/// Lists config maps, failing the test if that takes longer than [`PROMPT`].
async fn list(client: Client) -> kube::Result<Vec<ConfigMap>> {
    let api = config_maps(client);
    let list = tokio::time::timeout(PROMPT, api.list(&ListParams::default())).await;
    list.expect("no answer in time").map(|list| list.items)
}

/// Whether listing config maps gets no answer at all within [`HUNG`].
async fn hangs(client: Client) -> bool {
    let api = config_maps(client);
    tokio::time::timeout(HUNG, api.list(&ListParams::default()))
        .await
        .is_err()
}

async fn client_from_kubeconfig(cluster: &TestCluster) -> Client {
    let config =
        Config::from_custom_kubeconfig(cluster.kubeconfig().clone(), &KubeConfigOptions::default())
            .await
            .unwrap();
    Client::try_from(config).unwrap()
}

#[tokio::test]
async fn a_hung_cluster_answers_nothing_until_restored_while_others_answer() {
    let fleet = Envtest::start(2).await.expect("fleet starts");
    let [a, b] = fleet.clusters() else {
        unreachable!()
    };
    // The client now has an open connection, which must stall as well.
    list(a.client()).await.expect("a answers before the hang");

    a.hang();
    assert!(hangs(a.client()).await, "the hung cluster answered");
    // A client made from the kubeconfig opens new connections: they stall too.
    let fresh = client_from_kubeconfig(a).await;
    assert!(
        hangs(fresh.clone()).await,
        "a new client of the hung cluster was answered"
    );

    let started = Instant::now();
    list(b.client()).await.expect("the other cluster answers");
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "the other cluster took {:?}",
        started.elapsed()
    );

    a.restore();
    list(a.client()).await.expect("the same client recovers");
    list(fresh).await.expect("the new client recovers");
}

#[tokio::test]
async fn a_cut_off_cluster_fails_fast_and_restore_brings_it_back() {
    let fleet = Envtest::start(1).await.expect("fleet starts");
    let cluster = &fleet.clusters()[0];
    let api = config_maps(cluster.client());
    let version = api.list(&ListParams::default()).await.unwrap();
    let version = version.metadata.resource_version.unwrap();
    let mut watch = api
        .watch(&WatchParams::default(), &version)
        .await
        .expect("watch starts")
        .boxed();

    cluster.cut_off();
    // The watch's open connection is closed: its stream ends or fails at once.
    let ended = tokio::time::timeout(PROMPT, watch.try_next()).await;
    assert!(
        matches!(ended, Ok(Ok(None) | Err(_))),
        "the watch carried on after the cut: {ended:?}"
    );
    // New requests fail with a connection error, not after a timeout.
    let started = Instant::now();
    let err = list(cluster.client()).await.unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "failing took {:?}",
        started.elapsed()
    );
    assert!(
        !matches!(err, kube::Error::Api(_)),
        "a cut-off cluster answered: {err}"
    );

    cluster.restore();
    list(cluster.client())
        .await
        .expect("the same client recovers");
}

#[tokio::test]
async fn a_faulty_link_fails_its_own_clients_only() {
    let fleet = Envtest::start(1).await.expect("fleet starts");
    let cluster = &fleet.clusters()[0];
    let link = cluster.link().expect("link");
    assert_ne!(link.server(), cluster.server());
    let via_link = config_maps(link.client());
    let version = via_link.list(&ListParams::default()).await.unwrap();
    let version = version.metadata.resource_version.unwrap();
    let mut watch = via_link
        .watch(&WatchParams::default(), &version)
        .await
        .expect("watch starts")
        .boxed();

    link.hang();
    assert!(hangs(link.client()).await, "the hung link answered");
    // The cluster's own client is not affected.
    create_config_map(cluster.client(), "made-during-the-hang").await;
    // Bytes stop on the link's open connections too: the event is held...
    let held = tokio::time::timeout(Duration::from_secs(1), watch.try_next()).await;
    assert!(held.is_err(), "an event passed the hung link: {held:?}");

    // ...and delivered when the link is restored, on the same connection.
    link.restore();
    let event = tokio::time::timeout(PROMPT, watch.try_next()).await;
    match event.expect("the held watch resumes").expect("watch event") {
        Some(WatchEvent::Added(cm)) => {
            assert_eq!(cm.metadata.name.as_deref(), Some("made-during-the-hang"))
        }
        other => panic!("expected the held ADDED event, got {other:?}"),
    }
    list(link.client())
        .await
        .expect("the link's client recovers");

    // The link's kubeconfig goes through the link as well.
    let config =
        Config::from_custom_kubeconfig(link.kubeconfig().clone(), &KubeConfigOptions::default())
            .await
            .unwrap();
    let from_kubeconfig = Client::try_from(config).unwrap();
    link.cut_off();
    assert!(list(from_kubeconfig.clone()).await.is_err());
    assert!(list(link.client()).await.is_err());
    list(cluster.client())
        .await
        .expect("the cluster's client works while the link is cut off");
    link.restore();
    list(from_kubeconfig).await.expect("recovers");

    // Dropping the link closes its port.
    let addr = link.server().trim_start_matches("https://").to_owned();
    drop(link);
    let started = Instant::now();
    while tokio::net::TcpStream::connect(&addr).await.is_ok() {
        assert!(
            started.elapsed() < PROMPT,
            "{addr} still accepts connections"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn stop_and_restart_work_through_the_proxy_even_while_hung() {
    let fleet = Envtest::start(1).await.expect("fleet starts");
    let cluster = &fleet.clusters()[0];
    let server = cluster.server().to_owned();
    create_config_map(cluster.client(), "survivor").await;

    cluster.stop();
    assert!(
        list(cluster.client()).await.is_err(),
        "a stopped cluster answered"
    );
    cluster.restart().await.expect("restarts");
    assert_eq!(cluster.server(), server, "restart moved the cluster");
    assert_eq!(list(cluster.client()).await.unwrap().len(), 1);

    // Readiness is checked past the proxy, so a hung cluster restarts too,
    // and stays hung until restored.
    let pid = cluster.pid();
    cluster.hang();
    cluster.restart().await.expect("restarts while hung");
    assert_ne!(cluster.pid(), pid);
    assert!(hangs(cluster.client()).await, "restart ended the hang");
    cluster.restore();
    assert_eq!(list(cluster.client()).await.unwrap().len(), 1);
}
