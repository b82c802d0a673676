//! What a child carries of its parent in another cluster, and reading it
//! back: below the controller, whose `owns_across` maps children to
//! parents with it.

use std::{collections::BTreeMap, fmt};

use kube::{Resource, ResourceExt};

use crate::{
    cluster_name::ClusterName,
    object_request::ObjectRequest,
    request::{McRequest, ObjectKey},
};

/// The annotation on a child that names its parent in another cluster:
/// JSON with `cluster`, `apiVersion`, `kind`, `namespace` (for a namespaced
/// parent), `name` and `uid`.
pub const PARENT_ANNOTATION: &str = crate::prefixed!("parent");

/// The label on a child that holds its parent's UID.
pub const PARENT_UID_LABEL: &str = crate::prefixed!("parent-uid");

/// A parent in some cluster, as its children in other clusters name it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ParentRef {
    /// The parent's cluster.
    pub cluster: ClusterName,
    /// The parent's API version (`group/version`, or `version` for the core
    /// group).
    pub api_version: String,
    /// The parent's kind.
    pub kind: String,
    /// The parent's namespace; `None` for a cluster-scoped parent.
    pub namespace: Option<String>,
    /// The parent's name.
    pub name: String,
    /// The parent's UID.
    pub uid: String,
}

/// Why a parent reference cannot be made or read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ParentRefError {
    /// The parent has no UID or no name: it was not read from the API server.
    #[error("{kind} {name} has no {missing}: a parent must be read from its API server")]
    Incomplete {
        /// The parent's kind.
        kind: String,
        /// The parent's name, if any.
        name: String,
        /// What is missing.
        missing: &'static str,
    },
    /// A child's annotation is not a parent reference.
    #[error("annotation {PARENT_ANNOTATION} of {child} is not a parent reference: {reason}")]
    Malformed {
        /// The child, as `namespace/name`.
        child: String,
        /// What is wrong.
        reason: String,
    },
}

impl ParentRef {
    /// The reference to `parent`, which lives in `cluster`.
    pub fn of<P: Resource<DynamicType = ()>>(
        cluster: &ClusterName,
        parent: &P,
    ) -> Result<Self, ParentRefError> {
        let kind = P::kind(&()).into_owned();
        let missing = |missing| ParentRefError::Incomplete {
            kind: kind.clone(),
            name: parent.name_any(),
            missing,
        };
        let name = parent.meta().name.clone().ok_or_else(|| missing("name"))?;
        let uid = parent.meta().uid.clone().ok_or_else(|| missing("uid"))?;
        Ok(Self {
            cluster: cluster.clone(),
            api_version: P::api_version(&()).into_owned(),
            kind,
            namespace: parent.namespace(),
            name,
            uid,
        })
    }

    /// The reference to a request's object; `None` if the object is gone.
    pub fn of_request<P: Resource<DynamicType = ()>>(
        request: &ObjectRequest<P>,
    ) -> Option<Result<Self, ParentRefError>> {
        let parent = request.object.as_ref()?;
        Some(Self::of(request.cluster.name(), parent.as_ref()))
    }

    /// The parent `child` names, if it carries [`PARENT_ANNOTATION`].
    pub fn of_child<C: Resource>(child: &C) -> Option<Result<Self, ParentRefError>> {
        let value = child.annotations().get(PARENT_ANNOTATION)?;
        let malformed = |reason: String| ParentRefError::Malformed {
            child: ObjectKey::of(child).to_string(),
            reason,
        };
        let parsed: serde_json::Value = match serde_json::from_str(value) {
            Ok(parsed) => parsed,
            Err(error) => return Some(Err(malformed(error.to_string()))),
        };
        let field = |name: &str| parsed.get(name).and_then(|v| v.as_str()).map(str::to_owned);
        let required =
            |name: &'static str| field(name).ok_or_else(|| malformed(format!("no {name}")));
        Some((|| {
            Ok(Self {
                cluster: ClusterName::new(required("cluster")?),
                api_version: required("apiVersion")?,
                kind: required("kind")?,
                namespace: field("namespace"),
                name: required("name")?,
                uid: required("uid")?,
            })
        })())
    }

    /// Marks `child` as this parent's: sets [`PARENT_ANNOTATION`] and
    /// [`PARENT_UID_LABEL`], keeping its other annotations and labels.
    ///
    /// A child in another cluster than its parent takes these instead of
    /// an owner reference, which its cluster's garbage collector would take
    /// for one to an owner that is gone: while the parent is reconciled,
    /// writing a child that names it in `ownerReferences` to any other
    /// cluster fails with [`OwnerReferenceAcross`](super::OwnerReferenceAcross).
    pub fn adopt<C: Resource>(&self, child: &mut C) {
        child
            .annotations_mut()
            .insert(PARENT_ANNOTATION.to_owned(), self.annotation());
        child
            .labels_mut()
            .insert(PARENT_UID_LABEL.to_owned(), self.uid.clone());
    }

