//! The placement provider: of the clusters another provider offers, those
//! that Open Cluster Management's `PlacementDecision`s in a hub name.
//!
//! ```text
//! cargo run --example provider_placement
//! ```
//!
//! It starts four local API servers: a hub and three members, `east`,
//! `west` and `north`, which an inner provider offers under those names.
//! It installs the `PlacementDecision` CRD in the hub and plays Open
//! Cluster Management's placement controller: it writes a decision of the
//! `Placement` `web` naming `east`, then `east` and `west`, then `west` and
//! `north`, and deletes it. Only the clusters the decision names are in the
//! fleet, and each step shows there.

mod support;

use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube_multicluster::Fleet;
use kube_multicluster::envtest::{Envtest, crds_from_yaml};
use kube_multicluster::provider::ProgrammaticProvider;
use kube_multicluster::providers::placement::{
    Decisions, PLACEMENT_LABEL, PlacementProvider, placement_decision,
};
use tower::BoxError;

const NAMESPACE: &str = "default";

/// Open Cluster Management's `PlacementDecision`, as far as the provider
/// reads it (Open Cluster Management installs the full one).
const CRD: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: { name: placementdecisions.cluster.open-cluster-management.io }
spec:
  group: cluster.open-cluster-management.io
  names: { kind: PlacementDecision, listKind: PlacementDecisionList, plural: placementdecisions, singular: placementdecision }
  scope: Namespaced
  versions:
    - name: v1beta1
      served: true
      storage: true
      subresources: { status: {} }
      schema:
        openAPIV3Schema:
          type: object
          properties:
            status: { type: object, x-kubernetes-preserve-unknown-fields: true }
"#;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    support::logging();
    let env = Envtest::builder()
        .clusters(["hub", "east", "west", "north"])
        .start()
        .await?;
    let hub = &env.clusters()[0];
    hub.install_crds(crds_from_yaml(CRD)?).await?;

    // The inner provider: here every member, by name. Any provider works
    // (kubeconfig files, Secrets, ClusterProfiles, several under a multi
    // provider); the decisions choose among its clusters.
    let (inner, members) = ProgrammaticProvider::new();
    for member in &env.clusters()[1..] {
        support::config_map(member.client(), NAMESPACE, "settings").await?;
        members.engage(member.name(), member.client());
    }

    let fleet = Fleet::new();
    support::log_config_maps(&fleet);
    let provider =
        PlacementProvider::new(hub.client(), Decisions::placement(NAMESPACE, "web"), inner);
    let running = tokio::spawn({
        let fleet = fleet.clone();
        async move { fleet.run(provider).await }
    });

    // What the placement controller writes: a decision labelled with its
    // Placement, its clusters in the status.
    let decisions: Api<DynamicObject> =
        Api::namespaced_with(hub.client(), NAMESPACE, &placement_decision());
    let mut decision = DynamicObject::new("web-decision-1", &placement_decision());
    decision.metadata.labels = Some([(PLACEMENT_LABEL.to_owned(), "web".to_owned())].into());
    decisions.create(&PostParams::default(), &decision).await?;
    for clusters in [&["east"][..], &["east", "west"], &["west", "north"]] {
        tracing::info!(?clusters, "the placement decides");
        let named: Vec<_> = clusters
            .iter()
            .map(|cluster| serde_json::json!({ "clusterName": cluster, "reason": "" }))
            .collect();
        let status = serde_json::json!({ "status": { "decisions": named } });
        decisions
            .patch_status(
                "web-decision-1",
                &PatchParams::default(),
                &Patch::Merge(status),
            )
            .await?;
        support::clusters_are(&fleet, clusters).await?;
    }

    tracing::info!("the decision is deleted");
    decisions
        .delete("web-decision-1", &DeleteParams::default())
        .await?;
    support::clusters_are(&fleet, &[]).await?;
    // Stopped before the API servers are, so that its watch of the hub
    // does not report them gone.
    running.abort();
    let _ = running.await;
    Ok(())
}
