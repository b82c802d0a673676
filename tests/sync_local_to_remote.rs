//! The sync-local-to-remote example's two controllers on real API servers.

#[path = "../examples/sync-local-to-remote/sync.rs"]
mod sync;

use std::{future::Future, time::Duration};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api,
    api::{DeleteParams, ObjectMeta, Patch, PatchParams, PostParams},
};
use kube_fleet::{Fleet, provider::ProgrammaticProvider};
use kube_fleet_envtest::Envtest;
use serde_json::json;

async fn eventually<F, Fut>(what: &str, check: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = bool>,
{
    let waited = tokio::time::timeout(Duration::from_secs(60), async {
        while !check().await {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "timed out waiting for {what}");
}

async fn mode(api: &Api<ConfigMap>, name: &str) -> Option<String> {
    api.get_opt(name).await.unwrap()?.data?.get("mode").cloned()
}

async fn all_hold(apis: &[Api<ConfigMap>], want: Option<&str>, what: &str) {
    eventually(what, || async {
        for api in apis {
            if mode(api, "settings").await.as_deref() != want {
                return false;
            }
        }
        true
    })
    .await;
}

fn settings(mode: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some("settings".into()),
            labels: Some([(sync::SYNC.to_owned(), "true".to_owned())].into()),
            ..ObjectMeta::default()
        },
        data: Some([("mode".to_owned(), mode.to_owned())].into()),
        ..ConfigMap::default()
    }
}

#[tokio::test]
async fn labelled_config_maps_reach_every_remote_drift_is_reverted_and_deletion_follows() {
    let env = Envtest::start(4).await.unwrap();
    let fleet = Fleet::new();
    fleet.engage(sync::hub(), env.clusters()[0].client());
    let (provider, remotes) = ProgrammaticProvider::new();
    tokio::spawn({
        let fleet = fleet.clone();
        async move { fleet.run(provider).await }
    });
    // edge-1 is reached through a link, to cut the controllers off from it.
    let link = env.clusters()[1].link().unwrap();
    remotes.add("edge-1", link.client());
    remotes.add("edge-2", env.clusters()[2].client());
    let controllers = tokio::spawn(sync::run(fleet.clone()));
    let api = |i: usize| Api::<ConfigMap>::namespaced(env.clusters()[i].client(), "default");
    let hub = api(0);

    hub.create(&PostParams::default(), &settings("fast"))
        .await
        .unwrap();
    all_hold(&[api(1), api(2)], Some("fast"), "the copies").await;
    // The hub's ConfigMap carries the finalizer that deletes the copies.
    let source = hub.get("settings").await.unwrap();
    assert!(
        source
            .metadata
            .finalizers
            .unwrap_or_default()
            .contains(&sync::FINALIZER.to_owned())
    );

    // Drift in one remote is reverted there.
    api(2)
        .patch(
            "settings",
            &PatchParams::default(),
            &Patch::Merge(json!({ "data": { "mode": "drifted" } })),
        )
        .await
        .unwrap();
    all_hold(&[api(2)], Some("fast"), "the drift reverted").await;

    // Updates propagate; a remote that joins later gets the copy.
    hub.patch(
        "settings",
        &PatchParams::default(),
        &Patch::Merge(json!({ "data": { "mode": "safe" } })),
    )
    .await
    .unwrap();
    all_hold(&[api(1), api(2)], Some("safe"), "the update").await;
    remotes.add("edge-3", env.clusters()[3].client());
    all_hold(&[api(3)], Some("safe"), "the copy in the late remote").await;

    // Deleted while edge-1 does not answer: the others' copies go at once,
    // edge-1's when it answers again.
    link.cut_off();
    hub.delete("settings", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the hub's ConfigMap to go", || async {
        hub.get_opt("settings").await.unwrap().is_none()
    })
    .await;
    all_hold(&[api(2), api(3)], None, "the reachable copies to go").await;
    assert_eq!(mode(&api(1), "settings").await.as_deref(), Some("safe"));
    link.restore();
    all_hold(&[api(1)], None, "edge-1's copy to go").await;
    controllers.abort();
}
