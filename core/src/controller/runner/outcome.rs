//! What a failed reconcile means for its key: nothing more until it
//! changes if the error is terminal; otherwise what the error policy says,
//! or the key's backoff.

use std::sync::Arc;

use crate::{
    action::Action,
    client::{error_chain, is_unanswered},
    controller::ErrorPolicy,
    error::TerminalError,
    panic::contain,
    queue::{Outcome, Queue},
    request::McRequest,
};

/// The controller's answer to a failed reconcile.
pub(super) struct Failures {
    pub(super) controller: Arc<str>,
    pub(super) policy: Option<ErrorPolicy>,
}

impl Failures {
    /// What a reconcile's error means for its key: nothing more until it
    /// changes if the error is terminal; otherwise what the error policy
    /// says, or the key's backoff. `queue` tells whether it failed as it
    /// did last time.
    pub(super) fn failed(
        &self,
        queue: &mut Queue,
        key: &McRequest,
        error: &(dyn std::error::Error + Send + Sync + 'static),
    ) -> Outcome {
        let controller = &self.controller;
        let reason = error_chain(error);
        if TerminalError::is_in(error) {
            tracing::error!(%controller, request = %key, error = %reason, "reconcile failed for good; it runs again when it changes");
            return Outcome::Success(Action::await_change());
        }
        // A key that fails again as it did last time is not news: told at
        // `DEBUG` until its error changes or it succeeds.
        let again = queue.failed_again(key, &reason);
        // A panic in the error policy counts as no answer.
        let chosen = self.policy.as_ref().and_then(|policy| {
            contain(|| policy(key, error)).unwrap_or_else(|message| {
                tracing::error!(request = %key, %message, "the error policy panicked; using the backoff");
                None
            })
        });
        match chosen.map(|action| action.requeue_after()) {
            Some(None) => {
                tracing::error!(%controller, request = %key, error = %reason, "reconcile failed; by the error policy it runs again when it changes");
                Outcome::Success(Action::await_change())
            }
            Some(Some(after)) => {
                if again {
                    tracing::debug!(%controller, request = %key, error = %reason, ?after, "reconcile failed again, as before; retrying when the error policy says");
                } else {
                    tracing::warn!(%controller, request = %key, error = %reason, ?after, "reconcile failed; retrying when the error policy says");
                }
                Outcome::Failure(Some(after))
            }
            // The cluster's own transitions are logged once, as it stops
            // and starts answering (`client::reachability`).
            None if is_unanswered(error) => {
                tracing::debug!(%controller, request = %key, error = %reason, "reconcile failed: the cluster gives no answer; retrying after backoff, or once it answers");
                Outcome::Unanswered
            }
            None if again => {
                tracing::debug!(%controller, request = %key, error = %reason, "reconcile failed again, as before; retrying after backoff");
                Outcome::Failure(None)
            }
            None => {
                tracing::warn!(%controller, request = %key, error = %reason, "reconcile failed; retrying after backoff");
                Outcome::Failure(None)
            }
        }
    }
}
