//! What a reconciler that looks beyond its own cluster needs: one type read
//! across every engaged cluster, with indexes ([`FleetStore`]), and work done
//! in many clusters at once, each cluster's error kept apart
//! ([`for_each_cluster`]).
//!
//! Mapping a change in one cluster to work in others is the controller's:
//! [`Controller::watches`](crate::Controller::watches) for requests in
//! clusters a mapper names, and
//! [`Controller::watches_across`](crate::Controller::watches_across) for
//! every cluster of a selection, those that join later included.
//!
//! ```no_run
//! use std::time::Duration;
//!
//! use k8s_openapi::api::core::v1::Secret;
//! use kube::runtime::watcher;
//! use kube_multicluster::{Fleet, fleetwide::{FleetStore, for_each_cluster}};
//!
//! # async fn example(fleet: Fleet) {
//! // Every Secret of the fleet, indexed by type.
//! let secrets = FleetStore::<Secret>::new(&fleet, watcher::Config::default())
//!     .with_index("type", |secret| secret.type_.clone().into_iter().collect());
//! let tls = secrets.indexed("type", "kubernetes.io/tls").unwrap_or_default();
//! for found in &tls {
//!     println!("{} holds {:?}", found.cluster, found.object.metadata.name);
//! }
//!
//! // The same write in every cluster, eight at a time; a cluster that fails
//! // is reported and holds up no other.
//! let done = for_each_cluster(fleet.clusters(), 8, Duration::from_secs(30), |cluster| async move {
//!     kube::Api::<Secret>::default_namespaced(cluster.client())
//!         .get_opt("settings")
//!         .await?;
//!     Ok(())
//! })
//! .await;
//! for (cluster, error) in done.errors() {
//!     eprintln!("{cluster}: {error}");
//! }
//! # }
//! ```

mod each;
mod store;

pub use each::{ClusterErrors, PerCluster, for_each_cluster};
pub(crate) use each::{shown, unanswered};
pub use store::{FleetStore, InCluster, InvalidWatch};
