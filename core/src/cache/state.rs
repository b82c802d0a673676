use std::fmt;

/// Where a watch stands: still listing, in step with its cluster, or failing.
///
/// ```
/// use kube_multicluster::cache::WatchState;
///
/// let failing = WatchState::Failing { reason: "forbidden".into() };
/// assert_eq!(failing.to_string(), "failing: forbidden");
/// assert!(!failing.is_synced());
/// assert!(WatchState::Synced.is_synced());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchState {
    /// The first list has not completed, and nothing has failed yet.
    Syncing,
    /// The watch is in step with its cluster.
    Synced,
    /// The last attempt failed for `reason` (the type is not served, access
    /// is forbidden, the cluster does not answer...); the watch keeps
    /// retrying with backoff, and at once when its cluster answers again
    /// after an outage. It stays failing until a retry's request was
    /// answered and it ran a second without failing, or until it next
    /// lists or delivers a change.
    Failing {
        /// What went wrong, with its causes.
        reason: String,
    },
}

impl WatchState {
    /// Whether the watch is in step with its cluster.
    pub fn is_synced(&self) -> bool {
        matches!(self, Self::Synced)
    }
}

impl fmt::Display for WatchState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Syncing => f.write_str("syncing"),
            Self::Synced => f.write_str("synced"),
            Self::Failing { reason } => write!(f, "failing: {reason}"),
        }
    }
}

/// How long a failing watch's retry must run, once its request was
/// answered, to count as running again: an answer followed at once by an
/// error in the stream (a `410 Gone` for a version the server no longer
/// has) is a failure, not a resumed watch.
pub(crate) const RESUMED_AFTER: std::time::Duration = std::time::Duration::from_secs(1);

/// A watch's state and whether it has ever completed a list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Health {
    pub(crate) state: WatchState,
    pub(crate) has_synced: bool,
    /// While it fails: when a retry's watch request was answered since,
    /// after which it resumed where it was (it may hear nothing for long).
    pub(crate) answered: Option<tokio::time::Instant>,
}

impl Health {
    /// A watch that has not listed yet.
    pub(crate) fn syncing() -> Self {
        Self {
            state: WatchState::Syncing,
            has_synced: false,
            answered: None,
        }
    }

    /// The same, for a reader that has not seen a list complete yet: not
    /// synced, though the watch may be (its failure, if it fails, stays).
    pub(crate) fn unsynced(&self) -> Self {
        let state = match &self.state {
            WatchState::Synced => WatchState::Syncing,
            other => other.clone(),
        };
        Self {
            state,
            has_synced: false,
            answered: self.answered,
        }
    }

    /// The watch failed for `reason`. Returns whether that changed its
    /// state.
    pub(crate) fn fail(&mut self, reason: &str) -> bool {
        let failing = WatchState::Failing {
            reason: reason.to_owned(),
        };
        let changed = self.state != failing || self.answered.is_some();
        self.state = failing;
        self.answered = None;
        changed
    }

    /// A retry's watch request was answered: while it fails, it runs again
    /// once it has not failed for [`RESUMED_AFTER`] since. Returns whether
    /// that is news.
    pub(crate) fn answered(&mut self) -> bool {
        if !matches!(self.state, WatchState::Failing { .. }) || self.answered.is_some() {
            return false;
        }
        self.answered = Some(tokio::time::Instant::now());
        true
    }

    /// Whether it fails but its retry has run for [`RESUMED_AFTER`].
    pub(crate) fn resumed(&self) -> bool {
        self.answered
            .is_some_and(|answered| answered.elapsed() >= RESUMED_AFTER)
    }

    /// Where it stands now: failing until a retry has run for
    /// [`RESUMED_AFTER`], or until it hears something.
    pub(crate) fn current(&self) -> WatchState {
        match &self.state {
            WatchState::Failing { .. } if self.resumed() => self.unfailed(),
            state => state.clone(),
        }
    }

    fn unfailed(&self) -> WatchState {
        if self.has_synced {
            WatchState::Synced
        } else {
            WatchState::Syncing
        }
    }

