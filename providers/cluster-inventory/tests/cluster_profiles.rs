//! `ClusterProfile`s made healthy, rotated, broken and deleted in a hub API
//! server while the fleet runs, engaging workload API servers through an
//! exec credential plugin that prints service account tokens, or through
//! kubeconfig Secrets.

use std::{collections::BTreeMap, os::unix::fs::PermissionsExt, path::Path, time::Duration};

use k8s_openapi::{
    ByteString,
    api::core::v1::{ConfigMap, Secret, ServiceAccount},
};
use kube::{
    Api, CustomResourceExt,
    api::{DeleteParams, ObjectMeta, Patch, PatchParams, PostParams},
    runtime::watcher,
};
use kube_multicluster::{
    Action, Cluster, Controller, Fleet, FleetEvent, McRequest, ObjectRequest, provider::Problems,
};
use kube_multicluster_envtest::{Envtest, TestCluster};
use kube_multicluster_provider_cluster_inventory::{
    AccessConfig, CONSUMER_LABEL, ClusterProfileProvider, EXEC_EXTENSION, PROFILE_LABEL,
    SECRET_KEY, v1alpha1::ClusterProfile,
};
use tokio::sync::mpsc;
use tower::BoxError;

const PATIENCE: Duration = Duration::from_secs(30);
const NS: &str = "default";
const ACCOUNT: &str = "fleet";

/// A plugin that prints the token in `<dir>/<cluster>.token`, `<cluster>`
/// read from the exec extension kube hands it in `KUBERNETES_EXEC_INFO`,
/// valid for 62 s (so kube fetches a new one after 2 s), and notes each
/// run in `<dir>/runs`.
const PLUGIN: &str = r#"#!/bin/sh
dir="$(dirname "$0")"
cluster=$(printf '%s' "$KUBERNETES_EXEC_INFO" | sed -n 's/.*"config":{"cluster":"\([^"]*\)"}.*/\1/p')
echo "$cluster" >> "$dir/runs"
token=$(cat "$dir/$cluster.token") || exit 1
expires=$(date -u -d "@$(( $(date +%s) + 62 ))" +%Y-%m-%dT%H:%M:%SZ)
printf '{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"token":"%s","expirationTimestamp":"%s"}}\n' "$token" "$expires"
"#;

fn script(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path.display().to_string()
}

/// An access configuration of the providers `(name, command)`.
fn access(providers: &[(&str, &str)]) -> AccessConfig {
    let providers: Vec<serde_json::Value> = providers
        .iter()
        .map(|(name, command)| {
            serde_json::json!({
                "name": name,
                "execConfig": {
                    "apiVersion": "client.authentication.k8s.io/v1",
                    "command": command,
                    "provideClusterInfo": true,
                },
            })
        })
        .collect();
    let json = serde_json::json!({ "providers": providers }).to_string();
    AccessConfig::from_json(&json, "test").unwrap()
}

/// A token of the service account `fleet`, made a cluster admin, in
/// `cluster`; the account is made if it is not there.
async fn token(cluster: &TestCluster) -> String {
    cluster.admin_token(ACCOUNT).await.unwrap()
}

/// The endpoint of `cluster` as an access provider `provider` of a profile,
/// with the exec extension naming `cluster_name`.
fn access_provider(
    provider: &str,
    server: &str,
    cluster: &TestCluster,
    cluster_name: &str,
) -> serde_json::Value {
    let entry = cluster.kubeconfig().clusters[0].cluster.clone().unwrap();
    serde_json::json!({
        "name": provider,
        "cluster": {
            "server": server,
            "certificate-authority-data": entry.certificate_authority_data,
            "extensions": [{ "name": EXEC_EXTENSION, "extension": { "cluster": cluster_name } }],
        },
    })
}

fn server(cluster: &TestCluster) -> String {
    cluster.kubeconfig().clusters[0]
        .cluster
        .as_ref()
        .unwrap()
        .server
        .clone()
        .unwrap()
}

fn healthy(status: &str) -> serde_json::Value {
    serde_json::json!([{
        "type": "ControlPlaneHealthy",
        "status": status,
        "reason": "Test",
        "message": "set by the test",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }])
}

