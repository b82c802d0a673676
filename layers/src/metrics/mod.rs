//! Prometheus metrics for reconciles, queues, API requests and the fleet,
//! under controller-runtime's and client-go's names where they have one, so
//! that dashboards made for Go controllers read them, with a `cluster` label
//! added.
//!
//! [`ReconcileMetrics`] registers, in a `prometheus_client` registry:
//!
//! - `controller_runtime_reconcile_total{controller, cluster, result}`:
//!   reconciles by result: `success`, `error`, `requeue` (an
//!   [`Action::requeue`](kube_multicluster::Action::requeue) of zero) or
//!   `requeue_after`;
//! - `controller_runtime_reconcile_errors_total{controller, cluster}`:
//!   reconciles that failed, panics included;
//! - `controller_runtime_reconcile_panics_total{controller, cluster}`:
//!   reconciles that panicked (a [`Panicked`] error, so put [`MetricsLayer`]
//!   outside [`CatchPanicLayer`]);
//! - `controller_runtime_reconcile_time_seconds{controller, cluster}`: how
//!   long each took, as a histogram from 1 ms to about 130 s (past the
//!   recommended stack's 60 s timeout).
//!
//! Give the metrics the fleet with [`ReconcileMetrics::follow`] and they keep
//! series only for engaged clusters: a cluster's series are removed when it
//! leaves, and a reconcile that ends after its cluster left is not recorded.
//! Without it, series are kept for every cluster name ever seen.
//!
//! [`FleetCollector`] adds `kube_multicluster_engaged_clusters`, read from the fleet
//! at each scrape, with `kube_multicluster_cluster_health{cluster, state}`;
//! [`WorkqueueMetrics`] adds controller-runtime's workqueue metrics
//! (`workqueue_depth`, `workqueue_adds_total`, ...) per controller and
//! cluster from each controller's
//! [`QueueMetrics`](kube_multicluster::queue::QueueMetrics) (or [`QueueDepths`],
//! `workqueue_depth{name, controller}` alone, per controller); and
//! [`ClientMetrics`] adds client-go's `rest_client_requests_total` and
//! `rest_client_request_duration_seconds` per cluster. The registry encodes
//! to the Prometheus text format with `prometheus_client::encoding::text::encode`.
//!
//! ```
//! use kube_multicluster::{Action, Fleet, McRequest};
//! use kube_multicluster_layers::metrics::{FleetCollector, MetricsLayer, ReconcileMetrics};
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
//! assert!(text.contains(r#"controller_runtime_reconcile_total{controller="configmaps",cluster="east",result="success"} 1"#));
//! assert!(text.contains("kube_multicluster_engaged_clusters 1"));
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

mod client;
mod collector;
mod future;
mod layer;
mod registry;
mod service;
mod workqueue;

pub use client::ClientMetrics;
pub use collector::{FleetCollector, QueueDepths};
pub use future::ResponseFuture;
pub use layer::MetricsLayer;
pub use registry::ReconcileMetrics;
pub use service::Metrics;
pub use workqueue::{WORKQUEUE_METRICS, WorkqueueMetrics};
