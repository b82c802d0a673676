use std::{fmt, sync::Arc};

/// Why a reconcile runs: the first cause since the key last ran.
///
/// Changes to one key are merged while it waits, so a reconciler sees one
/// reason per run even when several things happened; a change that comes
/// while a key waits for a requeue or a retry runs it sooner, as
/// [`ObjectChanged`](Self::ObjectChanged) or
/// [`RelatedChanged`](Self::RelatedChanged). Use it for logs and metrics,
/// never to decide what to do: a reconciler reads the state of the world
/// and acts on all of it, whatever woke it.
///
/// ```
/// use kube_fleet::ReconcileReason;
///
/// assert_eq!(ReconcileReason::ObjectChanged.to_string(), "object changed");
/// assert_eq!(
///     ReconcileReason::RelatedChanged { kind: "Secret".into() }.to_string(),
///     "related Secret changed",
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
    ObjectChanged,
    /// An object of another kind that maps to this one changed: an owned
    /// child, or a watched object whose mapper named this one.
    RelatedChanged {
        /// The kind of the object that changed.
        kind: Arc<str>,
    },
    /// A request from [`Controller::reconcile_on`](crate::Controller::reconcile_on).
    External,
    /// A signal of [`Controller::reconcile_all_on`](crate::Controller::reconcile_all_on).
    ReconcileAll,
    /// The last run asked for it with [`Action::requeue`](crate::Action::requeue).
    Requeued,
    /// The last run failed: this is its retry, after the backoff or the
    /// delay the error policy chose.
    ErrorRetry,
    /// The last run was cut short because the cluster was replaced under
    /// its name (new credentials, say): it runs again against the new one.
    ClusterReplaced,
    /// Not known: a request made outside a controller (a layer's own
    /// loading, a test).
    Unknown,
}

impl fmt::Display for ReconcileReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Listed => f.write_str("listed"),
            Self::ObjectChanged => f.write_str("object changed"),
            Self::RelatedChanged { kind } => write!(f, "related {kind} changed"),
            Self::External => f.write_str("external request"),
            Self::ReconcileAll => f.write_str("reconcile all"),
            Self::Requeued => f.write_str("requeued"),
            Self::ErrorRetry => f.write_str("retry after error"),
            Self::ClusterReplaced => f.write_str("cluster replaced"),
            Self::Unknown => f.write_str("unknown"),
        }
    }
}