async fn create_profile(hub: &TestCluster, name: &str) {
    let profile: ClusterProfile = serde_json::from_value(serde_json::json!({
        "apiVersion": "multicluster.x-k8s.io/v1alpha1",
        "kind": "ClusterProfile",
        "metadata": { "name": name },
        "spec": { "clusterManager": { "name": "test" } },
    }))
    .unwrap();
    Api::<ClusterProfile>::namespaced(hub.client(), NS)
        .create(&PostParams::default(), &profile)
        .await
        .unwrap();
}

/// Merges `status` into the status of the profile `name`.
async fn set_status(hub: &TestCluster, name: &str, status: serde_json::Value) {
    Api::<ClusterProfile>::namespaced(hub.client(), NS)
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "status": status })),
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

struct Running {
    fleet: Fleet,
    /// Each reconcile, with the engagement of its cluster it ran against.
    reconciles: mpsc::UnboundedReceiver<(McRequest, Cluster)>,
    problems: Problems,
    events: mpsc::UnboundedReceiver<FleetEvent>,
}

fn run(provider: ClusterProfileProvider) -> Running {
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
    /// Waits until each of `names` in `cluster` is reconciled, in any order,
    /// by the engagement of `cluster` that is current when it is read.
    async fn reconciled(&mut self, cluster: &str, names: &[&str]) {
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

    /// The next fleet event, as `+name` (engaged) or `-name` (disengaged).
    async fn event(&mut self) -> String {
        let event = tokio::time::timeout(PATIENCE, self.events.recv())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "no fleet event within {PATIENCE:?}; problems: {:?}",
                    self.problems.current()
                )
            })
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

fn runs(dir: &Path, cluster: &str) -> usize {
    std::fs::read_to_string(dir.join("runs"))
        .unwrap_or_default()
        .lines()
        .filter(|line| *line == cluster)
        .count()
}

