//! The kind provider against real API servers, with a script standing in
//! for `kind` that answers from files: `clusters` lists the clusters,
//! `<name>.yaml` is the kubeconfig of cluster `<name>`, and `<name>.slow`
//! makes fetching it hang for that many seconds in a child process, whose
//! pid goes to `<name>.pid`.

use std::{
    collections::{BTreeMap, HashSet},
    os::unix::fs::PermissionsExt,
    path::PathBuf,
    time::Duration,
};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api,
    api::{ObjectMeta, PostParams},
    config::Kubeconfig,
    runtime::watcher,
};
use kube_multicluster::{
    Action, Controller, Fleet, McRequest, ObjectRequest,
    provider::{Problems, kubeconfig::KubeconfigPolicy},
};
use kube_multicluster_envtest::{Envtest, TestCluster};
use kube_multicluster_provider_kind::KindProvider;
use tokio::{sync::mpsc, task::JoinHandle};
use tower::BoxError;

const PATIENCE: Duration = Duration::from_secs(30);
const INTERVAL: Duration = Duration::from_millis(100);
const LIST_SOURCE: &str = "kind get clusters";

/// Answers `get clusters` and `get kubeconfig --name <name>` as kind does,
/// from the files beside it, and notes each call in `calls`.
const SCRIPT: &str = r#"#!/bin/sh
dir=$(dirname "$0")
echo "$*" >> "$dir/calls"
case "$*" in
"get clusters")
    if [ -e "$dir/fail" ]; then
        echo 'ERROR: failed to list clusters: command "docker ps" failed' >&2
        echo 'a second line that is never quoted' >&2
        exit 1
    fi
    if [ ! -s "$dir/clusters" ]; then
        echo 'No kind clusters found.' >&2
        exit 0
    fi
    cat "$dir/clusters"
    ;;
"get kubeconfig --name "*)
    if [ -e "$dir/$4.slow" ]; then
        # Hangs in a child, as `docker exec` does in a paused container.
        sleep "$(cat "$dir/$4.slow")" &
        echo $! > "$dir/$4.pid"
        wait $!
    fi
    # One read: the file may go at any moment.
    if ! cat "$dir/$4.yaml" 2>/dev/null; then
        echo "ERROR: could not locate any control plane nodes for cluster named '$4'" >&2
        exit 1
    fi
    ;;
*)
    echo "ERROR: unknown command: $*" >&2
    exit 2
    ;;
esac
"#;

/// A `kind` script in a directory of its own, removed on drop.
struct FakeKind {
    dir: PathBuf,
}

