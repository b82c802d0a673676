use std::fmt;

use kube::{Resource, ResourceExt};

use crate::cluster_name::ClusterName;

/// A request to reconcile one object in one cluster: the queue's key and what
/// a reconciler receives.
///
/// Displays as `cluster://<cluster>/<namespace>/<name>`, or
/// `cluster://<cluster>/<name>` for a cluster-scoped object.
///
/// ```
/// use kube_multicluster::McRequest;
///
/// let request = McRequest::new("east", Some("default"), "web");
/// assert_eq!(request.to_string(), "cluster://east/default/web");
/// assert_eq!(McRequest::new("east", None::<String>, "node-1").to_string(), "cluster://east/node-1");
/// ```
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct McRequest {
    /// The cluster the object lives in.
    pub cluster: ClusterName,
    /// The object's namespace; `None` for cluster-scoped objects.
    pub namespace: Option<String>,
    /// The object's name.
    pub name: String,
}

impl McRequest {
    /// A request for the object `namespace/name` in `cluster`.
    pub fn new(
        cluster: impl Into<ClusterName>,
        namespace: Option<impl Into<String>>,
        name: impl Into<String>,
    ) -> Self {
        Self {
            cluster: cluster.into(),
            namespace: namespace.map(Into::into),
            name: name.into(),
        }
    }

    /// A request for `object`, which lives in `cluster`.
    pub fn for_object<K: Resource>(cluster: ClusterName, object: &K) -> Self {
        Self {
            cluster,
            namespace: object.namespace(),
            name: object.name_any(),
        }
    }
}

impl fmt::Display for McRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.namespace {
            Some(namespace) => write!(f, "cluster://{}/{namespace}/{}", self.cluster, self.name),
            None => write!(f, "cluster://{}/{}", self.cluster, self.name),
        }
    }
}

/// An object's namespace and name, without its cluster: what a mapper names
/// when the cluster is chosen elsewhere (see
/// [`Controller::watches_across`](crate::Controller::watches_across)).
///
/// ```
/// use kube_multicluster::{McRequest, ObjectKey};
///
/// let key = ObjectKey::new(Some("default"), "web");
/// assert_eq!(key.in_cluster("east".into()), McRequest::new("east", Some("default"), "web"));
/// ```
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct ObjectKey {
    /// The object's namespace; `None` for cluster-scoped objects.
    pub namespace: Option<String>,
    /// The object's name.
    pub name: String,
}

impl ObjectKey {
    /// The key `namespace/name`.
    pub fn new(namespace: Option<impl Into<String>>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.map(Into::into),
            name: name.into(),
        }
    }

    /// The key of `object`.
    pub fn of<K: Resource>(object: &K) -> Self {
        Self {
            namespace: object.namespace(),
            name: object.name_any(),
        }
    }

    /// The request for this object in `cluster`.
    pub fn in_cluster(self, cluster: ClusterName) -> McRequest {
        McRequest {
            cluster,
            namespace: self.namespace,
            name: self.name,
        }
    }
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.namespace {
            Some(namespace) => write!(f, "{namespace}/{}", self.name),
            None => f.write_str(&self.name),
        }
    }
}