#[tokio::test]
async fn healthy_profiles_engage_through_the_plugin_which_refreshes_tokens_and_follow_their_endpoint()
 {
    let env = Envtest::start(3).await.unwrap();
    let (hub, one, two) = (&env.clusters()[0], &env.clusters()[1], &env.clusters()[2]);
    hub.install_crds([ClusterProfile::crd()]).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let plugin = script(dir.path(), "plugin", PLUGIN);
    std::fs::write(dir.path().join("one.token"), token(one).await).unwrap();
    std::fs::write(dir.path().join("two.token"), token(two).await).unwrap();
    create_config_map(one, "on-one").await;
    create_config_map(two, "on-two").await;
    create_profile(hub, "one").await;
    set_status(
        hub,
        "one",
        serde_json::json!({
            "conditions": healthy("True"),
            "accessProviders": [access_provider("envtest", &server(one), one, "one")],
        }),
    )
    .await;
    create_profile(hub, "two").await;
    set_status(
        hub,
        "two",
        serde_json::json!({
            "accessProviders": [access_provider("envtest", &server(two), two, "two")],
        }),
    )
    .await;

    let mut running = run(ClusterProfileProvider::new(
        hub.client(),
        access(&[("envtest", &plugin)]),
    ));
    assert_eq!(running.event().await, "+default/one");
    running.reconciled("default/one", &["on-one"]).await;
    // The plugin was told which cluster it is for.
    assert!(runs(dir.path(), "one") >= 1);
    // Not healthy: not engaged, and no problem.
    running.quiet().await;
    assert!(
        running.problems.current().is_empty(),
        "{:?}",
        running.problems.current()
    );
    set_status(
        hub,
        "two",
        serde_json::json!({ "conditions": healthy("Unknown") }),
    )
    .await;
    running.quiet().await;
    set_status(
        hub,
        "two",
        serde_json::json!({ "conditions": healthy("True") }),
    )
    .await;
    assert_eq!(running.event().await, "+default/two");
    running.reconciled("default/two", &["on-two"]).await;

    // A new token: the old one is revoked (its account deleted), the plugin
    // prints the new one. The plugin runs again before the token expires
    // (in the background, as a request finds less than a minute left), so
    // the cluster keeps working without being engaged again.
    let before = runs(dir.path(), "one");
    create_config_map(one, "before-rotation").await;
    Api::<ServiceAccount>::namespaced(one.client(), NS)
        .delete(ACCOUNT, &DeleteParams::default())
        .await
        .unwrap();
    create_config_map(one, "during-rotation").await;
    std::fs::write(dir.path().join("one.token"), token(one).await).unwrap();
    create_config_map(one, "after-rotation").await;
    running
        .reconciled(
            "default/one",
            &["before-rotation", "during-rotation", "after-rotation"],
        )
        .await;
    let cluster = running.fleet.get("default/one").unwrap();
    tokio::time::timeout(PATIENCE, async {
        // New requests, which the revoked token could not make, until the
        // plugin has run again.
        loop {
            let listed = Api::<ConfigMap>::namespaced(cluster.client(), NS)
                .list(&Default::default())
                .await;
            if listed.is_ok() && runs(dir.path(), "one") > before {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await
    .expect("the plugin run again, and requests with the new token");
    running.quiet().await;

    // The profile moves to another endpoint (a link to the same server):
    // engaged again, through it, and objects changed meanwhile reconciled.
    let link = one.link().unwrap();
    let linked = link.kubeconfig().clusters[0]
        .cluster
        .clone()
        .unwrap()
        .server
        .unwrap();
    set_status(
        hub,
        "one",
        serde_json::json!({
            "accessProviders": [access_provider("envtest", &linked, one, "one")],
        }),
    )
    .await;
    create_config_map(one, "while-moving").await;
    assert_eq!(running.event().await, "+default/one");
    running
        .reconciled("default/one", &["on-one", "while-moving", "after-rotation"])
        .await;
    assert!(link.connections_made() > 0, "the new endpoint was not used");
    // Its conditions or properties changing does not engage it again.
    set_status(
        hub,
        "one",
        serde_json::json!({
            "properties": [{ "name": "region", "value": "eu" }],
        }),
    )
    .await;
    running.quiet().await;

    // Unhealthy: disengaged. Deleted: disengaged.
    set_status(
        hub,
        "one",
        serde_json::json!({ "conditions": healthy("False") }),
    )
    .await;
    assert_eq!(running.event().await, "-default/one");
    Api::<ClusterProfile>::namespaced(hub.client(), NS)
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
async fn a_failing_hung_or_garbage_plugin_or_an_unknown_provider_is_reported_by_profile() {
    let env = Envtest::start(2).await.unwrap();
    let (hub, good) = (&env.clusters()[0], &env.clusters()[1]);
    hub.install_crds([ClusterProfile::crd()]).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let plugin = script(dir.path(), "plugin", PLUGIN);
    let failing = script(
        dir.path(),
        "failing",
        "#!/bin/sh\necho 'password=hunter2' >&2\nexit 3\n",
    );
    let garbage = script(dir.path(), "garbage", "#!/bin/sh\necho 'token: [hunter2'\n");
    let finished = dir.path().join("hung-finished");
    let hung = script(
        dir.path(),
        "hung",
        &format!(
            "#!/bin/sh\nsleep 6\ntouch '{}'\nexit 1\n",
            finished.display()
        ),
    );
    std::fs::write(dir.path().join("good.token"), token(good).await).unwrap();
    create_config_map(good, "on-good").await;
    for (profile, provider) in [
        ("hung", "hung"),
        ("failing", "failing"),
        ("garbage", "garbage"),
        ("unknown", "nobody"),
        ("good", "envtest"),
    ] {
        create_profile(hub, profile).await;
        set_status(
            hub,
            profile,
            serde_json::json!({
                "conditions": healthy("True"),
                "accessProviders": [access_provider(provider, &server(good), good, "good")],
            }),
        )
        .await;
    }

    let access = access(&[
        ("hung", &hung),
        ("failing", &failing),
        ("garbage", &garbage),
        ("envtest", &plugin),
    ]);
    let mut running = run(ClusterProfileProvider::new(hub.client(), access));
    assert_eq!(running.event().await, "+default/good");
    assert!(
        !finished.exists(),
        "the good profile waited for the hung plugin"
    );
    running.reconciled("default/good", &["on-good"]).await;
    for name in ["failing", "garbage", "hung"] {
        let problem = running
            .problem(&format!("ClusterProfile default/{name}"))
            .await;
        assert!(
            problem.contains("credentials could not be obtained"),
            "{name}: {problem}"
        );
        assert!(problem.contains("tried again every"), "{name}: {problem}");
        assert!(!problem.contains("hunter2"), "{name}: {problem}");
    }
    let unknown = running.problem("ClusterProfile default/unknown").await;
    assert!(
        unknown.contains("it lists: nobody; configured: hung, failing, garbage, envtest"),
        "{unknown}"
    );
    running.quiet().await;
    assert_eq!(running.fleet.clusters().len(), 1);

    // Deleted: its problem goes with it.
    Api::<ClusterProfile>::namespaced(hub.client(), NS)
        .delete("unknown", &DeleteParams::default())
        .await
        .unwrap();
    tokio::time::timeout(
        PATIENCE,
        running
            .problems
            .wait_for(|set| !set.contains_key("ClusterProfile default/unknown")),
    )
    .await
    .unwrap();
}

async fn put_secret(hub: &TestCluster, name: &str, profile: &str, value: &str) {
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some(BTreeMap::from([
                (CONSUMER_LABEL.to_owned(), "fleet-test".to_owned()),
                (PROFILE_LABEL.to_owned(), profile.to_owned()),
            ])),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([(
            SECRET_KEY.to_owned(),
            ByteString(value.as_bytes().to_vec()),
        )])),
        ..Secret::default()
    };
    Api::<Secret>::namespaced(hub.client(), NS)
        .patch(
            name,
            &PatchParams::apply("test").force(),
            &Patch::Apply(&secret),
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn with_secrets_the_one_labelled_for_the_consumer_and_profile_gives_the_cluster() {
    let env = Envtest::start(3).await.unwrap();
    let (hub, one, two) = (&env.clusters()[0], &env.clusters()[1], &env.clusters()[2]);
    hub.install_crds([ClusterProfile::crd()]).await.unwrap();
    create_config_map(one, "on-one").await;
    create_config_map(two, "on-two").await;
    create_profile(hub, "edge").await;
    set_status(
        hub,
        "edge",
        serde_json::json!({ "conditions": healthy("True") }),
    )
    .await;
    let text = |cluster: &TestCluster| serde_json::to_string(cluster.kubeconfig()).unwrap();
    put_secret(hub, "edge-credentials", "edge", &text(one)).await;

    let mut running = run(ClusterProfileProvider::from_secrets(
        hub.client(),
        "fleet-test",
    ));
    assert_eq!(running.event().await, "+default/edge");
    running.reconciled("default/edge", &["on-one"]).await;

    // A new kubeconfig in the Secret: engaged again, with it.
    put_secret(hub, "edge-credentials", "edge", &text(two)).await;
    assert_eq!(running.event().await, "+default/edge");
    running.reconciled("default/edge", &["on-two"]).await;

    // Two Secrets for one profile: which is meant is not known.
    put_secret(hub, "edge-other", "edge", &text(one)).await;
    assert_eq!(running.event().await, "-default/edge");
    let problem = running.problem("ClusterProfile default/edge").await;
    assert!(
        problem.contains("2 Secrets") && problem.contains("edge-other"),
        "{problem}"
    );
    let secrets = Api::<Secret>::namespaced(hub.client(), NS);
    secrets
        .delete("edge-other", &DeleteParams::default())
        .await
        .unwrap();
    assert_eq!(running.event().await, "+default/edge");

    // No Secret: disengaged and reported.
    secrets
        .delete("edge-credentials", &DeleteParams::default())
        .await
        .unwrap();
    assert_eq!(running.event().await, "-default/edge");
    let problem = running.problem("ClusterProfile default/edge").await;
    assert!(
        problem.contains("no Secret in its namespace is labelled"),
        "{problem}"
    );
}
