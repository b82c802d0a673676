//! One `tracing` span per reconcile.
//!
//! The span, `reconcile`, carries `controller`, `cluster`, `namespace`,
//! `name` and `reason` from the start, and records `outcome` (`ok` or
//! `error`) and `duration_ms` when the reconcile ends; everything the
//! reconciler logs falls inside it. The controller's name and the reason
//! come from the request when it carries them (an `ObjectRequest` from
//! `Controller::run` does); a plain `McRequest` has neither, and the
//! controller's name can then be given to the layer.
//!
//! ```
//! use kube_multicluster::{Action, McRequest};
//! use kube_multicluster_layers::trace::TraceLayer;
//! use tower::{BoxError, ServiceBuilder, service_fn};
//!
//! let service = ServiceBuilder::new()
//!     .layer(TraceLayer::new().controller("configmaps")) // McRequests name no controller
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
