//! Owner references that cannot hold: an object written to one cluster
//! that names as its owner the object being reconciled in another.
//!
//! Kubernetes' garbage collector deletes an object whose owners are all
//! gone, and an owner reference names an object of the same cluster (and,
//! for a namespaced owner, the same namespace). A child written to a member
//! with an owner reference to its parent in the hub is deleted there soon
//! after it is made, and made again by the next reconcile, without end. Each
//! cluster's client refuses such a write while the parent is reconciled, so
//! the loop never starts.

use std::{future::Future, sync::Arc};

use http::{Method, Request};
use kube::{Resource, ResourceExt, client::Body};
use serde_json::Value;

use crate::cluster_name::ClusterName;

tokio::task_local! {
    static RECONCILING: Reconciling;
}

/// What an owner reference can name: an object read from its API server.
pub(crate) trait Owner: Send + Sync {
    /// Its UID, if it has one.
    fn uid(&self) -> Option<&str>;
    /// `namespace/name`, or `name`.
    fn describe(&self) -> String;
}

impl<K: Resource + Send + Sync> Owner for K {
    fn uid(&self) -> Option<&str> {
        self.meta().uid.as_deref()
    }

    fn describe(&self) -> String {
        match self.meta().namespace.as_deref() {
            Some(namespace) => format!("{namespace}/{}", self.name_any()),
            None => self.name_any(),
        }
    }
}

/// The object a reconcile runs for, as the clients it writes through see
/// it.
#[derive(Clone)]
pub(crate) struct Reconciling {
    /// Its cluster.
    pub(crate) cluster: ClusterName,
    /// The object, shared with the cache.
    pub(crate) object: Arc<dyn Owner>,
}

/// Runs `reconcile` as the reconcile of `object` (none: an object that is
/// gone, which nothing can name as its owner).
pub(crate) async fn reconciling<F: Future>(object: Option<Reconciling>, reconcile: F) -> F::Output {
    match object {
        Some(object) => RECONCILING.scope(object, reconcile).await,
        None => reconcile.await,
    }
}

/// A write refused before it was sent: the object names as its owner, in
/// `metadata.ownerReferences`, the object being reconciled in another
/// cluster, where the owner does not exist.
///
/// The cluster's garbage collector would delete the object soon after it
/// was made, for want of its owner, and the next reconcile make it again,
/// without end. A child in another cluster than its parent is marked with
/// [`ParentRef::adopt`](crate::ownership::ParentRef::adopt) instead, and
/// its parent reconciled when it changes or goes with
/// [`Controller::owns_across`](crate::Controller::owns_across); see
/// [`ownership`](crate::ownership).
///
/// The cluster's client refuses it while its reconcile runs (also when a
/// layer or [`apply`](crate::apply::apply) makes the write), but not from a
/// task the reconcile spawned. It reaches the reconciler as
/// `kube::Error::Service` holding this error:
///
/// ```
/// use kube_fleet::ownership::OwnerReferenceAcross;
///
/// fn refused(error: &kube::Error) -> Option<&OwnerReferenceAcross> {
///     match error {
///         kube::Error::Service(inner) => inner.downcast_ref(),
///         _ => None,
///     }
/// }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "refused to write {path} to cluster {cluster}: its ownerReferences name {owner} (uid {uid}), \
     which is in cluster {owner_cluster}, not in {cluster}; {cluster}'s garbage collector would \
     delete the object and the reconcile make it again, without end. Mark the child with \
     ParentRef::adopt and watch it with Controller::owns_across instead"
)]
#[non_exhaustive]
pub struct OwnerReferenceAcross {
    /// The cluster the write was for.
    pub cluster: ClusterName,
    /// The path of the request (the object, or its collection for a
    /// create).
    pub path: String,
    /// The cluster of the owner.
    pub owner_cluster: ClusterName,
    /// The owner, as `namespace/name` (or `name`), in `owner_cluster`.
    pub owner: String,
    /// The owner's UID.
    pub uid: String,
}

/// Refuses `request` if it is a write to `cluster` during a reconcile in
/// another cluster whose body names the reconciled object as an owner.
/// Call it from the task that sends the request.
#[cfg(test)]
async fn refuse_owner_across(
    cluster: &ClusterName,
    request: &Request<Body>,
) -> Result<(), OwnerReferenceAcross> {
    match checked(cluster, request) {
        Some(check) => check.await,
        None => Ok(()),
    }
}

/// What is left to read to refuse a write to `cluster` during a reconcile
/// in another cluster whose body names the reconciled object as an owner:
/// nothing unless it is such a write, else its body. Call it from the task
/// that sends the request.
pub(super) fn checked(
    cluster: &ClusterName,
    request: &Request<Body>,
) -> Option<impl Future<Output = Result<(), OwnerReferenceAcross>> + Send + 'static> {
    if !matches!(
        *request.method(),
        Method::POST | Method::PUT | Method::PATCH
    ) {
        return None;
    }
    let object = RECONCILING.try_with(Reconciling::clone).ok()?;
    if object.cluster == *cluster || object.object.uid().is_none() {
        return None;
    }
    // A body in one piece, as kube's `Api` sends them; a streamed one is
    // not read.
    let body = request.body().try_clone()?;
    let (cluster, path) = (cluster.clone(), request.uri().path().to_owned());
    Some(async move {
        let Ok(bytes) = body.collect_bytes().await else {
            return Ok(());
        };
        refused(&bytes, &object, cluster, path)
    })
}

