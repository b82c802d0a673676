//! The ClusterRoles a manager prints are what its controllers need, on real
//! API servers with RBAC on: an operator bound to them works in every
//! cluster, and one that lacks a rule in one cluster fails there alone,
//! saying which cluster, which resource and which verb.
//!
//! The operator labels every ConfigMap it sees, in every cluster, and
//! watches Secrets in the local cluster only. The API server `cluster-0` is
//! engaged as the local cluster and bound to the local role; `cluster-1` is
//! engaged as `member` and bound to the member role. Both are reached as the
//! user `operator`, which may do nothing else.

mod support;

use std::sync::{Arc, Mutex};

use k8s_openapi::api::{
    core::v1::{ConfigMap, Secret},
    rbac::v1::{ClusterRole, ClusterRoleBinding, RoleRef, Subject},
};
use kube::{
    Api,
    api::{ObjectMeta, Patch, PatchParams, PostParams},
    runtime::watcher,
};
use kube_multicluster::{
    Action, ClusterName, Controller, Fleet, ObjectRequest,
    controller::{ClusterSelector, ControllerStatus, Watch},
    rbac::{Permissions, Rule, Scope},
};
use kube_multicluster_envtest::{Envtest, TestCluster};
use kube_multicluster_manager::{Error, Manager};
use support::PATIENCE;
use tokio::{sync::oneshot, task::JoinHandle, time::Instant};
use tower::{BoxError, service_fn};

const USER: &str = "operator";
const LOCAL_ROLE: &str = "operator";
const MEMBER_ROLE: &str = "operator-member";
const MEMBER: &str = "member";
const LABEL: &str = "rbac-test";

/// A running operator, and the failed reconciles it reported.
struct Operator {
    fleet: Fleet,
    status: ControllerStatus,
    permissions: Permissions,
    /// `request: error` for every reconcile that failed.
    errors: Arc<Mutex<Vec<String>>>,
    stop: Option<oneshot::Sender<()>>,
    run: JoinHandle<Result<(), Error>>,
}

impl Operator {
    /// Prints the operator's roles, grants them to `operator` in `local`
    /// and `member`, and starts it there; returns once it has labelled a
    /// ConfigMap in each.
    async fn bound_to_its_roles(local: &TestCluster, member: &TestCluster) -> Self {
        let fleet = Fleet::new();
        let errors = Arc::new(Mutex::new(Vec::new()));
        let (manager, status) = manager(&fleet, &errors);
        let permissions = manager.permissions();

        // What it prints is what it needs, and valid YAML for kubectl.
        let read = ["get", "list", "watch"];
        // With the fleet's identity reads, to find one cluster under two
        // names.
        let identity = |rules: &[Rule]| {
            let mut rules = rules.to_vec();
            rules.push(Rule::new("", "namespaces", ["get"]));
            rules.push(Rule::new("about.k8s.io", "clusterproperties", ["get"]));
            rules.sort_by(|a, b| (&a.api_groups, &a.resources).cmp(&(&b.api_groups, &b.resources)));
            rules
        };
        assert_eq!(
            permissions.rules(Scope::Local),
            identity(&[
                Rule::new("", "configmaps", ["get", "list", "patch", "watch"]),
                Rule::new("", "secrets", read),
            ])
        );
        assert_eq!(
            permissions.rules(Scope::Members),
            identity(&[Rule::new(
                "",
                "configmaps",
                ["get", "list", "patch", "watch"]
            )])
        );
        let printed: Vec<ClusterRole> =
            serde_saphyr::from_multiple(&manager.rbac_yaml(LOCAL_ROLE)).expect("valid YAML");
        let local_role = permissions.cluster_role(LOCAL_ROLE, Scope::Local);
        let member_role = permissions.cluster_role(MEMBER_ROLE, Scope::Members);
        assert_eq!(printed, [local_role.clone(), member_role.clone()]);

        bind(local, local_role).await;
        bind(member, member_role).await;
        for cluster in [local, member] {
            labelled_config_map(cluster, "first").await;
        }
        fleet.engage(ClusterName::local(), operator_client(local));
        fleet.engage(MEMBER, operator_client(member));
        let (stop, stopped) = oneshot::channel::<()>();
        let run = tokio::spawn(
            manager
                .graceful_shutdown_on(async move {
                    let _ = stopped.await;
                })
                .run(),
        );
        for cluster in [local, member] {
            patched(cluster, "first").await;
        }
        Self {
            fleet,
            status,
            permissions,
            errors,
            stop: Some(stop),
            run,
        }
    }

