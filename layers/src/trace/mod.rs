//! One `tracing` span per reconcile.
//!
//! The span, `reconcile`, carries `controller` (if named), `cluster`,
//! `namespace` and `name` from the start, and records `outcome` (`ok` or
//! `error`) and `duration_ms` when the reconcile ends; everything the
//! reconciler logs falls inside it.
//!
//! ```
//! use kube_fleet::{Action, McRequest};
//! use kube_fleet_layers::trace::TraceLayer;
//! use tower::{BoxError, ServiceBuilder, service_fn};
//!
//! let service = ServiceBuilder::new()
//!     .layer(TraceLayer::new().controller("configmaps"))
//!     .service(service_fn(|request: McRequest| async move {
//!         tracing::info!("working on it"); // logged with cluster, namespace and name
//!         Ok::<_, BoxError>(Action::await_change())
//!     }));
//! # drop(service);
//! ```

mod future;
mod layer;
mod service;

pub use future::ResponseFuture;
pub use layer::TraceLayer;
pub use service::Trace;
