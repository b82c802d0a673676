use std::{borrow::Borrow, fmt, sync::Arc};

/// The name of a cluster in the fleet.
///
/// Cheap to clone (a shared `Arc<str>`). The empty name is the process's own
/// cluster, [`ClusterName::local`], as in controller-runtime.
///
/// ```
/// use kube_multicluster::ClusterName;
///
/// let name = ClusterName::new("kind-east");
/// assert_eq!(name.as_str(), "kind-east");
/// assert_eq!(name, "kind-east");
/// assert!(ClusterName::local().is_local());
/// ```
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ClusterName(Arc<str>);

impl ClusterName {
    /// A cluster name.
    pub fn new(name: impl Into<Arc<str>>) -> Self {
        Self(name.into())
    }

    /// The process's own cluster: the one its in-cluster configuration or
    /// default kubeconfig reaches. Its name is empty.
    pub fn local() -> Self {
        static LOCAL: std::sync::OnceLock<Arc<str>> = std::sync::OnceLock::new();
        Self(LOCAL.get_or_init(|| Arc::from("")).clone())
    }

    /// Whether this is the [`local`](Self::local) cluster.
    pub fn is_local(&self) -> bool {
        self.0.is_empty()
    }

    /// The name as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ClusterName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for ClusterName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl From<&str> for ClusterName {
    fn from(name: &str) -> Self {
        Self::new(name)
    }
}

impl From<String> for ClusterName {
    fn from(name: String) -> Self {
        Self::new(name)
    }
}

impl Borrow<str> for ClusterName {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for ClusterName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl PartialEq<str> for ClusterName {
    fn eq(&self, other: &str) -> bool {
        &*self.0 == other
    }
}

impl PartialEq<&str> for ClusterName {
    fn eq(&self, other: &&str) -> bool {
        &*self.0 == *other
    }
}
