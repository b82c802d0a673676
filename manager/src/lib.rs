//! One entry point for a `kube-multicluster` operator.
//!
//! A [`Manager`] runs a fleet's providers, any number of controllers, the
//! HTTP endpoints and, if asked, [leader election](LeaderElection), under
//! one shutdown signal, and returns the first fatal error. It is optional:
//! everything it does can be done by hand with `kube-multicluster`'s own types.
//!
//! ```no_run
//! use std::time::Duration;
//!
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use kube::runtime::watcher;
//! use kube_multicluster::{Action, Controller, Fleet, ObjectRequest, provider::LocalProvider};
//! use kube_multicluster_layers::metrics::ReconcileMetrics;
//! use kube_multicluster_manager::{LeaderElection, Manager};
//! use tower::{BoxError, service_fn};
//!
//! # async fn example() -> Result<(), BoxError> {
//! let fleet = Fleet::new();
//! let mut manager = Manager::new(&fleet)
//!     .provider(LocalProvider::try_default().await?)
//!     .endpoints("0.0.0.0:8080".parse()?)
//!     .leader_election(LeaderElection::new("my-operator"))
//!     .graceful_shutdown_on(async {
//!         let _ = tokio::signal::ctrl_c().await;
//!     });
//! let metrics = ReconcileMetrics::new(manager.registry()).follow(&fleet);
//! # let _ = metrics;
//! let manager = manager.controller(
//!     Controller::<ConfigMap>::new(&fleet, watcher::Config::default()).named("configmaps"),
//!     service_fn(|request: ObjectRequest<ConfigMap>| async move {
//!         tracing::info!(%request, "reconcile");
//!         Ok::<_, BoxError>(Action::requeue(Duration::from_secs(300)))
//!     }),
//! );
//! manager.run().await?;
//! # Ok(())
//! # }
//! ```
//!
//! # Endpoints
//!
//! With [`Manager::endpoints`], it serves over HTTP/1.1:
//!
//! - `/healthz`: `200 ok` while the process runs.
//! - `/readyz`: `200` once every controller has started and has synced
//!   its watches in every engaged cluster it selects, `503` before; the
//!   body says, one line each, what each controller serves and which
//!   clusters it waits for. A cluster whose watches fail (the API server
//!   does not answer, a type it does not serve, a sync that outlasts the
//!   controller's sync timeout) is named with the reason but keeps the
//!   process ready, unless [`Manager::strict_readiness`] says otherwise.
//!   A replica waiting to lead is ready, and says so.
//! - `/metrics`: the Prometheus (OpenMetrics) text of the
//!   [`registry`](Manager::registry): the fleet's and each controller's
//!   gauges, `leader_election_master_status{name}` with leader election,
//!   and whatever is registered there.
//!
//! # Leader election
//!
//! The election is written on the Lease API here, following client-go's
//! algorithm, rather than taken from the `kube-lease-manager` crate: that
//! crate has no renew deadline (a leader cut off from the API server keeps
//! leading until the Lease expires), judges expiry by comparing the
//! server's `renewTime` with the local clock, and cannot tell which
//! reconciles must stop when. Here expiry is judged on the local clock
//! from when a record was first seen, the leader stops at its own renew
//! deadline, and a gate around every reconcile holds it to that instant;
//! see [`LeaderElection`].

#![cfg_attr(docsrs, feature(doc_cfg))]

mod election;
mod error;
mod gate;
mod http;
mod lease;
mod manager;
mod metrics;
mod readiness;
mod shard;
mod sharder;
mod timing;

pub use election::{ElectionStatus, LeaderElection, Role};
pub use error::Error;
pub use gate::NotHolder;
pub use manager::Manager;
pub use shard::{Coverage, Ownership, ShardStatus, Sharding};
pub use timing::LeaseParams;
