//! A controller across a fleet of real API servers, one test per scenario.

mod support;

use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::{
    Api,
    api::{ObjectMeta, Patch, PatchParams, PostParams},
    runtime::watcher,
};
use kube_multicluster::envtest::Envtest;
use kube_multicluster::{
    ClusterName, Controller, Fleet, McRequest, ObjectRequest, cache::WatchState,
    controller::ClusterSelector, provider::LocalProvider,
};
use support::*;

#[tokio::test]
async fn all_clusters_are_engaged_and_objects_that_existed_before_are_reconciled() {
    let env = Envtest::start(3).await.unwrap();
    for cluster in env.clusters() {
        create_config_map(cluster.client(), "before").await;
    }
    let mut running = Running::new();
    let mut rx = running.config_maps();
    running.add_all(&env);

    expect_all(
        &mut rx,
        env.clusters().iter().map(|c| request(c.name(), "before")),
    )
    .await;
    let mut engaged: Vec<_> = running
        .fleet
        .clusters()
        .iter()
        .map(|c| c.name().to_string())
        .collect();
    engaged.sort();
    assert_eq!(engaged, ["cluster-0", "cluster-1", "cluster-2"]);
}

#[tokio::test]
async fn new_and_updated_objects_are_reconciled() {
    let env = Envtest::start(2).await.unwrap();
    let mut running = Running::new();
    let mut rx = running.config_maps();
    running.add_all(&env);
    running.wait_served("cluster-1").await;

    let b = &env.clusters()[1];
    create_config_map(b.client(), "fresh").await;
    expect_all(&mut rx, [request("cluster-1", "fresh")]).await;

    Api::<ConfigMap>::default_namespaced(b.client())
        .patch(
            "fresh",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "data": { "value": "2" } })),
        )
        .await
        .unwrap();
    expect_all(&mut rx, [request("cluster-1", "fresh")]).await;
}

#[tokio::test]
async fn a_cluster_added_at_runtime_is_reconciled() {
    let mut env = Envtest::start(1).await.unwrap();
    let mut running = Running::new();
    let mut rx = running.config_maps();
    running.add_all(&env);
    running.wait_served("cluster-0").await;

    let late = env.add_cluster("late").await.unwrap();
    create_config_map(late.client(), "was-there").await;
    running.provider.engage("late", late.client());
    expect_all(&mut rx, [request("late", "was-there")]).await;
    create_config_map(late.client(), "came-later").await;
    expect_all(&mut rx, [request("late", "came-later")]).await;
}