impl FakeKind {
    fn new(test: &str) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "kube-multicluster-kind-{}-{test}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let kind = Self { dir };
        let script = kind.executable();
        std::fs::write(&script, SCRIPT).unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        kind.wait_until_runnable();
        kind
    }

    /// A process forked by another test's thread while the script was open
    /// for writing holds it open until it execs, and running the script
    /// until then fails with ETXTBSY: wait that out here, once.
    fn wait_until_runnable(&self) {
        for _ in 0..500 {
            match std::process::Command::new(self.executable())
                .arg("version")
                .stderr(std::process::Stdio::null())
                .status()
            {
                Ok(_) => return,
                Err(error) if error.raw_os_error() == Some(26) => {
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(error) => panic!("the kind script cannot run: {error}"),
            }
        }
        panic!("the kind script stayed busy");
    }

    fn executable(&self) -> PathBuf {
        self.dir.join("kind")
    }

    /// A provider that runs the script, and fetches every kubeconfig on
    /// every listing, so that the tests see a changed one at once.
    fn provider(&self) -> KindProvider {
        self.provider_with_default_refresh().refresh(INTERVAL)
    }

    fn provider_with_default_refresh(&self) -> KindProvider {
        KindProvider::new()
            .executable(self.executable())
            .interval(INTERVAL)
    }

    /// Replaces a file at once, so the script never reads half of it.
    fn write(&self, file: &str, contents: &str) {
        let temporary = self.dir.join(format!(".{file}.new"));
        std::fs::write(&temporary, contents).unwrap();
        std::fs::rename(&temporary, self.dir.join(file)).unwrap();
    }

    fn list(&self, names: &[&str]) {
        let mut text = names.join("\n");
        text.push('\n');
        self.write("clusters", &text);
    }

    fn kubeconfig(&self, name: &str, kubeconfig: &Kubeconfig) {
        // JSON is YAML.
        self.write(
            &format!("{name}.yaml"),
            &serde_json::to_string(kubeconfig).unwrap(),
        );
    }

    fn fail(&self, fail: bool) {
        let path = self.dir.join("fail");
        if fail {
            std::fs::write(path, "").unwrap();
        } else {
            std::fs::remove_file(path).unwrap();
        }
    }

    /// Every call made so far, one line of arguments each.
    fn calls(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.join("calls"))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// Makes fetching `name`'s kubeconfig hang for `seconds`.
    fn slow(&self, name: &str, seconds: u32) {
        self.write(&format!("{name}.slow"), &seconds.to_string());
    }

    /// The process that a slow fetch of `name`'s kubeconfig hangs in, once
    /// it has started.
    fn hung(&self, name: &str) -> Option<u32> {
        std::fs::read_to_string(self.dir.join(format!("{name}.pid")))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// How many times `name`'s kubeconfig was asked for.
    fn fetches(&self, name: &str) -> usize {
        let call = format!("get kubeconfig --name {name}");
        self.calls().iter().filter(|c| **c == call).count()
    }

    fn listings(&self) -> usize {
        self.calls().iter().filter(|c| *c == "get clusters").count()
    }

    /// Waits for two more listings than now: by then the events of every
    /// listing so far have reached the fleet.
    async fn two_more_listings(&self) {
        let from = self.listings();
        eventually("two more listings", || self.listings() >= from + 2).await;
    }
}

impl Drop for FakeKind {
    fn drop(&mut self) {
        // A script the provider ran may still be writing here until the
        // runtime drops the provider and kills it: try again for a while.
        for _ in 0..50 {
            if std::fs::remove_dir_all(&self.dir).is_ok() || !self.dir.exists() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// A fleet that runs the provider, and a controller of ConfigMaps on it
/// that records every reconcile.
struct Running {
    fleet: Fleet,
    problems: Problems,
    reconciles: mpsc::UnboundedReceiver<McRequest>,
    tasks: Vec<JoinHandle<()>>,
}

impl Running {
    fn start(provider: KindProvider) -> Self {
        let problems = provider.problems();
        let fleet = Fleet::new();
        let run = tokio::spawn({
            let fleet = fleet.clone();
            async move { fleet.run(provider).await }
        });
        let (tx, reconciles) = mpsc::unbounded_channel();
        let controller = Controller::<ConfigMap>::new(&fleet, watcher::Config::default());
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
        Self {
            fleet,
            problems,
            reconciles,
            tasks: vec![run, controller],
        }
    }

    fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .fleet
            .clusters()
            .iter()
            .map(|c| c.name().to_string())
            .collect();
        names.sort();
        names
    }

    /// Waits until each `(cluster, object)` has been reconciled.
    async fn reconciled(&mut self, expected: &[(&str, &str)]) {
        let mut missing: HashSet<(String, String)> = expected
            .iter()
            .map(|(c, o)| ((*c).to_owned(), (*o).to_owned()))
            .collect();
        tokio::time::timeout(PATIENCE, async {
            while !missing.is_empty() {
                let request = self.reconciles.recv().await.expect("the controller runs");
                missing.remove(&(request.cluster.to_string(), request.name));
            }
        })
        .await
        .unwrap_or_else(|_| panic!("not reconciled within {PATIENCE:?}: {missing:?}"));
    }

    async fn problems_where(
        &self,
        what: &str,
        ready: impl FnMut(&BTreeMap<String, String>) -> bool,
    ) -> BTreeMap<String, String> {
        tokio::time::timeout(PATIENCE, self.problems.wait_for(ready))
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "{what} within {PATIENCE:?}; problems: {:?}",
                    self.problems.current()
                )
            })
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

async fn eventually(what: &str, done: impl FnMut() -> bool) {
    within(PATIENCE, what, done).await;
}

async fn within(patience: Duration, what: &str, mut done: impl FnMut() -> bool) {
    tokio::time::timeout(patience, async {
        while !done() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{what}: not within {patience:?}"));
}

/// Whether the process `pid` is running: neither gone nor a zombie.
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        // The state follows the command, which is in parentheses.
        stat.rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with('Z'))
    })
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

fn insecure(kubeconfig: &Kubeconfig) -> Kubeconfig {
    let mut kubeconfig = kubeconfig.clone();
    for cluster in &mut kubeconfig.clusters {
        if let Some(cluster) = cluster.cluster.as_mut() {
            cluster.insecure_skip_tls_verify = Some(true);
        }
    }
    kubeconfig
}

fn source(name: &str) -> String {
    format!("kind cluster {name:?}")
}

#[tokio::test]
async fn listed_clusters_engage_under_their_kind_names_and_are_reconciled() {
    let env = Envtest::start(1).await.unwrap();
    let cluster = &env.clusters()[0];
    create(cluster, "settings").await;
    let kind = FakeKind::new("engage");
    // Two kind names for one API server: each is a cluster of its own.
    kind.kubeconfig("fleet-a", cluster.kubeconfig());
    kind.kubeconfig("fleet-b", cluster.kubeconfig());
    kind.list(&["fleet-a", "fleet-b"]);

    let mut running = Running::start(kind.provider());
    running
        .reconciled(&[("fleet-a", "settings"), ("fleet-b", "settings")])
        .await;
    assert_eq!(running.names(), ["fleet-a", "fleet-b"]);
    assert!(running.problems.current().is_empty());
}

#[tokio::test]
async fn a_cluster_removed_from_the_list_disengages_and_one_added_later_engages() {
    let env = Envtest::start(1).await.unwrap();
    let cluster = &env.clusters()[0];
    let kind = FakeKind::new("come-and-go");
    kind.kubeconfig("alpha", cluster.kubeconfig());
    kind.kubeconfig("beta", cluster.kubeconfig());
    kind.list(&["alpha"]);

    let running = Running::start(kind.provider());
    eventually("alpha engaged", || running.fleet.get("alpha").is_some()).await;
    let alpha = running.fleet.get("alpha").unwrap();

    kind.list(&["beta"]);
    eventually("alpha gone and beta engaged", || {
        running.names() == ["beta"]
    })
    .await;
    assert!(!alpha.is_engaged());

    // kind lists nothing, and says so on stderr: not a problem.
    kind.list(&[]);
    eventually("every cluster gone", || running.fleet.clusters().is_empty()).await;
    kind.two_more_listings().await;
    assert!(running.problems.current().is_empty());
}

#[tokio::test]
async fn only_clusters_with_the_prefix_are_engaged() {
    let env = Envtest::start(1).await.unwrap();
    let cluster = &env.clusters()[0];
    let kind = FakeKind::new("prefix");
    for name in ["dev-a", "prod-a", "prod-b"] {
        kind.kubeconfig(name, cluster.kubeconfig());
    }
    kind.list(&["dev-a", "prod-a", "prod-b"]);

    let running = Running::start(kind.provider().prefix("prod-"));
    eventually("prod-a and prod-b engaged", || {
        running.names() == ["prod-a", "prod-b"]
    })
    .await;
    // Had dev-a been engaged, it would be by now.
    kind.two_more_listings().await;
    assert_eq!(running.names(), ["prod-a", "prod-b"]);
    assert!(
        !kind.calls().iter().any(|call| call.ends_with("dev-a")),
        "a cluster without the prefix is not even asked for: {:?}",
        kind.calls()
    );
}

#[tokio::test]
async fn a_failing_kind_is_reported_and_keeps_the_engaged_clusters() {
    let env = Envtest::start(1).await.unwrap();
    let cluster = &env.clusters()[0];
    let kind = FakeKind::new("failing");
    kind.kubeconfig("alpha", cluster.kubeconfig());
    kind.list(&["alpha"]);

    let running = Running::start(kind.provider());
    eventually("alpha engaged", || running.fleet.get("alpha").is_some()).await;
    let alpha = running.fleet.get("alpha").unwrap();

    // The listing fails: reported, and alpha stays.
    kind.fail(true);
    let problems = running
        .problems_where("the failing listing reported", |set| {
            set.contains_key(LIST_SOURCE)
        })
        .await;
    let problem = &problems[LIST_SOURCE];
    let command = format!("{} get clusters", kind.executable().display());
    for says in [command.as_str(), "exit status: 1", "\"docker ps\" failed"] {
        assert!(problem.contains(says), "{says:?} not in {problem:?}");
    }
    assert!(!problem.contains("second line"), "{problem}");
    kind.two_more_listings().await;
    assert!(alpha.is_engaged(), "a failing listing disengaged alpha");

    kind.fail(false);
    running
        .problems_where("the listing's problem cleared", |set| set.is_empty())
        .await;
    kind.two_more_listings().await;
    assert!(
        alpha.is_engaged(),
        "alpha, whose kubeconfig did not change, was engaged again"
    );

    // Its kubeconfig cannot be fetched for a while: reported, and alpha stays.
    std::fs::remove_file(kind.dir.join("alpha.yaml")).unwrap();
    let problems = running
        .problems_where("the failing fetch reported", |set| {
            set.contains_key(&source("alpha"))
        })
        .await;
    let problem = &problems[&source("alpha")];
    assert!(
        problem.contains("get kubeconfig --name alpha") && problem.contains("could not locate"),
        "{problem}"
    );
    kind.two_more_listings().await;
    assert!(alpha.is_engaged(), "a failing fetch disengaged alpha");

    kind.kubeconfig("alpha", cluster.kubeconfig());
    running
        .problems_where("the fetch's problem cleared", |set| set.is_empty())
        .await;
    assert!(alpha.is_engaged());
}

#[tokio::test]
async fn a_missing_kind_is_reported_by_its_path() {
    let kind = FakeKind::new("missing");
    let missing = kind.dir.join("no-such-kind");
    let running = Running::start(kind.provider().executable(&missing));
    let problems = running
        .problems_where("the missing kind reported", |set| {
            set.contains_key(LIST_SOURCE)
        })
        .await;
    let problem = &problems[LIST_SOURCE];
    assert!(
        problem.contains(&format!("{} get clusters", missing.display()))
            && problem.contains("could not be run"),
        "{problem}"
    );
}

#[tokio::test]
async fn a_bad_kubeconfig_is_reported_under_its_cluster_and_leaves_the_others_alone() {
    let env = Envtest::start(1).await.unwrap();
    let cluster = &env.clusters()[0];
    create(cluster, "settings").await;
    let kind = FakeKind::new("bad-kubeconfig");
    kind.kubeconfig("good", cluster.kubeconfig());
    kind.kubeconfig("fine", cluster.kubeconfig());
    kind.kubeconfig("insecure", &insecure(cluster.kubeconfig()));
    kind.write(
        "broken.yaml",
        "users:\n- name: u\n  user:\n    token: \"SECRET-TOKEN\n",
    );
    kind.list(&["broken", "fine", "good", "insecure", "missing"]);

    let mut running = Running::start(kind.provider());
    let problems = running
        .problems_where("three clusters reported", |set| set.len() == 3)
        .await;
    for (name, says) in [
        ("broken", "not a kubeconfig"),
        ("insecure", "insecure-skip-tls-verify"),
        ("missing", "could not locate any control plane nodes"),
    ] {
        let problem = problems
            .get(&source(name))
            .unwrap_or_else(|| panic!("{name} not reported: {problems:?}"));
        assert!(problem.contains(says), "{name}: {problem}");
    }
    for problem in problems.values() {
        assert!(
            !problem.contains("SECRET-TOKEN"),
            "a secret leaked: {problem}"
        );
    }
    running
        .reconciled(&[("good", "settings"), ("fine", "settings")])
        .await;
    assert_eq!(running.names(), ["fine", "good"]);
    let fine = running.fleet.get("fine").unwrap();

    // good's kubeconfig turns into one the policy refuses: it leaves.
    kind.kubeconfig("good", &insecure(cluster.kubeconfig()));
    running
        .problems_where("good's refused kubeconfig reported", |set| {
            set.get(&source("good"))
                .is_some_and(|p| p.contains("insecure-skip-tls-verify"))
        })
        .await;
    eventually("good disengaged", || running.fleet.get("good").is_none()).await;

    // A cluster that is gone takes its problem along.
    kind.list(&["fine", "good", "insecure", "missing"]);
    running
        .problems_where("broken's problem cleared", |set| {
            !set.contains_key(&source("broken"))
        })
        .await;
    assert!(fine.is_engaged(), "the others' trouble touched fine");
    assert_eq!(running.names(), ["fine"]);
}

#[tokio::test]
async fn a_changed_kubeconfig_engages_the_cluster_again() {
    let env = Envtest::start(2).await.unwrap();
    let (first, second) = (&env.clusters()[0], &env.clusters()[1]);
    create(first, "first-only").await;
    create(second, "second-only").await;
    let kind = FakeKind::new("changed");
    kind.kubeconfig("moving", first.kubeconfig());
    kind.list(&["moving"]);

    let mut running = Running::start(kind.provider());
    running.reconciled(&[("moving", "first-only")]).await;
    let before = running.fleet.get("moving").unwrap();

    // Deleted and created again: the same name, another server.
    kind.kubeconfig("moving", second.kubeconfig());
    running.reconciled(&[("moving", "second-only")]).await;
    assert!(!before.is_engaged(), "the old cluster was replaced");
    assert!(running.fleet.get("moving").is_some_and(|c| c.is_engaged()));
    assert!(running.problems.current().is_empty());
}

#[tokio::test]
async fn a_failing_credential_plugin_is_reported_without_its_secrets() {
    const SECRETS: [&str; 3] = ["out-SECRET-7120", "arg-SECRET-3391", "env-SECRET-5807"];
    let kind = FakeKind::new("plugin");
    // kind's kubeconfigs have no plugin, but whatever `kind` prints is judged.
    let kubeconfig = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{ "name": "kind-plugin", "cluster": { "server": "https://127.0.0.1:1" } }],
        "users": [{ "name": "kind-plugin", "user": { "exec": {
            "apiVersion": "client.authentication.k8s.io/v1",
            "command": "sh",
            "args": ["-c", "echo out-SECRET-7120; echo $PASSWORD >&2; exit 1", "arg-SECRET-3391"],
            "env": [{ "name": "PASSWORD", "value": "env-SECRET-5807" }],
            "interactiveMode": "Never",
        }}}],
        "contexts": [{ "name": "kind-plugin", "context": { "cluster": "kind-plugin", "user": "kind-plugin" } }],
        "current-context": "kind-plugin",
    });
    kind.write("plugin.yaml", &kubeconfig.to_string());
    kind.list(&["plugin"]);

    let running = Running::start(
        kind.provider()
            .policy(KubeconfigPolicy::default().allow_exec()),
    );
    let problems = running
        .problems_where("the plugin's cluster reported", |set| {
            set.contains_key(&source("plugin"))
        })
        .await;
    let problem = &problems[&source("plugin")];
    assert!(
        // Under its source's name; the message says what is wrong.
        !problem.contains(&source("plugin")) && problem.contains("credentials"),
        "{problem}"
    );
    let everything = format!("{problems:?} {:?}", running.problems);
    for secret in SECRETS {
        assert!(
            !everything.contains(secret),
            "a secret leaked: {everything}"
        );
    }
    assert!(running.fleet.clusters().is_empty());
}

