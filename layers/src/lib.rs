//! Tower layers for reconcilers run by [`kube_multicluster`].
//!
//! Each layer is an ordinary [`tower_layer::Layer`], so it stacks with
//! `tower::ServiceBuilder` and with tower's own middleware. They work on the
//! [`ObjectRequest`]s that `Controller::run` hands out (and label spans and
//! metrics with the controller the request names), and on plain
//! `McRequest`s for a stack that maps the request to its key:
//!
//! - [`metrics`]: Prometheus counters and histograms by controller and cluster.
//! - [`retry`]: a `tower::retry::Policy` for transient API errors.
//! - [`trace`]: a `tracing` span per reconcile.
//! - [`catch_panic`]: a panicking reconcile becomes an error, so it is backed
//!   off and the controller keeps serving.
//!
//! [`recommended`] puts the usual ones together in one layer, in an order
//! its docs explain; `docs/layers.md` in the repository walks a request
//! through the stack.
//!
//! [`ObjectRequest`]: kube_multicluster::ObjectRequest

#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]

/// `get_ref`, `get_mut` and `into_inner` of a service that wraps the one in
/// its field `inner`.
macro_rules! inner_accessors {
    ($service:ident) => {
        impl<S> $service<S> {
            /// The inner service.
            pub fn get_ref(&self) -> &S {
                &self.inner
            }

            /// The inner service, mutably.
            pub fn get_mut(&mut self) -> &mut S {
                &mut self.inner
            }

            /// Unwraps the inner service.
            pub fn into_inner(self) -> S {
                self.inner
            }
        }
    };
}

pub mod catch_panic;
pub mod metrics;
pub mod recommended;
mod request;
pub mod retry;
pub mod trace;

pub use request::AsMcRequest;