    /// The failed reconciles of requests that start with `prefix`.
    fn errors_of(&self, prefix: &str) -> Vec<String> {
        let errors = self.errors.lock().unwrap();
        errors
            .iter()
            .filter(|e| e.starts_with(prefix))
            .cloned()
            .collect()
    }

    /// Stops the operator gracefully, as it would stop in production.
    async fn stop(mut self) {
        let _ = self.stop.take().expect("running").send(());
        let ended = tokio::time::timeout(PATIENCE, &mut self.run).await;
        assert!(
            matches!(ended, Ok(Ok(Ok(())))),
            "the operator stops cleanly: {ended:?}"
        );
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        self.run.abort();
    }
}

/// The operator's manager, not running yet, and its controller's status:
/// a controller of the ConfigMaps labelled `LABEL` that patches a label
/// onto each, and also watches the local cluster's Secrets.
fn manager(fleet: &Fleet, errors: &Arc<Mutex<Vec<String>>>) -> (Manager, ControllerStatus) {
    let errors = errors.clone();
    let controller = Controller::<ConfigMap>::new(
        fleet,
        watcher::Config::default().labels(&format!("{LABEL}=true")),
    )
    .watches::<Secret, _>(
        Watch::default().in_clusters(ClusterSelector::Local),
        |_, _| None,
    )
    .writes::<ConfigMap>(&["patch"])
    .error_policy(move |request, error| {
        errors.lock().unwrap().push(format!("{request}: {error}"));
        None
    });
    let status = controller.status();
    let labeller = service_fn(|request: ObjectRequest<ConfigMap>| async move {
        if request.object.is_some() {
            let api = Api::<ConfigMap>::namespaced(request.cluster.client(), "default");
            let label = serde_json::json!({ "metadata": { "labels": { "patched": "true" } } });
            api.patch(
                &request.request.name,
                &PatchParams::default(),
                &Patch::Merge(label),
            )
            .await?;
        }
        Ok::<_, BoxError>(Action::await_change())
    });
    (Manager::new(fleet).controller(controller, labeller), status)
}

/// A client of `cluster` for the user `operator`, in no group.
fn operator_client(cluster: &TestCluster) -> kube::Client {
    cluster
        .client_for(USER, &[])
        .expect("a client for the operator")
}

/// Creates `role` in `cluster` and binds it to the user `operator`.
async fn bind(cluster: &TestCluster, role: ClusterRole) {
    let name = role.metadata.name.clone().expect("a named role");
    Api::<ClusterRole>::all(cluster.client())
        .create(&PostParams::default(), &role)
        .await
        .expect("the ClusterRole");
    let binding = ClusterRoleBinding {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            ..ObjectMeta::default()
        },
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "ClusterRole".into(),
            name,
        },
        subjects: Some(vec![Subject {
            kind: "User".into(),
            name: USER.into(),
            api_group: Some("rbac.authorization.k8s.io".into()),
            ..Subject::default()
        }]),
    };
    Api::<ClusterRoleBinding>::all(cluster.client())
        .create(&PostParams::default(), &binding)
        .await
        .expect("the ClusterRoleBinding");
}

/// Replaces the member role in `cluster` with `permissions`' member rules
/// less `verb` on ConfigMaps.
async fn revoke(cluster: &TestCluster, permissions: &Permissions, verb: &str) {
    let mut fewer = permissions.clone();
    for rule in &mut fewer.members {
        if rule.resources == ["configmaps"] {
            rule.verbs.retain(|v| v != verb);
        }
    }
    let api = Api::<ClusterRole>::all(cluster.client());
    let mut role = api.get(MEMBER_ROLE).await.expect("the member role");
    role.rules = fewer.cluster_role(MEMBER_ROLE, Scope::Members).rules;
    api.replace(MEMBER_ROLE, &PostParams::default(), &role)
        .await
        .expect("the member role replaced");
}

