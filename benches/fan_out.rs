//! Fan-out memory: what a subscriber that reads slowly costs while a large
//! list and a wave of updates go by.
//!
//! ```text
//! cargo bench --bench fan_out            # 100,000 ConfigMaps
//! cargo bench --bench fan_out -- 20000   # another count
//! ```
//!
//! One real API server (envtest) holds N ConfigMaps of about 200 bytes of
//! data each. One shared watch lists them with one subscriber that reads
//! nothing until the end; then every object is updated once. Resident memory
//! of this process (`VmRSS`) is read before the watch starts, once the list
//! is in the store, after the updates, and after the subscriber has read
//! everything; `VmHWM` gives the peak.

use std::time::{Duration, Instant};

use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api,
    api::{ObjectMeta, Patch, PatchParams, PostParams},
    runtime::watcher,
};
use kube_multicluster::Cluster;
use kube_multicluster::envtest::Envtest;
use tower::BoxError;

mod os;
mod setup;

use os::status_kib;

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let n: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(100_000);
    let env = Envtest::start(1).await?;
    let client = kube::Client::try_from(setup::direct_config(&env.clusters()[0]).await?)?;
    let api = Api::<ConfigMap>::namespaced(client.clone(), "default");

    let began = Instant::now();
    stream::iter(0..n)
        .map(|i| {
            let api = api.clone();
            async move {
                let config_map = ConfigMap {
                    metadata: ObjectMeta {
                        name: Some(format!("cm-{i:06}")),
                        ..ObjectMeta::default()
                    },
                    data: Some([("value".to_owned(), "x".repeat(200))].into()),
                    ..ConfigMap::default()
                };
                api.create(&PostParams::default(), &config_map).await
            }
        })
        .buffer_unordered(64)
        .for_each(|created| async {
            created.expect("create");
        })
        .await;
    eprintln!("created {n} ConfigMaps in {:.1?}", began.elapsed());
    tokio::time::sleep(Duration::from_secs(1)).await;
    let baseline = status_kib("VmRSS:");

    let cluster = Cluster::new("bench", client.clone());
    let watch = cluster
        .cache()
        .watch::<ConfigMap>(&watcher::Config::default());
    let mut slow = watch.subscribe();
    watch.synced().await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let listed = status_kib("VmRSS:");

    let began = Instant::now();
    stream::iter(0..n)
        .map(|i| {
            let api = api.clone();
            async move {
                let patch = serde_json::json!({ "data": { "value": "y".repeat(200) } });
                api.patch(
                    &format!("cm-{i:06}"),
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await
            }
        })
        .buffer_unordered(64)
        .for_each(|patched| async {
            patched.expect("patch");
        })
        .await;
    // Until the watch has seen every update.
    while watch.store().state().iter().any(|cm| {
        cm.data
            .as_ref()
            .and_then(|d| d.get("value"))
            .is_some_and(|v| v.starts_with('x'))
    }) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!("updated {n} ConfigMaps in {:.1?}", began.elapsed());
    let updated = status_kib("VmRSS:");

    let mut read = 0usize;
    while tokio::time::timeout(Duration::from_secs(1), slow.next())
        .await
        .ok()
        .flatten()
        .is_some()
    {
        read += 1;
    }
    let drained = status_kib("VmRSS:");
    let peak = status_kib("VmHWM:");
    println!(
        "{n} objects, one subscriber reading nothing until the end: \
         listed +{:.1} MiB, after one update each +{:.1} MiB, \
         after reading ({read} changes) +{:.1} MiB; peak {:.1} MiB (baseline {:.1} MiB)",
        mib(listed - baseline),
        mib(updated - baseline),
        mib(drained.saturating_sub(baseline)),
        mib(peak),
        mib(baseline),
    );
    Ok(())
}
