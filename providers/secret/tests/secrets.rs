//! Kubeconfig Secrets created, changed, repointed, broken and deleted in a
//! hub API server while the fleet runs, engaging workload API servers.

use std::{collections::BTreeMap, time::Duration};

use k8s_openapi::{
    ByteString,
    api::core::v1::{ConfigMap, Secret},
};
use kube::{
    Api,
    api::{DeleteParams, ObjectMeta, Patch, PatchParams, PostParams},
    config::Kubeconfig,
    runtime::watcher,
};
use kube_multicluster::{
    Action, Controller, Duplicates, Fleet, FleetEvent, McRequest, ObjectRequest,
    controller::ControllerStatus, provider::Problems,
};
use kube_multicluster_envtest::{Envtest, TestCluster};
use kube_multicluster_provider_secret::{DEFAULT_LABEL, SecretProvider};
use tokio::sync::mpsc;
use tower::BoxError;

const PATIENCE: Duration = Duration::from_secs(30);
const NAMESPACE: &str = "default";

fn secrets(hub: &TestCluster) -> Api<Secret> {
    Api::namespaced(hub.client(), NAMESPACE)
}

fn text(kubeconfig: &Kubeconfig) -> String {
    serde_json::to_string(kubeconfig).unwrap()
}

/// A Secret `name`, labelled to be read, holding `data`.
fn secret(name: &str, data: &[(&str, &str)]) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some(BTreeMap::from([(
                DEFAULT_LABEL.to_owned(),
                "true".to_owned(),
            )])),
            ..ObjectMeta::default()
        },
        data: Some(
            data.iter()
                .map(|(k, v)| ((*k).to_owned(), ByteString(v.as_bytes().to_vec())))
                .collect(),
        ),
        ..Secret::default()
    }
}

async fn put(hub: &TestCluster, secret: Secret) {
    let name = secret.metadata.name.clone().unwrap();
    let api = secrets(hub);
    if api.get_opt(&name).await.unwrap().is_some() {
        api.patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "data": secret.data })),
        )
        .await
        .unwrap();
    } else {
        api.create(&PostParams::default(), &secret).await.unwrap();
    }
}

async fn create(cluster: &TestCluster, name: &str) {
    let config_map = ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    };
    Api::<ConfigMap>::default_namespaced(cluster.client())
        .create(&PostParams::default(), &config_map)
        .await
        .unwrap();
}

struct Running {
    tasks: Vec<tokio::task::JoinHandle<()>>,
    fleet: Fleet,
    reconciles: mpsc::UnboundedReceiver<McRequest>,
    status: ControllerStatus,
    problems: Problems,
    engaged: mpsc::UnboundedReceiver<FleetEvent>,
}

fn run(provider: SecretProvider) -> Running {
    run_in(Fleet::new(), provider)
}

