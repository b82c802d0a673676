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
//! A request that resolves to no engaged cluster ends at once with success
//! (see [`resolve_cluster`](crate::resolve_cluster)) and is counted as such
//! when this layer sits outside cluster resolution. Series are kept for every
//! cluster name ever seen.
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
//! let metrics = ReconcileMetrics::new(&mut registry);
//! FleetCollector::register(&mut registry, Fleet::new());
//!
//! let service = ServiceBuilder::new()
//!     .layer(MetricsLayer::new(metrics, "configmaps"))
//!     .service(service_fn(|_: McRequest| async { Ok::<_, BoxError>(Action::await_change()) }));
//! service.oneshot(McRequest::new("east", Some("ns"), "x")).await.unwrap();
//!
//! let mut text = String::new();
//! encode(&mut text, &registry).unwrap();
//! assert!(text.contains(r#"kube_fleet_reconciles_total{controller="configmaps",cluster="east",result="success"} 1"#));
//! assert!(text.contains("kube_fleet_engaged_clusters 0"));
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
