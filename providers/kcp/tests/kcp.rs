//! The logical clusters of a real kcp that bind an APIExport, as clusters:
//! engaged as they bind, reconciled in their own workspace over one
//! wildcard watch per type, disengaged as their binding or workspace goes,
//! and what goes wrong reported by source.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api, Client,
    api::{
        ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ObjectMeta, Patch, PatchParams,
        PostParams, WatchParams,
    },
    runtime::watcher,
};
use kube_multicluster::{
    Action, Controller, Fleet, ObjectRequest, ReconcileReason, provider::Problems,
};
use kube_multicluster_envtest::{KCP_EXAMPLE_EXPORT, Kcp};
use kube_multicluster_provider_kcp::KcpProvider;
use tower::BoxError;

const PATIENCE: Duration = Duration::from_secs(90);
/// An export nobody binds: its slice lists no endpoint.
const LONELY: &str = r#"
apiVersion: apis.kcp.io/v1alpha2
kind: APIExport
metadata: {name: lonely.io}
spec: {}
"#;

/// Makes `workspace` and binds the example export there, accepting its
/// claim on ConfigMaps or not; returns its logical cluster.
async fn consumer(kcp: &Kcp, workspace: &str, accept: bool) -> String {
    let cluster = kcp.create_workspace(workspace).await.unwrap();
    let path = format!("root:{workspace}");
    kcp.bind(
        &path,
        "root:provider",
        "example.io",
        &[("configmaps", accept)],
    )
    .await
    .unwrap();
    cluster
}

/// kcp, with the example export in the workspace `provider`.
async fn kcp() -> Kcp {
    let kcp = Kcp::start().await.expect("kcp starts");
    kcp.create_workspace("provider").await.unwrap();
    kcp.apply("root:provider", KCP_EXAMPLE_EXPORT)
        .await
        .unwrap();
    kcp
}

fn resource(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
}

async fn until(what: &str, mut done: impl AsyncFnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !done().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: not within {PATIENCE:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

async fn parent(client: &Client, name: &str) {
    let config_map = ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some([("fleet".to_owned(), "kcp".to_owned())].into()),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    };
    let api = Api::<ConfigMap>::namespaced(client.clone(), "default");
    // The workspace's `default` namespace may be made just after it is ready.
    until("a parent ConfigMap", async || {
        api.create(&PostParams::default(), &config_map)
            .await
            .is_ok()
    })
    .await;
}

/// What `<name>-seen` in the workspace says its reconcile's cluster was.
async fn seen_by(client: &Client, name: &str) -> Option<String> {
    let api = Api::<ConfigMap>::namespaced(client.clone(), "default");
    let child = api.get_opt(&format!("{name}-seen")).await.ok()??;
    child.data?.get("cluster").cloned()
}

/// Each key's reconciles, by `cluster/name`: whether each was the echo of
/// the controller's own write.
type Runs = Arc<Mutex<BTreeMap<String, Vec<bool>>>>;

/// Runs a controller of labelled ConfigMaps that writes `<name>-seen`, with
/// the reconciling cluster's name, in the parent's own cluster, and marks
/// the parent seen.
fn run(fleet: &Fleet, provider: KcpProvider) -> Runs {
    let runs: Runs = Arc::default();
    let controller =
        Controller::<ConfigMap>::new(fleet, watcher::Config::default().labels("fleet=kcp"));
    let counted = runs.clone();
    tokio::spawn(controller.run(tower::service_fn(
        move |request: ObjectRequest<ConfigMap>| {
            let counted = counted.clone();
            async move {
                let cluster = request.cluster.name().to_string();
                let echo = matches!(request.reason, ReconcileReason::OwnWrite { .. });
                counted
                    .lock()
                    .unwrap()
                    .entry(format!("{cluster}/{}", request.request.name))
                    .or_default()
                    .push(echo);
                let child = ConfigMap {
                    metadata: ObjectMeta {
                        name: Some(format!("{}-seen", request.request.name)),
                        ..ObjectMeta::default()
                    },
                    data: Some([("cluster".to_owned(), cluster)].into()),
                    ..ConfigMap::default()
                };
                let api = Api::<ConfigMap>::namespaced(request.cluster.client(), "default");
                match api.create(&PostParams::default(), &child).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(e)) if e.code == 409 => {}
                    Err(e) => return Err(BoxError::from(e)),
                }
                // A write its own watch shows: read back before its next reconcile.
                let seen = serde_json::json!({"metadata": {"annotations": {"seen": "yes"}}});
                api.patch(
                    &request.request.name,
                    &PatchParams::default(),
                    &Patch::Merge(seen),
                )
                .await?;
                Ok::<_, BoxError>(Action::await_change())
            }
        },
    )));
    tokio::spawn({
        let fleet = fleet.clone();
        async move { fleet.run(provider).await }
    });
    runs
}