#[tokio::test]
async fn a_hanging_fetch_delays_no_other_cluster() {
    const HANG: u32 = 20;
    // Well below HANG: what a cluster waiting for the hung fetch would take.
    const SOON: Duration = Duration::from_secs(8);
    let env = Envtest::start(1).await.unwrap();
    let cluster = &env.clusters()[0];
    let kind = FakeKind::new("hanging");
    for name in ["a", "b", "c"] {
        kind.kubeconfig(name, cluster.kubeconfig());
    }
    kind.slow("a", HANG);
    kind.list(&["a", "b", "c"]);

    let running = Running::start(kind.provider());
    within(SOON, "b and c engaged while a's fetch hangs", || {
        running.names() == ["b", "c"]
    })
    .await;
    let c = running.fleet.get("c").unwrap();
    // The listings go on, and a's fetch is not started again while it runs.
    kind.two_more_listings().await;
    assert_eq!(kind.fetches("a"), 1, "{:?}", kind.calls());
    assert!(running.problems.current().is_empty());

    // c goes while a's fetch still hangs: c leaves at once, and the fetch
    // of a, which goes too, is stopped along with what it runs.
    let hung = kind.hung("a").expect("a's fetch hangs");
    kind.list(&["b"]);
    within(SOON, "c disengaged while a's fetch hangs", || {
        !c.is_engaged()
    })
    .await;
    assert_eq!(running.names(), ["b"]);
    within(SOON, "a's hung fetch stopped", || !alive(hung)).await;
}

