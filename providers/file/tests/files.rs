//! Kubeconfig files written, rewritten, broken and deleted while the fleet
//! runs, on real API servers.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api,
    api::{ObjectMeta, PostParams},
    config::Kubeconfig,
    runtime::watcher,
};
use kube_multicluster::{Action, Controller, Fleet, McRequest, ObjectRequest, provider::Problems};
use kube_multicluster_envtest::{Envtest, TestCluster};
use kube_multicluster_provider_file::FileProvider;
use tokio::sync::mpsc;
use tower::BoxError;

const PATIENCE: Duration = Duration::from_secs(30);

/// A directory of its own for a test, removed when dropped.
struct Dir(PathBuf);

impl Dir {
    /// A directory of its own: tests run at once in one process, and two
    /// that shared a directory would move each other's files.
    fn new(test: &str) -> Self {
        static MADE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let made = MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!(
            "file-provider-{test}-{}-{made}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `cluster`'s kubeconfig with its one context named `context`.
fn kubeconfig(cluster: &TestCluster, context: &str) -> Kubeconfig {
    let mut kubeconfig = cluster.kubeconfig().clone();
    kubeconfig.contexts[0].name = context.to_owned();
    kubeconfig.current_context = Some(context.to_owned());
    kubeconfig
}

/// Writes `kubeconfig` to `path` as kubectl and editors do: whole, by a
/// rename, so that no reader sees half of it.
fn write(path: &Path, kubeconfig: &Kubeconfig) {
    write_text(path, &serde_json::to_string(kubeconfig).unwrap());
}

fn write_text(path: &Path, text: &str) {
    let partial = path.with_extension("partial");
    std::fs::write(&partial, text).unwrap();
    std::fs::rename(&partial, path).unwrap();
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

/// Runs `provider` in a fleet with a controller of ConfigMaps, whose
/// reconciles come out of the receiver.
fn run(provider: FileProvider) -> (Fleet, mpsc::UnboundedReceiver<McRequest>) {
    let fleet = Fleet::new();
    let (tx, rx) = mpsc::unbounded_channel();
    let controller = Controller::<ConfigMap>::new(&fleet, watcher::Config::default());
    tokio::spawn(controller.run(tower::service_fn(
        move |request: ObjectRequest<ConfigMap>| {
            let _ = tx.send(request.request);
            async { Ok::<_, BoxError>(Action::await_change()) }
        },
    )));
    tokio::spawn({
        let fleet = fleet.clone();
        async move { fleet.run(provider).await }
    });
    (fleet, rx)
}

/// Forgets the reconciles so far.
fn drain(rx: &mut mpsc::UnboundedReceiver<McRequest>) {
    while rx.try_recv().is_ok() {}
}

async fn reconciled(rx: &mut mpsc::UnboundedReceiver<McRequest>, cluster: &str, name: &str) {
    tokio::time::timeout(PATIENCE, async {
        while let Some(request) = rx.recv().await {
            if request.cluster.as_ref() == cluster && request.name == name {
                return;
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{cluster}/{name} not reconciled within {PATIENCE:?}"));
}

/// Waits until the fleet's clusters are `names`, sorted.
async fn clusters_are(fleet: &Fleet, names: &[&str]) {
    let mut names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
    names.sort();
    let now = || {
        let mut now: Vec<String> = fleet
            .clusters()
            .iter()
            .map(|c| c.name().to_string())
            .collect();
        now.sort();
        now
    };
    tokio::time::timeout(PATIENCE, async {
        while now() != names {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("clusters are {:?}, not {names:?}", now()));
}

async fn problem_of(problems: &Problems, source: &str) -> String {
    tokio::time::timeout(PATIENCE, problems.wait_for(|set| set.contains_key(source)))
        .await
        .unwrap_or_else(|_| panic!("no problem of {source} in {:?}", problems.current()))
        .remove(source)
        .unwrap()
}

fn name(file: &Path, context: &str) -> String {
    format!("{}+{context}", file.display())
}

#[tokio::test]
async fn files_written_rewritten_and_deleted_engage_re_engage_and_disengage() {
    let env = Envtest::start(2).await.unwrap();
    let (east, west) = (&env.clusters()[0], &env.clusters()[1]);
    create(east, "on-east").await;
    create(west, "on-west").await;
    let dir = Dir::new("changes");
    let (east_file, west_file) = (dir.path("east.kubeconfig"), dir.path("west.kubeconfig"));
    write(&east_file, &kubeconfig(east, "admin"));
    // Not a kubeconfig's name: not read.
    write(&dir.path("notes.txt"), &kubeconfig(west, "admin"));

    let provider = FileProvider::new([&dir.0]).debounce(Duration::from_millis(20));
    let problems = provider.problems();
    let (fleet, mut reconciles) = run(provider);
    let east_name = name(&east_file, "admin");
    reconciled(&mut reconciles, &east_name, "on-east").await;
    clusters_are(&fleet, &[&east_name]).await;

    // Added.
    write(&west_file, &kubeconfig(west, "admin"));
    let west_name = name(&west_file, "admin");
    reconciled(&mut reconciles, &west_name, "on-west").await;

    // Rewritten to point at the other server: the same name, re-engaged.
    drain(&mut reconciles);
    write(&east_file, &kubeconfig(west, "admin"));
    reconciled(&mut reconciles, &east_name, "on-west").await;

    // Half written: reported, and the cluster stays.
    write_text(&east_file, "clusters: [ {name: x, cluster: {server: ");
    let problem = problem_of(&problems, &east_file.display().to_string()).await;
    assert!(problem.contains("not a kubeconfig"), "{problem}");
    assert!(fleet.get(east_name.as_str()).is_some());
    drain(&mut reconciles);
    write(&east_file, &kubeconfig(east, "admin"));
    reconciled(&mut reconciles, &east_name, "on-east").await;
    assert!(problems.current().is_empty(), "{:?}", problems.current());

    // A second context in a file: a second cluster; a context removed: gone.
    let mut two = kubeconfig(east, "admin");
    let mut other = two.contexts[0].clone();
    other.name = "second".to_owned();
    two.contexts.push(other);
    write(&east_file, &two);
    let second = name(&east_file, "second");
    reconciled(&mut reconciles, &second, "on-east").await;
    clusters_are(&fleet, &[&east_name, &second, &west_name]).await;
    write(&east_file, &kubeconfig(east, "second"));
    clusters_are(&fleet, &[&second, &west_name]).await;

    // Deleted.
    std::fs::remove_file(&west_file).unwrap();
    clusters_are(&fleet, &[&second]).await;
}

#[tokio::test]
async fn a_file_that_does_not_exist_yet_is_picked_up_when_written() {
    let env = Envtest::start(1).await.unwrap();
    let east = &env.clusters()[0];
    create(east, "on-east").await;
    let dir = Dir::new("later");
    // A file in a directory that is not there yet, and a glob.
    let file = dir.path("later/fleet.yaml");
    let globbed = dir.path("east-1.yaml");
    let provider = FileProvider::new([file.clone(), dir.path("east-*.yaml")])
        .debounce(Duration::from_millis(20));
    let (fleet, mut reconciles) = run(provider);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(fleet.clusters().is_empty());
    write(&globbed, &kubeconfig(east, "glob"));
    reconciled(&mut reconciles, &name(&globbed, "glob"), "on-east").await;
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    write(&file, &kubeconfig(east, "admin"));
    reconciled(&mut reconciles, &name(&file, "admin"), "on-east").await;
}

#[tokio::test]
async fn unsafe_and_broken_contexts_are_refused_with_their_source_and_others_run() {
    let env = Envtest::start(1).await.unwrap();
    let east = &env.clusters()[0];
    create(east, "on-east").await;
    let dir = Dir::new("refused");
    let file = dir.path("fleet.kubeconfig");
    let mut kubeconfig = kubeconfig(east, "good");
    let good = kubeconfig.contexts[0].clone();
    let mut insecure_cluster = kubeconfig.clusters[0].clone();
    insecure_cluster.name = "insecure".to_owned();
    let cluster = insecure_cluster.cluster.as_mut().unwrap();
    cluster.insecure_skip_tls_verify = Some(true);
    cluster.certificate_authority_data = None;
    kubeconfig.clusters.push(insecure_cluster);
    let mut insecure = good.clone();
    insecure.name = "insecure".to_owned();
    insecure.context.as_mut().unwrap().cluster = "insecure".to_owned();
    let mut dangling = good.clone();
    dangling.name = "dangling".to_owned();
    dangling.context.as_mut().unwrap().cluster = "nowhere".to_owned();
    kubeconfig.contexts.extend([insecure, dangling]);
    write(&file, &kubeconfig);

    let provider = FileProvider::new([&file]).debounce(Duration::from_millis(20));
    let problems = provider.problems();
    let (fleet, mut reconciles) = run(provider);
    reconciled(&mut reconciles, &name(&file, "good"), "on-east").await;
    let refused = problem_of(&problems, &name(&file, "insecure")).await;
    assert!(refused.contains("insecure-skip-tls-verify"), "{refused}");
    // The key names the file and context; the message says what is wrong.
    assert!(!refused.contains(&file.display().to_string()), "{refused}");
    assert!(
        refused.starts_with("context \"insecure\" refused"),
        "{refused}"
    );
    let dangling = problem_of(&problems, &name(&file, "dangling")).await;
    assert!(dangling.contains("cluster \"nowhere\""), "{dangling}");
    clusters_are(&fleet, &[&name(&file, "good")]).await;

    // Allowed by the user: the insecure context engages.
    let opted_in = FileProvider::new([&file]).policy(
        kube_multicluster::provider::kubeconfig::KubeconfigPolicy::default()
            .allow_insecure_skip_tls_verify(),
    );
    let (fleet, mut reconciles) = run(opted_in);
    reconciled(&mut reconciles, &name(&file, "insecure"), "on-east").await;
    clusters_are(&fleet, &[&name(&file, "good"), &name(&file, "insecure")]).await;
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
async fn no_token_or_key_reaches_logs_errors_or_debug_output() {
    const TOKEN: &str = "tok-SECRET-8812";
    const ARGUMENT: &str = "arg-SECRET-4471";
    let env = Envtest::start(1).await.unwrap();
    let east = &env.clusters()[0];
    let (logs, _guard) = capture_logs();
    let dir = Dir::new("secrets");
    let file = dir.path("fleet.kubeconfig");
    let mut kubeconfig = kubeconfig(east, "good");
    let written = serde_json::to_value(&kubeconfig).unwrap();
    let key = written["users"][0]["user"]["client-key-data"]
        .as_str()
        .expect("a client key")
        .to_owned();
    // A user with a token the API server does not know, and one with an
    // exec plugin whose arguments hold a secret.
    let mut token = kubeconfig.auth_infos[0].clone();
    token.name = "token".to_owned();
    token.auth_info = Some(kube::config::AuthInfo {
        token: Some(TOKEN.to_owned().into()),
        ..Default::default()
    });
    let mut exec = kubeconfig.auth_infos[0].clone();
    exec.name = "exec".to_owned();
    exec.auth_info = Some(
        serde_json::from_value(serde_json::json!({
            "exec": {
                "apiVersion": "client.authentication.k8s.io/v1",
                "command": "login",
                "args": ["--password", ARGUMENT],
                "env": [{"name": "PASSWORD", "value": ARGUMENT}]
            }
        }))
        .unwrap(),
    );
    kubeconfig.auth_infos.extend([token, exec]);
    for user in ["token", "exec"] {
        let mut context = kubeconfig.contexts[0].clone();
        context.name = user.to_owned();
        context.context.as_mut().unwrap().user = Some(user.to_owned());
        kubeconfig.contexts.push(context);
    }
    write(&file, &kubeconfig);

    let provider = FileProvider::new([&file]).debounce(Duration::from_millis(20));
    let problems = provider.problems();
    let (fleet, _reconciles) = run(provider);
    let refused = problem_of(&problems, &name(&file, "exec")).await;
    assert!(refused.contains("\"login\""), "{refused}");
    clusters_are(&fleet, &[&name(&file, "good"), &name(&file, "token")]).await;
    // The token's cluster fails at the API server, and that is logged.
    let read = || String::from_utf8(logs.lock().unwrap().clone()).unwrap();
    tokio::time::timeout(PATIENCE, async {
        while !read().contains("Unauthorized") {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the token's cluster was refused by the API server");
    let logs = read();
    assert!(logs.contains("fleet.kubeconfig"), "nothing was logged");
    let debug = format!("{problems:?} {:?}", fleet.clusters());
    for secret in [TOKEN, ARGUMENT, &key] {
        assert!(!logs.contains(secret), "a secret was logged");
        assert!(!debug.contains(secret), "a secret is in Debug output");
        assert!(
            !problems.current().values().any(|p| p.contains(secret)),
            "a secret is in a problem"
        );
    }
}

#[tokio::test]
async fn a_file_read_while_it_is_being_written_keeps_its_clusters() {
    let env = Envtest::start(1).await.unwrap();
    let east = &env.clusters()[0];
    create(east, "on-east").await;
    let dir = Dir::new("half-written");
    let file = dir.path("fleet.kubeconfig");
    let whole = kubeconfig(east, "admin");
    write(&file, &whole);
    let provider = FileProvider::new([&dir.0]).debounce(Duration::from_millis(200));
    let (fleet, mut reconciles) = run(provider);
    let name = name(&file, "admin");
    reconciled(&mut reconciles, &name, "on-east").await;
    let mut changes = fleet.subscribe().events;

    // Another file changes, so the directory is read 200 ms later; the
    // kubeconfig is caught half written then (written in place, as
    // client-go does: it parses, but its user is not there yet), and is
    // whole again 100 ms later.
    std::fs::write(dir.path("notes.txt"), "x").unwrap();
    tokio::time::sleep(Duration::from_millis(150)).await;
    let mut half = whole.clone();
    half.auth_infos.clear();
    std::fs::write(&file, serde_json::to_string(&half).unwrap()).unwrap();
    tokio::time::sleep(Duration::from_millis(110)).await;
    std::fs::write(&file, serde_json::to_string(&whole).unwrap()).unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    if let Ok(change) = changes.try_recv() {
        panic!("the cluster changed: {change:?}");
    }
    assert!(fleet.get(name.as_str()).is_some());
}

#[tokio::test]
async fn a_source_that_cannot_be_looked_at_keeps_its_clusters() {
    cannot_be_looked_at(false).await;
}

#[tokio::test]
async fn a_glob_whose_directory_cannot_be_looked_at_keeps_its_clusters() {
    cannot_be_looked_at(true).await;
}

/// A directory source, or a glob in it, whose directory becomes a link to
/// itself, then goes.
async fn cannot_be_looked_at(glob: bool) {
    let env = Envtest::start(1).await.unwrap();
    let east = &env.clusters()[0];
    create(east, "on-east").await;
    let dir = Dir::new("unreadable");
    let source = dir.path("fleet");
    std::fs::create_dir_all(&source).unwrap();
    let file = source.join("east.kubeconfig");
    write(&file, &kubeconfig(east, "admin"));
    let watched = if glob {
        source.join("*.kubeconfig")
    } else {
        source.clone()
    };
    let provider = FileProvider::new([&watched]).debounce(Duration::from_millis(20));
    let problems = provider.problems();
    let (fleet, mut reconciles) = run(provider);
    let name = name(&file, "admin");
    reconciled(&mut reconciles, &name, "on-east").await;
    let mut changes = fleet.subscribe().events;

    // The directory becomes a link to itself: it cannot be looked at, which
    // is not the same as gone.
    std::fs::rename(&source, dir.path("moved")).unwrap();
    std::os::unix::fs::symlink(&source, &source).unwrap();
    let problem = problem_of(&problems, &source.display().to_string()).await;
    assert!(problem.contains("cannot be looked at"), "{problem}");
    if let Ok(change) = changes.try_recv() {
        panic!("the cluster changed: {change:?}");
    }
    assert!(fleet.get(name.as_str()).is_some());

    // Gone for good: its cluster goes, and so does the problem.
    std::fs::remove_file(&source).unwrap();
    clusters_are(&fleet, &[]).await;
    assert!(problems.current().is_empty(), "{:?}", problems.current());
}
