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

use std::sync::Arc;

use tower::BoxError;

use http::{Method, Request, Response};
use kube::client::Body;
use serde_json::Value;

use super::{
    error::OwnerReferenceAcross,
    inner::{AnyBody, Around, Below},
    reachability::Reachability,
    reconciling::{self, Owner},
};
use crate::cluster_name::ClusterName;

/// Refuses a write to its cluster that names as its owner the object being
/// reconciled in another cluster (see [`OwnerReferenceAcross`]), before
/// anything below is asked.
#[derive(Clone)]
pub(super) struct RefuseOwnersAcross {
    pub(super) cluster: ClusterName,
    pub(super) reachability: Arc<Reachability>,
}

impl Around for RefuseOwnersAcross {
    async fn around<S: Below>(
        self,
        request: Request<Body>,
        mut inner: S,
    ) -> Result<Response<AnyBody>, BoxError> {
        if let Some(check) = checked(&self, &request) {
            check.await?;
        }
        inner.call(request).await
    }
}

/// What is left to read to refuse a write to `to` during a reconcile in
/// another cluster whose body names the reconciled object as an owner:
/// nothing unless it is such a write, else its body. Call it from the task
/// that sends the request.
fn checked(
    to: &RefuseOwnersAcross,
    request: &Request<Body>,
) -> Option<impl Future<Output = Result<(), OwnerReferenceAcross>> + Send + 'static> {
    if !matches!(
        *request.method(),
        Method::POST | Method::PUT | Method::PATCH
    ) {
        return None;
    }
    let object = reconciling::current()?;
    let owner = object.object.clone()?;
    if object.cluster == to.cluster || owner.uid().is_none() {
        return None;
    }
    // A body in one piece, as kube's `Api` sends them; a streamed one is
    // not read.
    let body = request.body().try_clone()?;
    let cluster = to.cluster.clone();
    let path = request.uri().path().to_owned();
    let created = request.method() == Method::POST;
    let reachability = to.reachability.clone();
    Some(async move {
        let Ok(bytes) = body.collect_bytes().await else {
            return Ok(());
        };
        let Some(uid) = owner.uid() else {
            return Ok(());
        };
        if !names_owner(&bytes, uid)
            || !unreachable_owner(&object.reachability, &*owner, &reachability, &path)
        {
            return Ok(());
        }
        let path = if created {
            created_path(&path, &bytes)
        } else {
            path
        };
        Err(OwnerReferenceAcross {
            cluster,
            path,
            owner_cluster: object.cluster.clone(),
            owner: owner.describe(),
            uid: uid.to_owned(),
        })
    })
}

/// Whether the garbage collector where `path` is written cannot find the
/// reconciled object: it is in another cluster, or, in the same one (two
/// namespaces of one host engaged as clusters), in another namespace than
/// the child.
fn unreachable_owner(
    owner_reachability: &Arc<Reachability>,
    owner: &dyn Owner,
    reachability: &Arc<Reachability>,
    path: &str,
) -> bool {
    // Namespaces of one host share its reachability. Clusters of their own
    // are taken for different servers, even one engaged under two names:
    // an address does not tell (one proxy can front many clusters). The
    // logical clusters of a host split by annotation share it too, but
    // each has a garbage collector of its own.
    if !Arc::ptr_eq(owner_reachability, reachability) || reachability.is_collected_apart() {
        return true;
    }
    match owner.namespace() {
        // A cluster-scoped owner is found from any namespace.
        None => false,
        Some(namespace) => namespace_of(path) != Some(namespace),
    }
}

/// The namespace of the object at `path` (`/api/v1/namespaces/a/pods`,
/// `/apis/apps/v1/namespaces/a/deployments/b`); `None` for a cluster-scoped
/// one (a `Namespace` itself among them).
fn namespace_of(path: &str) -> Option<&str> {
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let at = match segments.first() {
        Some(&"api") => 2,
        Some(&"apis") => 3,
        _ => return None,
    };
    match (segments.get(at), segments.get(at + 1), segments.get(at + 2)) {
        (Some(&"namespaces"), Some(namespace), Some(_)) => Some(namespace),
        _ => None,
    }
}

