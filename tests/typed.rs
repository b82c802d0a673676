//! The typed path against real API servers: a controller names its type and
//! watch once, and each reconcile gets the cluster, the object from that very
//! watch, why it runs, and the controller's name.

mod support;

use std::sync::Arc;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api,
    api::{Patch, PatchParams, PostParams},
    runtime::{reflector::ObjectRef, watcher},
};
use kube_multicluster::envtest::Envtest;
use kube_multicluster::{Action, Controller, ObjectRequest, ReconcileReason};
use support::*;
use tokio::sync::mpsc;
use tower::BoxError;

/// What a reconcile saw: its key's name, whether it had the object, whether
/// that object was the very allocation in the controller's watch, its
/// reason and controller name.
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    cluster: String,
    name: String,
    exists: bool,
    same_allocation: bool,
    reason: ReconcileReason,
    controller: Option<String>,
}

fn marked(name: &str, marked: bool) -> ConfigMap {
    let mut config_map = config_map(name);
    config_map.metadata.labels = Some([("team".to_owned(), marked.to_string())].into());
    config_map
}

/// The next reconcile of `name`; every reconcile seen meanwhile goes to `log`.
async fn next(rx: &mut mpsc::UnboundedReceiver<Seen>, log: &mut Vec<Seen>, name: &str) -> Seen {
    tokio::time::timeout(PATIENCE, async {
        loop {
            let seen = rx.recv().await.expect("the controller runs");
            log.push(seen.clone());
            if seen.name == name {
                return seen;
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no reconcile of {name}"))
}

#[tokio::test]
async fn a_reconciler_gets_the_object_from_the_controllers_own_watch_with_its_reason() {
    let env = Envtest::start(2).await.unwrap();
    for cluster in env.clusters() {
        let api = Api::<ConfigMap>::default_namespaced(cluster.client());
        for (name, mark) in [("in", true), ("out", false)] {
            api.create(&PostParams::default(), &marked(name, mark))
                .await
                .unwrap();
        }
    }
    let mut running = Running::new();
    let selector = watcher::Config::default().labels("team=true");
    let (tx, mut rx) = mpsc::unbounded_channel();
    let service = tower::service_fn({
        let selector = selector.clone();
        move |request: ObjectRequest<ConfigMap>| {
            // The watch this controller started, found by its configuration:
            // the object handed over is the one in its store, not a copy.
            let in_store = request
                .cluster
                .cache()
                .find::<ConfigMap>(&selector)
                .and_then(|watch| {
                    watch
                        .store()
                        .get(&ObjectRef::new(&request.request.name).within("default"))
                });
            let same_allocation = match (&request.object, &in_store) {
                (Some(handed), Some(stored)) => Arc::ptr_eq(handed, stored),
                _ => false,
            };
            let _ = tx.send(Seen {
                cluster: request.cluster.name().to_string(),
                name: request.request.name.clone(),
                exists: request.object.is_some(),
                same_allocation,
                reason: request.reason.clone(),
                controller: request.controller.as_deref().map(str::to_owned),
            });
            async { Ok::<_, BoxError>(Action::await_change()) }
        }
    });
    running.spawn(
        Controller::<ConfigMap>::new(&running.fleet, selector).named("teams"),
        service,
    );
    running.add_all(&env);

    let mut log = Vec::new();
    let first = next(&mut rx, &mut log, "in").await;
    assert!(first.exists && first.same_allocation, "{first:?}");
    assert_eq!(first.reason, ReconcileReason::Listed);
    assert_eq!(first.controller.as_deref(), Some("teams"));
    let second = next(&mut rx, &mut log, "in").await;
    assert_ne!(second.cluster, first.cluster, "once in each cluster");

    let api = Api::<ConfigMap>::default_namespaced(env.clusters()[0].client());
    let change = serde_json::json!({ "data": { "k": "v" } });
    api.patch("in", &PatchParams::default(), &Patch::Merge(&change))
        .await
        .unwrap();
    let changed = next(&mut rx, &mut log, "in").await;
    assert_eq!(changed.cluster, "cluster-0");
    assert_eq!(changed.reason, ReconcileReason::ObjectUpdated);
    assert!(changed.exists && changed.same_allocation, "{changed:?}");

    // No longer matching the selector: the watch drops it, and the
    // reconciler is told it is gone.
    let unmark = serde_json::json!({ "metadata": { "labels": { "team": "false" } } });
    api.patch("in", &PatchParams::default(), &Patch::Merge(&unmark))
        .await
        .unwrap();
    let unmarked = next(&mut rx, &mut log, "in").await;
    assert_eq!(unmarked.reason, ReconcileReason::ObjectUpdated);
    assert!(!unmarked.exists, "{unmarked:?}");

    while let Ok(Some(seen)) =
        tokio::time::timeout(std::time::Duration::from_millis(500), rx.recv()).await
    {
        log.push(seen);
    }
    assert!(
        log.iter().all(|s| s.name != "out"),
        "the selector keeps others out: {log:?}"
    );
}

/// Grants `user` read rights on ConfigMaps in `namespace` only (a Role).
async fn grant_reading_in(client: kube::Client, namespace: &str, user: &str) {
    use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
    use kube::api::ObjectMeta;
    let meta = ObjectMeta {
        name: Some("config-map-reader".into()),
        namespace: Some(namespace.into()),
        ..ObjectMeta::default()
    };
    let role = Role {
        metadata: meta.clone(),
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec![String::new()]),
            resources: Some(vec!["configmaps".into()]),
            verbs: vec!["get".into(), "list".into(), "watch".into()],
            ..PolicyRule::default()
        }]),
    };
    let binding = RoleBinding {
        metadata: meta,
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "Role".into(),
            name: "config-map-reader".into(),
        },
        subjects: Some(vec![Subject {
            kind: "User".into(),
            name: user.into(),
            api_group: Some("rbac.authorization.k8s.io".into()),
            ..Subject::default()
        }]),
    };
    Api::<Role>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &role)
        .await
        .unwrap();
    Api::<RoleBinding>::namespaced(client, namespace)
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
}

