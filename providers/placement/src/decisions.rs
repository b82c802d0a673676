//! Which resources hold placement decisions, and the cluster names one holds.

use std::{fmt, sync::Arc};

use kube::{
    ResourceExt,
    api::{ApiResource, DynamicObject},
    runtime::watcher,
};
use kube_multicluster::ClusterName;

/// The label of Open Cluster Management's `PlacementDecision`s whose value
/// names the `Placement` they were made for.
pub const PLACEMENT_LABEL: &str = "cluster.open-cluster-management.io/placement";

type ClusterNames = Arc<dyn Fn(&str) -> ClusterName + Send + Sync>;

/// Resources that hold placement decisions: objects of one kind, in one
/// namespace or all, that match a label selector, each naming clusters in
/// `status.decisions[].clusterName`.
///
/// That is the shape Argo CD's `clusterDecisionResource` generator reads,
/// and the shape of Open Cluster Management's `PlacementDecision`
/// ([`Decisions::placement`]). Any other kind of that shape works through
/// [`Decisions::new`]:
///
/// ```
/// use kube::api::{ApiResource, GroupVersionKind};
/// use kube_multicluster::ClusterName;
/// use kube_multicluster_provider_placement::Decisions;
///
/// let gvk = GroupVersionKind::gvk("example.com", "v1", "Rollout");
/// let decisions = Decisions::new(ApiResource::from_gvk_with_plural(&gvk, "rollouts"))
///     .namespace("fleet")
///     .labels("app=web")
///     // The decisions name `east`; the provider placed over calls it `prod#east`.
///     .cluster_names(|name| ClusterName::new(format!("prod#{name}")));
/// assert_eq!(decisions.resource().kind, "Rollout");
/// ```
#[derive(Clone)]
pub struct Decisions {
    resource: ApiResource,
    namespace: Option<String>,
    labels: Option<String>,
    cluster_names: ClusterNames,
}

impl fmt::Debug for Decisions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Decisions")
            .field("resource", &self.resource.api_version)
            .field("kind", &self.resource.kind)
            .field("namespace", &self.namespace)
            .field("labels", &self.labels)
            .finish_non_exhaustive()
    }
}

impl Decisions {
    /// The decisions held in objects of `resource`, in every namespace,
    /// whatever their labels, naming clusters as the provider placed over
    /// names them.
    pub fn new(resource: ApiResource) -> Self {
        Self {
            resource,
            namespace: None,
            labels: None,
            cluster_names: Arc::new(|name| ClusterName::new(name)),
        }
    }

    /// The `PlacementDecision`s (`cluster.open-cluster-management.io/v1beta1`)
    /// of the `Placement` `placement` in `namespace`: those labelled
    /// [`PLACEMENT_LABEL`]`=<placement>` there.
    ///
    /// ```
    /// use kube_multicluster_provider_placement::Decisions;
    ///
    /// let decisions = Decisions::placement("fleet", "web");
    /// assert_eq!(decisions.resource().plural, "placementdecisions");
    /// ```
    pub fn placement(namespace: impl Into<String>, placement: &str) -> Self {
        Self::new(placement_decision())
            .namespace(namespace)
            .labels(&format!("{PLACEMENT_LABEL}={placement}"))
    }

    /// Reads the decisions of `namespace` alone.
    #[must_use]
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = Some(namespace.into());
        self
    }

    /// Reads the decisions that match the label selector `selector` alone
    /// (`app=web`, `tier in (a, b)`), as
    /// [`watcher::Config::labels`] takes it.
    #[must_use]
    pub fn labels(mut self, selector: &str) -> Self {
        self.labels = Some(selector.to_owned());
        self
    }

    /// How the provider placed over names the cluster that a decision
    /// names `name`; the same name unless set. A decision's
    /// `clusterName` is the name the placing system gives a cluster (an
    /// Open Cluster Management `ManagedCluster`, an Argo CD cluster), which
    /// need not be the name a provider gives it (a
    /// [multi provider](https://docs.rs/kube-multicluster-provider-multi)'s
    /// prefix, say).
    #[must_use]
    pub fn cluster_names(
        mut self,
        cluster_names: impl Fn(&str) -> ClusterName + Send + Sync + 'static,
    ) -> Self {
        self.cluster_names = Arc::new(cluster_names);
        self
    }

    /// The resource the decisions are read from.
    pub fn resource(&self) -> &ApiResource {
        &self.resource
    }

    pub(crate) fn api(&self, hub: kube::Client) -> kube::Api<DynamicObject> {
        match &self.namespace {
            Some(namespace) => kube::Api::namespaced_with(hub, namespace, &self.resource),
            None => kube::Api::all_with(hub, &self.resource),
        }
    }

    pub(crate) fn watcher_config(&self) -> watcher::Config {
        match &self.labels {
            Some(selector) => watcher::Config::default().labels(selector),
            None => watcher::Config::default(),
        }
    }

    /// What their watch is called in problems:
    /// `PlacementDecisions (cluster.open-cluster-management.io/v1beta1) in
    /// fleet labelled ...`.
    pub(crate) fn watch_source(&self) -> String {
        let mut source = format!("{}s ({})", self.resource.kind, self.resource.api_version);
        if let Some(namespace) = &self.namespace {
            source.push_str(&format!(" in {namespace}"));
        }
        if let Some(selector) = &self.labels {
            source.push_str(&format!(" labelled {selector}"));
        }
        source
    }

    /// What `object` is called in problems: `PlacementDecision fleet/web-1`.
    pub(crate) fn source(&self, object: &DynamicObject) -> String {
        format!("{} {}", self.resource.kind, key(object))
    }

    /// The cluster a decision's `clusterName` names, as the provider placed
    /// over names it.
    pub(crate) fn cluster_name(&self, name: &str) -> ClusterName {
        (self.cluster_names)(name)
    }
}

