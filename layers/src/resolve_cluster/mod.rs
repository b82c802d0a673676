//! Resolves an [`McRequest`]'s cluster name to the engaged [`Cluster`], for
//! stacks run with `Controller::run_raw` (`Controller::run` hands over the
//! cluster itself).
//!
//! The inner service receives a [`ClusterRequest`]. A request for a cluster
//! that has left the fleet (or never joined) ends quietly with
//! [`Action::await_change`]: it is neither an error nor retried, so work for a
//! departed cluster cannot loop. (A controller drops requests for clusters
//! outside the fleet before they reach its service, with a warning; this
//! layer only sees those whose cluster left in between.)
//!
//! ```
//! use kube_fleet::{Action, Fleet, McRequest};
//! use kube_fleet_layers::resolve_cluster::{ClusterRequest, ResolveClusterLayer};
//! use tower::{BoxError, ServiceBuilder, service_fn};
//!
//! # fn example(fleet: &Fleet) {
//! let service = ServiceBuilder::new()
//!     .layer(ResolveClusterLayer::new(fleet.clone()))
//!     .service(service_fn(|request: ClusterRequest| async move {
//!         let _client = request.cluster.client();
//!         Ok::<_, BoxError>(Action::await_change())
//!     }));
//! # }
//! ```
//!
//! [`McRequest`]: kube_fleet::McRequest
//! [`Cluster`]: kube_fleet::Cluster
//! [`Action::await_change`]: kube_fleet::Action::await_change

mod future;
mod layer;
mod service;

pub use future::ResponseFuture;
pub use layer::ResolveClusterLayer;
pub use service::{ClusterRequest, ResolveCluster};
