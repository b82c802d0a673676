//! Loads the object a request names from its cluster's cache, for stacks
//! run with `Controller::run_raw` (`Controller::run` hands the object over
//! itself, from the controller's own watch).
//!
//! The inner service receives an [`ObjectRequest`] carrying the object as an
//! `Arc<K>` shared with the cache (no copy), or `None` when the object does
//! not exist: it was deleted, and the reconciler must say what that means
//! (clean up, or nothing).
//!
//! The object comes from the cluster's shared watch of `K` once it has
//! synced. If the cluster has no such watch (a request another cluster's
//! event made for a cluster this controller does not watch), it is read from
//! the API server instead.
//!
//! ```
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use kube_fleet::{Action, Fleet};
//! use kube_fleet_layers::{
//!     load_object::{LoadObjectLayer, ObjectRequest},
//!     resolve_cluster::ResolveClusterLayer,
//! };
//! use tower::{BoxError, ServiceBuilder, service_fn};
//!
//! # fn example(fleet: &Fleet) {
//! let service = ServiceBuilder::new()
//!     .layer(ResolveClusterLayer::new(fleet.clone()))
//!     .layer(LoadObjectLayer::<ConfigMap>::new())
//!     .service(service_fn(|request: ObjectRequest<ConfigMap>| async move {
//!         match request.object {
//!             Some(config_map) => println!("{} has {:?}", request.request, config_map.data),
//!             None => println!("{} was deleted", request.request),
//!         }
//!         Ok::<_, BoxError>(Action::await_change())
//!     }));
//! # }
//! ```

mod error;
mod future;
mod layer;
mod service;

pub use error::LoadError;
pub use future::ResponseFuture;
pub use kube_fleet::ObjectRequest;
pub use layer::LoadObjectLayer;
pub use service::LoadObject;
