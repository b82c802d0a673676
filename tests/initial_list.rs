//! A watch that accepts a list from the API server's cache lists by
//! streaming where the API server allows it, and in pages where it does not,
//! with nothing lost either way.

mod support;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{Client, runtime::watcher};
use kube_multicluster::Controller;
use kube_multicluster::envtest::Envtest;
use support::{
    Running, create_config_map, expect_all, lists_served, recorder, request,
    streaming_lists_served, watches_served,
};

async fn create(client: &Client, names: &[&str]) {
    for name in names {
        create_config_map(client.clone(), name).await;
    }
}

#[tokio::test]
async fn streaming_lists_where_allowed_and_pages_where_refused_reconcile_everything() {
    let (streams, pages) = tokio::join!(
        Envtest::builder().clusters(["streams"]).start(),
        Envtest::builder()
            .clusters(["pages"])
            .apiserver_arg("--feature-gates=WatchList=false")
            .start(),
    );
    let (streams, pages) = (streams.unwrap(), pages.unwrap());
    let (streams_admin, pages_admin) =
        (streams.clusters()[0].client(), pages.clusters()[0].client());
    create(&streams_admin, &["before-1", "before-2"]).await;
    create(&pages_admin, &["before-1", "before-2"]).await;
    let streams_lists = lists_served(&streams_admin, "configmaps").await;
    let pages_lists = lists_served(&pages_admin, "configmaps").await;
    let streams_streamed = streaming_lists_served(&streams_admin, "configmaps").await;
    // The API server's own watches.
    let streams_watches = watches_served(&streams_admin, "configmaps").await;
    let pages_watches = watches_served(&pages_admin, "configmaps").await;

    let mut running = Running::new();
    let (service, mut reconciled) = recorder();
    let config = watcher::Config::default().any_semantic();
    running.spawn(
        Controller::<ConfigMap>::new(&running.fleet, config),
        service,
    );
    running.add_all(&streams);
    running.add_all(&pages);
    let everything_before = ["streams", "pages"]
        .into_iter()
        .flat_map(|cluster| ["before-1", "before-2"].map(|name| request(cluster, name)));
    expect_all(&mut reconciled, everything_before).await;
    running.wait_served("streams").await;
    running.wait_served("pages").await;

    // The refused cluster watches on after its paged list, as the other does.
    create(&streams_admin, &["after"]).await;
    create(&pages_admin, &["after"]).await;
    expect_all(
        &mut reconciled,
        [request("streams", "after"), request("pages", "after")],
    )
    .await;

    assert_eq!(
        lists_served(&streams_admin, "configmaps").await,
        streams_lists,
        "a streaming list is a watch: the API server answers no LIST"
    );
    assert_eq!(
        streaming_lists_served(&streams_admin, "configmaps").await,
        streams_streamed + 1,
        "the list was streamed"
    );
    assert!(
        lists_served(&pages_admin, "configmaps").await > pages_lists,
        "where streaming is refused, the watch lists in pages"
    );
    for (admin, before) in [
        (&streams_admin, streams_watches),
        (&pages_admin, pages_watches),
    ] {
        assert_eq!(
            watches_served(admin, "configmaps").await,
            before + 1,
            "one watch each, the refused one not retried"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streaming_list_longer_than_its_watch_timeout_falls_back_to_pages() {
    use std::time::Duration;

    use kube::api::{ObjectMeta, PostParams};
    use kube_multicluster::{cache::Transform, controller::Watch};

    let env = Envtest::start(1).await.unwrap();
    let cluster = env.clusters()[0].name().to_owned();
    let api = kube::Api::<ConfigMap>::default_namespaced(env.clusters()[0].client());
    // 20 MB in all: more than the HTTP/2 windows hold while the watch takes
    // the objects in slowly, so the API server cannot send them all before
    // the watch's timeout.
    let big = "x".repeat(100_000);
    let names: Vec<String> = (0..200).map(|i| format!("big-{i:03}")).collect();
    futures::future::join_all(names.iter().map(|name| {
        let (api, big) = (api.clone(), big.clone());
        async move {
            let config_map = ConfigMap {
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    ..ObjectMeta::default()
                },
                data: Some([("value".to_owned(), big)].into()),
                ..ConfigMap::default()
            };
            api.create(&PostParams::default(), &config_map)
                .await
                .unwrap();
        }
    }))
    .await;

    // 200 objects at 20 ms each take 4 s; the watch times out after 2 s.
    let slow = Transform::metadata(|_: &mut ObjectMeta| {
        std::thread::sleep(Duration::from_millis(20));
    });
    let watch = Watch::new(watcher::Config::default().any_semantic().timeout(2)).transform(slow);
    let mut running = Running::new();
    let (service, mut reconciled) = recorder();
    running.spawn(Controller::<ConfigMap>::new(&running.fleet, watch), service);
    running.add_all(&env);
    expect_all(
        &mut reconciled,
        names.iter().map(|name| request(&cluster, name)),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engage_storm_lists_a_bounded_number_at_once_and_an_unreachable_cluster_holds_up_none() {
    use std::{
        collections::HashSet,
        sync::{Arc, Mutex},
        time::Duration,
    };

    use kube_multicluster::{Action, Fleet, ObjectRequest};
    use tower::{BoxError, service_fn};

    let env = Envtest::start(1).await.expect("envtest");
    let cluster = &env.clusters()[0];
    create(&cluster.client(), &["storm"]).await;
    let fleet = Fleet::with_config(kube_multicluster::FleetConfig {
        initial_lists: 2,
        ..kube_multicluster::FleetConfig::default()
    });
    assert_eq!(fleet.status().initial_lists.limit(), 2);
    // Refuses connections: each of its lists fails, and gives its permit
    // back while the watch waits to retry.
    let unreachable =
        Client::try_from(kube::Config::new("https://127.0.0.1:1".parse().unwrap())).unwrap();
    fleet.engage("unreachable", unreachable);

    let reconciled = Arc::new(Mutex::new(HashSet::new()));
    let controller = Controller::<ConfigMap>::new(&fleet, watcher::Config::default());
    tokio::spawn(controller.run(service_fn({
        let reconciled = reconciled.clone();
        move |request: ObjectRequest<ConfigMap>| {
            if request.request.name == "storm" {
                reconciled
                    .lock()
                    .unwrap()
                    .insert(request.cluster.name().to_string());
            }
            async { Ok::<_, BoxError>(Action::await_change()) }
        }
    })));
    // Thirty clusters at once, each with its own client and connection.
    const CLUSTERS: usize = 30;
    for i in 0..CLUSTERS {
        fleet.engage(format!("storm-{i}"), cluster.client());
    }
    let (mut most, mut waited) = (0, 0);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while reconciled.lock().unwrap().len() < CLUSTERS {
        let lists = fleet.status().initial_lists;
        most = most.max(lists.in_flight());
        waited = waited.max(lists.waiting());
        assert!(
            tokio::time::Instant::now() < deadline,
            "reconciled in {:?} of {CLUSTERS}; lists {lists:?}",
            reconciled.lock().unwrap().len()
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    println!("at most {most} lists at once, {waited} waiting");
    assert!(most <= 2, "{most} lists at once");
    assert!(waited >= 1, "no list waited for a permit");
    assert!(!reconciled.lock().unwrap().contains("unreachable"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_that_hangs_holds_the_last_permit_for_thirty_seconds_and_the_one_waiting_is_not_failing()
 {
    use std::time::Duration;

    use kube_multicluster::{Action, Fleet, ObjectRequest, cache::WatchState, controller::Config};
    use tower::{BoxError, service_fn};

    let env = Envtest::start(1).await.expect("envtest");
    let cluster = &env.clusters()[0];
    // Accepts connections and never answers: the list's TLS handshake
    // hangs.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = silent.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((connection, _)) = silent.accept().await {
            held.push(connection);
        }
    });
    let hangs = Client::try_from(kube::Config::new(
        format!("https://{address}").parse().unwrap(),
    ))
    .unwrap();

    let fleet = Fleet::with_config(kube_multicluster::FleetConfig {
        initial_lists: 1,
        ..kube_multicluster::FleetConfig::default()
    });
    let controller = Controller::<ConfigMap>::new(&fleet, watcher::Config::default())
        .with_config(Config::default().sync_timeout(Duration::from_secs(1)));
    let status = controller.status();
    tokio::spawn(
        controller.run(service_fn(|_: ObjectRequest<ConfigMap>| async {
            Ok::<_, BoxError>(Action::await_change())
        })),
    );
    fleet.engage("hangs", hangs);
    while fleet.status().initial_lists.in_flight() < 1 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let engaged = tokio::time::Instant::now();
    fleet.engage("answers", cluster.client());

    // Past the sync timeout, the cluster waiting for the permit is syncing,
    // not failing; the one that hangs is failing.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let waiting = status.cluster("answers").expect("started");
    assert!(!waiting.serving);
    assert!(
        waiting
            .watches
            .iter()
            .all(|w| w.state == WatchState::Syncing),
        "{waiting}"
    );
    assert_eq!(fleet.status().initial_lists.waiting(), 1);
    let hanging = status.cluster("hangs").expect("started");
    assert!(
        hanging
            .watches
            .iter()
            .all(|w| matches!(w.state, WatchState::Failing { .. })),
        "{hanging}"
    );

    // The permit comes back after thirty seconds, and the cluster syncs.
    let deadline = engaged + Duration::from_secs(60);
    while !status.cluster("answers").is_some_and(|c| c.serving) {
        assert!(tokio::time::Instant::now() < deadline, "never served");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let served = engaged.elapsed();
    println!("served {served:?} after it was engaged behind a cluster that hangs");
    assert!(served >= Duration::from_secs(25), "{served:?}");
    assert!(!status.cluster("hangs").expect("started").serving);
}