#[tokio::test]
async fn an_engaged_cluster_is_not_asked_for_its_kubeconfig_on_every_listing() {
    let env = Envtest::start(1).await.unwrap();
    let cluster = &env.clusters()[0];
    let kind = FakeKind::new("refresh");
    kind.kubeconfig("steady", cluster.kubeconfig());
    kind.list(&["steady"]);

    let running = Running::start(kind.provider_with_default_refresh());
    eventually("steady engaged", || running.fleet.get("steady").is_some()).await;
    for _ in 0..3 {
        kind.two_more_listings().await;
    }
    assert_eq!(kind.fetches("steady"), 1, "{:?}", kind.calls());

    // A cluster whose fetch fails is asked again on the next listing.
    kind.list(&["steady", "late"]);
    running
        .problems_where("late's missing kubeconfig reported", |set| {
            set.contains_key(&source("late"))
        })
        .await;
    let fetched = kind.fetches("late");
    kind.kubeconfig("late", cluster.kubeconfig());
    eventually("late engaged", || running.fleet.get("late").is_some()).await;
    assert!(kind.fetches("late") > fetched);
    assert!(running.problems.current().is_empty());
}

#[tokio::test]
async fn a_command_that_is_no_longer_awaited_is_killed_with_its_children() {
    let kind = FakeKind::new("children");
    kind.slow("stuck", 60);
    kind.list(&["stuck"]);

    let running = Running::start(kind.provider());
    let mut hung = None;
    eventually("stuck's fetch hangs", || {
        hung = kind.hung("stuck");
        hung.is_some()
    })
    .await;
    let hung = hung.unwrap();
    assert!(alive(hung));
    // Dropping the provider drops its fetch: `kind` is killed, and so is the
    // process it waits for.
    drop(running);
    within(Duration::from_secs(10), "the hung child killed", || {
        !alive(hung)
    })
    .await;
}

