//! Why a controller stops, and what it does with a reconcile's error.

use std::sync::Arc;

use tower::BoxError;

use crate::{action::Action, request::McRequest};

/// Why a controller stopped other than by a graceful shutdown.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The controller was built wrong: a `DynamicObject` watch without the
    /// type it watches, or a verb Kubernetes does not have in
    /// [`Controller::writes`](crate::Controller::writes), say. Reported when it is run.
    #[error("controller {controller}: {reason}")]
    Invalid {
        /// The controller's name.
        controller: String,
        /// What is wrong.
        reason: String,
    },
    /// The service reported from `poll_ready` that it has failed for good.
    #[error("controller {controller}: the reconcile service failed")]
    Service {
        /// The controller's name.
        controller: String,
        /// The service's error.
        #[source]
        source: BoxError,
    },
}

/// What a controller does with a reconcile's error: see
/// [`Controller::error_policy`](crate::Controller::error_policy).
pub type ErrorPolicy = Arc<
    dyn Fn(&McRequest, &(dyn std::error::Error + Send + Sync + 'static)) -> Option<Action>
        + Send
        + Sync,
>;
