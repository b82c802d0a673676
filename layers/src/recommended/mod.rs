//! The recommended stack in one layer, with defaults that suit most controllers.
//!
//! [`RecommendedLayer`] wraps a reconciler of the [`ObjectRequest<K>`]s that
//! `Controller::run` hands out in, from the outside in:
//!
//! 1. [`trace`](crate::trace): outermost, so the span covers the whole
//!    reconcile, retries included, and everything inside logs with the
//!    request's controller, cluster, namespace, name and reason;
//! 2. [`metrics`](crate::metrics): counts each reconcile once, with its final
//!    result after retries, labelled with the request's controller; outside
//!    the panic catch so that panics are counted as such;
//! 3. [`catch_panic`](crate::catch_panic): a panic anywhere inside becomes an
//!    error, which the queue backs off;
//! 4. tower's `Timeout`: bounds the whole reconcile, retries included
//!    (default 60 s); a timed-out reconcile is cancelled and backed off;
//! 5. tower's `Retry` with [`TransientErrors`](crate::retry::TransientErrors):
//!    conflicts, 429s, 5xx and connection errors are retried a few times
//!    (default 3) within the reconcile, after a short jittered backoff, before
//!    the queue's longer backoff takes over;
//! 6. [`Refresh`]: each attempt reads the object again from the controller's
//!    watch just before the reconciler is called, so a retry after a
//!    conflict works on the version that caused it.
//!
//! The controller's name is given once, to `Controller::named`: the request
//! carries it to the span and the metrics. Concurrency and rate limits are not
//! layers: the controller's queue applies them per cluster before a key
//! leaves it (see `kube_multicluster::controller::Config`). The stack works on any
//! request that implements [`AsMcRequest`](crate::AsMcRequest) and `Clone`,
//! so it also wraps a stack of plain `McRequest`s.
//!
//! ```
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use kube::runtime::watcher;
//! use kube_multicluster::{Action, Controller, Fleet, ObjectRequest};
//! use kube_multicluster_layers::recommended::RecommendedLayer;
//! use tower::{BoxError, ServiceBuilder, service_fn};
//!
//! # async fn example(fleet: Fleet) -> Result<(), kube_multicluster::controller::Error> {
//! let service = ServiceBuilder::new()
//!     .layer(RecommendedLayer::new())
//!     .service(service_fn(|request: ObjectRequest<ConfigMap>| async move {
//!         tracing::info!(exists = request.object.is_some(), "reconciling");
//!         Ok::<_, BoxError>(Action::await_change())
//!     }));
//! Controller::<ConfigMap>::new(&fleet, watcher::Config::default())
//!     .named("configmaps")
//!     .run(service)
//!     .await
//! # }
//! ```
//!
//! [`ObjectRequest<K>`]: kube_multicluster::ObjectRequest

mod layer;
mod refresh;

pub use layer::{RecommendedLayer, RecommendedService};
pub use refresh::{Refresh, RefreshLayer};