/// The resource of Open Cluster Management's `PlacementDecision`s.
///
/// ```
/// let resource = kube_multicluster_provider_placement::placement_decision();
/// assert_eq!(resource.api_version, "cluster.open-cluster-management.io/v1beta1");
/// assert_eq!(resource.kind, "PlacementDecision");
/// ```
pub fn placement_decision() -> ApiResource {
    ApiResource {
        group: "cluster.open-cluster-management.io".to_owned(),
        version: "v1beta1".to_owned(),
        api_version: "cluster.open-cluster-management.io/v1beta1".to_owned(),
        kind: "PlacementDecision".to_owned(),
        plural: "placementdecisions".to_owned(),
    }
}

/// An object's `namespace/name`, or its name if it has no namespace.
pub(crate) fn key(object: &DynamicObject) -> String {
    match object.namespace() {
        Some(namespace) => format!("{namespace}/{}", object.name_any()),
        None => object.name_any(),
    }
}

/// The cluster names a decision lists now, in order and once each, and
/// what in it is malformed (empty if nothing). An object being deleted
/// names none; so does one with no `status.decisions` yet.
pub(crate) fn named(object: &DynamicObject) -> (Vec<String>, Vec<String>) {
    let mut names = Vec::new();
    let mut malformed = Vec::new();
    if object.metadata.deletion_timestamp.is_some() {
        return (names, malformed);
    }
    let decisions = match object.data.get("status") {
        None | Some(serde_json::Value::Null) => return (names, malformed),
        Some(serde_json::Value::Object(status)) => status.get("decisions"),
        Some(_) => {
            malformed.push("status is not an object".to_owned());
            return (names, malformed);
        }
    };
    let decisions = match decisions {
        None | Some(serde_json::Value::Null) => return (names, malformed),
        Some(serde_json::Value::Array(decisions)) => decisions,
        Some(_) => {
            malformed.push("status.decisions is not a list".to_owned());
            return (names, malformed);
        }
    };
    for (index, decision) in decisions.iter().enumerate() {
        match decision.get("clusterName") {
            Some(serde_json::Value::String(name)) if !name.is_empty() => {
                if !names.contains(name) {
                    names.push(name.clone());
                }
            }
            Some(serde_json::Value::String(_)) => {
                malformed.push(format!("status.decisions[{index}].clusterName is empty"));
            }
            None | Some(serde_json::Value::Null) => {
                malformed.push(format!("status.decisions[{index}] has no clusterName"));
            }
            Some(_) => malformed.push(format!(
                "status.decisions[{index}].clusterName is not a string"
            )),
        }
    }
    (names, malformed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decision(status: serde_json::Value) -> DynamicObject {
        let mut object = DynamicObject::new("web-1", &placement_decision()).within("fleet");
        object.data = serde_json::json!({ "status": status });
        object
    }

    #[test]
    fn cluster_names_are_read_in_order_once_each() {
        let object = decision(serde_json::json!({ "decisions": [
            { "clusterName": "east", "reason": "" },
            { "clusterName": "west" },
            { "clusterName": "east" },
        ]}));
        assert_eq!(named(&object), (vec!["east".into(), "west".into()], vec![]));
    }

    #[test]
    fn a_decision_without_status_names_nothing_and_is_no_problem() {
        let mut object = decision(serde_json::Value::Null);
        assert_eq!(named(&object), (vec![], vec![]));
        object.data = serde_json::json!({});
        assert_eq!(named(&object), (vec![], vec![]));
        object.data = serde_json::json!({ "status": {} });
        assert_eq!(named(&object), (vec![], vec![]));
    }

    #[test]
    fn malformed_entries_are_told_and_the_others_still_count() {
        let object = decision(serde_json::json!({ "decisions": [
            { "clusterName": 7 },
            { "clusterName": "west" },
            "east",
            { "clusterName": "" },
            { "reason": "" },
        ]}));
        assert_eq!(
            named(&object),
            (
                vec!["west".into()],
                vec![
                    "status.decisions[0].clusterName is not a string".into(),
                    "status.decisions[2] has no clusterName".into(),
                    "status.decisions[3].clusterName is empty".into(),
                    "status.decisions[4] has no clusterName".into(),
                ]
            )
        );
        let object = decision(serde_json::json!({ "decisions": { "clusterName": "east" } }));
        assert_eq!(
            named(&object),
            (vec![], vec!["status.decisions is not a list".into()])
        );
    }

    #[test]
    fn sources_name_the_kind_and_the_object() {
        let decisions = Decisions::placement("fleet", "web");
        assert_eq!(
            decisions.source(&decision(serde_json::Value::Null)),
            "PlacementDecision fleet/web-1"
        );
        assert_eq!(
            decisions.watch_source(),
            "PlacementDecisions (cluster.open-cluster-management.io/v1beta1) in fleet \
             labelled cluster.open-cluster-management.io/placement=web"
        );
    }
}
