//! Each cluster's watches and requests share one HTTP/2 connection, and a
//! connection that dies, loudly or silently, is replaced.

mod support;

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::{
    Api, Client, Config,
    api::{ListParams, Patch, PatchParams, WatchParams},
    runtime::watcher,
};
use kube_multicluster::envtest::{Envtest, FaultyLink};
use kube_multicluster::{
    Action, Controller, McRequest, ObjectRequest,
    client::{self, ClientOptions, KeepAlive},
};
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

/// One cluster, `name`, whose API server runs with `flag` too.
async fn one_cluster_with(name: &str, flag: &str) -> Envtest {
    Envtest::builder()
        .clusters([name])
        .apiserver_arg(flag)
        .start()
        .await
        .unwrap()
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
    running.provider.engage("http2", http2);
    running.provider.engage("http1", http1);

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
        .engage("cluster", client::client(config(&link)).unwrap());
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
    let options = ClientOptions::default().keep_alive(KeepAlive::new(
        Duration::from_secs(1),
        Duration::from_secs(1),
    ));
    running
        .provider
        .engage("cluster", options.client(config(&link)).unwrap());
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

#[tokio::test]
async fn watches_beyond_what_one_connection_carries_leave_room_for_requests() {
    let env = Envtest::start(1).await.unwrap();
    let link = env.clusters()[0].link().unwrap();
    let api: Api<ConfigMap> = Api::default_namespaced(client::client(config(&link)).unwrap());

    // The API server takes 100 streams per connection; a watch holds one
    // for as long as it runs.
    let (all, every) = (ListParams::default(), WatchParams::default());
    let mut watches = Vec::new();
    for _ in 0..120 {
        let watch = tokio::time::timeout(PATIENCE, api.watch(&every, "0"));
        watches.push(watch.await.expect("a watch starts").unwrap().boxed());
    }
    let list = tokio::time::timeout(Duration::from_secs(10), api.list(&all));
    list.await.expect("a request is answered").unwrap();
    // The HTTP/2 connection, and one HTTP/1.1 connection for each watch and
    // request it could not carry.
    let open = link.open_connections();
    assert!((2..=40).contains(&open), "{open} connections");

    // Once the watches end, requests share the one connection again (the
    // list's HTTP/1.1 connection may wait in the pool, idle).
    drop(watches);
    until("the watches' connections close", || {
        link.open_connections() <= 2
    })
    .await;
    let made = link.connections_made();
    futures::future::try_join_all((0..20).map(|_| api.list(&all)))
        .await
        .unwrap();
    assert_eq!(link.connections_made(), made);
}

#[tokio::test]
async fn an_upgrade_goes_over_http1() {
    let env = Envtest::start(1).await.unwrap();
    let link = env.clusters()[0].link().unwrap();
    let client = client::client(config(&link)).unwrap();

    // A watch over a WebSocket, as exec, attach and port-forward upgrade.
    let request = http::Request::get("/api/v1/namespaces/default/configmaps?watch=true")
        .header(http::header::CONNECTION, "Upgrade")
        .header(http::header::UPGRADE, "websocket")
        .header(http::header::ORIGIN, "http://localhost")
        .header(http::header::SEC_WEBSOCKET_VERSION, "13")
        .header(http::header::SEC_WEBSOCKET_KEY, "dGhlIHNhbXBsZSBub25jZQ==")
        .body(Vec::new())
        .unwrap();
    let response = client.send(request.map(Into::into)).await.unwrap();
    let status = response.status();
    let body = response.into_body().collect_bytes().await;
    assert_eq!(status, http::StatusCode::SWITCHING_PROTOCOLS, "{body:?}");
}

#[tokio::test]
async fn requests_refused_as_the_server_closes_the_connection_are_sent_again() {
    // The API server sends GOAWAY after 2 % of requests, as in front of a
    // load balancer: requests on their way when it does are refused.
    let env = one_cluster_with("going-away", "--goaway-chance=0.02").await;
    let link = env.clusters()[0].link().unwrap();
    let api: Api<ConfigMap> = Api::default_namespaced(client::client(config(&link)).unwrap());

    let all = ListParams::default();
    let lists = futures::stream::iter(0..2_000)
        .map(|_| api.list(&all))
        .buffer_unordered(50)
        .collect::<Vec<_>>()
        .await;
    let failed: Vec<_> = lists.iter().filter_map(|r| r.as_ref().err()).collect();
    assert!(
        failed.is_empty(),
        "{} failed: {:?}",
        failed.len(),
        failed.first()
    );
    // A new connection after each GOAWAY, which the requests waiting then
    // share, rather than one each.
    let made = link.connections_made();
    eprintln!("{made} connections made");
    assert!((5..=100).contains(&made), "{made} connections made");
}

#[tokio::test]
async fn a_server_without_http2_is_spoken_to_in_http1() {
    let env = one_cluster_with("http1", "--disable-http2-serving=true").await;
    let cluster = &env.clusters()[0];
    let link = cluster.link().unwrap();
    let mut running = Running::new();
    let mut reconciled = labelling(&mut running);
    running
        .provider
        .engage("http1", client::client(config(&link)).unwrap());
    create_config_map(cluster.client(), "over-http1").await;
    expect_all(&mut reconciled, [request("http1", "over-http1")]).await;
}

#[tokio::test]
async fn a_cluster_briefly_unreachable_is_spoken_to_in_http2_again() {
    let env = Envtest::start(1).await.unwrap();
    let link = env.clusters()[0].link().unwrap();
    let mut config = config(&link);
    config.connect_timeout = Some(Duration::from_secs(1));
    let api: Api<ConfigMap> = Api::default_namespaced(client::client(config).unwrap());
    let all = ListParams::default();

    // The first connection stalls past its timeout, and the cluster comes
    // back soon after.
    link.hang();
    let first = tokio::spawn({
        let api = api.clone();
        async move { api.list(&ListParams::default()).await }
    });
    tokio::time::sleep(Duration::from_millis(1_300)).await;
    link.restore();
    let _ = first.await.unwrap();

    // Nothing said the server lacks HTTP/2: requests made together share
    // one new connection.
    let made = link.connections_made();
    futures::future::try_join_all((0..30).map(|_| api.list(&all)))
        .await
        .unwrap();
    let new = link.connections_made() - made;
    assert!(new <= 1, "{new} connections for 30 requests");
}
