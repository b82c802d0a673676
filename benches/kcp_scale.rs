//! kcp at scale: N workspaces binding one APIExport, engaged through the
//! kcp provider, one controller watching ConfigMaps (the export's claim)
//! in every one of them.
//!
//! ```text
//! cargo bench --bench kcp_scale              # 1,000 workspaces
//! cargo bench --bench kcp_scale -- 200       # another count
//! cargo bench --bench kcp_scale -- 200 --idle  # stop once the idle clusters are measured
//! ```
//!
//! A kcp started by the harness (built once, cached) gets N workspaces,
//! each binding the example export and accepting its claim on ConfigMaps,
//! and none holding a labelled ConfigMap (each has kcp's own
//! `kube-root-ca.crt`, which the controller's selector leaves out). The
//! controller watches ConfigMaps labelled `bench=kcp` in all namespaces.
//! The provider engages one of them first:
//! the process's resident memory is read once the controller serves it.
//! Then the rest are engaged (the provider sees every binding), and the
//! memory is read again once the controller serves all N: the cost per
//! idle logical cluster is the difference divided by N − 1. Then each
//! workspace gets one ConfigMap, and the bench waits until every one is
//! reconciled in its own logical cluster (the request's cluster is the
//! object's `kcp.io/cluster`), reading the memory a third time: the cost
//! per cached object. Reported beside them: the watches of ConfigMaps kcp
//! serves for the fleet (its own `apiserver_longrunning_requests`, before
//! the provider starts and after), the watches the provider's shard caches
//! hold, the time to engage and serve every workspace, and this process's
//! tokio tasks.

mod os;

use std::{
    collections::HashSet,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api,
    api::{ObjectMeta, PostParams},
    runtime::watcher,
};
use kube_multicluster::{
    Action, Controller, Fleet, ObjectRequest,
    envtest::{KCP_EXAMPLE_EXPORT, Kcp},
    providers::kcp::KcpProvider,
};
use tower::{BoxError, service_fn};

