//! Cluster API `Cluster`s and their kubeconfig Secrets created, made ready,
//! rotated, broken and deleted in a management API server while the fleet
//! runs, engaging workload API servers.

use std::{collections::BTreeMap, time::Duration};

use k8s_openapi::{
    ByteString,
    api::core::v1::{ConfigMap, Secret},
};
use kube::{
    Api, CustomResourceExt,
    api::{DeleteParams, ObjectMeta, Patch, PatchParams, PostParams},
    config::Kubeconfig,
    runtime::watcher,
};
use kube_multicluster::{
    Action, Cluster, Controller, Fleet, FleetEvent, McRequest, ObjectRequest, provider::Problems,
};
use kube_multicluster_envtest::{Envtest, TestCluster};
use kube_multicluster_provider_cluster_api::{
    CLUSTER_NAME_LABEL, ClusterApiProvider, ClusterObject, KUBECONFIG_KEY, v1beta1, v1beta2,
};
use serde::Serialize;
use tokio::sync::mpsc;
use tower::BoxError;

const PATIENCE: Duration = Duration::from_secs(30);
const NS: &str = "default";

fn text(kubeconfig: &Kubeconfig) -> String {
    serde_json::to_string(kubeconfig).unwrap()
}

/// Creates or replaces the kubeconfig Secret of the cluster `cluster`.
async fn put_secret(hub: &TestCluster, cluster: &str, value: Option<&str>) {
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(format!("{cluster}-kubeconfig")),
            labels: Some(BTreeMap::from([(
                CLUSTER_NAME_LABEL.to_owned(),
                cluster.to_owned(),
            )])),
            ..ObjectMeta::default()
        },
        type_: Some("cluster.x-k8s.io/secret".to_owned()),
        data: Some(
            value
                .map(|v| (KUBECONFIG_KEY.to_owned(), ByteString(v.as_bytes().to_vec())))
                .into_iter()
                .collect(),
        ),
        ..Secret::default()
    };
    Api::<Secret>::namespaced(hub.client(), NS)
        .patch(
            &format!("{cluster}-kubeconfig"),
            &PatchParams::apply("test").force(),
            &Patch::Apply(&secret),
        )
        .await
        .unwrap();
}

async fn create_config_map(cluster: &TestCluster, name: &str) {
    let config_map = ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    };
    Api::<ConfigMap>::namespaced(cluster.client(), NS)
        .create(&PostParams::default(), &config_map)
        .await
        .unwrap();
}

/// Creates the `Cluster` `name` of type `K`, with no status.
async fn create_cluster<K>(hub: &TestCluster, name: &str, spec: serde_json::Value)
where
    K: ClusterObject + Serialize,
{
    let object: K = serde_json::from_value(serde_json::json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "metadata": { "name": name },
        "spec": spec,
    }))
    .unwrap();
    Api::<K>::namespaced(hub.client(), NS)
        .create(&PostParams::default(), &object)
        .await
        .unwrap();
}

/// Merges `status` into the status of the `Cluster` `name`.
async fn set_status<K>(hub: &TestCluster, name: &str, status: serde_json::Value)
where
    K: ClusterObject,
{
    Api::<K>::namespaced(hub.client(), NS)
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "status": status })),
        )
        .await
        .unwrap();
}

fn initialized() -> serde_json::Value {
    serde_json::json!({ "initialization": { "controlPlaneInitialized": true } })
}

struct Running {
    fleet: Fleet,
    /// Each reconcile, with the engagement of its cluster it ran against.
    reconciles: mpsc::UnboundedReceiver<(McRequest, Cluster)>,
    problems: Problems,
    events: mpsc::UnboundedReceiver<FleetEvent>,
}

fn run<K: ClusterObject>(provider: ClusterApiProvider<K>) -> Running {
    let problems = provider.problems();
    let fleet = Fleet::new();
    let events = fleet.subscribe().events;
    let (tx, reconciles) = mpsc::unbounded_channel();
    let controller = Controller::<ConfigMap>::new(&fleet, watcher::Config::default());
    tokio::spawn(controller.run(tower::service_fn(
        move |request: ObjectRequest<ConfigMap>| {
            // Sent as the reconcile is called, not in the future: a handle
            // of a replaced engagement (which holds its client) is read
            // before any of its successor's, so none outlives the waits.
            let _ = tx.send((request.request, request.cluster));
            async { Ok::<_, BoxError>(Action::await_change()) }
        },
    )));
    tokio::spawn({
        let fleet = fleet.clone();
        async move { fleet.run(provider).await }
    });
    Running {
        fleet,
        reconciles,
        problems,
        events,
    }
}