    /// The value of [`PARENT_ANNOTATION`] for this parent.
    pub fn annotation(&self) -> String {
        let mut fields = BTreeMap::new();
        fields.insert("cluster", self.cluster.as_str());
        fields.insert("apiVersion", &self.api_version);
        fields.insert("kind", &self.kind);
        if let Some(namespace) = &self.namespace {
            fields.insert("namespace", namespace);
        }
        fields.insert("name", &self.name);
        fields.insert("uid", &self.uid);
        serde_json::to_string(&fields).expect("strings serialize")
    }

    /// The request that reconciles the parent.
    pub fn request(&self) -> McRequest {
        McRequest::new(
            self.cluster.clone(),
            self.namespace.clone(),
            self.name.clone(),
        )
    }

    /// Whether the parent is a `P`: same kind and API group.
    pub fn is_a<P: Resource<DynamicType = ()>>(&self) -> bool {
        self.kind == P::kind(&()) && group(&self.api_version) == P::group(&())
    }

    /// The label selector of this parent's children.
    pub fn selector(&self) -> String {
        format!("{PARENT_UID_LABEL}={}", self.uid)
    }

    /// The parent's identity without its UID: what its children are found by.
    pub(super) fn key(&self) -> String {
        parent_key(
            &self.cluster,
            group(&self.api_version),
            &self.kind,
            self.namespace.as_deref(),
            &self.name,
        )
    }
}

impl fmt::Display for ParentRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.kind, self.request())
    }
}

fn group(api_version: &str) -> &str {
    api_version.rsplit_once('/').map_or("", |(group, _)| group)
}

fn parent_key(
    cluster: &ClusterName,
    group: &str,
    kind: &str,
    namespace: Option<&str>,
    name: &str,
) -> String {
    // Newlines are in no cluster, group, kind, namespace or name.
    format!(
        "{}\n{group}\n{kind}\n{}\n{name}",
        cluster.as_str(),
        namespace.unwrap_or("")
    )
}

/// The requests for the parents of kind `P` a child names.
pub(crate) fn parents_of<P, C>(child: &C) -> Option<McRequest>
where
    P: Resource<DynamicType = ()>,
    C: Resource,
{
    match ParentRef::of_child(child)? {
        Ok(parent) if parent.is_a::<P>() => Some(parent.request()),
        Ok(_) => None,
        Err(error) => {
            tracing::warn!(%error, "a child's parent reference is unreadable; it maps to no parent");
            None
        }
    }
}

/// Whether the parent key `key` is that of `parent`'s request (any kind:
/// a `Children` holds the children of one parent type's controller).
pub(super) fn key_names(key: &str, parent: &McRequest) -> bool {
    let mut parts = key.split('\n');
    let [Some(cluster), Some(_), Some(_), Some(namespace), Some(name)] =
        std::array::from_fn(|_| parts.next())
    else {
        return false;
    };
    cluster == parent.cluster.as_str()
        && namespace == parent.namespace.as_deref().unwrap_or("")
        && name == parent.name
}

