use std::{fmt, sync::Arc};

/// Why a reconcile runs: the first cause since the key last ran.
///
/// Changes to one key are merged while it waits, so a reconciler sees one
/// reason per run even when several things happened; a change that comes
/// while a key waits for a requeue or a retry runs it sooner, as
/// [`ObjectUpdated`](Self::ObjectUpdated) or
/// [`RelatedObjectUpdated`](Self::RelatedObjectUpdated). Use it for logs
/// and metrics, never to decide what to do: a reconciler reads the state of
/// the world and acts on all of it, whatever woke it.
///
/// The variants kube-runtime's `ReconcileReason` has carry its names
/// (`ObjectUpdated`, `RelatedObjectUpdated`, `ReconcilerRequestedRetry`,
/// `ErrorPolicyRequestedRetry`, `BulkReconcile`, `Unknown`), so a `match`
/// ports as it is; a related object is named by its kind here, not by an
/// object reference. The others say what a fleet adds: `Listed` (a watch
/// listed the object, as when the controller starts serving a cluster),
/// `External` (kube-runtime says `Unknown` for `reconcile_on`),
/// `ClusterReplaced` and `OwnWrite`.
///
/// ```
/// use kube_multicluster::ReconcileReason;
///
/// assert_eq!(ReconcileReason::ObjectUpdated.to_string(), "object updated");
/// assert_eq!(
///     ReconcileReason::RelatedObjectUpdated { kind: "Secret".into() }.to_string(),
///     "related object updated: Secret",
/// );
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ReconcileReason {
    /// A watch of the controller listed the object, or an object that maps
    /// to it: the controller started serving the cluster, or the watch
    /// listed again after it lost its place.
    Listed,
    /// The object was created, changed or deleted.
    ObjectUpdated,
    /// An object of another kind that maps to this one changed: an owned
    /// child, or a watched object whose mapper named this one.
    RelatedObjectUpdated {
        /// The kind of the object that changed.
        kind: Arc<str>,
    },
    /// A change that only echoes the controller's own write: the object
    /// (this one, or a related one that maps to it) is as a reconcile of
    /// this controller left it. Queued behind every other change and the
    /// start-up backlog; see
    /// [`Config::read_your_writes`](crate::controller::Config::read_your_writes).
    OwnWrite {
        /// The kind of the object written.
        kind: Arc<str>,
    },
    /// A request from [`Controller::reconcile_on`](crate::Controller::reconcile_on).
    External,
    /// A signal of [`Controller::reconcile_all_on`](crate::Controller::reconcile_all_on).
    BulkReconcile,
    /// The last run asked for it with [`Action::requeue`](crate::Action::requeue).
    ReconcilerRequestedRetry,
    /// The last run failed: this is its retry, after the delay the
    /// [error policy](crate::Controller::error_policy) chose or, where it
    /// chose none, the key's backoff (the default policy, as kube-runtime
    /// has none of its own).
    ErrorPolicyRequestedRetry,
    /// The last run was cut short because the cluster was replaced under
    /// its name (new credentials, say): it runs again against the new one.
    ClusterReplaced,
    /// Not known: a request made outside a controller
    /// ([`ObjectRequest::new`](crate::ObjectRequest::new), in a test).
    Unknown,
}

impl fmt::Display for ReconcileReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Listed => f.write_str("listed"),
            Self::ObjectUpdated => f.write_str("object updated"),
            Self::RelatedObjectUpdated { kind } => write!(f, "related object updated: {kind}"),
            Self::OwnWrite { kind } => write!(f, "own write echoed: {kind}"),
            Self::External => f.write_str("external request"),
            Self::BulkReconcile => f.write_str("bulk reconcile requested"),
            Self::ReconcilerRequestedRetry => f.write_str("reconciler requested retry"),
            Self::ErrorPolicyRequestedRetry => f.write_str("error policy requested retry"),
            Self::ClusterReplaced => f.write_str("cluster replaced"),
            Self::Unknown => f.write_str("unknown"),
        }
    }
}