/// How many workspaces are made (and bound) at once.
const AT_ONCE: usize = 24;
const PATIENCE: Duration = Duration::from_secs(900);

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let n: usize = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(1000);
    assert!(n >= 2, "at least two workspaces");
    let kcp = Kcp::start().await?;
    kcp.create_workspace("provider").await?;
    kcp.apply("root:provider", KCP_EXAMPLE_EXPORT).await?;

    // The first workspace, alone.
    let first = tenant(&kcp, 0).await?;
    let watches_before = kcp.watches_served("configmaps").await?;
    let provider = KcpProvider::new(kcp.config("root:provider").await?, "example.io")?;
    let shards = provider.shards();
    let fleet = Fleet::new();
    let served: Arc<Mutex<HashSet<String>>> = Arc::default();
    let reconciled: Arc<Mutex<HashSet<String>>> = Arc::default();
    let crossed: Arc<Mutex<Vec<String>>> = Arc::default();
    let controller =
        Controller::<ConfigMap>::new(&fleet, watcher::Config::default().labels("bench=kcp"));
    let status = controller.status();
    let (seen, wrong) = (reconciled.clone(), crossed.clone());
    tokio::spawn(
        controller.run(service_fn(move |request: ObjectRequest<ConfigMap>| {
            let (seen, wrong) = (seen.clone(), wrong.clone());
            async move {
                let Some(object) = &request.object else {
                    return Ok(Action::await_change());
                };
                let annotations = object.metadata.annotations.as_ref();
                let own = annotations.and_then(|a| a.get("kcp.io/cluster"));
                if own.map(String::as_str) != Some(request.cluster.name().as_str()) {
                    wrong
                        .lock()
                        .unwrap()
                        .push(format!("{own:?} in {}", request.cluster.name()));
                }
                seen.lock()
                    .unwrap()
                    .insert(request.cluster.name().to_string());
                Ok::<_, BoxError>(Action::await_change())
            }
        })),
    );
    tokio::spawn({
        let fleet = fleet.clone();
        async move { fleet.run(provider).await }
    });
    let serving = |want: usize| {
        let status = status.clone();
        let served = served.clone();
        async move {
            let deadline = Instant::now() + PATIENCE;
            loop {
                let now: HashSet<String> = status
                    .clusters()
                    .into_iter()
                    .filter(|c| c.serving)
                    .map(|c| c.cluster.to_string())
                    .collect();
                if now.len() >= want {
                    *served.lock().unwrap() = now;
                    return;
                }
                assert!(Instant::now() < deadline, "{} of {want} served", now.len());
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    serving(1).await;
    assert!(served.lock().unwrap().contains(&first));
    tokio::time::sleep(Duration::from_secs(2)).await;
    let one = os::resident_bytes();

    // The rest.
    let made = Instant::now();
    let clusters: Vec<String> = stream::iter(1..n)
        .map(|i| tenant(&kcp, i))
        .buffer_unordered(AT_ONCE)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<_, _>>()?;
    let making = made.elapsed();
    serving(n).await;
    let all_served = made.elapsed();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let all = os::resident_bytes();
    let watches_idle = kcp.watches_served("configmaps").await? - watches_before;
    let tasks = tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks();

    if std::env::args().any(|a| a == "--idle") {
        println!(
            "kcp {n} idle workspaces: {:.1} KiB per logical cluster, {tasks} tokio tasks",
            all.saturating_sub(one) as f64 / (n - 1) as f64 / 1024.0
        );
        return Ok(());
    }

    // One ConfigMap in each, each reconciled in its own logical cluster.
    let started = Instant::now();
    let paths: Vec<String> = (0..n).map(|i| format!("root:tenant-{i}")).collect();
    stream::iter(paths.iter())
        .map(|path| settings(&kcp, path))
        .buffer_unordered(AT_ONCE)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?;
    let deadline = Instant::now() + PATIENCE;
    while reconciled.lock().unwrap().len() < n {
        assert!(Instant::now() < deadline, "not every object reconciled");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let reconciling = started.elapsed();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let with_objects = os::resident_bytes();
    let crossed = crossed.lock().unwrap().clone();
    assert!(
        crossed.is_empty(),
        "reconciled in another logical cluster: {crossed:?}"
    );
    let watches_after = kcp.watches_served("configmaps").await? - watches_before;
    let engaged = fleet.clusters().len();
    assert_eq!(engaged, n);
    assert!(clusters.iter().all(|c| fleet.get(c.as_str()).is_some()));

    let per_cluster = all.saturating_sub(one) as f64 / (n - 1) as f64;
    let per_object = with_objects.saturating_sub(all) as f64 / n as f64;
    println!("kcp {n} workspaces binding one export, one controller of ConfigMaps");
    println!(
        "  workspaces made and bound ({AT_ONCE} at once): {:.1} s; all engaged and served {:.1} s after the first was made",
        making.as_secs_f64(),
        all_served.as_secs_f64()
    );
    println!(
        "  memory per idle logical cluster: {:.1} KiB ({} KiB resident with one, {} KiB with {n})",
        per_cluster / 1024.0,
        one / 1024,
        all / 1024
    );
    println!(
        "  one ConfigMap in each, all reconciled in their own cluster in {:.1} s: {:.1} KiB more per object",
        reconciling.as_secs_f64(),
        per_object / 1024.0
    );
    println!(
        "  watches of ConfigMaps kcp serves for the fleet: {watches_idle} idle, {watches_after} with objects \
         (a virtual workspace's watch counts twice there); the shard caches hold {}",
        shards.watch_count()
    );
    println!("  tokio tasks alive: {tasks}");
    Ok(())
}

/// Makes the workspace `tenant-<i>` and binds the example export there;
/// returns its logical cluster.
async fn tenant(kcp: &Kcp, i: usize) -> Result<String, BoxError> {
    let name = format!("tenant-{i}");
    let cluster = kcp.create_workspace(&name).await?;
    kcp.bind(
        &format!("root:{name}"),
        "root:provider",
        "example.io",
        &[("configmaps", true)],
    )
    .await?;
    Ok(cluster)
}

/// Creates the labelled ConfigMap `settings` in the workspace at `path`, once its
/// `default` namespace is there.
async fn settings(kcp: &Kcp, path: &str) -> Result<(), BoxError> {
    let api = Api::<ConfigMap>::namespaced(kcp.client(path).await?, "default");
    let config_map = ConfigMap {
        metadata: ObjectMeta {
            name: Some("settings".into()),
            labels: Some([("bench".to_owned(), "kcp".to_owned())].into()),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match api.create(&PostParams::default(), &config_map).await {
            Ok(_) => return Ok(()),
            Err(e) if Instant::now() > deadline => return Err(e.into()),
            Err(_) => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    }
}
