//! Resolves an [`McRequest`]'s cluster name to the engaged [`Cluster`].
//!
//! The inner service receives a [`ClusterRequest`]. A request for a cluster
//! that has left the fleet (or never joined) ends quietly with
//! [`Action::await_change`]: it is neither an error nor retried, so work for a
//! departed cluster cannot loop. A request for a cluster that is joining but
//! not yet synced fails with [`NotYetEngaged`], so the controller retries it
//! after its backoff instead of losing it.
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

mod error;
mod future;
mod layer;
mod service;

pub use error::NotYetEngaged;
pub use future::ResponseFuture;
pub use layer::ResolveClusterLayer;
pub use service::{ClusterRequest, ResolveCluster};
