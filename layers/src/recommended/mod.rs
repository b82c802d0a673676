//! The recommended stack in one layer, with defaults that suit most controllers.
//!
//! [`RecommendedLayer<K>`] wraps a reconciler of [`ObjectRequest<K>`]s in,
//! from the outside in:
//!
//! 1. [`trace`](crate::trace): outermost, so the span covers the whole
//!    reconcile, retries included, and everything inside logs with the
//!    request's cluster, namespace and name;
//! 2. [`metrics`](crate::metrics): counts each reconcile once, with its final
//!    result after retries; outside the panic catch so that panics are
//!    counted as such;
//! 3. [`catch_panic`](crate::catch_panic): a panic anywhere inside becomes an
//!    error, which the queue backs off;
//! 4. tower's `Timeout`: bounds the whole reconcile, retries included
//!    (default 60 s); a timed-out reconcile is cancelled and backed off;
//! 5. tower's `Retry` with [`TransientErrors`](crate::retry::TransientErrors):
//!    conflicts, 429s, 5xx and connection errors are retried a few times
//!    (default 3) within the reconcile, after a short jittered backoff, before
//!    the queue's longer backoff takes over;
//! 6. [`resolve_cluster`](crate::resolve_cluster) and
//!    [`load_object`](crate::load_object): the request becomes an
//!    [`ObjectRequest<K>`] with the cluster and the cached object.
//!
//! Concurrency and rate limits are not layers: the controller's queue applies
//! them per cluster before a key leaves it (see `kube_fleet::controller::Config`).
//!
//! ```
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use kube_fleet::{Action, Fleet};
//! use kube_fleet_layers::{load_object::ObjectRequest, recommended::RecommendedLayer};
//! use tower::{BoxError, ServiceBuilder, service_fn};
//!
//! # fn example(fleet: &Fleet) {
//! let service = ServiceBuilder::new()
//!     .layer(RecommendedLayer::<ConfigMap>::new(fleet.clone(), "configmaps"))
//!     .service(service_fn(|request: ObjectRequest<ConfigMap>| async move {
//!         Ok::<_, BoxError>(Action::await_change())
//!     }));
//! # }
//! ```
//!
//! [`ObjectRequest<K>`]: crate::load_object::ObjectRequest

mod layer;

pub use layer::{RecommendedLayer, RecommendedService};
