//! The Cluster API `Cluster` type, `cluster.x-k8s.io/v1beta1` (served by
//! Cluster API releases before 1.11, and alongside `v1beta2` since): the
//! fields the provider reads, with their upstream names, and the others
//! kept as JSON.

use std::collections::BTreeMap;

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use crate::v1beta2::{ApiEndpoint, ClusterAvailabilityGate};
use crate::{ClusterObject, schema::any_object};

/// The desired state of a `Cluster`.
#[derive(CustomResource, Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
#[kube(
    group = "cluster.x-k8s.io",
    version = "v1beta1",
    kind = "Cluster",
    plural = "clusters",
    shortname = "cl",
    namespaced,
    status = "ClusterStatus"
)]
#[serde(rename_all = "camelCase")]
pub struct ClusterSpec {
    /// Whether Cluster API's controllers leave this cluster alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<bool>,
    /// The cluster's networks, as JSON.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "any_object")]
    pub cluster_network: Option<serde_json::Value>,
    /// Where the control plane's API server is reached.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane_endpoint: Option<ApiEndpoint>,
    /// The object that provides the control plane, as JSON (a
    /// `corev1.ObjectReference`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "any_object")]
    pub control_plane_ref: Option<serde_json::Value>,
    /// The object that provides the infrastructure, as JSON (a
    /// `corev1.ObjectReference`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "any_object")]
    pub infrastructure_ref: Option<serde_json::Value>,
    /// The ClusterClass topology the cluster is built from, as JSON.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "any_object")]
    pub topology: Option<serde_json::Value>,
    /// Further conditions the cluster's `Ready` condition waits for (Cluster
    /// API 1.9 and later).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub availability_gates: Option<Vec<ClusterAvailabilityGate>>,
}

/// The observed state of a `Cluster`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterStatus {
    /// The failure domains the infrastructure offers, by name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_domains: Option<BTreeMap<String, FailureDomainSpec>>,
    /// A terse reason for a failure the controllers cannot recover from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_reason: Option<String>,
    /// A longer message for such a failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_message: Option<String>,
    /// The phase (`Pending`, `Provisioning`, `Provisioned`, `Deleting`,
    /// `Failed`, `Unknown`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// Whether the infrastructure is ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub infrastructure_ready: Option<bool>,
    /// Whether the control plane is ready (initialized, in this version's
    /// words): the provider's default readiness test.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane_ready: Option<bool>,
    /// The cluster's conditions, in Cluster API's `v1beta1` form.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Vec<Condition>>,
    /// The generation last reconciled by Cluster API.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The `v1beta2` status fields, kept while both are served (Cluster API
    /// 1.9 and later), as JSON.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "any_object")]
    pub v1beta2: Option<serde_json::Value>,
}

/// A failure domain the infrastructure offers.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FailureDomainSpec {
    /// Whether control plane machines may go there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane: Option<bool>,
    /// Free-form attributes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attributes: Option<BTreeMap<String, String>>,
}

/// A condition of a `Cluster`, in Cluster API's `v1beta1` form (with a
/// severity).
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// The condition's type, such as `Ready`.
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// `Error`, `Warning` or `Info`, when the status is `False`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub severity: Option<String>,
    /// When the status last changed (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<String>,
    /// Why, in CamelCase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Why, for people.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

impl ClusterObject for Cluster {
    /// `status.controlPlaneReady` is true.
    fn control_plane_initialized(&self) -> bool {
        self.status.as_ref().and_then(|s| s.control_plane_ready) == Some(true)
    }
}