fn refused(
    bytes: &[u8],
    object: &Reconciling,
    cluster: ClusterName,
    path: String,
) -> Result<(), OwnerReferenceAcross> {
    let Some(uid) = object.object.uid() else {
        return Ok(());
    };
    // Most writes do not carry the UID at all.
    if !contains(bytes, uid.as_bytes()) {
        return Ok(());
    }
    let Ok(body) = serde_json::from_slice::<Value>(bytes) else {
        return Ok(());
    };
    if !names_owner(&body, uid) {
        return Ok(());
    }
    Err(OwnerReferenceAcross {
        cluster,
        path,
        owner_cluster: object.cluster.clone(),
        owner: object.object.describe(),
        uid: uid.to_owned(),
    })
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|w| w == needle)
}

/// Whether `body` (an object, a merge or apply patch, or a JSON patch)
/// puts an owner reference with `uid` into the object it writes.
fn names_owner(body: &Value, uid: &str) -> bool {
    let has_uid = |reference: &Value| reference.get("uid").and_then(Value::as_str) == Some(uid);
    let in_list = |references: &Value| match references {
        Value::Array(references) => references.iter().any(has_uid),
        reference => has_uid(reference),
    };
    match body {
        Value::Object(fields) => {
            // A JSON patch's operation on the owner references.
            let path = fields.get("path").and_then(Value::as_str);
            if path.is_some_and(|path| path.contains("/ownerReferences"))
                && fields.get("value").is_some_and(in_list)
            {
                return true;
            }
            fields.iter().any(|(name, value)| {
                (name == "ownerReferences" && in_list(value)) || names_owner(value, uid)
            })
        }
        Value::Array(items) => items.iter().any(|item| names_owner(item, uid)),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const UID: &str = "0b5a41c4-hub-parent";

    fn owner() -> Value {
        json!({"apiVersion": "v1", "kind": "ConfigMap", "name": "parent", "uid": UID})
    }

    #[test]
    fn owner_references_are_found_in_objects_patches_and_lists() {
        let object = json!({"metadata": {"name": "child", "ownerReferences": [owner()]}});
        assert!(names_owner(&object, UID));
        let json_patch =
            json!([{"op": "add", "path": "/metadata/ownerReferences", "value": [owner()]}]);
        assert!(names_owner(&json_patch, UID));
        let one = json!([{"op": "add", "path": "/metadata/ownerReferences/-", "value": owner()}]);
        assert!(names_owner(&one, UID));
        let list = json!({"items": [{"metadata": {"ownerReferences": [owner()]}}]});
        assert!(names_owner(&list, UID));
    }

    #[test]
    fn the_uid_elsewhere_is_no_owner_reference() {
        // The marks `ParentRef::adopt` sets, and an Event about the parent.
        let adopted = json!({"metadata": {
            "labels": {"kube-fleet.dev/parent-uid": UID},
            "annotations": {"kube-fleet.dev/parent": format!("{{\"uid\":\"{UID}\"}}")},
        }});
        assert!(!names_owner(&adopted, UID));
        let event = json!({"involvedObject": owner(), "reason": "Copied"});
        assert!(!names_owner(&event, UID));
        let other = json!({"metadata": {"ownerReferences": [{"uid": "another", "name": "x"}]}});
        assert!(!names_owner(&other, UID));
    }

    fn request(method: Method, body: &Value) -> Request<Body> {
        Request::builder()
            .method(method)
            .uri("/api/v1/namespaces/default/configmaps")
            .body(Body::from(serde_json::to_vec(body).unwrap()))
            .unwrap()
    }

    fn hub_parent() -> Reconciling {
        let mut parent = k8s_openapi::api::core::v1::ConfigMap::default();
        parent.metadata.name = Some("parent".into());
        parent.metadata.namespace = Some("default".into());
        parent.metadata.uid = Some(UID.into());
        Reconciling {
            cluster: "hub".into(),
            object: Arc::new(parent),
        }
    }

    #[tokio::test]
    async fn only_writes_to_another_cluster_during_the_owners_reconcile_are_refused() {
        let child = json!({"metadata": {"name": "child", "ownerReferences": [owner()]}});
        let member = ClusterName::new("member");
        // Outside any reconcile: nothing known of the owner.
        assert!(
            refuse_owner_across(&member, &request(Method::POST, &child))
                .await
                .is_ok()
        );
        let refused = reconciling(Some(hub_parent()), async {
            let same = refuse_owner_across(&"hub".into(), &request(Method::POST, &child)).await;
            assert!(same.is_ok(), "the owner's own cluster");
            let read = refuse_owner_across(&member, &request(Method::GET, &child)).await;
            assert!(read.is_ok(), "a read");
            refuse_owner_across(&member, &request(Method::PATCH, &child)).await
        })
        .await
        .expect_err("refused");
        assert_eq!(refused.cluster, member);
        assert_eq!(refused.owner_cluster.as_str(), "hub");
        assert_eq!(refused.path, "/api/v1/namespaces/default/configmaps");
        assert_eq!(refused.owner, "default/parent");
        let text = refused.to_string();
        assert!(text.contains("owns_across") && text.contains(UID), "{text}");
    }
}