impl Running {
    async fn reconciled(&mut self, cluster: &str, name: &str) {
        self.reconciled_all(cluster, &[name]).await;
    }

    /// Waits until each of `names` in `cluster` is reconciled, in any order,
    /// by the engagement of `cluster` that is current when it is read.
    async fn reconciled_all(&mut self, cluster: &str, names: &[&str]) {
        let mut left: Vec<&str> = names.to_vec();
        tokio::time::timeout(PATIENCE, async {
            while let Some((request, ran_against)) = self.reconciles.recv().await {
                // One that ran against an engagement replaced since is not
                // counted: what is awaited is reconciled by the current one.
                if request.cluster.as_ref() == cluster && ran_against.is_engaged() {
                    left.retain(|name| *name != request.name);
                }
                if left.is_empty() {
                    return;
                }
            }
        })
        .await
        .unwrap_or_else(|_| {
            panic!("{cluster}: {left:?} of {names:?} not reconciled within {PATIENCE:?}")
        });
    }

    /// Waits for the next fleet event, and gives it as `+name` (engaged)
    /// or `-name` (disengaged).
    async fn event(&mut self) -> String {
        let event = tokio::time::timeout(PATIENCE, self.events.recv())
            .await
            .unwrap_or_else(|_| panic!("no fleet event within {PATIENCE:?}"))
            .unwrap();
        match event {
            FleetEvent::Engaged(cluster) => format!("+{}", cluster.name()),
            FleetEvent::Disengaged(name) => format!("-{name}"),
        }
    }

    /// No fleet event for a while.
    async fn quiet(&mut self) {
        let event = tokio::time::timeout(Duration::from_secs(2), self.events.recv()).await;
        assert!(
            event.is_err(),
            "unexpected fleet event {:?}",
            event.unwrap()
        );
    }

    async fn problem(&self, source: &str) -> String {
        tokio::time::timeout(
            PATIENCE,
            self.problems.wait_for(|set| set.contains_key(source)),
        )
        .await
        .unwrap_or_else(|_| panic!("no problem of {source} in {:?}", self.problems.current()))
        .remove(source)
        .unwrap()
    }
}

