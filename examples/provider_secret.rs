//! The Secret provider: each labelled Secret holding a kubeconfig in one
//! namespace of a hub cluster is a cluster, named after the Secret.
//!
//! ```text
//! cargo run --example provider_secret                                # a local hub and two workload API servers
//! cargo run --example provider_secret -- --namespace fleet-system    # your cluster's Secrets (kubectl's kubeconfig), until Ctrl-C
//! ```
//!
//! With no arguments it starts three local API servers, one the hub. It
//! writes a Secret for each of the other two into the hub, then points one
//! Secret at the other server, writes a Secret without a kubeconfig, and
//! deletes one: each step shows in the fleet, the Secret without a
//! kubeconfig only as a problem. A Secret is read when it carries the label
//! `sigs.k8s.io/multicluster-runtime-kubeconfig: "true"` and holds the
//! kubeconfig under the key `kubeconfig`.

mod support;

use std::collections::BTreeMap;

use k8s_openapi::{ByteString, api::core::v1::Secret};
use kube::{
    Api,
    api::{DeleteParams, ObjectMeta, Patch, PatchParams},
    config::Kubeconfig,
};
use kube_multicluster::Fleet;
use kube_multicluster::envtest::Envtest;
use kube_multicluster::providers::secret::{DEFAULT_KEY, DEFAULT_LABEL, SecretProvider};
use tower::BoxError;

const NAMESPACE: &str = "default";

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    support::logging();
    let fleet = Fleet::new();
    support::log_config_maps(&fleet);
    if let Some(namespace) = support::arg("--namespace") {
        let hub = kube::Client::try_default().await?;
        tokio::spawn(async move {
            tokio::signal::ctrl_c().await.ok();
            std::process::exit(0);
        });
        fleet.run(SecretProvider::new(hub, namespace)).await;
        return Ok(());
    }

    let env = Envtest::start(3).await?;
    let (hub, east, west) = (&env.clusters()[0], &env.clusters()[1], &env.clusters()[2]);
    support::config_map(east.client(), "default", "on-east").await?;
    support::config_map(west.client(), "default", "on-west").await?;
    let secrets = Api::<Secret>::namespaced(hub.client(), NAMESPACE);
    apply(&secrets, "east", Some(east.kubeconfig())).await?;
    apply(&secrets, "west", Some(west.kubeconfig())).await?;

    let provider = SecretProvider::new(hub.client(), NAMESPACE);
    let problems = provider.problems();
    tokio::spawn({
        let fleet = fleet.clone();
        async move { fleet.run(provider).await }
    });
    support::clusters_are(&fleet, &["east", "west"]).await?;

    tracing::info!("Secret east is pointed at the west server: engaged again");
    let before = fleet.get("east").ok_or("east engaged")?;
    apply(&secrets, "east", Some(west.kubeconfig())).await?;
    tokio::time::timeout(std::time::Duration::from_secs(30), before.disengaged()).await?;

    tracing::info!("a Secret without a kubeconfig: a problem, and no cluster");
    apply(&secrets, "empty", None).await?;
    let found = problems
        .wait_for(|set| set.contains_key("Secret default/empty"))
        .await;
    tracing::warn!(problems = ?found, "problems");

    tracing::info!("Secret west is deleted");
    secrets.delete("west", &DeleteParams::default()).await?;
    support::clusters_are(&fleet, &["east"]).await?;
    Ok(())
}

/// Creates or replaces the labelled Secret `name`, holding `kubeconfig`
/// under the default key (or nothing).
async fn apply(
    secrets: &Api<Secret>,
    name: &str,
    kubeconfig: Option<&Kubeconfig>,
) -> Result<(), BoxError> {
    let data = match kubeconfig {
        Some(kubeconfig) => BTreeMap::from([(
            DEFAULT_KEY.to_owned(),
            ByteString(serde_json::to_vec(kubeconfig)?),
        )]),
        None => BTreeMap::new(),
    };
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some(BTreeMap::from([(
                DEFAULT_LABEL.to_owned(),
                "true".to_owned(),
            )])),
            ..ObjectMeta::default()
        },
        data: Some(data),
        ..Secret::default()
    };
    secrets
        .patch(
            name,
            &PatchParams::apply("provider-secret-example").force(),
            &Patch::Apply(&secret),
        )
        .await?;
    Ok(())
}