fn run_in(fleet: Fleet, provider: SecretProvider) -> Running {
    let problems = provider.problems();
    let engaged = fleet.subscribe().events;
    let (tx, reconciles) = mpsc::unbounded_channel();
    let controller = Controller::<ConfigMap>::new(&fleet, watcher::Config::default());
    let status = controller.status();
    let controller = tokio::spawn(async move {
        let _ = controller
            .run(tower::service_fn(
                move |request: ObjectRequest<ConfigMap>| {
                    let _ = tx.send(request.request);
                    async { Ok::<_, BoxError>(Action::await_change()) }
                },
            ))
            .await;
    });
    let provider = tokio::spawn({
        let fleet = fleet.clone();
        async move { fleet.run(provider).await }
    });
    Running {
        tasks: vec![controller, provider],
        fleet,
        reconciles,
        status,
        problems,
        engaged,
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl Running {
    /// Waits until each `cluster/name` of `wanted` has been reconciled, in
    /// any order.
    async fn reconciled_all(&mut self, wanted: &[(&str, &str)]) {
        let mut missing: Vec<String> = wanted.iter().map(|(c, n)| format!("{c}/{n}")).collect();
        tokio::time::timeout(PATIENCE, async {
            while let Some(request) = self.reconciles.recv().await {
                let seen = format!("{}/{}", request.cluster, request.name);
                missing.retain(|m| *m != seen);
                if missing.is_empty() {
                    return;
                }
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{wanted:?} not all reconciled within {PATIENCE:?}"));
    }

    async fn reconciled(&mut self, cluster: &str, name: &str) {
        tokio::time::timeout(PATIENCE, async {
            while let Some(request) = self.reconciles.recv().await {
                if request.cluster.as_ref() == cluster && request.name == name {
                    return;
                }
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{cluster}/{name} not reconciled within {PATIENCE:?}"));
    }

    fn drain(&mut self) {
        while self.reconciles.try_recv().is_ok() {}
    }

    /// The names the fleet engaged since last asked, in order.
    fn engagements(&mut self) -> Vec<String> {
        let mut names = Vec::new();
        while let Ok(event) = self.engaged.try_recv() {
            if let FleetEvent::Engaged(cluster) = event {
                names.push(cluster.name().to_string());
            }
        }
        names
    }

    async fn until(&self, what: &str, done: impl Fn(&Fleet) -> bool) {
        tokio::time::timeout(PATIENCE, async {
            while !done(&self.fleet) {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("not {what} within {PATIENCE:?}"));
    }

    /// The fleet's problem with the name `name`, once it has one.
    async fn problem_of_fleet(&self, name: &str) -> String {
        let source = format!("cluster {name:?}");
        let problems = self.fleet.problems();
        tokio::time::timeout(PATIENCE, problems.wait_for(|set| set.contains_key(&source)))
            .await
            .unwrap_or_else(|_| panic!("no problem of {source} in {:?}", problems.current()))
            .remove(&source)
            .unwrap()
    }

    async fn problem_of(&self, source: &str) -> String {
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
async fn a_secret_engages_re_engages_when_repointed_and_ignores_metadata_changes() {
    let env = Envtest::start(3).await.unwrap();
    let (hub, east, west) = (&env.clusters()[0], &env.clusters()[1], &env.clusters()[2]);
    create(east, "on-east").await;
    create(west, "on-west").await;
    // Every request of the first kubeconfig goes through this link.
    let old = east.link().unwrap();
    put(
        hub,
        secret("edge", &[("kubeconfig", &text(old.kubeconfig()))]),
    )
    .await;

    let mut running = run(SecretProvider::new(hub.client(), NAMESPACE));
    running.reconciled("edge", "on-east").await;
    assert_eq!(running.engagements(), ["edge"]);

    // Labels, annotations and other keys change nothing. A second Secret
    // created after the change is engaged after it is seen.
    secrets(hub)
        .patch(
            "edge",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({
                "metadata": { "annotations": { "owner": "platform" } },
                "stringData": { "notes": "the edge cluster" },
            })),
        )
        .await
        .unwrap();
    put(
        hub,
        secret("marker", &[("kubeconfig", &text(west.kubeconfig()))]),
    )
    .await;
    running.reconciled("marker", "on-west").await;
    assert_eq!(running.engagements(), ["marker"], "edge engaged again");

    // Repointed: engaged again, objects there reconciled, and the old
    // kubeconfig's connections closed for good.
    running.drain();
    put(
        hub,
        secret("edge", &[("kubeconfig", &text(west.kubeconfig()))]),
    )
    .await;
    running.reconciled("edge", "on-west").await;
    assert_eq!(running.engagements(), ["edge"]);
    tokio::time::timeout(PATIENCE, async {
        while old.open_connections() > 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the old kubeconfig's connections closed");
    let made = old.connections_made();
    create(west, "later").await;
    running.reconciled("edge", "later").await;
    assert_eq!(old.connections_made(), made, "the old kubeconfig was used");
    assert_eq!(old.open_connections(), 0);

    // Deleted: the count drops.
    secrets(hub)
        .delete("marker", &DeleteParams::default())
        .await
        .unwrap();
    running
        .until("marker disengaged", |fleet| fleet.clusters().len() == 1)
        .await;
    assert!(running.fleet.get("edge").is_some());

    // No longer labelled: disengaged.
    secrets(hub)
        .patch(
            "edge",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({
                "metadata": { "labels": { DEFAULT_LABEL: null } },
            })),
        )
        .await
        .unwrap();
    running
        .until("edge disengaged", |fleet| fleet.clusters().is_empty())
        .await;
}

#[tokio::test]
async fn a_secret_being_deleted_disengages_at_once() {
    let env = Envtest::start(2).await.unwrap();
    let (hub, east) = (&env.clusters()[0], &env.clusters()[1]);
    create(east, "on-east").await;
    let mut held = secret("edge", &[("kubeconfig", &text(east.kubeconfig()))]);
    held.metadata.finalizers = Some(vec!["example.com/hold".to_owned()]);
    put(hub, held).await;
    let mut running = run(SecretProvider::new(hub.client(), NAMESPACE));
    running.reconciled("edge", "on-east").await;
    secrets(hub)
        .delete("edge", &DeleteParams::default())
        .await
        .unwrap();
    running
        .until("edge disengaged", |fleet| fleet.clusters().is_empty())
        .await;
    // Still there, held by its finalizer.
    let left = secrets(hub).get("edge").await.unwrap();
    assert!(left.metadata.deletion_timestamp.is_some());
    secrets(hub)
        .patch(
            "edge",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "metadata": { "finalizers": null } })),
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn bad_secrets_are_reported_by_name_and_others_keep_working() {
    let env = Envtest::start(2).await.unwrap();
    let (hub, east) = (&env.clusters()[0], &env.clusters()[1]);
    create(east, "on-east").await;
    let good = text(east.kubeconfig());
    put(hub, secret("good", &[("kubeconfig", &good)])).await;
    // No such key.
    put(hub, secret("no-key", &[("config", &good)])).await;
    // Not YAML.
    put(
        hub,
        secret("malformed", &[("kubeconfig", "clusters: [ {name: ")]),
    )
    .await;
    // An exec plugin, refused by default.
    let mut exec: serde_json::Value = serde_json::from_str(&good).unwrap();
    exec["users"][0]["user"] = serde_json::json!({
        "exec": { "apiVersion": "client.authentication.k8s.io/v1", "command": "get-token" }
    });
    put(hub, secret("exec", &[("kubeconfig", &exec.to_string())])).await;
    // A context naming a cluster the kubeconfig lacks.
    let mut dangling: serde_json::Value = serde_json::from_str(&good).unwrap();
    dangling["contexts"][0]["context"]["cluster"] = "nowhere".into();
    put(
        hub,
        secret("dangling", &[("kubeconfig", &dangling.to_string())]),
    )
    .await;
    // A server nothing listens on.
    let mut down: serde_json::Value = serde_json::from_str(&good).unwrap();
    down["clusters"][0]["cluster"]["server"] = "https://127.0.0.1:1".into();
    put(hub, secret("down", &[("kubeconfig", &down.to_string())])).await;

    let mut running = run(SecretProvider::new(hub.client(), NAMESPACE));
    running.reconciled("good", "on-east").await;
    let no_key = running.problem_of("Secret default/no-key").await;
    assert!(no_key.contains("no key \"kubeconfig\""), "{no_key}");
    let malformed = running.problem_of("Secret default/malformed").await;
    assert!(
        // Under its source's name; the message says what is wrong.
        !malformed.contains("Secret default/malformed") && malformed.contains("not a kubeconfig"),
        "{malformed}"
    );
    let exec = running.problem_of("Secret default/exec").await;
    assert!(
        exec.contains("exec credential plugin") && exec.contains("allow_exec"),
        "{exec}"
    );
    let dangling = running.problem_of("Secret default/dangling").await;
    assert!(dangling.contains("cluster \"nowhere\""), "{dangling}");

    // The unreachable one is engaged, and its controller says why it
    // cannot serve it, by name.
    let failing = tokio::time::timeout(PATIENCE, async {
        loop {
            if let Some(down) = running.status.cluster("down")
                && down.failing().next().is_some()
            {
                return down.to_string();
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the unreachable cluster is reported failing");
    assert!(failing.contains("\"down\""), "{failing}");
    let mut names: Vec<String> = running
        .fleet
        .clusters()
        .iter()
        .map(|c| c.name().to_string())
        .collect();
    names.sort();
    assert_eq!(names, ["down", "good"]);

    // The others keep working.
    create(east, "later").await;
    running.reconciled("good", "later").await;

    // Fixed: engaged, and the problem gone.
    put(hub, secret("exec", &[("kubeconfig", &good)])).await;
    running.reconciled("exec", "on-east").await;
    assert!(running.problems.get("Secret default/exec").is_none());
    // Deleted: its problem goes with it.
    secrets(hub)
        .delete("no-key", &DeleteParams::default())
        .await
        .unwrap();
    tokio::time::timeout(
        PATIENCE,
        running
            .problems
            .wait_for(|set| !set.contains_key("Secret default/no-key")),
    )
    .await
    .expect("the deleted Secret's problem cleared");
}

/// Everything logged at debug level and above on this thread, while the
/// guard lives.
fn capture_logs() -> (
    std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
    tracing::subscriber::DefaultGuard,
) {
    #[derive(Clone)]
    struct Buffer(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
    impl std::io::Write for Buffer {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let buffer = Buffer(Default::default());
    let logs = buffer.0.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .with_writer(move || buffer.clone())
        .finish();
    (logs, tracing::subscriber::set_default(subscriber))
}

#[tokio::test]
async fn no_token_key_or_plugin_argument_reaches_logs_problems_or_debug_output() {
    const TOKEN: &str = "tok-SECRET-5521";
    const ARGUMENT: &str = "arg-SECRET-9034";
    let env = Envtest::start(2).await.unwrap();
    let (hub, east) = (&env.clusters()[0], &env.clusters()[1]);
    let (logs, _guard) = capture_logs();
    let good: serde_json::Value = serde_json::to_value(east.kubeconfig()).unwrap();
    let key = good["users"][0]["user"]["client-key-data"]
        .as_str()
        .unwrap()
        .to_owned();
    // A token the API server does not know: engaged, and refused there.
    let mut token = good.clone();
    token["users"][0]["user"] = serde_json::json!({ "token": TOKEN });
    // An exec plugin with a secret in its arguments and environment.
    let mut exec = good.clone();
    exec["users"][0]["user"] = serde_json::json!({ "exec": {
        "apiVersion": "client.authentication.k8s.io/v1",
        "command": "login",
        "args": ["--password", ARGUMENT],
        "env": [{ "name": "PASSWORD", "value": ARGUMENT }],
    }});
    // Broken YAML right after the key.
    let broken = format!("{{\"users\": [{{\"user\": {{\"client-key-data\": \"{key}\" ");
    put(hub, secret("good", &[("kubeconfig", &good.to_string())])).await;
    put(hub, secret("token", &[("kubeconfig", &token.to_string())])).await;
    put(hub, secret("exec", &[("kubeconfig", &exec.to_string())])).await;
    put(hub, secret("broken", &[("kubeconfig", &broken)])).await;

    let running = run(SecretProvider::new(hub.client(), NAMESPACE));
    running.problem_of("Secret default/exec").await;
    running.problem_of("Secret default/broken").await;
    running
        .until("good and token engaged", |fleet| {
            fleet.clusters().len() == 2
        })
        .await;
    let read = || String::from_utf8(logs.lock().unwrap().clone()).unwrap();
    tokio::time::timeout(PATIENCE, async {
        while !read().contains("Unauthorized") {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the token's cluster was refused by the API server, and that logged");
    let logs = read();
    assert!(logs.contains("Secret default/exec"), "nothing was logged");
    let debug = format!("{:?} {:?}", running.problems, running.fleet.clusters());
    let problems = format!("{:?}", running.problems.current());
    for secret in [TOKEN, ARGUMENT, key.as_str()] {
        assert!(!logs.contains(secret), "a secret was logged");
        assert!(!debug.contains(secret), "a secret is in Debug output");
        assert!(!problems.contains(secret), "a secret is in a problem");
    }
}

#[tokio::test]
async fn a_credential_plugin_that_fails_for_a_while_is_tried_again() {
    let env = Envtest::start(2).await.unwrap();
    let (hub, east) = (&env.clusters()[0], &env.clusters()[1]);
    create(east, "on-east").await;
    // A plugin that fails until `ready` exists, then hands out the
    // cluster's own client certificate.
    let dir = tempfile_dir("secret-plugin");
    let ready = dir.join("ready");
    let kubeconfig = east
        .exec_kubeconfig(&format!(
            "[ -e '{}' ] || {{ echo not yet >&2; exit 1; }}",
            ready.display()
        ))
        .unwrap();
    put(hub, secret("east", &[("kubeconfig", &text(&kubeconfig))])).await;

    let provider = SecretProvider::new(hub.client(), NAMESPACE)
        .policy(kube_multicluster::provider::kubeconfig::KubeconfigPolicy::default().allow_exec())
        .retry(Duration::from_millis(200));
    let mut running = run(provider);
    let problem = running.problem_of("Secret default/east").await;
    assert!(
        problem.contains("credentials could not be obtained"),
        "{problem}"
    );
    assert!(running.fleet.get("east").is_none());
    std::fs::write(&ready, "").unwrap();
    running.reconciled("east", "on-east").await;
    assert!(running.problems.get("Secret default/east").is_none());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Waits until `path` exists.
async fn exists(path: &std::path::Path) {
    tokio::time::timeout(PATIENCE, async {
        while !path.exists() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{} not there within {PATIENCE:?}", path.display()));
}

#[tokio::test]
async fn a_key_removed_while_its_rotation_is_built_leaves_the_rotation_unengaged() {
    let env = Envtest::start(2).await.unwrap();
    let (hub, east) = (&env.clusters()[0], &env.clusters()[1]);
    create(east, "on-east").await;
    put(
        hub,
        secret("east", &[("kubeconfig", &text(east.kubeconfig()))]),
    )
    .await;
    let provider = SecretProvider::new(hub.client(), NAMESPACE)
        .policy(kube_multicluster::provider::kubeconfig::KubeconfigPolicy::default().allow_exec());
    let mut running = run(provider);
    running.reconciled("east", "on-east").await;
    let engaged = running.fleet.get("east").unwrap();
    assert_eq!(running.engagements(), ["east"]);

    // Rotated to credentials from a plugin that takes a while, then the key
    // is removed before the plugin has answered.
    let dir = tempfile_dir("revoked");
    let answered = dir.join("answered");
    let rotated = east
        .exec_kubeconfig(&format!("sleep 2; touch '{}'", answered.display()))
        .unwrap();
    put(hub, secret("east", &[("kubeconfig", &text(&rotated))])).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    secrets(hub)
        .patch(
            "east",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "data": { "kubeconfig": null } })),
        )
        .await
        .unwrap();
    let problem = running.problem_of("Secret default/east").await;
    assert!(problem.contains("has no key"), "{problem}");

    // The plugin answers (kube may run it once more for the build); its
    // credentials are never engaged.
    exists(&answered).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(running.engagements(), Vec::<String>::new());
    assert!(
        engaged.is_engaged(),
        "the cluster engaged before was replaced"
    );
    let problem = running.problems.get("Secret default/east");
    assert!(
        problem.as_deref().is_some_and(|p| p.contains("has no key")),
        "{problem:?}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A new, empty directory for a test's files.
fn tempfile_dir(what: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("{what}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[tokio::test]
async fn a_credential_plugin_runs_once_per_client_and_its_failures_say_what_happened() {
    let env = Envtest::start(2).await.unwrap();
    let (hub, east) = (&env.clusters()[0], &env.clusters()[1]);
    create(east, "on-east").await;
    let dir = tempfile_dir("plugin-runs");
    let runs = dir.join("runs");
    let counted = east
        .exec_kubeconfig(&format!("echo run >> '{}'", runs.display()))
        .unwrap();
    put(hub, secret("east", &[("kubeconfig", &text(&counted))])).await;
    // One that exits with a failure, one that prints what is not an
    // ExecCredential: each says which, and neither repeats the output.
    let exits = east
        .exec_kubeconfig("echo out-SECRET-1; echo err-SECRET-2 >&2; exit 3")
        .unwrap();
    put(hub, secret("exits", &[("kubeconfig", &text(&exits))])).await;
    let garbage = east
        .exec_kubeconfig("echo '{ not: out-SECRET-3'; exit 0")
        .unwrap();
    put(hub, secret("garbage", &[("kubeconfig", &text(&garbage))])).await;

    let provider = SecretProvider::new(hub.client(), NAMESPACE)
        .policy(kube_multicluster::provider::kubeconfig::KubeconfigPolicy::default().allow_exec());
    let mut running = run(provider);
    running.reconciled("east", "on-east").await;
    create(east, "later").await;
    running.reconciled("east", "later").await;
    let ran = std::fs::read_to_string(&runs).unwrap();
    assert_eq!(
        ran.lines().count(),
        1,
        "the plugin ran {} times",
        ran.lines().count()
    );

    let exited = running.problem_of("Secret default/exits").await;
    assert!(exited.contains("failed (exit status: 3)"), "{exited}");
    let printed = running.problem_of("Secret default/garbage").await;
    assert!(
        printed.contains("output is not an ExecCredential"),
        "{printed}"
    );
    for problem in [&exited, &printed] {
        assert!(!problem.contains("SECRET"), "{problem}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Whether the process `pid` has ended (gone, or a zombie waiting to be
/// reaped).
fn ended(pid: &str) -> bool {
    match std::fs::read_to_string(format!("/proc/{}/stat", pid.trim())) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z')),
    }
}

/// A program that stops while a credential plugin hangs: the runtime is
/// dropped at once, and the plugin, with what it started, is killed.
#[test]
fn a_hung_credential_plugin_holds_up_no_exit_and_is_killed() {
    let harness = tokio::runtime::Runtime::new().unwrap();
    let env = harness.block_on(Envtest::start(2)).unwrap();
    let (hub, east) = (&env.clusters()[0], &env.clusters()[1]);
    let dir = tempfile_dir("plugin-hangs");
    let (shell, sleep) = (dir.join("shell"), dir.join("sleep"));
    let hangs = east
        .exec_kubeconfig(&format!(
            "echo $$ > '{}'; sleep 15 & echo $! > '{}'; wait",
            shell.display(),
            sleep.display()
        ))
        .unwrap();
    harness.block_on(put(hub, secret("east", &[("kubeconfig", &text(&hangs))])));

    // The program: its own runtime, as `#[tokio::main]` makes one.
    let program = tokio::runtime::Runtime::new().unwrap();
    let hub_kubeconfig = hub.kubeconfig().clone();
    program.spawn(async move {
        let config = kube::Config::from_custom_kubeconfig(hub_kubeconfig, &Default::default())
            .await
            .unwrap();
        let hub = kube::Client::try_from(config).unwrap();
        let provider = SecretProvider::new(hub, NAMESPACE).policy(
            kube_multicluster::provider::kubeconfig::KubeconfigPolicy::default().allow_exec(),
        );
        Fleet::new().run(provider).await
    });
    // Each pid once its file holds it.
    let began = std::time::Instant::now();
    let pid = |file: &std::path::Path| {
        std::fs::read_to_string(file)
            .ok()
            .filter(|pid| pid.ends_with('\n') && pid.trim().parse::<u32>().is_ok())
    };
    let (shell, sleep) = loop {
        if let (Some(shell), Some(sleep)) = (pid(&shell), pid(&sleep)) {
            break (shell, sleep);
        }
        assert!(began.elapsed() < PATIENCE, "the plugin did not start");
        std::thread::sleep(Duration::from_millis(20));
    };

    let stopping = std::time::Instant::now();
    drop(program);
    let took = stopping.elapsed();
    assert!(
        took < Duration::from_secs(3),
        "the program took {took:?} to stop"
    );
    let killed = std::time::Instant::now();
    while !(ended(&shell) && ended(&sleep)) {
        assert!(
            killed.elapsed() < Duration::from_secs(5),
            "the plugin ({shell}) or what it started ({sleep}) still runs"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(env);
    drop(harness);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A plugin that hands out a service account's token, good (it says) for
/// 62 s: renewed by running the plugin again once less than a minute is
/// left, while the token in hand still serves requests, in one engagement.
#[tokio::test]
async fn a_plugin_token_about_to_expire_is_renewed_in_the_same_engagement() {
    use std::os::unix::fs::PermissionsExt;

    let env = Envtest::start(2).await.unwrap();
    let (hub, east) = (&env.clusters()[0], &env.clusters()[1]);
    create(east, "on-east").await;
    let token = east.admin_token("fleet").await.unwrap();

    let dir = tempfile_dir("plugin-token");
    let runs = dir.join("runs");
    let plugin = dir.join("plugin");
    std::fs::write(
        &plugin,
        format!(
            "#!/bin/sh\necho run >> '{runs}'\nexp=$(date -u -d '+62 seconds' +%Y-%m-%dT%H:%M:%SZ)\n\
             echo '{{\"apiVersion\":\"client.authentication.k8s.io/v1\",\"kind\":\"ExecCredential\",\
             \"status\":{{\"token\":\"{token}\",\"expirationTimestamp\":\"'$exp'\"}}}}'\n",
            runs = runs.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&plugin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut kubeconfig = serde_json::to_value(east.kubeconfig()).unwrap();
    kubeconfig["users"][0]["user"] = serde_json::json!({ "exec": {
        "apiVersion": "client.authentication.k8s.io/v1",
        "command": plugin.display().to_string(),
    }});
    put(
        hub,
        secret("east", &[("kubeconfig", &kubeconfig.to_string())]),
    )
    .await;

    let provider = SecretProvider::new(hub.client(), NAMESPACE)
        .policy(kube_multicluster::provider::kubeconfig::KubeconfigPolicy::default().allow_exec());
    let mut running = run(provider);
    running.reconciled("east", "on-east").await;
    let engaged = running.fleet.get("east").unwrap();
    assert_eq!(std::fs::read_to_string(&runs).unwrap().lines().count(), 1);
    // Requests a few seconds on find the token due, and go on with it
    // while the plugin runs again.
    for i in 0..4 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let name = format!("later-{i}");
        create(east, &name).await;
        running.reconciled("east", &name).await;
        // Through the cluster's own client, as a reconciler writes.
        Api::<ConfigMap>::namespaced(engaged.client(), NAMESPACE)
            .get(&name)
            .await
            .unwrap();
    }
    let ran = std::fs::read_to_string(&runs).unwrap().lines().count();
    assert!(
        ran >= 2,
        "the plugin ran {ran} times: the token was not renewed"
    );
    assert!(
        engaged.is_engaged(),
        "renewing the token re-engaged the cluster"
    );
    assert!(
        running.problems.current().is_empty(),
        "{:?}",
        running.problems.current()
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Every reconcile seen within `window`, as `cluster/name`.
async fn seen_for(running: &mut Running, window: Duration) -> Vec<String> {
    let mut seen = Vec::new();
    let deadline = tokio::time::Instant::now() + window;
    while let Ok(Some(request)) = tokio::time::timeout_at(deadline, running.reconciles.recv()).await
    {
        seen.push(format!("{}/{}", request.cluster, request.name));
    }
    seen
}

#[tokio::test]
async fn two_secrets_for_one_cluster_are_warned_about_by_default_and_engaged_once_when_asked() {
    let env = Envtest::start(3).await.unwrap();
    let (hub, east, west) = (&env.clusters()[0], &env.clusters()[1], &env.clusters()[2]);
    create(east, "on-east").await;
    create(west, "on-west").await;
    let kubeconfig = text(east.kubeconfig());
    for name in ["east-a", "east-b"] {
        put(hub, secret(name, &[("kubeconfig", &kubeconfig)])).await;
    }
    put(
        hub,
        secret("west", &[("kubeconfig", &text(west.kubeconfig()))]),
    )
    .await;

    // By default both names are engaged, and the second is reported.
    let mut running = run(SecretProvider::new(hub.client(), NAMESPACE));
    running
        .until("the duplicate found", |fleet| {
            fleet.status().duplicates.len() == 1
        })
        .await;
    let duplicate = running.fleet.status().duplicates.remove(0);
    let mut names = [duplicate.name.to_string(), duplicate.of.to_string()];
    names.sort();
    assert_eq!(names, ["east-a", "east-b"], "{duplicate:?}");
    assert!(duplicate.engaged);
    let problems = running.fleet.problems().current();
    let problem = &problems[&format!("cluster {:?}", duplicate.name.as_str())];
    assert!(
        problem.contains(&format!("{:?}", duplicate.of.as_str())) && problem.contains("EngageOnce"),
        "{problem}"
    );
    running
        .reconciled_all(&[("east-a", "on-east"), ("east-b", "on-east")])
        .await;
    drop(running);

    // Engaged once: one name serves the cluster, the other is held back.
    let fleet = Fleet::with_config(kube_multicluster::FleetConfig {
        duplicates: Duplicates::EngageOnce,
        ..kube_multicluster::FleetConfig::default()
    });
    let mut running = run_in(fleet, SecretProvider::new(hub.client(), NAMESPACE));
    running
        .until("one name engaged, one held back", |fleet| {
            fleet.status().duplicates.len() == 1 && fleet.get("west").is_some()
        })
        .await;
    let duplicate = running.fleet.status().duplicates.remove(0);
    assert!(!duplicate.engaged);
    let (engaged, held) = (duplicate.of.to_string(), duplicate.name.to_string());
    assert!(running.fleet.get(engaged.as_str()).is_some());
    assert!(running.fleet.get(held.as_str()).is_none());
    running
        .reconciled_all(&[(engaged.as_str(), "on-east"), ("west", "on-west")])
        .await;
    let seen = seen_for(&mut running, Duration::from_secs(2)).await;
    assert!(
        !seen.contains(&format!("{held}/on-east")),
        "the name held back reconciles nothing: {seen:?}"
    );
    let problem = running.problem_of_fleet(&held).await;
    assert!(problem.contains(&format!("{engaged:?}")), "{problem}");
    assert!(running.engagements().iter().all(|name| *name != held));

    // The name engaged goes: the one held back takes its place.
    secrets(hub)
        .delete(&engaged, &DeleteParams::default())
        .await
        .unwrap();
    running.reconciled(&held, "on-east").await;
    assert!(running.fleet.get(engaged.as_str()).is_none());
    assert!(running.fleet.status().duplicates.is_empty());
    assert!(running.fleet.problems().current().is_empty());
}