#[tokio::test]
async fn a_cluster_engages_once_initialized_re_engages_on_a_new_kubeconfig_and_leaves_when_deleted()
{
    let env = Envtest::start(3).await.unwrap();
    let (hub, one, two) = (&env.clusters()[0], &env.clusters()[1], &env.clusters()[2]);
    hub.install_crds([v1beta2::Cluster::crd()]).await.unwrap();
    create_config_map(one, "on-one").await;
    create_config_map(two, "on-two").await;
    // The first kubeconfig of `one` reaches it through a link that counts
    // its connections.
    let old = one.link().unwrap();
    create_cluster::<v1beta2::Cluster>(hub, "one", serde_json::json!({ "paused": false })).await;
    put_secret(hub, "one", Some(&text(old.kubeconfig()))).await;
    create_cluster::<v1beta2::Cluster>(hub, "two", serde_json::json!({})).await;
    set_status::<v1beta2::Cluster>(hub, "two", initialized()).await;
    put_secret(hub, "two", Some(&text(two.kubeconfig()))).await;

    let mut running = run(ClusterApiProvider::new(hub.client()));
    assert_eq!(running.event().await, "+default/two");
    running.reconciled("default/two", "on-two").await;
    // Not initialized: not engaged, and no problem either.
    running.quiet().await;
    assert!(running.fleet.get("default/one").is_none());
    assert!(
        running.problems.current().is_empty(),
        "{:?}",
        running.problems.current()
    );

    // Its status says so: engaged.
    set_status::<v1beta2::Cluster>(
        hub,
        "one",
        serde_json::json!({ "initialization": { "infrastructureProvisioned": true } }),
    )
    .await;
    running.quiet().await;
    set_status::<v1beta2::Cluster>(hub, "one", initialized()).await;
    assert_eq!(running.event().await, "+default/one");
    running.reconciled("default/one", "on-one").await;

    // A new kubeconfig (another user's certificate) while objects change:
    // engaged again, every object changed meanwhile reconciled afterwards,
    // and the old kubeconfig's connections closed and not used again.
    create_config_map(one, "before-rotation").await;
    let rotated = one
        .kubeconfig_for("rotated-admin", &["system:masters"])
        .unwrap();
    put_secret(hub, "one", Some(&text(&rotated))).await;
    create_config_map(one, "during-rotation").await;
    assert_eq!(running.event().await, "+default/one");
    create_config_map(one, "after-rotation").await;
    running
        .reconciled_all(
            "default/one",
            &[
                "on-one",
                "before-rotation",
                "during-rotation",
                "after-rotation",
            ],
        )
        .await;
    tokio::time::timeout(PATIENCE, async {
        while old.open_connections() > 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the old kubeconfig's connections closed");
    let made = old.connections_made();
    create_config_map(one, "later").await;
    running.reconciled("default/one", "later").await;
    assert_eq!(old.connections_made(), made, "the old kubeconfig was used");

    // The Secret deleted: disengaged, and reported; written again: engaged.
    Api::<Secret>::namespaced(hub.client(), NS)
        .delete("one-kubeconfig", &DeleteParams::default())
        .await
        .unwrap();
    assert_eq!(running.event().await, "-default/one");
    let problem = running.problem("Cluster default/one").await;
    assert!(
        problem.contains("Secret default/one-kubeconfig is not there"),
        "{problem}"
    );
    put_secret(hub, "one", Some(&text(one.kubeconfig()))).await;
    assert_eq!(running.event().await, "+default/one");
    assert_eq!(running.problems.get("Cluster default/one"), None);

    // A Cluster given a deletion timestamp (it has a finalizer) leaves at
    // once; one deleted outright too.
    let clusters = Api::<v1beta2::Cluster>::namespaced(hub.client(), NS);
    clusters
        .patch(
            "one",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "metadata": { "finalizers": ["test/hold"] } })),
        )
        .await
        .unwrap();
    clusters
        .delete("one", &DeleteParams::default())
        .await
        .unwrap();
    assert_eq!(running.event().await, "-default/one");
    clusters
        .delete("two", &DeleteParams::default())
        .await
        .unwrap();
    assert_eq!(running.event().await, "-default/two");
    assert!(running.fleet.clusters().is_empty());
    assert!(
        running.problems.current().is_empty(),
        "{:?}",
        running.problems.current()
    );
}

#[tokio::test]
async fn a_broken_kubeconfig_is_reported_by_cluster_and_the_others_keep_working() {
    let env = Envtest::start(2).await.unwrap();
    let (hub, good) = (&env.clusters()[0], &env.clusters()[1]);
    hub.install_crds([v1beta2::Cluster::crd()]).await.unwrap();
    create_config_map(good, "on-good").await;
    for name in ["good", "garbage", "refused", "empty", "unlabelled"] {
        create_cluster::<v1beta2::Cluster>(hub, name, serde_json::json!({})).await;
        set_status::<v1beta2::Cluster>(hub, name, initialized()).await;
    }
    put_secret(hub, "good", Some(&text(good.kubeconfig()))).await;
    put_secret(hub, "garbage", Some("{ not: [a kubeconfig")).await;
    let mut insecure = good.kubeconfig().clone();
    insecure.clusters[0]
        .cluster
        .as_mut()
        .unwrap()
        .insecure_skip_tls_verify = Some(true);
    put_secret(hub, "refused", Some(&text(&insecure))).await;
    put_secret(hub, "empty", None).await;
    // A Secret of the right name without Cluster API's label is not read.
    let unlabelled = Secret {
        metadata: ObjectMeta {
            name: Some("unlabelled-kubeconfig".to_owned()),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([(
            KUBECONFIG_KEY.to_owned(),
            ByteString(text(good.kubeconfig()).into_bytes()),
        )])),
        ..Secret::default()
    };
    Api::<Secret>::namespaced(hub.client(), NS)
        .create(&PostParams::default(), &unlabelled)
        .await
        .unwrap();

    let mut running = run(ClusterApiProvider::new(hub.client()));
    assert_eq!(running.event().await, "+default/good");
    running.reconciled("default/good", "on-good").await;
    let garbage = running.problem("Cluster default/garbage").await;
    assert!(
        garbage.contains("Secret default/garbage-kubeconfig")
            && garbage.contains("not a kubeconfig"),
        "{garbage}"
    );
    let refused = running.problem("Cluster default/refused").await;
    assert!(refused.contains("insecure-skip-tls-verify"), "{refused}");
    let empty = running.problem("Cluster default/empty").await;
    assert!(empty.contains("has no key \"value\""), "{empty}");
    let unlabelled = running.problem("Cluster default/unlabelled").await;
    assert!(unlabelled.contains(CLUSTER_NAME_LABEL), "{unlabelled}");
    running.quiet().await;
    assert_eq!(running.fleet.clusters().len(), 1);

    // Fixed: engaged, and the problem gone.
    put_secret(hub, "garbage", Some(&text(good.kubeconfig()))).await;
    assert_eq!(running.event().await, "+default/garbage");
    assert_eq!(running.problems.get("Cluster default/garbage"), None);
    running.reconciled("default/garbage", "on-good").await;
}