    /// The watch received an event (`listed` if it completed a list).
    /// Returns whether that is news: its state changed, or a list
    /// completed.
    pub(crate) fn heard(&mut self, listed: bool) -> bool {
        self.has_synced |= listed;
        let state = self.unfailed();
        let changed = self.state != state || listed;
        self.state = state;
        self.answered = None;
        changed
    }
}

/// Logs a watch's failures once per cause, not once per retry.
#[derive(Debug)]
pub(crate) struct FailureLog {
    cluster: crate::cluster_name::ClusterName,
    kind: String,
    api_version: String,
    last: Option<String>,
}

impl FailureLog {
    /// The log of the watch of `kind` (`api_version`) in `cluster`.
    pub(crate) fn new(
        cluster: crate::cluster_name::ClusterName,
        kind: String,
        api_version: String,
    ) -> Self {
        Self {
            cluster,
            kind,
            api_version,
            last: None,
        }
    }

    /// Logs that the watch failed with `error`, and says why: as a warning
    /// if the cause is new, at debug level if it is the last one or if the
    /// cluster gave no answer: that the cluster stops and starts answering
    /// is told once for all its requests, by its client
    /// (`client::reachability`).
    pub(crate) fn failed(&mut self, error: &kube::runtime::watcher::Error) -> String {
        let reason = super::discovery::failure_reason(error, &self.kind, &self.api_version);
        let unanswered = crate::client::is_unanswered(error);
        let (cluster, kind) = (&self.cluster, &self.kind);
        if unanswered {
            tracing::debug!(%cluster, %kind, %reason, "watch failed: the cluster gives no answer; retrying with backoff");
        } else if self.last.as_deref() == Some(reason.as_str()) {
            tracing::debug!(%cluster, %kind, %reason, "watch failed again");
        } else {
            tracing::warn!(%cluster, %kind, %reason, "watch failed; retrying with backoff");
            self.last = Some(reason.clone());
        }
        reason
    }

    /// The watch works again: its next failure is news.
    pub(crate) fn recovered(&mut self) {
        self.last = None;
    }
}

/// One watch as a controller needs it: its type and where it stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchStatus {
    /// The watched kind, `ConfigMap` say.
    pub kind: String,
    /// Its API version, `v1` or `example.com/v1`.
    pub api_version: String,
    /// Whether only metadata is watched.
    pub metadata_only: bool,
    /// Where it stands.
    pub state: WatchState,
}

impl fmt::Display for WatchStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let metadata = if self.metadata_only {
            " (metadata)"
        } else {
            ""
        };
        write!(
            f,
            "{} {}{metadata}: {}",
            self.api_version, self.kind, self.state
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failing() -> Health {
        let mut health = Health::syncing();
        health.heard(true);
        health.fail("the cluster gives no answer");
        health
    }

    #[tokio::test(start_paused = true)]
    async fn a_retry_answered_runs_again_once_it_has_not_failed_for_a_second() {
        let mut health = failing();
        assert!(health.answered(), "news");
        assert!(!health.answered(), "told once");
        assert!(matches!(health.current(), WatchState::Failing { .. }));
        tokio::time::sleep(RESUMED_AFTER).await;
        assert_eq!(health.current(), WatchState::Synced);
        assert!(health.resumed());
    }

    #[tokio::test(start_paused = true)]
    async fn an_answer_followed_by_an_error_in_the_stream_is_still_a_failure() {
        let mut health = failing();
        health.answered();
        // `410 Gone` in the stream, right after the answer.
        health.fail("too old resource version");
        tokio::time::sleep(RESUMED_AFTER * 2).await;
        assert!(
            matches!(health.current(), WatchState::Failing { reason } if reason.contains("too old"))
        );
    }

    #[test]
    fn an_answer_tells_nothing_of_a_watch_that_does_not_fail() {
        let mut health = Health::syncing();
        assert!(!health.answered());
        health.heard(true);
        assert!(!health.answered());
        assert_eq!(health.current(), WatchState::Synced);
    }
}
