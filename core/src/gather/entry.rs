//! One member cluster's entry in a parent's status, as it is written.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// What a parent's status says of one cluster: what was read from the
/// parent's child there, how fresh it is, and the cluster's health.
/// Serialized in camelCase, the fields that are `None` left out:
///
/// ```json
/// { "cluster": "member-1", "child": "hello", "value": 1,
///   "lastSeen": "2025-01-01T12:00:00Z", "health": "Healthy", "stale": false }
/// ```
///
/// Give the parent's status type a `Vec<ClusterEntry>` field (its CRD schema
/// from [`entries_schema`](super::entries_schema)).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct ClusterEntry {
    /// The cluster's name; the local cluster's as
    /// [`Gather::local_name`](super::Gather::local_name) says.
    pub cluster: String,
    /// The name of the child read; `None` when the cluster has none (then
    /// [`message`](Self::message) says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub child: Option<String>,
    /// The child's condition, for [`Read::condition`](super::Read::condition).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub condition: Option<ChildCondition>,
    /// What the selector found, for [`Read::field`](super::Read::field): the
    /// value, or an array of every value when it found several.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<Value>,
    /// Why nothing was read (no child in the cluster, its children not
    /// listed yet, the condition or field not there), or why the entry is
    /// stale though the cluster answers (its children's watch fails).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// When the cluster last answered, so how fresh the entry is: the time
    /// of the write for a cluster that answers, the last answer heard for
    /// one that does not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_seen: Option<Time>,
    /// The cluster's health: `Healthy`, `Degraded`, `Unreachable`,
    /// `Settling` (see [`ClusterHealth`](crate::health::ClusterHealth)).
    pub health: String,
    /// Whether the cluster does not answer (`Unreachable`, or set aside),
    /// its children are not read (their watch has not synced, or fails), or
    /// it is not engaged yet after a restart: the entry is its last value,
    /// as of [`last_seen`](Self::last_seen).
    #[serde(default)]
    pub stale: bool,
}

/// A condition of a child, as [`Read::condition`](super::Read::condition)
/// reads it (`metav1.Condition`'s fields, those the child has).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct ChildCondition {
    /// The condition's type.
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// Its reason, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Its message, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// When its status last changed, if the child says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<Time>,
}

impl ClusterEntry {
    /// The entry of `cluster` with nothing read yet.
    pub(super) fn new(cluster: String, health: String, stale: bool) -> Self {
        Self {
            cluster,
            health,
            stale,
            ..Self::default()
        }
    }

    /// Takes what `other` read (child, condition, value, message).
    pub(super) fn read_as(&mut self, other: &Self) {
        self.child.clone_from(&other.child);
        self.condition.clone_from(&other.condition);
        self.value.clone_from(&other.value);
        self.message.clone_from(&other.message);
    }

    /// The entry without its `lastSeen` when it is fresh: what a write
    /// changes if it changes anything else. A fresh entry's time is the
    /// write's, so it alone never makes one.
    pub(super) fn compared(&self) -> Self {
        let mut entry = self.clone();
        if !entry.stale {
            entry.last_seen = None;
        }
        entry
    }
}

/// The OpenAPI schema of a list of [`ClusterEntry`], for the parent's CRD
/// (with schemars: `#[schemars(schema_with = "...")]` on the field, through
/// `schemars::Schema::try_from`).
///
/// ```
/// let schema = kube_multicluster::gather::entries_schema();
/// assert_eq!(schema["type"], "array");
/// assert_eq!(schema["items"]["required"][0], "cluster");
/// ```
pub fn entries_schema() -> Value {
    let string = json!({ "type": "string" });
    let time = json!({ "type": "string", "format": "date-time" });
    json!({
        "type": "array",
        "items": {
            "type": "object",
            "required": ["cluster", "health"],
            "properties": {
                "cluster": string,
                "child": string,
                "condition": {
                    "type": "object",
                    "required": ["type", "status"],
                    "properties": {
                        "type": string,
                        "status": string,
                        "reason": string,
                        "message": string,
                        "lastTransitionTime": time,
                    },
                },
                "value": { "x-kubernetes-preserve-unknown-fields": true },
                "message": string,
                "lastSeen": time,
                "health": string,
                "stale": { "type": "boolean" },
            },
        },
    })
}
