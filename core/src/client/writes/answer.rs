//! Which requests are writes to record, and what their answers say.

use std::{collections::BTreeMap, sync::Arc};

use http::{Method, Request, Response};
use http_body_util::BodyExt;
use kube::client::Body;
use serde::Deserialize;
use tokio::time::Instant;
use tower::BoxError;

use super::{ObjectId, Sending, Writes, Written, version_of};
use crate::{client::cluster_client::AnyBody, cluster_name::ClusterName};

/// The object `path` names, and the subresource if any: `None` for a
/// collection, a path outside the API, or a subresource other than
/// `status` and `scale` (which change the object's own version).
fn object_of(
    path: &str,
    created: bool,
) -> Option<(String, String, Option<String>, Option<String>)> {
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let (group, rest) = match segments.as_slice() {
        ["api", _version, rest @ ..] => ("", rest),
        ["apis", group, _version, rest @ ..] => (*group, rest),
        _ => return None,
    };
    let (namespace, rest): (Option<&str>, &[&str]) = match rest {
        // A namespace itself, or its subresource.
        ["namespaces", _] | ["namespaces", _, "status" | "finalize"] => (None, rest),
        ["namespaces", namespace, rest @ ..] => (Some(*namespace), rest),
        rest => (None, rest),
    };
    let (resource, name) = match rest {
        [resource] if created => (*resource, None),
        [resource, name] => (*resource, Some(*name)),
        [resource, name, "status" | "scale" | "finalize"] if !created => (*resource, Some(*name)),
        _ => return None,
    };
    Some((
        group.to_owned(),
        resource.to_owned(),
        namespace.map(str::to_owned),
        name.map(str::to_owned),
    ))
}

#[derive(Deserialize)]
struct Stored {
    #[serde(default)]
    kind: Option<String>,
    #[serde(default)]
    metadata: Option<StoredMeta>,
    #[serde(default)]
    details: Option<StatusDetails>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct StoredMeta {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    resource_version: Option<String>,
    #[serde(default)]
    uid: Option<String>,
    #[serde(default)]
    labels: Option<BTreeMap<String, String>>,
    #[serde(default)]
    deletion_timestamp: Option<serde::de::IgnoredAny>,
    #[serde(default)]
    deletion_grace_period_seconds: Option<i64>,
    #[serde(default)]
    finalizers: Option<Vec<String>>,
}

#[derive(Deserialize)]
struct StatusDetails {
    #[serde(default)]
    uid: Option<String>,
}

/// What a write request is, if it is one to record: its method and path.
pub(crate) struct Pending {
    method: Method,
    path: String,
    writer: Arc<str>,
    /// The cluster whose client sends it.
    cluster: ClusterName,
    _sending: Option<Sending>,
}

/// The write `request` makes, to record once answered; `None` for a read,
/// a dry run, a collection's deletion or a subresource that is not the
/// object's. Note it as on its way with [`Prepared::sending`] before the
/// request is sent.
pub(crate) fn pending(
    request: &Request<Body>,
    writer: Arc<str>,
    cluster: &ClusterName,
) -> Option<Prepared> {
    let method = request.method();
    if !matches!(
        *method,
        Method::POST | Method::PUT | Method::PATCH | Method::DELETE
    ) {
        return None;
    }
    if request.uri().query().is_some_and(|q| q.contains("dryRun=")) {
        return None;
    }
    let path = request.uri().path();
    let created = *method == Method::POST;
    let (group, resource, namespace, name) = object_of(path, created)?;
    // A create names its object in its body, unless the server does.
    let body = if name.is_none() {
        request.body().try_clone()
    } else {
        None
    };
    Some(Prepared {
        pending: Pending {
            method: method.clone(),
            path: path.to_owned(),
            writer,
            cluster: cluster.clone(),
            _sending: None,
        },
        id: (group, resource, namespace, name),
        body,
    })
}

/// A write about to be sent.
pub(crate) struct Prepared {
    pending: Pending,
    id: (String, String, Option<String>, Option<String>),
    body: Option<Body>,
}

impl Prepared {
    /// Notes the write in `writes` as on its way.
    pub(crate) async fn sending(self, writes: &Arc<Writes>) -> Pending {
        let Prepared {
            mut pending,
            id: (group, resource, namespace, name),
            body,
        } = self;
        let name = match (name, body) {
            (Some(name), _) => Some(name),
            (None, Some(body)) => body
                .collect_bytes()
                .await
                .ok()
                .and_then(|bytes| serde_json::from_slice::<Stored>(&bytes).ok())
                .and_then(|stored| stored.metadata?.name),
            (None, None) => None,
        };
        if let Some(name) = name {
            let id = ObjectId {
                group,
                resource,
                namespace,
                name,
            };
            pending._sending = Some(writes.sending(id, pending.writer.clone()));
        }
        pending
    }
}

impl Pending {
    /// Records the write `response` answers in `writes`, and gives the
    /// response back whole. Only a successful answer is read.
    pub(crate) async fn answered(
        self,
        response: Response<AnyBody>,
        writes: &Writes,
    ) -> Result<Response<AnyBody>, BoxError> {
        if !response.status().is_success() {
            return Ok(response);
        }
        let (parts, body) = response.into_parts();
        let bytes = body.collect().await?.to_bytes();
        if let Some(written) = self.written(&bytes) {
            writes.record(written);
        }
        // Recorded: its echo is told by its version from now on.
        drop(self);
        let body = http_body_util::Full::new(bytes)
            .map_err(|never: std::convert::Infallible| -> BoxError { match never {} })
            .boxed_unsync();
        Ok(Response::from_parts(parts, body))
    }