/// The path of the object a create to the collection at `collection`
/// with the body `bytes` would make: the collection's, with the body's
/// name (or its `generateName` and `*`) after it; the collection's alone
/// if the body has neither.
fn created_path(collection: &str, bytes: &[u8]) -> String {
    let body = serde_json::from_slice::<Value>(bytes).unwrap_or_default();
    let field = |name: &str| {
        body.pointer(&format!("/metadata/{name}"))
            .and_then(Value::as_str)
            .filter(|value| !value.is_empty())
    };
    let collection = collection.trim_end_matches('/');
    match (field("name"), field("generateName")) {
        (Some(name), _) => format!("{collection}/{name}"),
        (None, Some(prefix)) => format!("{collection}/{prefix}*"),
        (None, None) => collection.to_owned(),
    }
}

/// Whether `bytes` (an object, a merge or apply patch, or a JSON patch)
/// put an owner reference with `uid` into the object's
/// `metadata.ownerReferences`.
fn names_owner(bytes: &[u8], uid: &str) -> bool {
    // Most writes do not carry the UID at all.
    let Ok(text) = std::str::from_utf8(bytes) else {
        return false;
    };
    if !text.contains(uid) {
        return false;
    }
    let Ok(body) = serde_json::from_str::<Value>(text) else {
        return false;
    };
    puts_owner(&body, uid)
}

const OWNER_REFERENCES: &str = "/metadata/ownerReferences";

fn puts_owner(body: &Value, uid: &str) -> bool {
    match body {
        Value::Object(_) => body
            .pointer(OWNER_REFERENCES)
            .is_some_and(|references| names_uid(references, uid)),
        // A JSON patch: its operations that add or replace owner
        // references, or the metadata that holds them.
        Value::Array(operations) => operations.iter().any(|operation| {
            let op = operation.get("op").and_then(Value::as_str);
            let path = operation.get("path").and_then(Value::as_str);
            let (Some("add" | "replace"), Some(path), Some(value)) =
                (op, path, operation.get("value"))
            else {
                return false;
            };
            if path.starts_with(OWNER_REFERENCES) {
                names_uid(value, uid)
            } else if let Some(rest) = OWNER_REFERENCES.strip_prefix(path) {
                value
                    .pointer(rest)
                    .is_some_and(|references| names_uid(references, uid))
            } else {
                false
            }
        }),
        _ => false,
    }
}

