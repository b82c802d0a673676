use std::time::Duration;

/// What a reconciler asks for after a successful run.
///
/// ```
/// use std::time::Duration;
/// use kube_multicluster::Action;
///
/// assert_eq!(Action::requeue(Duration::from_secs(300)).requeue_after(), Some(Duration::from_secs(300)));
/// assert_eq!(Action::await_change().requeue_after(), None);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Action {
    requeue_after: Option<Duration>,
}

impl Action {
    /// Run the reconciler for this object again after `duration`, even if
    /// nothing changes. A change that comes sooner runs it sooner.
    #[must_use]
    pub const fn requeue(duration: Duration) -> Self {
        Self {
            requeue_after: Some(duration),
        }
    }

    /// Run it again only when a watched change arrives.
    #[must_use]
    pub const fn await_change() -> Self {
        Self {
            requeue_after: None,
        }
    }

    /// The delay asked for by [`requeue`](Self::requeue), if any.
    pub const fn requeue_after(&self) -> Option<Duration> {
        self.requeue_after
    }
}
