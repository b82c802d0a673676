//! Prometheus metrics for reconciles and the fleet.
//!
//! [`ReconcileMetrics`] registers, in a `prometheus_client` registry:
//!
//! - `kube_fleet_reconciles_total{controller, cluster, result}`: reconciles by
//!   result, `success`, `error` or `panic` (a [`Panicked`] error, so put
//!   [`MetricsLayer`] outside [`CatchPanicLayer`]);
//! - `kube_fleet_reconcile_duration_seconds{controller, cluster}`: how long
//!   each took, as a histogram from 1 ms to about 130 s (past the
//!   recommended stack's 60 s timeout).
//!
//! Give the metrics the fleet with [`ReconcileMetrics::follow`] and they keep
//! series only for engaged clusters: a cluster's series are removed when it
//! leaves, and a reconcile that ends after its cluster left is not recorded.
//! Without it, series are kept for every cluster name ever seen.
//!
//! [`FleetCollector`] adds `kube_fleet_engaged_clusters`, read from the fleet
//! at each scrape, and [`QueueDepths`] adds `kube_fleet_queue_depth{controller}`
//! from each controller's [`QueueDepth`](kube_fleet::QueueDepth). The registry encodes to the Prometheus text format with
//! `prometheus_client::encoding::text::encode`.
//!
//! ```
//! use kube_fleet::{Action, Fleet, McRequest};
//! use kube_fleet_layers::metrics::{FleetCollector, MetricsLayer, ReconcileMetrics};
//! use prometheus_client::{encoding::text::encode, registry::Registry};
//! use tower::{BoxError, ServiceBuilder, ServiceExt, service_fn};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let mut registry = Registry::default();
//! let fleet = Fleet::new();
//! let metrics = ReconcileMetrics::new(&mut registry).follow(&fleet);
//! FleetCollector::register(&mut registry, fleet.clone());
//! # let (idle, _) = tower_test::mock::pair::<http::Request<kube::client::Body>, http::Response<kube::client::Body>>();
//! fleet.engage("east", kube::Client::new(idle, "default"));
//!
//! let service = ServiceBuilder::new()
//!     // A plain McRequest names no controller; an ObjectRequest from
//!     // `Controller::run` does, and the layer needs no name then.
//!     .layer(MetricsLayer::new(metrics.clone()).controller("configmaps"))
//!     .service(service_fn(|_: McRequest| async { Ok::<_, BoxError>(Action::await_change()) }));
//! service.oneshot(McRequest::new("east", Some("ns"), "x")).await.unwrap();
//!
//! let mut text = String::new();
//! encode(&mut text, &registry).unwrap();
//! assert!(text.contains(r#"kube_fleet_reconciles_total{controller="configmaps",cluster="east",result="success"} 1"#));
//! assert!(text.contains("kube_fleet_engaged_clusters 1"));
//!
//! // When the cluster leaves, so do its series.
//! fleet.disengage("east");
//! # tokio::task::yield_now().await;
//! # while metrics.clusters_recorded() > 0 { tokio::task::yield_now().await; }
//! let mut text = String::new();
//! encode(&mut text, &registry).unwrap();
//! assert!(!text.contains(r#"cluster="east""#));
//! # }
//! ```
//!
//! [`Panicked`]: crate::catch_panic::Panicked
//! [`CatchPanicLayer`]: crate::catch_panic::CatchPanicLayer

mod collector;
mod future;
mod layer;
mod registry;
mod service;

pub use collector::{FleetCollector, QueueDepths};
pub use future::ResponseFuture;
pub use layer::MetricsLayer;
pub use registry::ReconcileMetrics;
pub use service::Metrics;
