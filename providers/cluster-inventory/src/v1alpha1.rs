//! The Cluster Inventory API `ClusterProfile` type,
//! `multicluster.x-k8s.io/v1alpha1` (cluster-inventory-api v0.1): its
//! fields, with their upstream names.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::schema::any_object;

/// The condition type whose status `True` says a profile's control plane
/// is healthy: the provider's default readiness test.
pub const CONTROL_PLANE_HEALTHY: &str = "ControlPlaneHealthy";

/// The label a `ClusterProfile` carries with the name of the cluster
/// manager that wrote it.
pub const CLUSTER_MANAGER_LABEL: &str = "x-k8s.io/cluster-manager";

/// The desired state of a `ClusterProfile`, written by its cluster manager.
#[derive(CustomResource, Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
#[kube(
    group = "multicluster.x-k8s.io",
    version = "v1alpha1",
    kind = "ClusterProfile",
    plural = "clusterprofiles",
    namespaced,
    status = "ClusterProfileStatus"
)]
#[serde(rename_all = "camelCase")]
pub struct ClusterProfileSpec {
    /// A name for people.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub display_name: Option<String>,
    /// The cluster manager that owns the profile.
    pub cluster_manager: ClusterManager,
}

/// The cluster manager of a profile.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
pub struct ClusterManager {
    /// Its name.
    pub name: String,
}

/// The observed state of a `ClusterProfile`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterProfileStatus {
    /// The profile's conditions, such as [`CONTROL_PLANE_HEALTHY`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Vec<Condition>>,
    /// The cluster's Kubernetes version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<ClusterVersion>,
    /// Properties of the cluster (KEP-4322).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub properties: Option<Vec<Property>>,
    /// The older name of `accessProviders`; an entry there of the same name
    /// wins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential_providers: Option<Vec<AccessProvider>>,
    /// How the cluster is reached through each named access provider.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_providers: Option<Vec<AccessProvider>>,
}

/// The Kubernetes version of a cluster.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
pub struct ClusterVersion {
    /// Such as `v1.34.1`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes: Option<String>,
}

/// A property of a cluster.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Property {
    /// Its name.
    pub name: String,
    /// Its value.
    pub value: String,
    /// When it was last observed (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_observed_time: Option<String>,
}

/// How the cluster is reached through one access provider: the provider's
/// name, which a consumer maps to a credential plugin, and the cluster's
/// endpoint.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
pub struct AccessProvider {
    /// The access provider's name.
    pub name: String,
    /// The cluster's endpoint, as a kubeconfig's cluster entry.
    #[serde(default)]
    pub cluster: AccessCluster,
}

/// A cluster's endpoint, as a kubeconfig's cluster entry (client-go's
/// `clientcmd/api/v1.Cluster`), with its kebab-case field names.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub struct AccessCluster {
    /// The API server's URL.
    #[serde(default)]
    pub server: String,
    /// The name the server's certificate is checked against, if not the
    /// URL's host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_server_name: Option<String>,
    /// Whether the server's certificate goes unchecked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub insecure_skip_tls_verify: Option<bool>,
    /// A file holding the CA certificates (on the consumer's machine).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificate_authority: Option<String>,
    /// The CA certificates, PEM, base64-encoded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificate_authority_data: Option<String>,
    /// A proxy to reach the server through.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy_url: Option<String>,
    /// Whether responses go uncompressed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disable_compression: Option<bool>,
    /// Extensions by name, such as `client.authentication.k8s.io/exec`,
    /// which a credential plugin is given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extensions: Option<Vec<NamedExtension>>,
}

/// A named extension of a cluster entry.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
pub struct NamedExtension {
    /// Its name.
    pub name: String,
    /// Its value, a JSON object.
    #[schemars(schema_with = "any_object")]
    pub extension: serde_json::Value,
}

/// A condition of a `ClusterProfile`, as Kubernetes' `metav1.Condition`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// The condition's type, such as [`CONTROL_PLANE_HEALTHY`].
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

impl ClusterProfile {
    /// Whether the condition [`CONTROL_PLANE_HEALTHY`] is `True`: the
    /// provider's default readiness test.
    pub fn control_plane_healthy(&self) -> bool {
        let conditions = self.status.as_ref().and_then(|s| s.conditions.as_ref());
        conditions
            .into_iter()
            .flatten()
            .any(|c| c.type_ == CONTROL_PLANE_HEALTHY && c.status == "True")
    }

    /// The access providers of the status, by name: those of
    /// `credentialProviders`, replaced by those of `accessProviders` of the
    /// same name.
    pub fn access_providers(&self) -> Vec<&AccessProvider> {
        let status = self.status.as_ref();
        let older = status.and_then(|s| s.credential_providers.as_ref());
        let newer = status.and_then(|s| s.access_providers.as_ref());
        let mut all: Vec<&AccessProvider> = Vec::new();
        for provider in older
            .into_iter()
            .flatten()
            .chain(newer.into_iter().flatten())
        {
            all.retain(|p| p.name != provider.name);
            all.push(provider);
        }
        all
    }
}
