//! The hub pushes ConfigMaps labelled `kube-multicluster.dev/sync=true` to every
//! provider cluster, and a second controller, in each of those clusters,
//! reverts drift.
//!
//! `cargo run --example sync-local-to-remote` starts a local fleet (a hub and
//! two provider clusters, real API servers): a labelled ConfigMap reaches
//! both, a copy edited by hand is put back, an update propagates, and
//! deleting the hub's ConfigMap deletes the copies.

#[path = "../support/mod.rs"]
mod support;
mod sync;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api,
    api::{DeleteParams, ObjectMeta, Patch, PatchParams, PostParams},
};
use kube_multicluster::envtest::Envtest;
use kube_multicluster::{Fleet, provider::ProgrammaticProvider};
use serde_json::json;
use tower::BoxError;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    support::logging();
    let env = Envtest::start(3).await?;
    let fleet = Fleet::new();
    fleet.engage(sync::hub(), env.clusters()[0].client());
    let (provider, remotes) = ProgrammaticProvider::new();
    tokio::spawn({
        let fleet = fleet.clone();
        async move { fleet.run(provider).await }
    });
    remotes.engage("edge-1", env.clusters()[1].client());
    remotes.engage("edge-2", env.clusters()[2].client());
    let controllers = tokio::spawn(sync::run(fleet.clone()));

    let hub = Api::<ConfigMap>::namespaced(env.clusters()[0].client(), "default");
    let settings = ConfigMap {
        metadata: ObjectMeta {
            name: Some("settings".into()),
            labels: Some([(sync::SYNC.to_owned(), "true".to_owned())].into()),
            ..ObjectMeta::default()
        },
        data: Some([("mode".to_owned(), "fast".to_owned())].into()),
        ..ConfigMap::default()
    };
    hub.create(&PostParams::default(), &settings).await?;
    let remote: Vec<Api<ConfigMap>> = env.clusters()[1..]
        .iter()
        .map(|c| Api::namespaced(c.client(), "default"))
        .collect();
    holds(&remote, Some("fast"), "pushed to edge-1 and edge-2").await?;

    remote[1]
        .patch(
            "settings",
            &PatchParams::default(),
            &Patch::Merge(json!({ "data": { "mode": "drifted" } })),
        )
        .await?;
    holds(&remote, Some("fast"), "the drift in edge-2 was reverted").await?;

    hub.patch(
        "settings",
        &PatchParams::default(),
        &Patch::Merge(json!({ "data": { "mode": "safe" } })),
    )
    .await?;
    holds(&remote, Some("safe"), "the update reached both").await?;

    hub.delete("settings", &DeleteParams::default()).await?;
    holds(&remote, None, "the copies went with the hub's ConfigMap").await?;

    controllers.abort();
    for cluster in fleet.clusters() {
        fleet.disengage(cluster.name());
    }
    Ok(())
}

/// Waits until every remote copy's `mode` is `mode` (or the copy is gone).
async fn holds(remote: &[Api<ConfigMap>], mode: Option<&str>, what: &str) -> Result<(), BoxError> {
    support::wait_for(what, || async {
        for api in remote {
            let found = api.get_opt("settings").await?;
            let held = found
                .and_then(|c| c.data)
                .and_then(|d| d.get("mode").cloned());
            if held.as_deref() != mode {
                return Ok(false);
            }
        }
        Ok(true)
    })
    .await?;
    tracing::info!("{what}");
    Ok(())
}