async fn config_map_watches(kcp: &Kcp) -> u64 {
    kcp.watches_served("configmaps")
        .await
        .expect("kcp's metrics")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logical_clusters_that_bind_the_export_are_reconciled_in_their_own_workspace() {
    let kcp = kcp().await;
    let a = consumer(&kcp, "consumer-a", true).await;
    let b = consumer(&kcp, "consumer-b", true).await;
    let (in_a, in_b) = (
        kcp.client("root:consumer-a").await.unwrap(),
        kcp.client("root:consumer-b").await.unwrap(),
    );
    let watches_before = config_map_watches(&kcp).await;
    // What one watch of ConfigMaps across the export's logical clusters
    // counts at kcp: the virtual workspace's, and the one it opens on the
    // shard's storage.
    let one_watch = {
        let url = &kcp.endpoints("root:provider", "example.io").await.unwrap()[0];
        let everywhere = kcp.client_at(&format!("{url}/clusters/*")).await.unwrap();
        let watch = Api::<ConfigMap>::all(everywhere)
            .watch(&WatchParams::default(), "0")
            .await
            .unwrap()
            .boxed();
        until("a watch counted", async || {
            config_map_watches(&kcp).await > watches_before
        })
        .await;
        // Both parts of it, once the second has had time to start.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let counted = config_map_watches(&kcp).await - watches_before;
        drop(watch);
        until("the watch let go", async || {
            config_map_watches(&kcp).await == watches_before
        })
        .await;
        counted
    };

    let provider = KcpProvider::new(kcp.config("root:provider").await.unwrap(), "example.io")
        .expect("a provider");
    let problems = provider.problems();
    let shards = provider.shards();
    let fleet = Fleet::new();
    let runs = run(&fleet, provider);
    until("both logical clusters engaged", async || {
        fleet.get(a.as_str()).is_some() && fleet.get(b.as_str()).is_some()
    })
    .await;

    parent(&in_a, "parent").await;
    parent(&in_b, "parent").await;
    until("each parent reconciled in its own workspace", async || {
        seen_by(&in_a, "parent").await.as_deref() == Some(a.as_str())
            && seen_by(&in_b, "parent").await.as_deref() == Some(b.as_str())
    })
    .await;
    assert_eq!(problems.current(), BTreeMap::new());
    // Each cluster's writes are told from its own part of the watch: the
    // parent's mark comes back as the echo of its own write.
    until("each parent's echo", async || {
        let runs = runs.lock().unwrap();
        [&a, &b].iter().all(|cluster| {
            runs.get(&format!("{cluster}/parent"))
                .is_some_and(|echoes| echoes.contains(&true))
        })
    })
    .await;

    // One watch of ConfigMaps for both, at the shard and in the cache.
    let caches = shards.caches();
    assert_eq!(caches.len(), 1, "{caches:?}");
    assert_eq!(shards.watch_count(), 1, "{caches:?}");
    assert_eq!(config_map_watches(&kcp).await - watches_before, one_watch);

    // A third workspace binds later: engaged, reconciled, the same watch.
    let c = consumer(&kcp, "consumer-c", true).await;
    let in_c = kcp.client("root:consumer-c").await.unwrap();
    until("the third logical cluster engaged", async || {
        fleet.get(c.as_str()).is_some()
    })
    .await;
    parent(&in_c, "parent").await;
    until(
        "the third parent reconciled in its own workspace",
        async || seen_by(&in_c, "parent").await.as_deref() == Some(c.as_str()),
    )
    .await;
    assert_eq!(config_map_watches(&kcp).await - watches_before, one_watch);
    {
        let runs = runs.lock().unwrap();
        for cluster in [&a, &b, &c] {
            assert!(runs.contains_key(&format!("{cluster}/parent")), "{runs:?}");
        }
    }

    // b's binding deleted: b leaves, a and c stay.
    let bindings = resource("apis.kcp.io", "v1alpha2", "APIBinding", "apibindings");
    Api::<DynamicObject>::all_with(in_b.clone(), &bindings)
        .delete("example.io", &DeleteParams::default())
        .await
        .unwrap();
    until("b disengaged", async || fleet.get(b.as_str()).is_none()).await;
    assert!(fleet.get(a.as_str()).is_some() && fleet.get(c.as_str()).is_some());

    // c's workspace deleted: c leaves, a stays and still reconciles.
    let workspaces = resource("tenancy.kcp.io", "v1alpha1", "Workspace", "workspaces");
    Api::<DynamicObject>::all_with(kcp.client("root").await.unwrap(), &workspaces)
        .delete("consumer-c", &DeleteParams::default())
        .await
        .unwrap();
    until("c disengaged", async || fleet.get(c.as_str()).is_none()).await;
    parent(&in_a, "later").await;
    until("a reconciles on", async || {
        seen_by(&in_a, "later").await.as_deref() == Some(a.as_str())
    })
    .await;
    assert_eq!(problems.current(), BTreeMap::new());
    // a's reconciles never waited in vain for their own writes.
    let waits = fleet.get(a.as_str()).unwrap().read_your_writes();
    assert!(waits.writes >= 4 && waits.timeouts == 0, "{waits:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_goes_wrong_is_reported_by_source_and_touches_no_other_cluster() {
    let kcp = kcp().await;
    kcp.apply("root:provider", LONELY).await.unwrap();
    let good = consumer(&kcp, "consumer-good", true).await;
    let rejecting = consumer(&kcp, "consumer-rejecting", false).await;
    let config = kcp.config("root:provider").await.unwrap();

    // A slice that does not exist, and one that lists no endpoint.
    let missing = KcpProvider::new(config.clone(), "no-such-export").unwrap();
    let lonely = KcpProvider::new(config.clone(), "lonely.io").unwrap();
    let (missing_problems, lonely_problems) = (missing.problems(), lonely.problems());
    let (missing_fleet, lonely_fleet) = (Fleet::new(), Fleet::new());
    for (fleet, provider) in [(&missing_fleet, missing), (&lonely_fleet, lonely)] {
        let fleet = fleet.clone();
        tokio::spawn(async move { fleet.run(provider).await });
    }

    let provider = KcpProvider::new(config, "example.io").unwrap();
    let problems = provider.problems();
    let fleet = Fleet::new();
    let _runs = run(&fleet, provider);

    until("the missing slice reported", async || {
        reported(
            &missing_problems,
            "APIExportEndpointSlice no-such-export",
            "not found",
        )
    })
    .await;
    until("the lonely slice reported", async || {
        reported(
            &lonely_problems,
            "APIExportEndpointSlice lonely.io",
            "lists no endpoint",
        )
    })
    .await;
    // Each reports its own slice only.
    assert_eq!(
        missing_problems.current().len(),
        1,
        "{:?}",
        missing_problems.current()
    );
    assert_eq!(
        lonely_problems.current().len(),
        1,
        "{:?}",
        lonely_problems.current()
    );

    // The rejected claim is reported, and its cluster engaged all the same.
    let source = format!("APIBinding example.io in {rejecting}");
    until("the rejected claim reported", async || {
        reported(&problems, &source, "configmaps")
    })
    .await;
    until("both engaged", async || {
        fleet.get(good.as_str()).is_some() && fleet.get(rejecting.as_str()).is_some()
    })
    .await;
    let in_good = kcp.client("root:consumer-good").await.unwrap();
    parent(&in_good, "parent").await;
    until("the good cluster reconciled", async || {
        seen_by(&in_good, "parent").await.as_deref() == Some(good.as_str())
    })
    .await;

    // The good cluster's own problems: none.
    assert_eq!(problems.current().len(), 1, "{:?}", problems.current());

    // The shard goes away: reported under it, its clusters kept.
    let shard = format!(
        "kcp shard {}",
        kcp.endpoints("root:provider", "example.io").await.unwrap()[0]
    );
    drop(kcp);
    until("the unreachable shard reported", async || {
        reported(&problems, &shard, "APIBindings")
    })
    .await;
    assert!(fleet.get(good.as_str()).is_some() && fleet.get(rejecting.as_str()).is_some());
}

fn reported(problems: &Problems, source: &str, says: &str) -> bool {
    problems
        .get(source)
        .is_some_and(|message| message.contains(says))
}

/// An export that claims ConfigMaps and the LogicalClusters that hold each
/// workspace's path.
const PATHS: &str = r#"
apiVersion: apis.kcp.io/v1alpha2
kind: APIExport
metadata: {name: paths.io}
spec:
  permissionClaims:
  - {group: "", resource: configmaps, verbs: ["*"]}
  - {group: core.kcp.io, resource: logicalclusters, verbs: ["get", "list", "watch"]}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn named_by_path_each_workspace_is_engaged_under_its_path() {
    let kcp = Kcp::start().await.expect("kcp starts");
    kcp.create_workspace("provider").await.unwrap();
    kcp.apply("root:provider", PATHS).await.unwrap();
    let mut clusters = Vec::new();
    for (workspace, paths_accepted) in [("team-a", true), ("team-b", false)] {
        clusters.push(kcp.create_workspace(workspace).await.unwrap());
        let claims = [
            ("configmaps", true),
            ("logicalclusters.core.kcp.io", paths_accepted),
        ];
        kcp.bind(
            &format!("root:{workspace}"),
            "root:provider",
            "paths.io",
            &claims,
        )
        .await
        .unwrap();
    }
    let provider = KcpProvider::new(kcp.config("root:provider").await.unwrap(), "paths.io")
        .unwrap()
        .named_by_path();
    let problems = provider.problems();
    let fleet = Fleet::new();
    let _runs = run(&fleet, provider);
    until("team-a engaged under its path", async || {
        fleet.get("root:team-a").is_some()
    })
    .await;
    let in_a = kcp.client("root:team-a").await.unwrap();
    parent(&in_a, "parent").await;
    until("reconciled under its path", async || {
        seen_by(&in_a, "parent").await.as_deref() == Some("root:team-a")
    })
    .await;
    // team-b did not accept the claim on its path: reported, not engaged.
    let source = format!("logical cluster {}", clusters[1]);
    until("team-b's unknown path reported", async || {
        reported(&problems, &source, "path is not known")
    })
    .await;
    let names: Vec<String> = fleet
        .clusters()
        .iter()
        .map(|c| c.name().to_string())
        .collect();
    assert_eq!(names, ["root:team-a"]);
}
