//! Turns a panicking reconcile into an error.
//!
//! A panic in the service's `call` or while its future runs becomes a
//! [`Panicked`] error carrying the panic message. The controller then backs
//! the key off like any failure and keeps serving every other key; metrics
//! count it as a panic.
//!
//! ```
//! use kube_multicluster::{Action, McRequest};
//! use kube_multicluster_layers::catch_panic::{CatchPanicLayer, Panicked};
//! use tower::{BoxError, ServiceBuilder, ServiceExt, service_fn};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let service = ServiceBuilder::new()
//!     .layer(CatchPanicLayer::new())
//!     .service(service_fn(|_: McRequest| async {
//!         if true {
//!             panic!("unexpected state");
//!         }
//!         Ok::<_, BoxError>(Action::await_change())
//!     }));
//! let error = service.oneshot(McRequest::new("c", Some("ns"), "x")).await.unwrap_err();
//! assert_eq!(error.downcast_ref::<Panicked>().unwrap().message(), "unexpected state");
//! # }
//! ```

mod error;
mod future;
mod layer;
mod service;

pub use error::Panicked;
pub use future::ResponseFuture;
pub use layer::CatchPanicLayer;
pub use service::CatchPanic;