/// Where the default `kind`, found on `PATH`, is tried: in a run of this
/// test binary of its own, whose `PATH` starts with the script's directory.
const ON_PATH: &str = "KUBE_MULTICLUSTER_KIND_TEST_DIR";

#[tokio::test]
async fn by_default_the_kind_on_path_is_run() {
    let env = Envtest::start(1).await.unwrap();
    let kind = FakeKind::new("on-path");
    kind.kubeconfig("dev", env.clusters()[0].kubeconfig());
    kind.list(&["dev"]);
    let path = format!(
        "{}:{}",
        kind.dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let run = tokio::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "the_kind_on_path_engages_its_clusters",
            "--ignored",
            "--nocapture",
        ])
        .env("PATH", path)
        .env(ON_PATH, &kind.dir)
        .output()
        .await
        .unwrap();
    let said = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success() && said.contains("1 passed"),
        "{said}{}",
        String::from_utf8_lossy(&run.stderr)
    );
}

/// Run by `by_default_the_kind_on_path_is_run` in a process of its own.
#[tokio::test]
#[ignore = "run by by_default_the_kind_on_path_is_run, with its PATH"]
async fn the_kind_on_path_engages_its_clusters() {
    let dir = std::env::var(ON_PATH).expect("run by by_default_the_kind_on_path_is_run");
    let path = std::env::var("PATH").unwrap();
    assert!(path.starts_with(&dir), "the script is first on PATH");
    let fleet = Fleet::new();
    tokio::spawn({
        let fleet = fleet.clone();
        async move { fleet.run(KindProvider::new()).await }
    });
    tokio::time::timeout(PATIENCE, async {
        while fleet.get("dev").is_none() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the cluster of the kind on PATH engaged");
    // And it is the cluster the script named.
    let client = fleet.get("dev").unwrap().client();
    Api::<ConfigMap>::default_namespaced(client)
        .list(&Default::default())
        .await
        .unwrap();
}