async fn create_namespace(client: kube::Client, name: &str) {
    use k8s_openapi::api::core::v1::Namespace;
    let namespace = Namespace {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        ..Namespace::default()
    };
    Api::<Namespace>::all(client)
        .create(&PostParams::default(), &namespace)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_namespaced_controller_sees_only_its_namespace_and_needs_only_a_role_there() {
    use kube_multicluster::controller::Watch;

    let env = Envtest::start(1).await.unwrap();
    let cluster = &env.clusters()[0];
    let admin = cluster.client();
    create_namespace(admin.clone(), "team-a").await;
    for namespace in ["team-a", "default"] {
        Api::<ConfigMap>::namespaced(admin.clone(), namespace)
            .create(
                &PostParams::default(),
                &config_map(&format!("in-{namespace}")),
            )
            .await
            .unwrap();
    }
    grant_reading_in(admin.clone(), "team-a", "team-a-operator").await;
    // The controller's only credentials: a user with that Role and no
    // cluster-wide right at all.
    let operator = cluster.client_for("team-a-operator", &[]).unwrap();

    let mut running = Running::new();
    let (service, mut rx) = recorder();
    let controller =
        Controller::<ConfigMap>::new(&running.fleet, Watch::default().in_namespace("team-a"));
    let status = controller.status();
    running.spawn(controller, service);
    running.provider.engage("cluster-0", operator);

    let mut seen = expect_all(
        &mut rx,
        [kube_multicluster::McRequest::new(
            "cluster-0",
            Some("team-a"),
            "in-team-a",
        )],
    )
    .await;
    tokio::time::timeout(PATIENCE, status.synced())
        .await
        .expect("the namespaced watch syncs with a Role only");
    Api::<ConfigMap>::namespaced(admin.clone(), "default")
        .create(&PostParams::default(), &config_map("later-in-default"))
        .await
        .unwrap();
    Api::<ConfigMap>::namespaced(admin, "team-a")
        .create(&PostParams::default(), &config_map("later-in-team-a"))
        .await
        .unwrap();
    seen.extend(
        expect_all(
            &mut rx,
            [kube_multicluster::McRequest::new(
                "cluster-0",
                Some("team-a"),
                "later-in-team-a",
            )],
        )
        .await,
    );
    seen.extend(drain_for(&mut rx, std::time::Duration::from_millis(500)).await);
    assert!(
        seen.iter()
            .all(|r| r.namespace.as_deref() == Some("team-a")),
        "nothing from outside team-a: {seen:?}"
    );
}

#[tokio::test]
async fn a_hub_and_spoke_controller_watches_parents_in_the_hub_and_children_in_members() {
    use kube_multicluster::{
        ClusterName, McRequest,
        controller::{ClusterSelector, Watch},
    };

    let env = Envtest::start(3).await.unwrap();
    let hub = env.clusters()[0].client();
    let members = &env.clusters()[1..];
    // A parent in the hub, and a same-named object in each member (which,
    // as a parent, the controller must not see there).
    create_config_map(hub.clone(), "job").await;
    for member in members {
        create_config_map(member.client(), "job").await;
    }

    let fleet = kube_multicluster::Fleet::new();
    let (service, mut rx) = recorder::<ObjectRequest<ConfigMap>>();
    let (children_tx, mut children) = mpsc::unbounded_channel::<ClusterName>();
    // Parents: ConfigMaps in the hub. Children: Secrets in the members,
    // labelled with their parent's name; a child's change asks for its
    // parent in the hub.
    let controller = Controller::<ConfigMap>::new(
        &fleet,
        Watch::default().in_clusters(ClusterSelector::matching(|name| name == "hub")),
    )
    .watches::<k8s_openapi::api::core::v1::Secret, _>(
        Watch::default().in_clusters(ClusterSelector::matching(|name| name != "hub")),
        move |member, secret| {
            let _ = children_tx.send(member.clone());
            let parent = secret.metadata.labels.as_ref()?.get("parent")?.clone();
            Some(McRequest::new("hub", Some("default"), parent))
        },
    );
    let status = controller.status();
    let task = tokio::spawn(controller.run(service));
    fleet.engage("hub", hub.clone());
    for member in members {
        fleet.engage(member.name(), member.client());
    }
    expect_all(&mut rx, [request("hub", "job")]).await;
    tokio::time::timeout(PATIENCE, status.synced())
        .await
        .expect("every watch syncs where it runs");

    // Only the hub runs the parents' watch; only the members the children's.
    let hub_status = status.cluster("hub").unwrap();
    assert_eq!(hub_status.watches.len(), 1, "{hub_status}");
    assert_eq!(hub_status.watches[0].kind, "ConfigMap");
    for member in members {
        let member_status = status.cluster(member.name()).unwrap();
        assert_eq!(member_status.watches.len(), 1, "{member_status}");
        assert_eq!(member_status.watches[0].kind, "Secret");
    }

    // A child in a member reconciles its parent in the hub.
    let mut child = k8s_openapi::api::core::v1::Secret {
        metadata: kube::api::ObjectMeta {
            name: Some("child".into()),
            labels: Some([("parent".to_owned(), "job".to_owned())].into()),
            ..Default::default()
        },
        ..Default::default()
    };
    let _ = drain_for(&mut rx, std::time::Duration::from_millis(300)).await;
    Api::<k8s_openapi::api::core::v1::Secret>::default_namespaced(members[1].client())
        .create(&PostParams::default(), &child)
        .await
        .unwrap();
    expect_all(&mut rx, [request("hub", "job")]).await;
    let seen_in = tokio::time::timeout(PATIENCE, async {
        loop {
            let cluster = children.recv().await.unwrap();
            if cluster == members[1].name() {
                return cluster;
            }
        }
    })
    .await
    .unwrap();
    assert_eq!(seen_in, members[1].name());
    // A Secret in the hub is not watched.
    child.metadata.name = Some("not-a-child".into());
    Api::<k8s_openapi::api::core::v1::Secret>::default_namespaced(hub)
        .create(&PostParams::default(), &child)
        .await
        .unwrap();
    let after = drain_for(&mut rx, std::time::Duration::from_millis(1000)).await;
    assert!(
        after.is_empty(),
        "nothing from the hub's Secrets: {after:?}"
    );
    assert!(
        std::iter::from_fn(|| children.try_recv().ok()).all(|c| c != "hub"),
        "the children's watch does not run in the hub"
    );
    // Every reconcile was of the hub's parent, never of a member's ConfigMap.
    task.abort();
}

#[tokio::test]
async fn requests_naming_objects_the_watch_cannot_hold_are_dropped_not_read_as_deleted() {
    use k8s_openapi::api::core::v1::Secret;
    use kube::Resource;
    use kube_multicluster::{McRequest, controller::Watch};

    let env = Envtest::start(1).await.unwrap();
    let admin = env.clusters()[0].client();
    create_namespace(admin.clone(), "team-a").await;
    let mine = Api::<ConfigMap>::namespaced(admin.clone(), "team-a")
        .create(&PostParams::default(), &config_map("mine"))
        .await
        .unwrap();
    let foreign = create_config_map(admin.clone(), "foreign").await;

    let mut running = Running::new();
    let (tx, mut rx) = mpsc::unbounded_channel::<(McRequest, bool)>();
    let service = tower::service_fn(move |request: ObjectRequest<ConfigMap>| {
        let _ = tx.send((request.request.clone(), request.object.is_some()));
        async { Ok::<_, BoxError>(Action::await_change()) }
    });
    let (outside_tx, outside) = mpsc::unbounded_channel();
    let controller =
        Controller::<ConfigMap>::new(&running.fleet, Watch::default().in_namespace("team-a"))
            .owns::<Secret>(watcher::Config::default())
            .reconcile_on(tokio_stream::wrappers::UnboundedReceiverStream::new(
                outside,
            ));
    let status = controller.status();
    running.spawn(controller, service);
    running.add_all(&env);
    tokio::time::timeout(PATIENCE, status.synced())
        .await
        .unwrap();
    let mut seen = vec![
        tokio::time::timeout(PATIENCE, rx.recv())
            .await
            .expect("the object in team-a is listed")
            .unwrap(),
    ];

    // A Secret in another namespace owned by a ConfigMap there; requests
    // with no namespace, or another one.
    let mut child = Secret::default();
    child.metadata.name = Some("child".into());
    child.metadata.owner_references = Some(vec![foreign.controller_owner_ref(&()).unwrap()]);
    Api::<Secret>::default_namespaced(admin.clone())
        .create(&PostParams::default(), &child)
        .await
        .unwrap();
    outside_tx
        .send(McRequest::new("cluster-0", None::<String>, "mine"))
        .unwrap();
    outside_tx
        .send(McRequest::new("cluster-0", Some("default"), "foreign"))
        .unwrap();
    // Then one that is fine, which must come through.
    outside_tx
        .send(McRequest::new("cluster-0", Some("team-a"), "mine"))
        .unwrap();
    tokio::time::timeout(PATIENCE, async {
        while seen.len() < 2 {
            seen.push(rx.recv().await.unwrap());
        }
    })
    .await
    .expect("the good request runs");
    while let Ok(Some(more)) =
        tokio::time::timeout(std::time::Duration::from_millis(1000), rx.recv()).await
    {
        seen.push(more);
    }
    let mine_key = McRequest::new("cluster-0", Some("team-a"), mine.metadata.name.unwrap());
    assert!(
        seen.iter().all(|(key, exists)| *key == mine_key && *exists),
        "only the object the watch holds, always present: {seen:?}"
    );
}

#[tokio::test]
async fn a_retry_after_a_conflict_gets_the_object_as_the_watch_holds_it_now() {
    use kube_multicluster::layers::recommended::RecommendedLayer;
    use std::sync::Mutex;

    let env = Envtest::start(1).await.unwrap();
    let client = env.clusters()[0].client();
    create_config_map(client.clone(), "contended").await;
    let versions: Arc<Mutex<Vec<String>>> = Arc::default();
    let service = tower::service_fn({
        let versions = versions.clone();
        move |request: ObjectRequest<ConfigMap>| {
            let versions = versions.clone();
            async move {
                let object = request.object.clone().expect("exists");
                let version = object.metadata.resource_version.clone().unwrap();
                let first = {
                    let mut versions = versions.lock().unwrap();
                    versions.push(version.clone());
                    versions.len() == 1
                };
                if !first {
                    return Ok(Action::await_change());
                }
                // Someone else writes first; our write would conflict. Wait
                // until the controller's watch has seen their version.
                let api = Api::<ConfigMap>::default_namespaced(request.cluster.client());
                let change = serde_json::json!({ "data": { "by": "someone else" } });
                api.patch("contended", &PatchParams::default(), &Patch::Merge(&change))
                    .await?;
                let store = request
                    .cluster
                    .cache()
                    .find::<ConfigMap>(&watcher::Config::default())
                    .unwrap()
                    .store();
                let reference = ObjectRef::new("contended").within("default");
                while store
                    .get(&reference)
                    .and_then(|o| o.metadata.resource_version.clone())
                    == Some(version.clone())
                {
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                }
                let conflict = kube::core::Status::failure("conflict", "Conflict")
                    .with_code(409)
                    .boxed();
                Err::<Action, BoxError>(Box::new(kube::Error::Api(conflict)))
            }
        }
    });
    let mut running = Running::new();
    running.spawn(
        Controller::<ConfigMap>::new(&running.fleet, watcher::Config::default())
            .with_filter(|cm| cm.metadata.name.as_deref() == Some("contended")),
        tower::ServiceBuilder::new()
            .layer(RecommendedLayer::new())
            .service(service),
    );
    running.add_all(&env);
    tokio::time::timeout(PATIENCE, async {
        while versions.lock().unwrap().len() < 2 {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the conflict is retried");
    let versions = versions.lock().unwrap().clone();
    assert_ne!(versions[0], versions[1], "the retry read the newer version");
}

#[tokio::test]
async fn a_cluster_with_only_related_watches_takes_no_share_of_the_slots() {
    use k8s_openapi::api::core::v1::Secret;
    use kube_multicluster::{
        McRequest,
        controller::{ClusterSelector, Config, Watch},
    };
    use std::sync::atomic::{AtomicUsize, Ordering};

    let env = Envtest::start(2).await.unwrap();
    let hub = env.clusters()[0].client();
    for i in 0..8 {
        create_config_map(hub.clone(), &format!("job-{i}")).await;
    }
    let (now, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let service = tower::service_fn({
        let (now, most) = (now.clone(), most.clone());
        move |_: ObjectRequest<ConfigMap>| {
            let (now, most) = (now.clone(), most.clone());
            async move {
                let running = now.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(running, Ordering::SeqCst);
                tokio::time::sleep(std::time::Duration::from_millis(1000)).await;
                now.fetch_sub(1, Ordering::SeqCst);
                Ok::<_, BoxError>(Action::await_change())
            }
        }
    });
    let mut running = Running::new();
    let controller = Controller::<ConfigMap>::new(
        &running.fleet,
        Watch::default().in_clusters(ClusterSelector::matching(|name| name == "cluster-0")),
    )
    .watches::<Secret, _>(
        Watch::default().in_clusters(ClusterSelector::matching(|name| name != "cluster-0")),
        |_, _| None::<McRequest>,
    )
    .with_config(Config::default().concurrency(4));
    running.spawn(controller, service);
    // The member first, so that it is known when the hub's keys come.
    running
        .provider
        .engage("cluster-1", env.clusters()[1].client());
    running.wait_served("cluster-1").await;
    running.provider.engage("cluster-0", hub);
    running.wait_served("cluster-0").await;
    tokio::time::sleep(std::time::Duration::from_millis(2500)).await;
    assert_eq!(
        most.load(Ordering::SeqCst),
        4,
        "the hub, the only cluster with work, may use every slot"
    );
}

#[tokio::test]
async fn an_object_recreated_while_the_connection_was_cut_is_reconciled_after_a_relist() {
    let env = Envtest::start(1).await.unwrap();
    let cluster = &env.clusters()[0];
    // The test's own writes go past the fault proxy.
    let direct = kube::Client::try_from(
        kube::Config::from_custom_kubeconfig(cluster.direct_kubeconfig(), &Default::default())
            .await
            .unwrap(),
    )
    .unwrap();
    let first = create_config_map(direct.clone(), "phoenix").await;

    let mut running = Running::new();
    let (tx, mut rx) = mpsc::unbounded_channel::<(String, Option<String>)>();
    let service = tower::service_fn(move |request: ObjectRequest<ConfigMap>| {
        let uid = request.object.as_ref().and_then(|o| o.metadata.uid.clone());
        let _ = tx.send((request.request.name.clone(), uid));
        async { Ok::<_, BoxError>(Action::await_change()) }
    });
    // A predicate that passes each object once: only one remembered by UID
    // lets the recreated object through.
    running.spawn(
        Controller::<ConfigMap>::new(&running.fleet, watcher::Config::default())
            .with_predicate(|_| Some(0)),
        service,
    );
    running.add_all(&env);
    let reconciled_as = |uid: Option<String>| {
        move |(name, seen): &(String, Option<String>)| name == "phoenix" && *seen == uid
    };
    let wait = async |rx: &mut mpsc::UnboundedReceiver<_>, wanted: &dyn Fn(&_) -> bool| {
        tokio::time::timeout(PATIENCE, async {
            loop {
                let seen = rx.recv().await.unwrap();
                if wanted(&seen) {
                    return;
                }
            }
        })
        .await
    };
    wait(&mut rx, &reconciled_as(first.metadata.uid.clone()))
        .await
        .expect("reconciled at start");

    // Cut off, the object is deleted and created again, and the API server
    // restarts: its watch cache starts afresh, so the controller's watch
    // cannot resume where it stopped and must list again.
    cluster.cut_off();
    let api = Api::<ConfigMap>::default_namespaced(direct.clone());
    api.delete("phoenix", &Default::default()).await.unwrap();
    let second = api
        .create(&PostParams::default(), &config_map("phoenix"))
        .await
        .unwrap();
    assert_ne!(first.metadata.uid, second.metadata.uid);
    cluster.stop();
    cluster.restart().await.unwrap();
    let lists_before = all_lists_served(&direct, "configmaps").await;
    cluster.restore();

    wait(&mut rx, &reconciled_as(second.metadata.uid.clone()))
        .await
        .expect("the recreated object is reconciled once the connection is back");
    let lists_after = all_lists_served(&direct, "configmaps").await;
    assert!(
        lists_after > lists_before,
        "the controller listed again ({lists_before} lists before, {lists_after} after)"
    );
}

#[tokio::test]
async fn cached_objects_drop_their_managed_fields_unless_a_watch_keeps_them() {
    use kube_multicluster::controller::Watch;

    let env = Envtest::start(1).await.unwrap();
    let client = env.clusters()[0].client();
    let created = create_config_map(client, "fields").await;
    assert!(
        created.metadata.managed_fields.is_some(),
        "the API server records them"
    );
    let mut running = Running::new();
    let mut seen = Vec::new();
    for watch in [Watch::default(), Watch::default().keep_managed_fields()] {
        let (tx, rx) = mpsc::unbounded_channel();
        let service = tower::service_fn(move |request: ObjectRequest<ConfigMap>| {
            if let Some(object) = &request.object
                && request.request.name == "fields"
            {
                let _ = tx.send(object.metadata.managed_fields.is_some());
            }
            async { Ok::<_, BoxError>(Action::await_change()) }
        });
        running.spawn(Controller::<ConfigMap>::new(&running.fleet, watch), service);
        seen.push(rx);
    }
    running.add_all(&env);
    let mut kept = Vec::new();
    for rx in &mut seen {
        kept.push(
            tokio::time::timeout(PATIENCE, rx.recv())
                .await
                .expect("reconciled")
                .unwrap(),
        );
    }
    assert_eq!(kept, [false, true], "dropped by default, kept when asked");
}

#[tokio::test]
async fn a_controller_can_watch_only_the_metadata_of_its_type() {
    use kube::core::PartialObjectMeta;

    let env = Envtest::start(1).await.unwrap();
    let client = env.clusters()[0].client();
    let mut full = config_map("big");
    full.data = Some([("payload".to_owned(), "x".repeat(10_000))].into());
    Api::<ConfigMap>::default_namespaced(client)
        .create(&PostParams::default(), &full)
        .await
        .unwrap();
    let mut running = Running::new();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let service = tower::service_fn(
        move |request: ObjectRequest<PartialObjectMeta<ConfigMap>>| {
            if let Some(meta) = &request.object {
                let _ = tx.send((meta.metadata.name.clone(), meta.metadata.uid.is_some()));
            }
            async { Ok::<_, BoxError>(Action::await_change()) }
        },
    );
    let controller =
        Controller::<PartialObjectMeta<ConfigMap>>::new(&running.fleet, watcher::Config::default());
    let status = controller.status();
    running.spawn(controller, service);
    running.add_all(&env);
    let seen = tokio::time::timeout(PATIENCE, async {
        loop {
            let (name, has_uid) = rx.recv().await.unwrap();
            if name.as_deref() == Some("big") {
                return has_uid;
            }
        }
    })
    .await
    .expect("reconciled from metadata alone");
    assert!(seen, "the metadata is there");
    let cluster = status.cluster("cluster-0").unwrap();
    assert_eq!(cluster.watches[0].kind, "ConfigMap", "{cluster}");
    assert!(cluster.watches[0].metadata_only, "{cluster}");
}