#[tokio::test]
async fn a_removed_cluster_loses_its_watches_queue_and_running_reconciles() {
    let env = Envtest::start(2).await.unwrap();
    let (a, b) = (&env.clusters()[0], &env.clusters()[1]);
    for i in 0..5 {
        create_config_map(b.client(), &format!("queued-{i}")).await;
    }
    let mut running = Running::new();

    // One reconcile at a time; reconciles of cluster-1 hang until cancelled,
    // so its other keys stay queued behind the first.
    let (started_tx, mut started) = tokio::sync::mpsc::unbounded_channel::<McRequest>();
    let (cancelled_tx, mut cancelled) = tokio::sync::mpsc::unbounded_channel::<McRequest>();
    let service = tower::ServiceBuilder::new()
        .concurrency_limit(1)
        .service(tower::service_fn(
            move |request: ObjectRequest<ConfigMap>| {
                let started_tx = started_tx.clone();
                let cancelled_tx = cancelled_tx.clone();
                let request = request.request;
                async move {
                    let _ = started_tx.send(request.clone());
                    if request.cluster == "cluster-1" {
                        let _report_cancel = OnDrop(Some(move || {
                            let _ = cancelled_tx.send(request);
                        }));
                        std::future::pending::<()>().await;
                    }
                    Ok::<_, tower::BoxError>(kube_multicluster::Action::await_change())
                }
            },
        ));
    running.spawn(
        Controller::<ConfigMap>::new(&running.fleet, watcher::Config::default()),
        service,
    );
    // The API server's own watches, before ours.
    let baseline = watches_served(&b.client(), "configmaps").await;
    running.provider.engage("cluster-1", b.client());
    let stuck = tokio::time::timeout(PATIENCE, started.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stuck.cluster, "cluster-1");
    // The watch request follows the list the reconcile came from.
    tokio::time::timeout(PATIENCE, async {
        while watches_served(&b.client(), "configmaps").await <= baseline {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("the cluster's watch is served");

    running.provider.disengage("cluster-1");
    let gone = tokio::time::timeout(PATIENCE, cancelled.recv())
        .await
        .expect("the running reconcile of the removed cluster is cancelled")
        .unwrap();
    assert_eq!(gone, stuck);
    assert!(running.fleet.get("cluster-1").is_none());

    // Its watch ends at the API server.
    tokio::time::timeout(PATIENCE, async {
        while watches_served(&b.client(), "configmaps").await > baseline {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("the removed cluster's watch stops");

    // Its queued keys never run, and new objects there start nothing, while
    // another cluster is served as usual.
    running.provider.engage("cluster-0", a.client());
    create_config_map(a.client(), "other").await;
    create_config_map(b.client(), "after-removal").await;
    let mut seen = expect_all(&mut started, [request("cluster-0", "other")]).await;
    seen.extend(drain_for(&mut started, Duration::from_secs(2)).await);
    assert!(
        seen.iter().all(|r| r.cluster != "cluster-1"),
        "a removed cluster's key ran: {seen:?}"
    );
}

#[tokio::test]
async fn an_unreachable_cluster_delays_no_other() {
    let env = Envtest::start(3).await.unwrap();
    for cluster in env.clusters() {
        create_config_map(cluster.client(), "x").await;
    }
    let down = &env.clusters()[1];
    down.stop();

    let mut running = Running::new();
    let mut rx = running.config_maps();
    running.add_all(&env);
    expect_all(
        &mut rx,
        [request("cluster-0", "x"), request("cluster-2", "x")],
    )
    .await;
    // The controller says why it does not serve the cluster.
    let status = &running.statuses[0];
    let failing = tokio::time::timeout(PATIENCE, async {
        loop {
            let cluster = status.cluster("cluster-1").expect("started there");
            assert!(!cluster.serving, "an unsynced cluster is not served");
            if cluster.failing().next().is_some() {
                return cluster;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the watch reports its failure");
    assert!(
        matches!(&failing.watches[0].state, WatchState::Failing { reason } if !reason.is_empty()),
        "{failing}"
    );
    assert!(!status.is_synced());

    down.restart().await.unwrap();
    expect_all(&mut rx, [request("cluster-1", "x")]).await;
    tokio::time::timeout(PATIENCE, running.statuses[0].synced())
        .await
        .expect("the controller serves every cluster once the last one answers");
}

#[tokio::test]
async fn the_same_reconciler_runs_against_the_local_cluster_alone() {
    let env = Envtest::start(1).await.unwrap();
    let local = &env.clusters()[0];
    create_config_map(local.client(), "mine").await;

    let fleet = Fleet::new();
    let provider = tokio::spawn({
        let fleet = fleet.clone();
        let local = LocalProvider::new(local.client());
        async move { fleet.run(local).await }
    });
    let (service, mut rx) = recorder();
    let controller = tokio::spawn(
        Controller::<ConfigMap>::new(&fleet, watcher::Config::default())
            .clusters(ClusterSelector::Local)
            .run(service),
    );
    let seen = expect_all(
        &mut rx,
        [McRequest::new(
            ClusterName::local(),
            Some("default"),
            "mine",
        )],
    )
    .await;
    assert!(seen.iter().all(|r| r.cluster.is_local()));
    assert_eq!(seen.last().unwrap().to_string(), "cluster:///default/mine");
    provider.abort();
    controller.abort();
}

#[tokio::test]
async fn a_change_in_one_cluster_can_enqueue_work_in_another() {
    let env = Envtest::builder()
        .clusters(["hub", "member"])
        .start()
        .await
        .unwrap();
    let mut running = Running::new();
    let (service, mut rx) = recorder();
    let controller = Controller::<ConfigMap>::new(&running.fleet, watcher::Config::default())
        .watches::<Secret, _>(watcher::Config::default(), |cluster, secret| {
            // A Secret in the hub asks for the member's ConfigMap of that name.
            (cluster == "hub").then(|| {
                McRequest::new(
                    "member",
                    Some("default"),
                    secret.metadata.name.clone().unwrap_or_default(),
                )
            })
        });
    running.spawn(controller, service);
    running.add_all(&env);
    running.wait_served("hub").await;
    running.wait_served("member").await;

    let secret = Secret {
        metadata: ObjectMeta {
            name: Some("shared".into()),
            ..ObjectMeta::default()
        },
        ..Secret::default()
    };
    Api::<Secret>::default_namespaced(env.clusters()[0].client())
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    expect_all(&mut rx, [request("member", "shared")]).await;
}

#[tokio::test]
async fn a_second_controller_for_the_same_type_opens_no_second_watch() {
    let env = Envtest::start(1).await.unwrap();
    let client = env.clusters()[0].client();
    // The API server watches some ConfigMaps itself.
    let before = watches_served(&client, "configmaps").await;
    let mut running = Running::new();
    let mut first = running.config_maps();
    let mut second = running.config_maps();
    running.add_all(&env);
    running.wait_served("cluster-0").await;

    create_config_map(client.clone(), "both").await;
    expect_all(&mut first, [request("cluster-0", "both")]).await;
    expect_all(&mut second, [request("cluster-0", "both")]).await;

    let cluster = running.fleet.get("cluster-0").unwrap();
    assert_eq!(cluster.cache().watch_count(), 1);
    assert_eq!(watches_served(&client, "configmaps").await, before + 1);
}

#[tokio::test]
async fn a_child_change_reconciles_its_owner_in_the_same_cluster() {
    let env = Envtest::start(1).await.unwrap();
    let client = env.clusters()[0].client();
    let owner = create_config_map(client.clone(), "owner").await;

    let mut running = Running::new();
    let (service, mut rx) = recorder();
    let controller = Controller::<ConfigMap>::new(&running.fleet, watcher::Config::default())
        .owns_metadata::<Secret>(watcher::Config::default());
    running.spawn(controller, service);
    running.add_all(&env);
    expect_all(&mut rx, [request("cluster-0", "owner")]).await;

    let child = Secret {
        metadata: ObjectMeta {
            name: Some("child".into()),
            owner_references: Some(vec![
                k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                    api_version: "v1".into(),
                    kind: "ConfigMap".into(),
                    name: "owner".into(),
                    uid: owner.metadata.uid.clone().unwrap(),
                    ..Default::default()
                },
            ]),
            ..ObjectMeta::default()
        },
        ..Secret::default()
    };
    Api::<Secret>::default_namespaced(client)
        .create(&PostParams::default(), &child)
        .await
        .unwrap();
    expect_all(&mut rx, [request("cluster-0", "owner")]).await;
}

/// Runs a closure when dropped: tells a test that a future was cancelled.
struct OnDrop<F: FnOnce()>(Option<F>);

impl<F: FnOnce()> Drop for OnDrop<F> {
    fn drop(&mut self) {
        if let Some(f) = self.0.take() {
            f();
        }
    }
}

#[tokio::test]
async fn re_engaging_a_name_replaces_the_cluster_and_its_watches() {
    let env = Envtest::start(2).await.unwrap();
    let (first, second) = (&env.clusters()[0], &env.clusters()[1]);
    create_config_map(first.client(), "on-first").await;
    create_config_map(second.client(), "on-second").await;
    let first_watches = watches_served(&first.client(), "configmaps").await;

    let mut running = Running::new();
    let mut rx = running.config_maps();
    running.provider.engage("moving", first.client());
    expect_all(&mut rx, [request("moving", "on-first")]).await;
    // The reconcile came from the list; the watch request follows it.
    tokio::time::timeout(PATIENCE, async {
        while watches_served(&first.client(), "configmaps").await < first_watches + 1 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("the watch runs at the first server");
    assert_eq!(
        watches_served(&first.client(), "configmaps").await,
        first_watches + 1
    );

    // The same name, other credentials and another server.
    running.provider.engage("moving", second.client());
    expect_all(&mut rx, [request("moving", "on-second")]).await;
    tokio::time::timeout(PATIENCE, async {
        while watches_served(&first.client(), "configmaps").await > first_watches {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("the replaced cluster's watch stops");
    let engaged = running.fleet.get("moving").unwrap();
    assert!(
        engaged
            .store::<ConfigMap>()
            .unwrap()
            .get(&kube::runtime::reflector::ObjectRef::new("on-second").within("default"))
            .is_some(),
        "the name now reads the second server"
    );
}

#[tokio::test]
async fn a_terminal_error_waits_for_the_object_to_change() {
    use kube_multicluster::{Action, TerminalError};

    let env = Envtest::start(1).await.unwrap();
    let client = env.clusters()[0].client();
    create_config_map(client.clone(), "broken").await;
    let mut running = Running::new();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let service = tower::service_fn(move |request: ObjectRequest<ConfigMap>| {
        let request = request.request;
        let _ = tx.send(request.clone());
        async move {
            if request.name == "broken" {
                Err(TerminalError::new("the spec cannot work").into())
            } else {
                Ok::<_, tower::BoxError>(Action::await_change())
            }
        }
    });
    running.spawn(
        Controller::<ConfigMap>::new(&running.fleet, watcher::Config::default()),
        service,
    );
    running.add_all(&env);
    expect_all(&mut rx, [request("cluster-0", "broken")]).await;
    let retried: Vec<_> = drain_for(&mut rx, Duration::from_secs(3))
        .await
        .into_iter()
        .filter(|r| r.name == "broken")
        .collect();
    assert!(retried.is_empty(), "not retried: {retried:?}");

    Api::<ConfigMap>::default_namespaced(client)
        .patch(
            "broken",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "data": { "value": "fixed" } })),
        )
        .await
        .unwrap();
    expect_all(&mut rx, [request("cluster-0", "broken")]).await;
}

#[tokio::test]
async fn reconcile_all_on_runs_every_known_object_again() {
    let env = Envtest::start(2).await.unwrap();
    let marked = |name: &str| {
        let mut cm = config_map(name);
        cm.metadata.labels = Some([("resync".to_owned(), "yes".to_owned())].into());
        cm
    };
    for cluster in env.clusters() {
        for name in ["a", "b"] {
            Api::<ConfigMap>::default_namespaced(cluster.client())
                .create(&PostParams::default(), &marked(name))
                .await
                .unwrap();
        }
    }
    let (signal, signals) = tokio::sync::mpsc::unbounded_channel::<()>();
    let mut running = Running::new();
    let (service, mut rx) = recorder();
    let controller = Controller::<ConfigMap>::new(
        &running.fleet,
        watcher::Config::default().labels("resync=yes"),
    )
    .reconcile_all_on(tokio_stream::wrappers::UnboundedReceiverStream::new(
        signals,
    ));
    running.spawn(controller, service);
    running.add_all(&env);
    let everything: Vec<_> = ["cluster-0", "cluster-1"]
        .into_iter()
        .flat_map(|c| [request(c, "a"), request(c, "b")])
        .collect();
    expect_all(&mut rx, everything.clone()).await;
    assert!(drain_for(&mut rx, Duration::from_secs(1)).await.is_empty());

    signal.send(()).unwrap();
    let again = expect_all(&mut rx, everything).await;
    assert_eq!(again.len(), 4, "each once: {again:?}");
}

#[tokio::test]
async fn a_clusters_store_is_its_controllers_watch_whatever_its_selector() {
    let env = Envtest::start(1).await.unwrap();
    let client = env.clusters()[0].client();
    let mut marked = support::config_map("marked");
    marked.metadata.labels = Some([("app".to_owned(), "on".to_owned())].into());
    kube::Api::<ConfigMap>::default_namespaced(client.clone())
        .create(&Default::default(), &marked)
        .await
        .unwrap();
    create_config_map(client.clone(), "unmarked").await;
    let mut running = Running::new();
    let (service, mut rx) = support::recorder::<ObjectRequest<ConfigMap>>();
    let selected = watcher::Config::default().labels("app=on");
    running.spawn(
        kube_multicluster::Controller::<ConfigMap>::new(&running.fleet, selected.clone()),
        service,
    );
    running.provider.engage("east", client);
    expect_all(&mut rx, [request("east", "marked")]).await;
    let east = running.fleet.get("east").unwrap();
    let store = east
        .store::<ConfigMap>()
        .expect("the controller's one watch");
    let names: Vec<String> = store
        .state()
        .iter()
        .filter_map(|c| c.metadata.name.clone())
        .collect();
    assert_eq!(names, ["marked"]);

    // A second watch of the type: which one is meant must be said.
    let other = east.cache().watch::<ConfigMap>(&watcher::Config::default());
    other.synced().await;
    assert!(
        east.store::<ConfigMap>().is_none(),
        "two watches of ConfigMaps"
    );
    let found = east.cache().find::<ConfigMap>(&selected).unwrap();
    assert_eq!(found.store().state().len(), 1);
    drop(other);
    assert!(east.store::<ConfigMap>().is_some(), "one again");
}