#[tokio::test]
async fn v1beta1_clusters_are_read_by_control_plane_ready_or_by_a_test_of_ones_own() {
    let env = Envtest::start(2).await.unwrap();
    let (hub, workload) = (&env.clusters()[0], &env.clusters()[1]);
    hub.install_crds([v1beta1::Cluster::crd()]).await.unwrap();
    create_config_map(workload, "on-workload").await;
    for name in ["ready", "provisioned"] {
        create_cluster::<v1beta1::Cluster>(hub, name, serde_json::json!({})).await;
        put_secret(hub, name, Some(&text(workload.kubeconfig()))).await;
    }

    // The default test: `status.controlPlaneReady`.
    let mut running = run(ClusterApiProvider::v1beta1(hub.client()));
    running.quiet().await;
    set_status::<v1beta1::Cluster>(
        hub,
        "provisioned",
        serde_json::json!({ "phase": "Provisioned" }),
    )
    .await;
    running.quiet().await;
    set_status::<v1beta1::Cluster>(
        hub,
        "ready",
        serde_json::json!({ "controlPlaneReady": true }),
    )
    .await;
    assert_eq!(running.event().await, "+default/ready");
    running.reconciled("default/ready", "on-workload").await;

    // A test of one's own: the phase. A cluster that stops passing it is
    // disengaged.
    let mut by_phase = run(ClusterApiProvider::v1beta1(hub.client()).ready(|cluster| {
        cluster.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Provisioned")
    }));
    assert_eq!(by_phase.event().await, "+default/provisioned");
    by_phase.quiet().await;
    set_status::<v1beta1::Cluster>(
        hub,
        "provisioned",
        serde_json::json!({ "phase": "Deleting" }),
    )
    .await;
    assert_eq!(by_phase.event().await, "-default/provisioned");
}

#[tokio::test]
async fn a_key_removed_while_its_rotation_is_built_leaves_the_rotation_unengaged() {
    let env = Envtest::start(2).await.unwrap();
    let (hub, one) = (&env.clusters()[0], &env.clusters()[1]);
    hub.install_crds([v1beta2::Cluster::crd()]).await.unwrap();
    create_config_map(one, "on-one").await;
    create_cluster::<v1beta2::Cluster>(hub, "one", serde_json::json!({})).await;
    set_status::<v1beta2::Cluster>(hub, "one", initialized()).await;
    put_secret(hub, "one", Some(&text(one.kubeconfig()))).await;
    let provider = ClusterApiProvider::new(hub.client())
        .policy(kube_multicluster::provider::kubeconfig::KubeconfigPolicy::default().allow_exec());
    let mut running = run(provider);
    assert_eq!(running.event().await, "+default/one");
    running.reconciled("default/one", "on-one").await;
    let engaged = running.fleet.get("default/one").unwrap();

    // Rotated to credentials from a plugin that takes a while, then the key
    // is removed before the plugin has answered.
    let dir = std::env::temp_dir().join(format!("capi-revoked-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let answered = dir.join("answered");
    let rotated = one
        .exec_kubeconfig(&format!("sleep 2; touch '{}'", answered.display()))
        .unwrap();
    put_secret(hub, "one", Some(&text(&rotated))).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    put_secret(hub, "one", None).await;
    let problem = running.problem("Cluster default/one").await;
    assert!(problem.contains("has no key"), "{problem}");

    // The plugin answers; its credentials are never engaged.
    tokio::time::timeout(PATIENCE, async {
        while !answered.exists() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the plugin answered");
    // Kube may run it once more for the build.
    tokio::time::sleep(Duration::from_secs(3)).await;
    running.quiet().await;
    assert!(
        engaged.is_engaged(),
        "the cluster engaged before was replaced"
    );
    let problem = running.problems.get("Cluster default/one");
    assert!(
        problem.as_deref().is_some_and(|p| p.contains("has no key")),
        "{problem:?}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
