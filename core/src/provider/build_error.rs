//! Why building a client for a cluster gave none: shared by
//! `Engagements` and the kubeconfig client builders.

/// Why building a client for a cluster gave none.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BuildError {
    /// What the cluster is built from is not usable, or is refused (a
    /// kubeconfig that does not parse, a plugin the policy does not allow):
    /// not tried again until it changes.
    #[error("{0}")]
    Refused(String),
    /// It is fine, but gave no client now (a credential plugin failed or
    /// hung): tried again after a while.
    #[error("{0}")]
    Unavailable(String),
}
