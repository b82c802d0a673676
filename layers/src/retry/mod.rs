//! Retries of transient API errors, through tower's own [`Retry`] middleware.
//!
//! [`TransientErrors`] is a [`tower::retry::Policy`]: it retries a reconcile
//! that failed with a conflict (409, but not `AlreadyExists`), too many
//! requests (429, after the server's `retryAfterSeconds` if given and no
//! longer than the policy's longest backoff), a server error (5xx but 501),
//! a connection error or a timeout, a bounded number of times with jittered
//! exponential backoff (50 ms doubling to 2 s by default). It never retries
//! other client errors (validation, permission, not found): those will not
//! go away by themselves. What is left after the retries goes back to the
//! controller's queue, which backs the key off for longer.
//!
//! ```
//! use kube_multicluster::{Action, McRequest};
//! use kube_multicluster_layers::retry::TransientErrors;
//! use tower::{BoxError, ServiceBuilder, retry::RetryLayer, service_fn};
//!
//! let service = ServiceBuilder::new()
//!     .layer(RetryLayer::new(TransientErrors::new(3)))
//!     .service(service_fn(|_: McRequest| async { Ok::<_, BoxError>(Action::await_change()) }));
//! # drop(service);
//! ```
//!
//! [`Retry`]: tower::retry::Retry

mod policy;

pub use policy::TransientErrors;
