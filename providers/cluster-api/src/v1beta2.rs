//! The Cluster API `Cluster` type, `cluster.x-k8s.io/v1beta2` (Cluster API
//! 1.11 and later): the fields the provider reads, with their upstream
//! names, and the others kept as JSON.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{ClusterObject, schema::any_object};

/// The desired state of a `Cluster`.
#[derive(CustomResource, Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
#[kube(
    group = "cluster.x-k8s.io",
    version = "v1beta2",
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
    /// The cluster's networks (`apiServerPort`, `services`, `pods`,
    /// `serviceDomain`), as JSON.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "any_object")]
    pub cluster_network: Option<serde_json::Value>,
    /// Where the control plane's API server is reached.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane_endpoint: Option<ApiEndpoint>,
    /// The object that provides the control plane.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane_ref: Option<ContractVersionedObjectReference>,
    /// The object that provides the infrastructure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub infrastructure_ref: Option<ContractVersionedObjectReference>,
    /// The ClusterClass topology the cluster is built from, as JSON.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "any_object")]
    pub topology: Option<serde_json::Value>,
    /// Further conditions the cluster's `Available` condition waits for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub availability_gates: Option<Vec<ClusterAvailabilityGate>>,
}

/// A host and port an API server is reached at.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
pub struct ApiEndpoint {
    /// The host name or address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// The port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<i32>,
}

/// A reference to an object of a provider's contract: its API group
/// (without version), kind and name, in the same namespace.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ContractVersionedObjectReference {
    /// The API group.
    #[serde(default)]
    pub api_group: String,
    /// The kind.
    #[serde(default)]
    pub kind: String,
    /// The name.
    #[serde(default)]
    pub name: String,
}

/// A condition a `Cluster`'s `Available` condition waits for.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterAvailabilityGate {
    /// The condition's type.
    pub condition_type: String,
    /// `Positive` (the default) or `Negative`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub polarity: Option<String>,
}

/// A failure domain the infrastructure offers.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FailureDomain {
    /// Its name.
    pub name: String,
    /// Whether control plane machines may go there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane: Option<bool>,
    /// Free-form attributes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attributes: Option<std::collections::BTreeMap<String, String>>,
}

/// The observed state of a `Cluster`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterStatus {
    /// The cluster's conditions (`Available`, `ControlPlaneAvailable`,
    /// `InfrastructureReady`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Vec<Condition>>,
    /// What has been provisioned and initialized so far.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initialization: Option<ClusterInitializationStatus>,
    /// The control plane's replica counts, as JSON.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "any_object")]
    pub control_plane: Option<serde_json::Value>,
    /// The workers' replica counts, as JSON.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "any_object")]
    pub workers: Option<serde_json::Value>,
    /// The failure domains the infrastructure offers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_domains: Option<Vec<FailureDomain>>,
    /// The phase (`Pending`, `Provisioning`, `Provisioned`, `Deleting`,
    /// `Failed`, `Unknown`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// The generation last reconciled by Cluster API.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The `v1beta1` status fields, kept while they are phased out, as JSON.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "any_object")]
    pub deprecated: Option<serde_json::Value>,
}

/// What has been provisioned and initialized of a `Cluster`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterInitializationStatus {
    /// Whether the infrastructure is provisioned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub infrastructure_provisioned: Option<bool>,
    /// Whether the control plane is initialized: its API server answers and
    /// the kubeconfig Secret is usable. The provider's default readiness
    /// test.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane_initialized: Option<bool>,
}

/// A condition of a `Cluster`, as Kubernetes' `metav1.Condition`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// The condition's type, such as `Available`.
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// The generation the condition was set for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
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
    /// `status.initialization.controlPlaneInitialized` is true.
    fn control_plane_initialized(&self) -> bool {
        let initialization = self.status.as_ref().and_then(|s| s.initialization.as_ref());
        initialization.and_then(|i| i.control_plane_initialized) == Some(true)
    }
}
