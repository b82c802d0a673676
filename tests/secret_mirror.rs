//! The secret-mirror example's controller on real API servers.

#[path = "../examples/secret-mirror/mirror.rs"]
mod mirror;
mod support;

use support::eventually;

use std::{collections::BTreeMap, time::Duration};

use k8s_openapi::{ByteString, api::core::v1::Secret};
use kube::{
    Api,
    api::{DeleteParams, ObjectMeta, Patch, PatchParams, PostParams},
};
use kube_multicluster::envtest::Envtest;
use kube_multicluster::{ClusterName, Fleet, provider::ProgrammaticProvider};
use serde_json::json;

fn data(value: &str) -> BTreeMap<String, ByteString> {
    [("key".to_owned(), ByteString(value.as_bytes().to_vec()))].into()
}

fn secret(name: &str, label: &str, value: &str) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some([(label.to_owned(), "true".to_owned())].into()),
            ..ObjectMeta::default()
        },
        data: Some(data(value)),
        ..Secret::default()
    }
}

async fn value(api: &Api<Secret>, name: &str) -> Option<String> {
    let secret = api.get_opt(name).await.unwrap()?;
    let bytes = secret.data?.get("key")?.clone();
    Some(String::from_utf8_lossy(&bytes.0).into_owned())
}

async fn all_hold(apis: &[Api<Secret>], name: &str, want: Option<&str>, what: &str) {
    eventually(what, || async {
        for api in apis {
            if value(api, name).await.as_deref() != want {
                return false;
            }
        }
        true
    })
    .await;
}

#[tokio::test]
async fn sources_are_mirrored_updated_put_back_and_deleted_in_every_other_cluster() {
    let env = Envtest::start(4).await.unwrap();
    let fleet = Fleet::new();
    fleet.engage(ClusterName::local(), env.clusters()[0].client());
    let (provider, others) = ProgrammaticProvider::new();
    tokio::spawn({
        let fleet = fleet.clone();
        async move { fleet.run(provider).await }
    });
    others.engage("east", env.clusters()[1].client());
    others.engage("west", env.clusters()[2].client());
    let controller = tokio::spawn(mirror::run(fleet.clone()));
    let api = |i: usize| Api::<Secret>::namespaced(env.clusters()[i].client(), "default");
    let (source, members) = (api(0), [api(1), api(2)]);

    source
        .create(&PostParams::default(), &secret("s", mirror::MIRROR, "one"))
        .await
        .unwrap();
    // An unlabelled Secret is not mirrored.
    let mut plain = secret("plain", mirror::MIRROR, "x");
    plain.metadata.labels = None;
    source.create(&PostParams::default(), &plain).await.unwrap();
    all_hold(&members, "s", Some("one"), "the mirrors").await;
    let mirrored = members[0].get("s").await.unwrap();
    assert_eq!(mirrored.metadata.labels.unwrap()[mirror::MIRRORED], "true");

    source
        .patch(
            "s",
            &PatchParams::default(),
            &Patch::Merge(json!({ "data": data("two") })),
        )
        .await
        .unwrap();
    all_hold(&members, "s", Some("two"), "the update").await;

    // Edited by hand, and a key added: put back as the source has it.
    members[1]
        .patch(
            "s",
            &PatchParams::default(),
            &Patch::Merge(json!({ "data": { "key": ByteString(b"edited".to_vec()), "extra": ByteString(b"x".to_vec()) } })),
        )
        .await
        .unwrap();
    eventually("the edit put back", || async {
        let data = members[1].get("s").await.unwrap().data.unwrap_or_default();
        data == self::data("two")
    })
    .await;

    // A cluster that joins later gets the mirror.
    others.engage("late", env.clusters()[3].client());
    all_hold(
        &[api(3)],
        "s",
        Some("two"),
        "the mirror in the late cluster",
    )
    .await;

    // The label removed from the source: the mirrors go.
    source
        .patch(
            "s",
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "labels": { mirror::MIRROR: null } } })),
        )
        .await
        .unwrap();
    all_hold(&[api(1), api(2), api(3)], "s", None, "the mirrors to go").await;
    // Asked again, then deleted at the source: gone again.
    source
        .patch(
            "s",
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "labels": { mirror::MIRROR: "true" } } })),
        )
        .await
        .unwrap();
    all_hold(
        &[api(1), api(2), api(3)],
        "s",
        Some("two"),
        "the mirrors back",
    )
    .await;
    source.delete("s", &DeleteParams::default()).await.unwrap();
    all_hold(
        &[api(1), api(2), api(3)],
        "s",
        None,
        "the mirrors to go with the source",
    )
    .await;
    assert!(members[0].get_opt("plain").await.unwrap().is_none());
    controller.abort();
}

#[tokio::test]
async fn mirrors_are_kept_while_the_reference_cluster_is_not_known() {
    let env = Envtest::start(2).await.unwrap();
    let member = Api::<Secret>::namespaced(env.clusters()[1].client(), "default");
    member
        .create(
            &PostParams::default(),
            &secret("kept", mirror::MIRRORED, "old"),
        )
        .await
        .unwrap();
    let fleet = Fleet::new();
    let (provider, others) = ProgrammaticProvider::new();
    tokio::spawn({
        let fleet = fleet.clone();
        async move { fleet.run(provider).await }
    });
    let controller = tokio::spawn(mirror::run(fleet.clone()));
    others.engage("east", env.clusters()[1].client());
    // No reference cluster: a missing source proves nothing.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(value(&member, "kept").await.as_deref(), Some("old"));

    // The reference cluster joins, without that source: the mirror goes.
    fleet.engage(ClusterName::local(), env.clusters()[0].client());
    eventually("the mirror without a source to go", || async {
        value(&member, "kept").await.is_none()
    })
    .await;
    controller.abort();
}
