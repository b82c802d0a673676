//! Secrets labelled `kube-multicluster.dev/mirror=true` in the reference cluster are
//! mirrored into every other cluster: updates propagate, a mirror edited by
//! hand is put back, and deleting the source deletes the mirrors.
//!
//! `cargo run --example secret-mirror` starts a local fleet (the reference
//! cluster and two others, real API servers) and shows each of these.

mod mirror;
#[path = "../support/mod.rs"]
mod support;

use std::collections::BTreeMap;

use k8s_openapi::{ByteString, api::core::v1::Secret};
use kube::{
    Api,
    api::{DeleteParams, ObjectMeta, Patch, PatchParams, PostParams},
};
use kube_multicluster::envtest::Envtest;
use kube_multicluster::{ClusterName, Fleet, provider::ProgrammaticProvider};
use serde_json::json;
use tower::BoxError;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    support::logging();
    let env = Envtest::start(3).await?;
    let reference = &env.clusters()[0];
    let fleet = Fleet::new();
    fleet.engage(ClusterName::local(), reference.client());
    let (provider, others) = ProgrammaticProvider::new();
    tokio::spawn({
        let fleet = fleet.clone();
        async move { fleet.run(provider).await }
    });
    others.engage("east", env.clusters()[1].client());
    others.engage("west", env.clusters()[2].client());
    let controller = tokio::spawn(mirror::run(fleet.clone()));

    let sources = Api::<Secret>::namespaced(reference.client(), "default");
    let source = Secret {
        metadata: ObjectMeta {
            name: Some("db-password".into()),
            labels: Some([(mirror::MIRROR.to_owned(), "true".to_owned())].into()),
            ..ObjectMeta::default()
        },
        data: Some(data("hunter2")),
        ..Secret::default()
    };
    sources.create(&PostParams::default(), &source).await?;
    let mirrors: Vec<Api<Secret>> = env.clusters()[1..]
        .iter()
        .map(|c| Api::namespaced(c.client(), "default"))
        .collect();
    holds(&mirrors, Some("hunter2"), "mirrored into east and west").await?;

    sources
        .patch(
            "db-password",
            &PatchParams::default(),
            &Patch::Merge(json!({ "data": data("correct-horse") })),
        )
        .await?;
    holds(&mirrors, Some("correct-horse"), "the update propagated").await?;

    mirrors[0]
        .patch(
            "db-password",
            &PatchParams::default(),
            &Patch::Merge(json!({ "data": data("edited") })),
        )
        .await?;
    holds(
        &mirrors,
        Some("correct-horse"),
        "the edited mirror was put back",
    )
    .await?;

    sources
        .delete("db-password", &DeleteParams::default())
        .await?;
    holds(&mirrors, None, "the mirrors went with the source").await?;

    controller.abort();
    for cluster in fleet.clusters() {
        fleet.disengage(cluster.name());
    }
    Ok(())
}

fn data(password: &str) -> BTreeMap<String, ByteString> {
    [(
        "password".to_owned(),
        ByteString(password.as_bytes().to_vec()),
    )]
    .into()
}

/// Waits until every mirror holds `password` (or is gone, for `None`).
async fn holds(
    mirrors: &[Api<Secret>],
    password: Option<&str>,
    what: &str,
) -> Result<(), BoxError> {
    support::wait_for(what, || async {
        for api in mirrors {
            let found = api.get_opt("db-password").await?;
            let held = found
                .and_then(|s| s.data)
                .and_then(|d| d.get("password").cloned());
            if held
                .map(|b| String::from_utf8_lossy(&b.0).into_owned())
                .as_deref()
                != password
            {
                return Ok(false);
            }
        }
        Ok(true)
    })
    .await?;
    tracing::info!("{what}");
    Ok(())
}
