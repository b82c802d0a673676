//! What the provider reads of an APIBinding and of an APIExportEndpointSlice.

use kube::{
    ResourceExt,
    api::{ApiResource, DynamicObject, GroupVersionKind},
};
use serde_json::Value;

/// The annotation kcp marks every object with: the logical cluster it is in.
pub const CLUSTER_ANNOTATION: &str = "kcp.io/cluster";

/// The annotation kcp marks a `LogicalCluster` with: its workspace's path
/// (`root:org:team`).
pub const PATH_ANNOTATION: &str = "kcp.io/path";

/// kcp's LogicalClusters (one, `cluster`, in each logical cluster), as an
/// export that claims them serves them.
pub(crate) fn logical_clusters() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("core.kcp.io", "v1alpha1", "LogicalCluster"),
        "logicalclusters",
    )
}

/// kcp's APIBindings, as an export's virtual workspace serves them.
pub(crate) fn api_bindings() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("apis.kcp.io", "v1alpha2", "APIBinding"),
        "apibindings",
    )
}

/// kcp's APIExportEndpointSlices.
pub(crate) fn endpoint_slices() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("apis.kcp.io", "v1alpha1", "APIExportEndpointSlice"),
        "apiexportendpointslices",
    )
}

/// The logical cluster an object is in, from its annotation.
pub(crate) fn logical_cluster(object: &DynamicObject) -> Option<&str> {
    object
        .annotations()
        .get(CLUSTER_ANNOTATION)
        .map(String::as_str)
        .filter(|name| !name.is_empty())
}

/// The permission claims of the export that the binding does not accept,
/// as `resource.group` (`configmaps` for the core group).
pub(crate) fn claims_not_accepted(binding: &DynamicObject) -> Vec<String> {
    let accepted: Vec<(&str, &str)> = binding.data["spec"]["permissionClaims"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|claim| claim["state"].as_str() == Some("Accepted"))
        .map(group_resource)
        .collect();
    binding.data["status"]["exportPermissionClaims"]
        .as_array()
        .into_iter()
        .flatten()
        .map(group_resource)
        .filter(|claim| !accepted.contains(claim))
        .map(|(group, resource)| {
            if group.is_empty() {
                resource.to_owned()
            } else {
                format!("{resource}.{group}")
            }
        })
        .collect()
}

fn group_resource(claim: &Value) -> (&str, &str) {
    (
        claim["group"].as_str().unwrap_or_default(),
        claim["resource"].as_str().unwrap_or_default(),
    )
}

/// The URLs an endpoint slice lists, in its order, each once.
pub(crate) fn endpoint_urls(slice: &DynamicObject) -> Vec<String> {
    let mut urls: Vec<String> = Vec::new();
    let endpoints = slice.data["status"]["endpoints"].as_array().into_iter();
    for url in endpoints.flatten().filter_map(|e| e["url"].as_str()) {
        let url = url.trim_end_matches('/');
        if !url.is_empty() && !urls.iter().any(|known| known == url) {
            urls.push(url.to_owned());
        }
    }
    urls
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(value: Value) -> DynamicObject {
        serde_json::from_value(value).expect("an object")
    }

    #[test]
    fn a_claim_of_the_export_not_accepted_by_the_binding_is_named() {
        let binding = object(serde_json::json!({
            "apiVersion": "apis.kcp.io/v1alpha2",
            "kind": "APIBinding",
            "metadata": {"name": "b", "annotations": {"kcp.io/cluster": "abc"}},
            "spec": {"permissionClaims": [
                {"group": "", "resource": "configmaps", "state": "Accepted"},
                {"group": "", "resource": "secrets", "state": "Rejected"},
            ]},
            "status": {"exportPermissionClaims": [
                {"group": "", "resource": "configmaps"},
                {"group": "", "resource": "secrets"},
                {"group": "apps", "resource": "deployments"},
            ]},
        }));
        assert_eq!(logical_cluster(&binding), Some("abc"));
        assert_eq!(
            claims_not_accepted(&binding),
            ["secrets", "deployments.apps"]
        );
    }

    #[test]
    fn an_endpoint_slice_lists_each_url_once() {
        let slice = object(serde_json::json!({
            "apiVersion": "apis.kcp.io/v1alpha1",
            "kind": "APIExportEndpointSlice",
            "metadata": {"name": "s"},
            "status": {"endpoints": [{"url": "https://a/x/"}, {"url": "https://a/x"}, {"url": ""}, {"url": "https://b/x"}]},
        }));
        assert_eq!(endpoint_urls(&slice), ["https://a/x", "https://b/x"]);
        let empty = object(serde_json::json!({
            "apiVersion": "apis.kcp.io/v1alpha1",
            "kind": "APIExportEndpointSlice",
            "metadata": {"name": "s"},
        }));
        assert!(endpoint_urls(&empty).is_empty());
    }
}