    fn written(&self, bytes: &[u8]) -> Option<Written> {
        let created = self.method == Method::POST;
        let (group, resource, namespace, name) = object_of(&self.path, created)?;
        let stored: Stored = serde_json::from_slice(bytes).ok()?;
        let status = stored.kind.as_deref() == Some("Status");
        let meta = stored.metadata;
        let (version, uid, labels, gone) = match (&meta, status) {
            (Some(meta), false) => (
                version_of(meta.resource_version.as_deref())?,
                meta.uid.clone(),
                meta.labels.clone().unwrap_or_default(),
                self.deletes(meta),
            ),
            // A deletion answered with a `Status`: the object is gone.
            _ if self.method == Method::DELETE => {
                (0, stored.details.and_then(|d| d.uid), BTreeMap::new(), true)
            }
            _ => return None,
        };
        let name = name.or_else(|| meta.as_ref().and_then(|m| m.name.clone()))?;
        let namespace = namespace.or_else(|| meta.as_ref().and_then(|m| m.namespace.clone()));
        Some(Written {
            id: ObjectId {
                group,
                resource,
                namespace,
                name,
            },
            version,
            uid,
            gone,
            labels,
            writer: self.writer.clone(),
            cluster: self.cluster.clone(),
            at: Instant::now(),
        })
    }

    /// Whether the write, answered with `meta`, deleted its object: a
    /// deletion that left nothing to wait for (no finalizers, no grace
    /// period), or any write that took the last finalizer off an object
    /// being deleted. A deletion that left the object in place changed it,
    /// as an update does.
    fn deletes(&self, meta: &StoredMeta) -> bool {
        let waits = meta.finalizers.as_ref().is_some_and(|f| !f.is_empty())
            || meta.deletion_grace_period_seconds.is_some_and(|s| s > 0);
        match meta.deletion_timestamp {
            Some(_) => !waits,
            None => self.method == Method::DELETE,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_name_the_objects_written() {
        let of = |path, created| object_of(path, created);
        assert_eq!(
            of("/api/v1/namespaces/a/configmaps", true),
            Some(("".into(), "configmaps".into(), Some("a".into()), None))
        );
        assert_eq!(
            of("/apis/apps/v1/namespaces/a/deployments/b/status", false),
            Some((
                "apps".into(),
                "deployments".into(),
                Some("a".into()),
                Some("b".into())
            ))
        );
        assert_eq!(
            of("/api/v1/namespaces/a", false),
            Some(("".into(), "namespaces".into(), None, Some("a".into())))
        );
        assert_eq!(
            of("/api/v1/namespaces/a/status", false),
            Some(("".into(), "namespaces".into(), None, Some("a".into())))
        );
        assert_eq!(
            of("/apis/example.com/v1/widgets/w", false),
            Some((
                "example.com".into(),
                "widgets".into(),
                None,
                Some("w".into())
            ))
        );
        assert_eq!(of("/api/v1/namespaces/a/pods/p/eviction", true), None);
        assert_eq!(of("/api/v1/namespaces/a/configmaps", false), None);
        assert_eq!(of("/version", false), None);
    }

    fn pending(method: Method) -> Pending {
        Pending {
            method,
            path: "/api/v1/namespaces/a/configmaps/c".into(),
            writer: "parents".into(),
            cluster: "east".into(),
            _sending: None,
        }
    }

    #[test]
    fn a_write_that_takes_the_last_finalizer_off_deletes_and_one_that_leaves_some_does_not() {
        let answer = |meta: serde_json::Value| {
            serde_json::to_vec(&serde_json::json!({"kind": "ConfigMap", "metadata": meta})).unwrap()
        };
        let deleting = serde_json::json!({
            "name": "c", "namespace": "a", "uid": "u", "resourceVersion": "7",
            "deletionTimestamp": "2026-01-01T00:00:00Z",
        });
        let last_taken = pending(Method::PATCH)
            .written(&answer(deleting.clone()))
            .unwrap();
        assert!(last_taken.gone);
        let mut held = deleting.clone();
        held["finalizers"] = serde_json::json!(["example.com/cleanup"]);
        let held = pending(Method::DELETE).written(&answer(held)).unwrap();
        assert!(!held.gone, "still there, as after an update");
        assert_eq!(held.version, 7);
        let plain = serde_json::json!({"name": "c", "uid": "u", "resourceVersion": "8"});
        assert!(
            pending(Method::DELETE)
                .written(&answer(plain.clone()))
                .unwrap()
                .gone
        );
        assert!(!pending(Method::PATCH).written(&answer(plain)).unwrap().gone);
        let status = serde_json::json!({"kind": "Status", "details": {"uid": "u"}});
        let gone = pending(Method::DELETE)
            .written(&serde_json::to_vec(&status).unwrap())
            .unwrap();
        assert!(gone.gone);
        assert_eq!(gone.uid.as_deref(), Some("u"));
    }
}
