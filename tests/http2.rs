//! Each cluster's watches and requests share one HTTP/2 connection, and a
//! connection that dies, loudly or silently, is replaced.

mod support;

use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::{
    Api, Client, Config,
    api::{Patch, PatchParams},
    runtime::watcher,
};
use kube_fleet::{
    Action, Controller, McRequest, ObjectRequest,
    client::{self, ClientOptions},
};
use kube_fleet_envtest::{Envtest, FaultyLink};
use support::{PATIENCE, Running, create_config_map, expect_all, request};
use tokio::sync::mpsc;
use tower::{BoxError, service_fn};

fn config(link: &FaultyLink) -> Config {
    Config::try_from(link.kubeconfig().clone()).expect("the link's kubeconfig is valid")
}

/// Runs a ConfigMap controller, with a related watch of Secrets, whose
/// reconciler labels each ConfigMap through the cluster's client. Returns the
/// requests it has reconciled.
fn labelling(running: &mut Running) -> mpsc::UnboundedReceiver<McRequest> {
    let (tx, rx) = mpsc::unbounded_channel();
    let controller = Controller::<ConfigMap>::new(&running.fleet, watcher::Config::default())
        .owns_metadata::<Secret>(watcher::Config::default());
    let service = service_fn(move |request: ObjectRequest<ConfigMap>| {
        let tx = tx.clone();
        async move {
            let api: Api<ConfigMap> = Api::namespaced(request.cluster.client(), "default");
            let patch = serde_json::json!({"metadata": {"labels": {"seen": "yes"}}});
            api.patch(
                &request.request.name,
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await?;
            let _ = tx.send(request.request);
            Ok::<_, BoxError>(Action::await_change())
        }
    });
    running.spawn(controller, service);
    rx
}

async fn until(what: &str, mut done: impl FnMut() -> bool) {
    tokio::time::timeout(PATIENCE, async {
        while !done() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("not within {PATIENCE:?}: {what}"));
}

async fn create_all(client: &Client, names: &[String]) {
    futures::future::join_all(
        names
            .iter()
            .map(|name| create_config_map(client.clone(), name)),
    )
    .await;
}

#[tokio::test]
async fn two_watches_and_many_concurrent_requests_share_one_connection() {
    let env = Envtest::start(1).await.unwrap();
    let cluster = &env.clusters()[0];
    let names: Vec<String> = (0..60).map(|i| format!("cm-{i}")).collect();
    create_all(&cluster.client(), &names).await;

    let (multiplexed, separate) = (cluster.link().unwrap(), cluster.link().unwrap());
    let mut running = Running::new();
    let mut reconciled = labelling(&mut running);
    let http2 = client::client(config(&multiplexed)).unwrap();
    let http1 = ClientOptions::default()
        .http1_only()
        .client(config(&separate))
        .unwrap();
    running.provider.add("http2", http2);
    running.provider.add("http1", http1);

    let wanted = names
        .iter()
        .flat_map(|name| [request("http2", name), request("http1", name)]);
    expect_all(&mut reconciled, wanted).await;

    // Every watch and every patch, 60 started at once, went over one
    // connection; kube's HTTP/1.1 needs one per watch and per patch in flight.
    assert_eq!(multiplexed.open_connections(), 1);
    assert!(
        separate.open_connections() > 2,
        "HTTP/1.1 holds {} connections",
        separate.open_connections()
    );
    // Connections opened together before the first finished its handshake
    // are given up as soon as it offers HTTP/2.
    assert!(
        multiplexed.connections_made() <= 3,
        "{} connections made",
        multiplexed.connections_made()
    );
}

#[tokio::test]
async fn a_connection_cut_off_is_replaced_and_the_watches_go_on() {
    let env = Envtest::start(1).await.unwrap();
    let cluster = &env.clusters()[0];
    let link = cluster.link().unwrap();
    let mut running = Running::new();
    let mut reconciled = labelling(&mut running);
    running
        .provider
        .add("cluster", client::client(config(&link)).unwrap());
    running.wait_served("cluster").await;

    link.cut_off();
    until("the connection is closed", || link.open_connections() == 0).await;
    // Changed while no client can reach the cluster.
    create_config_map(cluster.client(), "made-while-cut-off").await;
    link.restore();

    expect_all(&mut reconciled, [request("cluster", "made-while-cut-off")]).await;
    create_config_map(cluster.client(), "made-after").await;
    expect_all(&mut reconciled, [request("cluster", "made-after")]).await;
    assert_eq!(link.open_connections(), 1);
}

#[tokio::test]
async fn a_connection_that_stops_answering_is_found_by_ping_and_replaced() {
    let env = Envtest::start(1).await.unwrap();
    let cluster = &env.clusters()[0];
    let link = cluster.link().unwrap();
    let mut running = Running::new();
    let mut reconciled = labelling(&mut running);
    let options =
        ClientOptions::default().keep_alive(Duration::from_secs(1), Duration::from_secs(1));
    running
        .provider
        .add("cluster", options.client(config(&link)).unwrap());
    running.wait_served("cluster").await;
    create_config_map(cluster.client(), "before").await;
    expect_all(&mut reconciled, [request("cluster", "before")]).await;
    let made = link.connections_made();

    // Bytes stop moving, but nothing closes: only a ping that is never
    // answered shows the connection is dead. The client then dials again
    // (the link accepts the new connection, and holds it while it hangs).
    link.hang();
    until("the client dials a new connection", || {
        link.connections_made() > made
    })
    .await;
    create_config_map(cluster.client(), "made-while-hung").await;
    link.restore();

    expect_all(&mut reconciled, [request("cluster", "made-while-hung")]).await;
    until("the dead connection is closed", || {
        link.open_connections() == 1
    })
    .await;
}
