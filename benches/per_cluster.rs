//! Per-cluster cost: memory, tokio tasks and time to sync when engaging many
//! clusters that each watch ConfigMaps.
//!
//! ```text
//! cargo bench --bench per_cluster              # 100, then 1000 clusters
//! cargo bench --bench per_cluster -- 250       # other counts
//! ```
//!
//! Every cluster has a distinct name and its own `kube::Client` (its own
//! connection), all pointing at one real API server (envtest) holding 20
//! ConfigMaps. One controller watches ConfigMaps in every cluster. Measured:
//! the process's resident memory and live tokio tasks before and after, per
//! cluster, and the time from the first engage until the controller serves
//! every cluster (its watch there synced).

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api, Client, Config,
    api::{ObjectMeta, PostParams},
    config::KubeConfigOptions,
    runtime::watcher,
};
use kube_fleet::{Action, Controller, Fleet, McRequest, provider::ProgrammaticProvider};
use kube_fleet_envtest::Envtest;
use tower::{BoxError, service_fn};

mod os;

use os::resident_bytes;

fn alive_tasks() -> usize {
    tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks()
}

async fn measure(config: &Config, clusters: usize) -> Result<(), BoxError> {
    let fleet = Fleet::new();
    let (provider, handle) = ProgrammaticProvider::new();
    let provider_task = tokio::spawn({
        let fleet = fleet.clone();
        async move { fleet.run(provider).await }
    });
    let controller = Controller::<ConfigMap>::new(&fleet, watcher::Config::default());
    let status = controller.status();
    let controller = tokio::spawn(controller.run_raw(service_fn(|_: McRequest| async {
        Ok::<_, BoxError>(Action::await_change())
    })));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (memory_before, tasks_before) = (resident_bytes(), alive_tasks());

    let began = Instant::now();
    for i in 0..clusters {
        handle.add(format!("cluster-{i:04}"), Client::try_from(config.clone())?);
    }
    while status.clusters().iter().filter(|c| c.serving).count() < clusters {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let synced = began.elapsed();
    // Let the initial reconciles drain before reading memory and tasks.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (memory_after, tasks_after) = (resident_bytes(), alive_tasks());

    let per = |delta: f64| delta / clusters as f64;
    println!(
        "{clusters} clusters: all synced in {synced:.2?}; memory +{:.1} MiB ({:.1} KiB per cluster); \
         tokio tasks +{} ({:.2} per cluster)",
        (memory_after as f64 - memory_before as f64) / 1048576.0,
        per(memory_after as f64 - memory_before as f64) / 1024.0,
        tasks_after as i64 - tasks_before as i64,
        per(tasks_after as f64 - tasks_before as f64),
    );
    controller.abort();
    provider_task.abort();
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let counts: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let counts = if counts.is_empty() {
        vec![100, 1000]
    } else {
        counts
    };

    let env = Envtest::start(1).await?;
    let cluster = &env.clusters()[0];
    let api = Api::<ConfigMap>::default_namespaced(cluster.client());
    for i in 0..20 {
        let config_map = ConfigMap {
            metadata: ObjectMeta {
                name: Some(format!("cm-{i}")),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        };
        api.create(&PostParams::default(), &config_map).await?;
    }
    let config =
        // Past envtest's fault proxy, which would count its own tasks and buffers here.
        Config::from_custom_kubeconfig(cluster.direct_kubeconfig(), &KubeConfigOptions::default())
            .await?;
    for clusters in counts {
        measure(&config, clusters).await?;
    }
    Ok(())
}