/// Creates the ConfigMap `name` labelled for the operator in `cluster`.
async fn labelled_config_map(cluster: &TestCluster, name: &str) {
    let config_map = ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some([(LABEL.to_owned(), "true".to_owned())].into()),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    };
    Api::<ConfigMap>::namespaced(cluster.client(), "default")
        .create(&PostParams::default(), &config_map)
        .await
        .unwrap_or_else(|e| panic!("creating ConfigMap {name}: {e}"));
}

/// Whether the operator has labelled the ConfigMap `name` in `cluster`.
async fn is_patched(cluster: &TestCluster, name: &str) -> bool {
    let config_map = Api::<ConfigMap>::namespaced(cluster.client(), "default")
        .get(name)
        .await
        .expect("the ConfigMap");
    config_map
        .metadata
        .labels
        .is_some_and(|labels| labels.get("patched").is_some_and(|v| v == "true"))
}

/// Waits until the operator has labelled the ConfigMap `name` in `cluster`.
async fn patched(cluster: &TestCluster, name: &str) {
    let deadline = Instant::now() + PATIENCE;
    while !is_patched(cluster, name).await {
        assert!(
            Instant::now() < deadline,
            "{name} in {} not labelled within {PATIENCE:?}",
            cluster.name()
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// Waits until `check` gives something, for at most `PATIENCE`.
async fn eventually<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(found) = check() {
            return found;
        }
        assert!(Instant::now() < deadline, "{what} within {PATIENCE:?}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_role_without_patch_fails_reconciles_there_alone_naming_user_verb_and_resource() {
    let env = Envtest::start(2).await.expect("envtest");
    let (local, member) = (&env.clusters()[0], &env.clusters()[1]);
    let operator = Operator::bound_to_its_roles(local, member).await;

    revoke(member, &operator.permissions, "patch").await;
    for cluster in [local, member] {
        labelled_config_map(cluster, "second").await;
    }
    // The local cluster keeps working.
    patched(local, "second").await;
    // In the member, the reconcile fails, and the error the controller
    // hands its error policy (and logs) says where and what is missing.
    let failed = eventually("a failed reconcile in the member", || {
        operator
            .errors_of("cluster://member/default/second: ")
            .into_iter()
            .next()
    })
    .await;
    for wanted in [
        "forbidden",
        "User \"operator\"",
        "cannot patch resource \"configmaps\"",
    ] {
        assert!(failed.contains(wanted), "{wanted:?} in {failed:?}");
    }
    assert!(!is_patched(member, "second").await);
    assert_eq!(
        operator.errors_of("cluster:///"),
        Vec::<String>::new(),
        "nothing failed in the local cluster"
    );
    operator.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_role_without_list_stalls_that_cluster_alone_and_its_status_says_why() {
    let env = Envtest::start(2).await.expect("envtest");
    let (local, member) = (&env.clusters()[0], &env.clusters()[1]);
    let operator = Operator::bound_to_its_roles(local, member).await;

    revoke(member, &operator.permissions, "list").await;
    // The running watch listed before; new credentials make it start over
    // (as a provider re-engages a cluster whose kubeconfig changed).
    operator.fleet.engage(MEMBER, operator_client(member));
    let stalled = eventually("the member's ConfigMap watch failing", || {
        operator
            .status
            .cluster(MEMBER)
            .filter(|cluster| cluster.failing().next().is_some())
    })
    .await;
    assert!(!stalled.serving, "{stalled}");
    let said = stalled.to_string();
    for wanted in [
        "cluster \"member\"",
        "ConfigMap: failing",
        "User \"operator\"",
        "cannot list resource \"configmaps\"",
    ] {
        assert!(said.contains(wanted), "{wanted:?} in {said:?}");
    }

    // The local cluster is served, and keeps working.
    let local_status = operator.status.cluster("").expect("started locally");
    assert!(
        local_status.serving && local_status.failing().next().is_none(),
        "{local_status}"
    );
    labelled_config_map(local, "second").await;
    patched(local, "second").await;
    operator.stop().await;
}
