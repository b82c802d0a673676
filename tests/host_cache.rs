//! Namespaces of one API server engaged as clusters of their own: each sees
//! its namespace only, and all share one watch per type at the API server.

mod support;

use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::{
    Api,
    api::{DeleteParams, ObjectMeta, PostParams},
    runtime::watcher,
};
use kube_multicluster::envtest::Envtest;
use kube_multicluster::{Controller, Fleet, McRequest, cache::HostCache};
use support::{PATIENCE, recorder, watches_served};

async fn namespace(client: &kube::Client, name: &str) {
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

async fn config_map_in(client: &kube::Client, namespace: &str, name: &str) {
    Api::<ConfigMap>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &support::config_map(name))
        .await
        .unwrap();
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

fn names(store: &kube::runtime::reflector::Store<ConfigMap>) -> Vec<String> {
    let mut names: Vec<String> = store
        .state()
        .iter()
        .map(|cm| {
            format!(
                "{}/{}",
                cm.metadata.namespace.as_deref().unwrap_or_default(),
                cm.metadata.name.as_deref().unwrap_or_default()
            )
        })
        .collect();
    names.sort();
    names
}

#[tokio::test]
async fn each_namespace_sees_its_own_objects_over_one_shared_watch() {
    let env = Envtest::start(1).await.unwrap();
    let admin = env.clusters()[0].client();
    for ns in ["team-a", "team-b", "team-c"] {
        namespace(&admin, ns).await;
        config_map_in(&admin, ns, &format!("{ns}-settings")).await;
    }
    let watches_before = watches_served(&admin, "configmaps").await;

    let host = HostCache::new("host", support::http2_client(&env.clusters()[0]));
    let fleet = Fleet::new();
    for ns in ["team-a", "team-b", "team-c"] {
        fleet.engage_view(ns, host.view(ns));
    }
    let (reconciler, mut reconciles) = recorder::<kube_multicluster::ObjectRequest<ConfigMap>>();
    let controller = Controller::<ConfigMap>::new(&fleet, watcher::Config::default());
    let status = controller.status();
    let running = tokio::spawn(controller.run(reconciler));
    tokio::time::timeout(PATIENCE, status.synced())
        .await
        .expect("every namespace synced");

    // Each namespace's cluster reconciles its own objects, and no other's.
    let mut seen = Vec::new();
    while seen.len() < 3 {
        let got = tokio::time::timeout(PATIENCE, reconciles.recv())
            .await
            .expect("a reconcile")
            .unwrap();
        assert_eq!(
            got.namespace.as_deref(),
            Some(got.cluster.as_str()),
            "{got:?} crossed namespaces"
        );
        seen.push(got.name.clone());
    }
    seen.sort();
    assert_eq!(
        seen,
        ["team-a-settings", "team-b-settings", "team-c-settings"]
    );
    for ns in ["team-a", "team-b", "team-c"] {
        let store = fleet.get(ns).unwrap().store::<ConfigMap>().unwrap();
        assert_eq!(names(&store), [format!("{ns}/{ns}-settings")]);
    }

    // One watch at the API server for the three, by its own count.
    tokio::time::timeout(PATIENCE, async {
        while watches_served(&admin, "configmaps").await == watches_before {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the shared watch served");
    // The three started together: a watch each would be served by now.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let served = watches_served(&admin, "configmaps").await;
    assert_eq!(served, watches_before + 1, "one watch for three namespaces");
    assert_eq!(host.watch_count(), 1);

    // The client of a namespace's cluster defaults to its namespace.
    let team_b = fleet.get("team-b").unwrap();
    assert_eq!(team_b.client().default_namespace(), "team-b");
    Api::<ConfigMap>::default_namespaced(team_b.client())
        .create(&PostParams::default(), &support::config_map("made-by-b"))
        .await
        .unwrap();
    tokio::time::timeout(PATIENCE, async {
        loop {
            let got = reconciles.recv().await.unwrap();
            assert_eq!(got.namespace.as_deref(), Some(got.cluster.as_str()));
            if got == McRequest::new("team-b", Some("team-b"), "made-by-b") {
                return;
            }
        }
    })
    .await
    .expect("team-b's new object reconciled in team-b");

    // A namespace engaged later reads the objects already there; one not
    // engaged is read by nobody.
    namespace(&admin, "team-d").await;
    config_map_in(&admin, "team-d", "team-d-settings").await;
    config_map_in(&admin, "default", "not-engaged").await;
    fleet.engage_view("team-d", host.view("team-d"));
    tokio::time::timeout(PATIENCE, async {
        loop {
            let got = reconciles.recv().await.unwrap();
            assert_ne!(got.name, "not-engaged");
            if got.cluster.as_str() == "team-d" {
                assert_eq!(got.name, "team-d-settings");
                return;
            }
        }
    })
    .await
    .expect("team-d reconciled");
    assert_eq!(
        watches_served(&admin, "configmaps").await,
        watches_before + 1
    );

    // A deletion reaches the namespace's store only.
    Api::<ConfigMap>::namespaced(admin.clone(), "team-a")
        .delete("team-a-settings", &DeleteParams::default())
        .await
        .unwrap();
    let team_a = fleet.get("team-a").unwrap().store::<ConfigMap>().unwrap();
    until("team-a's object gone from its store", || {
        team_a.state().is_empty()
    })
    .await;
    let team_c = fleet.get("team-c").unwrap().store::<ConfigMap>().unwrap();
    assert_eq!(names(&team_c), ["team-c/team-c-settings"]);

    // Once every namespace has left, the one watch stops.
    drop((team_a, team_c, team_b));
    for ns in ["team-a", "team-b", "team-c", "team-d"] {
        assert!(fleet.disengage(ns));
    }
    until("the shared watch stopped", || host.watch_count() == 0).await;
    running.abort();
}

#[tokio::test]
async fn a_cluster_scoped_kind_is_seen_whole_by_each_namespace() {
    use kube::{
        api::{ApiResource, DynamicObject, GroupVersionKind},
        core::discovery::Scope,
    };
    use kube_multicluster::controller::Watch;

    let env = Envtest::start(1).await.unwrap();
    let admin = env.clusters()[0].client();
    namespace(&admin, "team-a").await;
    namespace(&admin, "team-b").await;
    let host = HostCache::new("host", support::http2_client(&env.clusters()[0]));
    let fleet = Fleet::new();
    fleet.engage_view("team-a", host.view("team-a"));
    fleet.engage_view("team-b", host.view("team-b"));
    let namespaces = ApiResource::from_gvk(&GroupVersionKind::gvk("", "v1", "Namespace"));
    let (reconciler, mut reconciles) =
        recorder::<kube_multicluster::ObjectRequest<DynamicObject>>();
    let controller = Controller::<DynamicObject>::new(
        &fleet,
        Watch::default().resource(namespaces, Scope::Cluster),
    );
    let running = tokio::spawn(controller.run(reconciler));
    // Each namespace's cluster reconciles every namespace, team-b among them.
    let mut seen = std::collections::HashSet::new();
    tokio::time::timeout(PATIENCE, async {
        while seen.len() < 2 {
            let got = reconciles.recv().await.unwrap();
            if got.name == "team-b" {
                seen.insert(got.cluster.to_string());
            }
        }
    })
    .await
    .expect("both clusters see the namespace team-b");
    assert_eq!(host.watch_count(), 1);
    running.abort();
}