pub(super) fn request_key<P: Resource<DynamicType = ()>>(request: &McRequest) -> String {
    parent_key(
        &request.cluster,
        &P::group(&()),
        &P::kind(&()),
        request.namespace.as_deref(),
        &request.name,
    )
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::{apps::v1::Deployment, core::v1::ConfigMap};
    use kube::api::ObjectMeta;

    use super::*;

    fn parent(namespace: Option<&str>, name: &str, uid: &str) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                namespace: namespace.map(str::to_owned),
                name: Some(name.to_owned()),
                uid: Some(uid.to_owned()),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        }
    }

    fn child_with(annotation: Option<&str>) -> ConfigMap {
        let mut child = ConfigMap::default();
        child.metadata.namespace = Some("apps".into());
        child.metadata.name = Some("copy".into());
        if let Some(value) = annotation {
            child
                .annotations_mut()
                .insert(PARENT_ANNOTATION.into(), value.into());
        }
        child
    }

    #[test]
    fn a_reference_written_by_adopt_reads_back_the_same() {
        let hub = ClusterName::new("hub");
        let reference = ParentRef::of(&hub, &parent(Some("team"), "web", "uid-1")).unwrap();
        let mut child = child_with(None);
        child.labels_mut().insert("app".into(), "kept".into());
        reference.adopt(&mut child);
        assert_eq!(ParentRef::of_child(&child).unwrap().unwrap(), reference);
        assert_eq!(child.labels()[PARENT_UID_LABEL], "uid-1");
        assert_eq!(child.labels()["app"], "kept", "other labels stay");
        assert_eq!(reference.selector(), format!("{PARENT_UID_LABEL}=uid-1"));
        assert_eq!(
            reference.request(),
            McRequest::new("hub", Some("team"), "web")
        );
        assert!(reference.is_a::<ConfigMap>() && !reference.is_a::<Deployment>());
    }

    #[test]
    fn the_annotation_is_json_that_names_no_namespace_for_a_cluster_scoped_parent() {
        let reference =
            ParentRef::of(&ClusterName::new("hub"), &parent(None, "global", "uid-2")).unwrap();
        let json: serde_json::Value = serde_json::from_str(&reference.annotation()).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "cluster": "hub", "apiVersion": "v1", "kind": "ConfigMap",
                "name": "global", "uid": "uid-2",
            })
        );
        let mut child = child_with(None);
        reference.adopt(&mut child);
        let read = ParentRef::of_child(&child).unwrap().unwrap();
        assert_eq!(read.namespace, None);
        assert_eq!(
            read.request(),
            McRequest::new("hub", None::<String>, "global")
        );
    }

    #[test]
    fn a_parent_not_read_from_its_api_server_cannot_be_referenced() {
        let mut unsaved = parent(Some("team"), "web", "x");
        unsaved.metadata.uid = None;
        let error = ParentRef::of(&ClusterName::new("hub"), &unsaved).unwrap_err();
        assert!(
            matches!(error, ParentRefError::Incomplete { missing: "uid", .. }),
            "{error}"
        );
    }

    #[test]
    fn an_unreadable_annotation_is_an_error_that_names_the_child_and_no_annotation_is_none() {
        assert!(ParentRef::of_child(&child_with(None)).is_none());
        for (value, says) in [
            ("not json", "expected"),
            (
                r#"{"cluster":"hub","apiVersion":"v1","kind":"ConfigMap","name":"web"}"#,
                "no uid",
            ),
            (
                r#"{"apiVersion":"v1","kind":"ConfigMap","name":"web","uid":"u"}"#,
                "no cluster",
            ),
        ] {
            let error = ParentRef::of_child(&child_with(Some(value)))
                .unwrap()
                .unwrap_err();
            let text = error.to_string();
            assert!(text.contains("apps/copy") && text.contains(says), "{text}");
        }
        // A child whose parent is unreadable maps to no parent.
        assert_eq!(
            parents_of::<ConfigMap, _>(&child_with(Some("not json"))),
            None
        );
    }

    #[test]
    fn children_are_grouped_by_the_parents_identity_without_its_uid() {
        let hub = ClusterName::new("hub");
        let first = ParentRef::of(&hub, &parent(Some("team"), "web", "uid-1")).unwrap();
        let again = ParentRef::of(&hub, &parent(Some("team"), "web", "uid-2")).unwrap();
        // Made again under the same name: the same group, so a sweep finds
        // the old children by the new parent's request.
        assert_eq!(first.key(), again.key());
        let request = first.request();
        assert_eq!(first.key(), request_key::<ConfigMap>(&request));
        assert!(key_names(&first.key(), &request));
        assert!(!key_names(
            &first.key(),
            &McRequest::new("hub", Some("team"), "api")
        ));
        assert!(!key_names(
            &first.key(),
            &McRequest::new("east", Some("team"), "web")
        ));
        assert!(!key_names(
            &first.key(),
            &McRequest::new("hub", Some("other"), "web")
        ));
        assert!(!key_names("not a key", &request));
        // Another kind of the same name is another parent.
        assert_ne!(first.key(), request_key::<Deployment>(&request));
        // A parent of a named group: its key and its type check take the
        // group from `group/version`, whatever the version.
        let mut deployment = Deployment::default();
        deployment.metadata.namespace = Some("team".into());
        deployment.metadata.name = Some("web".into());
        deployment.metadata.uid = Some("uid-3".into());
        let apps = ParentRef::of(&hub, &deployment).unwrap();
        assert_eq!(apps.api_version, "apps/v1");
        assert_eq!(apps.key(), request_key::<Deployment>(&request));
        let mut other_version = apps.clone();
        other_version.api_version = "apps/v2".into();
        assert_eq!(other_version.key(), apps.key());
        assert!(other_version.is_a::<Deployment>());
        // The same kind in another group is not a `Deployment`, nor the
        // same parent.
        let mut other_group = apps.clone();
        other_group.api_version = "example.com/v1".into();
        assert!(!other_group.is_a::<Deployment>());
        assert_ne!(other_group.key(), apps.key());
        // The same group and version, another kind.
        let mut other_kind = apps.clone();
        other_kind.kind = "StatefulSet".into();
        assert!(!other_kind.is_a::<Deployment>());
        // Only parents of the controller's kind are requested.
        let mut child = child_with(None);
        first.adopt(&mut child);
        assert_eq!(parents_of::<ConfigMap, _>(&child), Some(request));
        assert_eq!(parents_of::<Deployment, _>(&child), None);
    }
}
