use std::fmt;

use kube::{Resource, ResourceExt};

use crate::ClusterName;

/// A request to reconcile one object in one cluster: the queue's key and what
/// a reconciler receives.
///
/// Displays as `cluster://<cluster>/<namespace>/<name>`, or
/// `cluster://<cluster>/<name>` for a cluster-scoped object.
///
/// ```
/// use kube_fleet::McRequest;
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
