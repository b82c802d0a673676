//! The sync-local-to-remote example's two controllers on real API servers.

mod support;
#[path = "../examples/sync-local-to-remote/sync.rs"]
mod sync;

use support::eventually;

use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::{
    Api,
    api::{DeleteParams, ObjectMeta, Patch, PatchParams, PostParams},
};
use kube_multicluster::envtest::Envtest;
use kube_multicluster::{
    Fleet,
    ownership::ParentRef,
    provider::{ProgrammaticHandle, ProgrammaticProvider},
};
use serde_json::json;
use tokio::task::JoinHandle;
use tower::BoxError;

async fn mode(api: &Api<ConfigMap>, name: &str) -> Option<String> {
    api.get_opt(name).await.unwrap()?.data?.get("mode").cloned()
}

/// Edits the copy `name` by hand.
async fn drift(api: &Api<ConfigMap>, name: &str) {
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({ "data": { "mode": "drifted" } })),
    )
    .await
    .unwrap();
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

fn named(name: &str) -> ConfigMap {
    let mut config_map = settings("fast");
    config_map.metadata.name = Some(name.into());
    config_map
}

/// A hub with both controllers running, and `remotes` more clusters that
/// are not engaged yet: the handle engages them.
async fn setup(
    remotes: usize,
) -> (
    Envtest,
    ProgrammaticHandle,
    JoinHandle<Result<(), BoxError>>,
) {
    let env = Envtest::start(remotes + 1).await.unwrap();
    let fleet = Fleet::new();
    fleet.engage(sync::hub(), env.clusters()[0].client());
    let (provider, handle) = ProgrammaticProvider::new();
    tokio::spawn({
        let fleet = fleet.clone();
        async move { fleet.run(provider).await }
    });
    let controllers = tokio::spawn(sync::run(fleet));
    (env, handle, controllers)
}

#[tokio::test]
async fn labelled_config_maps_reach_every_remote_drift_is_reverted_and_deletion_follows() {
    let (env, remotes, controllers) = setup(3).await;
    // edge-1 is reached through a link, to cut the controllers off from it.
    let link = env.clusters()[1].link().unwrap();
    remotes.engage("edge-1", link.client());
    remotes.engage("edge-2", env.clusters()[2].client());
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
    drift(&api(2), "settings").await;
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
    remotes.engage("edge-3", env.clusters()[3].client());
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

/// A hub ConfigMap whose label is removed has its copies deleted and its
/// finalizer released, so it can be deleted.
#[tokio::test]
async fn unlabelling_then_deleting_a_hub_config_map_completes() {
    let (env, remotes, _controllers) = setup(1).await;
    remotes.engage("edge-1", env.clusters()[1].client());
    let hub = Api::<ConfigMap>::namespaced(env.clusters()[0].client(), "default");
    let edge = Api::<ConfigMap>::namespaced(env.clusters()[1].client(), "default");
    hub.create(&PostParams::default(), &named("a"))
        .await
        .unwrap();
    eventually("copy", || async {
        edge.get_opt("a").await.unwrap().is_some()
    })
    .await;
    hub.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {sync::SYNC: null}}})),
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    hub.delete("a", &DeleteParams::default()).await.unwrap();
    eventually("the unlabelled hub ConfigMap to go", || async {
        hub.get_opt("a").await.unwrap().is_none()
    })
    .await;
}

/// A ConfigMap in a remote that another controller made for a parent of
/// another kind (a Secret in the hub) is left alone.
#[tokio::test]
async fn revert_leaves_other_parents_children_alone() {
    let (env, remotes, _controllers) = setup(1).await;
    remotes.engage("edge-1", env.clusters()[1].client());
    let hub_secrets = Api::<Secret>::namespaced(env.clusters()[0].client(), "default");
    let edge = Api::<ConfigMap>::namespaced(env.clusters()[1].client(), "default");
    let secret = hub_secrets
        .create(
            &PostParams::default(),
            &Secret {
                metadata: ObjectMeta {
                    name: Some("creds".into()),
                    ..ObjectMeta::default()
                },
                ..Secret::default()
            },
        )
        .await
        .unwrap();
    let parent = ParentRef::of(&sync::hub(), &secret).unwrap();
    let mut child = ConfigMap {
        metadata: ObjectMeta {
            name: Some("creds-info".into()),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    };
    parent.adopt(&mut child);
    edge.create(&PostParams::default(), &child).await.unwrap();
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(
        edge.get_opt("creds-info").await.unwrap().is_some(),
        "revert deleted a child of a hub Secret that the sync controller never made"
    );
}

/// A copy deleted by hand in a remote is made again.
#[tokio::test]
async fn a_copy_deleted_by_hand_comes_back() {
    let (env, remotes, _controllers) = setup(1).await;
    remotes.engage("edge-1", env.clusters()[1].client());
    let hub = Api::<ConfigMap>::namespaced(env.clusters()[0].client(), "default");
    let edge = Api::<ConfigMap>::namespaced(env.clusters()[1].client(), "default");
    hub.create(&PostParams::default(), &named("b"))
        .await
        .unwrap();
    eventually("copy", || async {
        edge.get_opt("b").await.unwrap().is_some()
    })
    .await;
    // Drift reverted: the remote's watch of the copies has seen this one,
    // so that it sees its deletion too.
    drift(&edge, "b").await;
    eventually("drift reverted", || async {
        mode(&edge, "b").await.as_deref() == Some("fast")
    })
    .await;
    edge.delete("b", &DeleteParams::default()).await.unwrap();
    eventually("the copy to come back", || async {
        edge.get_opt("b").await.unwrap().is_some()
    })
    .await;
}
