//! The Cluster API provider: each `Cluster` of a management cluster whose
//! control plane is initialized is a cluster, named `namespace/name`,
//! reached through its `<name>-kubeconfig` Secret.
//!
//! ```text
//! cargo run --example provider_cluster_api                   # a local management cluster and two workload API servers
//! cargo run --example provider_cluster_api -- --management   # your management cluster (kubectl's kubeconfig), until Ctrl-C
//! cargo run --example provider_cluster_api -- --management --v1beta1   # one whose Cluster API serves v1beta1 only
//! ```
//!
//! With no arguments it starts three local API servers, one the management
//! cluster. It installs the `Cluster` CRD there (`cluster.x-k8s.io/v1beta2`,
//! as generated from the provider's type) and plays Cluster API's part: it
//! creates a `Cluster` for each of the other two with its kubeconfig Secret,
//! marks one initialized, then the other; gives one a new kubeconfig; and
//! deletes one. Each step shows in the fleet.

mod support;

use std::{collections::BTreeMap, time::Duration};

use k8s_openapi::{ByteString, api::core::v1::Secret};
use kube::{
    Api, CustomResourceExt,
    api::{DeleteParams, ObjectMeta, Patch, PatchParams, PostParams},
    config::Kubeconfig,
};
use kube_multicluster::Fleet;
use kube_multicluster::envtest::{Envtest, TestCluster};
use kube_multicluster::providers::cluster_api::{
    CLUSTER_NAME_LABEL, ClusterApiProvider, KUBECONFIG_KEY,
    v1beta2::{Cluster, ClusterSpec},
};
use tower::BoxError;

const NAMESPACE: &str = "default";

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    support::logging();
    let fleet = Fleet::new();
    support::log_config_maps(&fleet);
    if support::flag("--management") {
        let management = kube::Client::try_default().await?;
        tokio::spawn(async move {
            tokio::signal::ctrl_c().await.ok();
            std::process::exit(0);
        });
        if support::flag("--v1beta1") {
            fleet.run(ClusterApiProvider::v1beta1(management)).await;
        } else {
            fleet.run(ClusterApiProvider::new(management)).await;
        }
        return Ok(());
    }

    let env = Envtest::start(3).await?;
    let (management, east, west) = (&env.clusters()[0], &env.clusters()[1], &env.clusters()[2]);
    management.install_crds([Cluster::crd()]).await?;
    support::config_map(east.client(), "default", "on-east").await?;
    support::config_map(west.client(), "default", "on-west").await?;
    let clusters = Api::<Cluster>::namespaced(management.client(), NAMESPACE);
    for (name, workload) in [("east", east), ("west", west)] {
        let cluster = Cluster::new(name, ClusterSpec::default());
        clusters.create(&PostParams::default(), &cluster).await?;
        kubeconfig_secret(management, name, workload.kubeconfig()).await?;
    }

    let provider = ClusterApiProvider::new(management.client());
    let problems = provider.problems();
    tokio::spawn({
        let fleet = fleet.clone();
        async move { fleet.run(provider).await }
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    support::clusters_are(&fleet, &[]).await?;

    tracing::info!("the control plane of east is initialized");
    initialized(&clusters, "east").await?;
    support::clusters_are(&fleet, &["default/east"]).await?;
    tracing::info!("the control plane of west is initialized");
    initialized(&clusters, "west").await?;
    support::clusters_are(&fleet, &["default/east", "default/west"]).await?;

    tracing::info!("east's kubeconfig is rotated (another client certificate): engaged again");
    let before = fleet.get("default/east").ok_or("east engaged")?;
    let rotated = east.kubeconfig_for("rotated-admin", &["system:masters"])?;
    kubeconfig_secret(management, "east", &rotated).await?;
    tokio::time::timeout(Duration::from_secs(30), before.disengaged()).await?;
    support::clusters_are(&fleet, &["default/east", "default/west"]).await?;

    tracing::info!("west's kubeconfig Secret is deleted: disengaged, and reported");
    Api::<Secret>::namespaced(management.client(), NAMESPACE)
        .delete("west-kubeconfig", &DeleteParams::default())
        .await?;
    support::clusters_are(&fleet, &["default/east"]).await?;
    let found = problems
        .wait_for(|set| set.contains_key("Cluster default/west"))
        .await;
    tracing::warn!(problems = ?found, "problems");

    tracing::info!("Cluster east is deleted");
    clusters.delete("east", &DeleteParams::default()).await?;
    support::clusters_are(&fleet, &[]).await?;
    Ok(())
}

/// Writes the Secret `<name>-kubeconfig` as Cluster API does.
async fn kubeconfig_secret(
    management: &TestCluster,
    name: &str,
    kubeconfig: &Kubeconfig,
) -> Result<(), BoxError> {
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(format!("{name}-kubeconfig")),
            labels: Some(BTreeMap::from([(
                CLUSTER_NAME_LABEL.to_owned(),
                name.to_owned(),
            )])),
            ..ObjectMeta::default()
        },
        type_: Some("cluster.x-k8s.io/secret".to_owned()),
        data: Some(BTreeMap::from([(
            KUBECONFIG_KEY.to_owned(),
            ByteString(serde_json::to_vec(kubeconfig)?),
        )])),
        ..Secret::default()
    };
    Api::<Secret>::namespaced(management.client(), NAMESPACE)
        .patch(
            &format!("{name}-kubeconfig"),
            &PatchParams::apply("provider-cluster-api-example").force(),
            &Patch::Apply(&secret),
        )
        .await?;
    Ok(())
}

/// Sets `status.initialization.controlPlaneInitialized`, as Cluster API
/// does once the control plane answers.
async fn initialized(clusters: &Api<Cluster>, name: &str) -> Result<(), BoxError> {
    let status = serde_json::json!({
        "status": { "initialization": { "controlPlaneInitialized": true } },
    });
    clusters
        .patch_status(name, &PatchParams::default(), &Patch::Merge(status))
        .await?;
    Ok(())
}