/// Whether `references` (a list of owner references, or one) hold one to
/// `uid` that is put, not taken out (a strategic merge patch's
/// `$patch: delete`).
fn names_uid(references: &Value, uid: &str) -> bool {
    let names = |reference: &Value| {
        reference.get("uid").and_then(Value::as_str) == Some(uid)
            && reference.get("$patch").is_none()
    };
    match references {
        Value::Array(references) => references.iter().any(names),
        reference => names(reference),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::{
        super::{
            cluster_client::ClusterClient,
            reconciling::{Reconciling, reconciling},
        },
        *,
    };

    const UID: &str = "0b5a41c4-hub-parent";

    fn owner() -> Value {
        json!({"apiVersion": "v1", "kind": "ConfigMap", "name": "parent", "uid": UID})
    }

    fn names(body: &Value) -> bool {
        names_owner(&serde_json::to_vec(body).unwrap(), UID)
    }

    #[test]
    fn owner_references_put_by_objects_and_patches_are_found() {
        assert!(names(
            &json!({"metadata": {"name": "child", "ownerReferences": [owner()]}})
        ));
        assert!(names(
            &json!([{"op": "add", "path": "/metadata/ownerReferences", "value": [owner()]}])
        ));
        assert!(names(
            &json!([{"op": "add", "path": "/metadata/ownerReferences/-", "value": owner()}])
        ));
        assert!(names(
            &json!([{"op": "replace", "path": "/metadata", "value": {"ownerReferences": [owner()]}}])
        ));
    }

    #[test]
    fn the_uid_elsewhere_or_taken_out_is_no_owner_reference() {
        // The marks `ParentRef::adopt` sets, and an Event about the parent.
        assert!(!names(&json!({"metadata": {
            "labels": {"kube-multicluster.dev/parent-uid": UID},
            "annotations": {"kube-multicluster.dev/parent": format!("{{\"uid\":\"{UID}\"}}")},
        }})));
        assert!(!names(
            &json!({"involvedObject": owner(), "reason": "Copied"})
        ));
        // A manifest carried inside another object's spec.
        assert!(!names(
            &json!({"spec": {"manifests": [{"metadata": {"ownerReferences": [owner()]}}]}})
        ));
        // A reference taken out, or only tested.
        let mut taken_out = owner();
        taken_out["$patch"] = json!("delete");
        assert!(!names(
            &json!({"metadata": {"ownerReferences": [taken_out]}})
        ));
        assert!(!names(
            &json!([{"op": "test", "path": "/metadata/ownerReferences", "value": [owner()]}])
        ));
        assert!(!names(
            &json!({"metadata": {"ownerReferences": [{"uid": "another", "name": "x"}]}})
        ));
    }

    #[test]
    fn namespaces_are_read_from_the_path() {
        assert_eq!(namespace_of("/api/v1/namespaces/a/configmaps"), Some("a"));
        assert_eq!(
            namespace_of("/apis/apps/v1/namespaces/b/deployments/x"),
            Some("b")
        );
        assert_eq!(
            namespace_of("/api/v1/namespaces/a"),
            None,
            "the Namespace itself"
        );
        assert_eq!(
            namespace_of("/apis/rbac.authorization.k8s.io/v1/clusterroles"),
            None
        );
    }

    fn request(method: Method, path: &str, body: &Value) -> Request<Body> {
        Request::builder()
            .method(method)
            .uri(path)
            .body(Body::from(serde_json::to_vec(body).unwrap()))
            .unwrap()
    }

    fn client() -> ClusterClient {
        let config = kube::Config::new("https://hub.example.com".parse().unwrap());
        ClusterClient::from(kube::Client::try_from(config).unwrap())
    }

    /// A cluster's side of a write: its name and reachability.
    struct Side {
        cluster: ClusterName,
        reachability: Arc<Reachability>,
    }

    impl Side {
        fn new(name: &str) -> Self {
            Self::sharing(name, &Arc::new(Reachability::new(name.into(), client())))
        }

        fn sharing(name: &str, reachability: &Arc<Reachability>) -> Self {
            Self {
                cluster: name.into(),
                reachability: reachability.clone(),
            }
        }

        async fn write(
            &self,
            method: Method,
            path: &str,
            body: &Value,
        ) -> Result<(), OwnerReferenceAcross> {
            use tower::{Layer, Service, ServiceExt};

            use crate::client::inner::AroundLayer;

            // Through the layer, over a mock of what is below it: a write it
            // refuses reaches nothing below.
            let (below, mut handle) = tower_test::mock::pair::<Request<Body>, Response<AnyBody>>();
            let mut service = AroundLayer(RefuseOwnersAcross {
                cluster: self.cluster.clone(),
                reachability: self.reachability.clone(),
            })
            .layer(below);
            let call = service
                .ready()
                .await
                .unwrap()
                .call(request(method, path, body));
            drop(service);
            let answer = async {
                let (_, send) = handle.next_request().await?;
                send.send_response(Response::new(AnyBody::default()));
                Some(())
            };
            match tokio::join!(call, answer) {
                (Ok(_), sent) => {
                    assert!(sent.is_some(), "an allowed write goes below");
                    Ok(())
                }
                (Err(error), sent) => {
                    assert!(sent.is_none(), "a refused write reaches nothing below");
                    Err(*error.downcast::<OwnerReferenceAcross>().expect("a refusal"))
                }
            }
        }
    }

    fn parent_in(side: &Side, namespace: Option<&str>) -> Reconciling {
        let mut parent = k8s_openapi::api::core::v1::ConfigMap::default();
        parent.metadata.name = Some("parent".into());
        parent.metadata.namespace = namespace.map(str::to_owned);
        parent.metadata.uid = Some(UID.into());
        Reconciling {
            cluster: side.cluster.clone(),
            reachability: side.reachability.clone(),
            object: Some(Arc::new(parent)),
            writer: None,
        }
    }

    const CONFIGMAPS: &str = "/api/v1/namespaces/default/configmaps";

    #[tokio::test]
    async fn only_writes_to_another_cluster_during_the_owners_reconcile_are_refused() {
        let child = json!({"metadata": {"name": "child", "ownerReferences": [owner()]}});
        let (hub, member) = (Side::new("hub"), Side::new("member"));
        // Outside any reconcile: nothing known of the owner.
        assert!(member.write(Method::POST, CONFIGMAPS, &child).await.is_ok());
        let refused = reconciling(parent_in(&hub, Some("default")), async {
            assert!(
                hub.write(Method::POST, CONFIGMAPS, &child).await.is_ok(),
                "its own cluster"
            );
            assert!(
                member.write(Method::GET, CONFIGMAPS, &child).await.is_ok(),
                "a read"
            );
            member.write(Method::PATCH, CONFIGMAPS, &child).await
        })
        .await
        .expect_err("refused");
        assert_eq!(refused.cluster, member.cluster);
        assert_eq!(refused.owner_cluster.as_str(), "hub");
        assert_eq!(refused.path, CONFIGMAPS);
        assert_eq!(refused.owner, "default/parent");
        let text = refused.to_string();
        assert!(text.contains("owns_across") && text.contains(UID), "{text}");
    }

    #[tokio::test]
    async fn a_refused_create_names_the_object_it_would_have_made() {
        let (hub, member) = (Side::new("hub"), Side::new("member"));
        let named = json!({"metadata": {"name": "child", "ownerReferences": [owner()]}});
        let generated =
            json!({"metadata": {"generateName": "child-", "ownerReferences": [owner()]}});
        let refused = |body: Value| {
            let (hub, member) = (&hub, &member);
            async move {
                reconciling(parent_in(hub, Some("default")), async {
                    member.write(Method::POST, CONFIGMAPS, &body).await
                })
                .await
                .expect_err("refused")
            }
        };
        let by_name = refused(named).await;
        assert_eq!(by_name.path, format!("{CONFIGMAPS}/child"));
        assert!(
            by_name
                .to_string()
                .contains("configmaps/child to cluster member"),
            "{by_name}"
        );
        let by_prefix = refused(generated).await;
        assert_eq!(by_prefix.path, format!("{CONFIGMAPS}/child-*"));
    }

    #[tokio::test]
    async fn on_the_same_server_only_a_namespaced_owner_in_another_namespace_is_refused() {
        let child = json!({"metadata": {"name": "child", "ownerReferences": [owner()]}});
        // Two namespaces of one host: one reachability between them.
        let a = Side::new("team-a");
        let b = Side::sharing("team-b", &a.reachability);
        let cluster_scoped = reconciling(parent_in(&a, None), async {
            b.write(Method::POST, CONFIGMAPS, &child).await
        });
        assert!(cluster_scoped.await.is_ok(), "found from any namespace");
        let same_namespace = reconciling(parent_in(&a, Some("default")), async {
            b.write(Method::POST, CONFIGMAPS, &child).await
        });
        assert!(
            same_namespace.await.is_ok(),
            "the same namespace of the same server"
        );
        let other = reconciling(parent_in(&a, Some("team-a")), async {
            b.write(Method::POST, "/api/v1/namespaces/team-b/configmaps", &child)
                .await
        });
        assert!(other.await.is_err(), "another namespace");
    }

    #[tokio::test]
    async fn logical_clusters_of_one_host_are_refused_even_in_the_same_namespace() {
        let child = json!({"metadata": {"name": "child", "ownerReferences": [owner()]}});
        // Two logical clusters of a host split by annotation (kcp's): one
        // reachability, a garbage collector each.
        let shared = Arc::new(Reachability::new("shard".into(), client()).collected_apart(true));
        let (a, b) = (Side::sharing("a", &shared), Side::sharing("b", &shared));
        for namespace in [None, Some("default")] {
            let written = reconciling(parent_in(&a, namespace), async {
                b.write(Method::POST, CONFIGMAPS, &child).await
            });
            assert!(written.await.is_err(), "owner in {namespace:?}");
        }
        let own = reconciling(parent_in(&a, Some("default")), async {
            a.write(Method::POST, CONFIGMAPS, &child).await
        });
        assert!(own.await.is_ok(), "its own cluster");
    }
}
