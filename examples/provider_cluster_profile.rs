//! The Cluster Inventory API provider: each healthy `ClusterProfile` of a
//! hub is a cluster, named `namespace/name`, reached through the exec
//! credential plugin the consumer's access configuration names for the
//! profile's access provider.
//!
//! ```text
//! cargo run --example provider_cluster_profile                                  # a local hub and two workload API servers
//! cargo run --example provider_cluster_profile -- --access-config access.json   # your hub (kubectl's kubeconfig), until Ctrl-C
//! cargo run --example provider_cluster_profile -- --consumer my-controller      # your hub, credentials from labelled Secrets
//! ```
//!
//! With no arguments it starts three local API servers, one the hub. It
//! installs the `ClusterProfile` CRD there (`multicluster.x-k8s.io/v1alpha1`,
//! as generated from the provider's type), writes a credential plugin that
//! prints a service account token of the cluster it is asked for (the
//! cluster is named in the profile's `client.authentication.k8s.io/exec`
//! extension, which kube hands the plugin), and plays the cluster manager:
//! it creates a profile for each of the other two, marks one healthy, then
//! the other, then one unhealthy, and deletes the other. Each step shows in
//! the fleet.

mod support;

use std::{os::unix::fs::PermissionsExt, time::Duration};

use kube::{
    Api, CustomResourceExt,
    api::{DeleteParams, Patch, PatchParams, PostParams},
};
use kube_multicluster::Fleet;
use kube_multicluster::envtest::Envtest;
use kube_multicluster::providers::cluster_inventory::{
    AccessConfig, ClusterProfileProvider, EXEC_EXTENSION,
    v1alpha1::{ClusterManager, ClusterProfile, ClusterProfileSpec},
};
use tower::BoxError;

const NAMESPACE: &str = "default";

/// Prints, as an `ExecCredential`, the token in `<its directory>/<cluster>.token`,
/// `<cluster>` read from `KUBERNETES_EXEC_INFO`.
const PLUGIN: &str = r#"#!/bin/sh
cluster=$(printf '%s' "$KUBERNETES_EXEC_INFO" | sed -n 's/.*"config":{"cluster":"\([^"]*\)"}.*/\1/p')
token=$(cat "$(dirname "$0")/$cluster.token") || exit 1
printf '{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"token":"%s"}}\n' "$token"
"#;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    support::logging();
    let fleet = Fleet::new();
    support::log_config_maps(&fleet);
    let access_config = support::arg("--access-config");
    let consumer = support::arg("--consumer");
    if access_config.is_some() || consumer.is_some() {
        let hub = kube::Client::try_default().await?;
        tokio::spawn(async move {
            tokio::signal::ctrl_c().await.ok();
            std::process::exit(0);
        });
        let provider = match (access_config, consumer) {
            (Some(file), _) => ClusterProfileProvider::new(hub, AccessConfig::from_file(file)?),
            (None, Some(consumer)) => ClusterProfileProvider::from_secrets(hub, consumer),
            (None, None) => unreachable!(),
        };
        fleet.run(provider).await;
        return Ok(());
    }

    let env = Envtest::start(3).await?;
    let (hub, east, west) = (&env.clusters()[0], &env.clusters()[1], &env.clusters()[2]);
    hub.install_crds([ClusterProfile::crd()]).await?;
    let plugin = env.dir().join("profile-plugin");
    std::fs::write(&plugin, PLUGIN)?;
    std::fs::set_permissions(&plugin, std::fs::Permissions::from_mode(0o755))?;
    // What a consumer writes: its plugin for the access provider `envtest`.
    let access = AccessConfig::from_json(
        &serde_json::json!({ "providers": [{
            "name": "envtest",
            "execConfig": {
                "apiVersion": "client.authentication.k8s.io/v1",
                "command": plugin,
                "provideClusterInfo": true,
            },
        }]})
        .to_string(),
        "the example's access configuration",
    )?;
    let profiles = Api::<ClusterProfile>::namespaced(hub.client(), NAMESPACE);
    for (name, workload) in [("east", east), ("west", west)] {
        support::config_map(workload.client(), "default", &format!("on-{name}")).await?;
        std::fs::write(
            env.dir().join(format!("{name}.token")),
            workload.admin_token("fleet").await?,
        )?;
        let spec = ClusterProfileSpec {
            display_name: Some(name.to_owned()),
            cluster_manager: ClusterManager {
                name: "example".to_owned(),
            },
        };
        profiles
            .create(&PostParams::default(), &ClusterProfile::new(name, spec))
            .await?;
        let entry = workload.kubeconfig().clusters[0]
            .cluster
            .clone()
            .ok_or("a cluster")?;
        let status = serde_json::json!({ "status": { "accessProviders": [{
            "name": "envtest",
            "cluster": {
                "server": entry.server,
                "certificate-authority-data": entry.certificate_authority_data,
                "extensions": [{ "name": EXEC_EXTENSION, "extension": { "cluster": name } }],
            },
        }]}});
        profiles
            .patch_status(name, &PatchParams::default(), &Patch::Merge(status))
            .await?;
    }

    let provider = ClusterProfileProvider::new(hub.client(), access);
    tokio::spawn({
        let fleet = fleet.clone();
        async move { fleet.run(provider).await }
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    support::clusters_are(&fleet, &[]).await?;

    tracing::info!("east's control plane is healthy");
    health(&profiles, "east", "True").await?;
    support::clusters_are(&fleet, &["default/east"]).await?;
    tracing::info!("west's control plane is healthy");
    health(&profiles, "west", "True").await?;
    support::clusters_are(&fleet, &["default/east", "default/west"]).await?;
    tracing::info!("east's control plane is not healthy");
    health(&profiles, "east", "False").await?;
    support::clusters_are(&fleet, &["default/west"]).await?;
    tracing::info!("west's profile is deleted");
    profiles.delete("west", &DeleteParams::default()).await?;
    support::clusters_are(&fleet, &[]).await?;
    Ok(())
}

/// Sets the profile's `ControlPlaneHealthy` condition, as a cluster manager
/// does.
async fn health(profiles: &Api<ClusterProfile>, name: &str, status: &str) -> Result<(), BoxError> {
    let status = serde_json::json!({ "status": { "conditions": [{
        "type": "ControlPlaneHealthy",
        "status": status,
        "reason": "Example",
        "message": "set by the example",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }]}});
    profiles
        .patch_status(name, &PatchParams::default(), &Patch::Merge(status))
        .await?;
    Ok(())
}
