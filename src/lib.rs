//! Kubernetes controllers that reconcile across a dynamic fleet of clusters.
//!
//! A reconciler is written once, as a [`tower::Service`] of
//! [`ObjectRequest`]s answering an [`Action`], and run by a [`Controller`]
//! against every cluster of a [`Fleet`]: clusters that providers engage and
//! disengage while the process runs (kind clusters, kubeconfig files or
//! Secrets, Cluster API workload clusters, a `ClusterProfile` inventory), or
//! just the local one. The controller names its type once; each request
//! carries the cluster, the object from the controller's own watch there
//! (an `Arc`, never a copy), and why it runs ([`ReconcileReason`]).
//!
//! ```no_run
//! use std::time::Duration;
//!
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use kube::runtime::watcher;
//! use kube_fleet::{Action, Controller, Fleet, ObjectRequest, provider::LocalProvider};
//! use tower::{BoxError, service_fn};
//!
//! # async fn example() -> Result<(), BoxError> {
//! let fleet = Fleet::new();
//! tokio::spawn({
//!     let fleet = fleet.clone();
//!     let local = LocalProvider::try_default().await?;
//!     async move { fleet.run(local).await }
//! });
//! Controller::<ConfigMap>::new(&fleet, watcher::Config::default())
//!     .run(service_fn(|request: ObjectRequest<ConfigMap>| async move {
//!         println!("reconciling {request} ({}): {:?}", request.reason, request.object.is_some());
//!         Ok::<_, BoxError>(Action::requeue(Duration::from_secs(300)))
//!     }))
//!     .await?;
//! # Ok(())
//! # }
//! ```
//!
//! # Types known at run time
//!
//! A controller of `DynamicObject`s names its type with a
//! [`Watch`](controller::Watch): a fixed `ApiResource`, or a group and kind
//! that each cluster's discovery resolves to the version it serves. Where a
//! cluster does not serve the kind, that cluster's watch reports it and the
//! controller serves the others; it starts there once the kind appears.
//!
//! ```no_run
//! use kube::{api::DynamicObject, discovery::Scope};
//! use kube_fleet::{Action, Controller, Fleet, ObjectRequest, controller::Watch};
//! use tower::{BoxError, service_fn};
//!
//! # async fn example(fleet: Fleet) -> Result<(), kube_fleet::controller::Error> {
//! Controller::<DynamicObject>::new(
//!     &fleet,
//!     Watch::default().discover("example.com", "Widget", Scope::Namespaced),
//! )
//! .run(service_fn(|request: ObjectRequest<DynamicObject>| async move {
//!     if let Some(widget) = &request.object {
//!         println!("{request}: {:?} {}", widget.types, widget.data["spec"]);
//!     }
//!     Ok::<_, BoxError>(Action::await_change())
//! }))
//! .await
//! # }
//! ```
//!
//! Tests and examples run against real API servers started by the
//! `kube-fleet-envtest` crate.
//!
//! # Clients and TLS
//!
//! Build each cluster's client with [`client::client`] from its
//! `kube::Config`: one HTTP/2 connection carries all of the cluster's
//! watches and requests, where kube's own client opens an HTTP/1.1
//! connection per watch and per request in flight.
//!
//! The clusters' clients use the TLS backend you pick, through kube's own
//! features: by default rustls with ring (the features `rustls-tls` and
//! `ring`); `aws-lc-rs` instead of `ring`; or OpenSSL with
//! `default-features = false, features = ["openssl-tls"]`, whose clients
//! speak HTTP/1.1 only. `kube-fleet-layers` imposes none.

#![forbid(unsafe_code)]

mod action;
pub mod apply;
pub mod cache;
pub mod client;
mod cluster;
mod cluster_name;
pub mod controller;
mod error;
pub mod finalizer;
mod fleet;
pub mod fleetwide;
pub mod identity;
mod object_request;
pub mod ownership;
mod panic;
pub mod provider;
pub mod queue;
pub mod rbac;
mod reason;
mod request;

pub use action::Action;
pub use cluster::Cluster;
pub use cluster_name::ClusterName;
pub use controller::{Controller, Error};
pub use error::TerminalError;
pub use fleet::{Fleet, FleetEvent, FleetSubscription};
pub use object_request::ObjectRequest;
pub use reason::ReconcileReason;
pub use request::{McRequest, ObjectKey};

/// The README's code, compiled with the doc tests so that what it shows
/// keeps working.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

/// The providers guide's code, compiled with the doc tests.
#[cfg(doctest)]
#[doc = include_str!("../docs/providers.md")]
struct ProvidersDoctests;

/// The cluster identity guide's code, compiled with the doc tests.
#[cfg(doctest)]
#[doc = include_str!("../docs/identity.md")]
struct IdentityDoctests;

/// The controller patterns chapter's code, compiled with the doc tests.
#[cfg(doctest)]
#[doc = include_str!("../docs/patterns.md")]
struct PatternsDoctests;

/// The cross-cluster mapping and ownership chapter's code, compiled with the
/// doc tests.
#[cfg(doctest)]
#[doc = include_str!("../docs/cross-cluster.md")]
struct CrossClusterDoctests;

/// The book's introduction, compiled with the doc tests.
#[cfg(doctest)]
#[doc = include_str!("../docs/introduction.md")]
struct IntroductionDoctests;

/// The getting-started chapter's code, compiled with the doc tests.
#[cfg(doctest)]
#[doc = include_str!("../docs/getting-started.md")]
struct GettingStartedDoctests;

/// The core concepts chapter's code, compiled with the doc tests.
#[cfg(doctest)]
#[doc = include_str!("../docs/concepts.md")]
struct ConceptsDoctests;

/// The testing chapter's code, compiled with the doc tests (the unit tests
/// there run).
#[cfg(doctest)]
#[doc = include_str!("../docs/testing.md")]
struct TestingDoctests;

/// The credentials chapter's code, compiled with the doc tests.
#[cfg(doctest)]
#[doc = include_str!("../docs/credentials.md")]
struct CredentialsDoctests;

/// The contributing chapter, checked with the doc tests (its blocks are
/// shell and text).
#[cfg(doctest)]
#[doc = include_str!("../docs/contributing.md")]
struct ContributingDoctests;

/// The layers chapter's code, compiled with the doc tests.
#[cfg(doctest)]
#[doc = include_str!("../docs/layers.md")]
struct LayersDoctests;

/// The benchmarks chapter, checked with the doc tests (its blocks are
/// shell).
#[cfg(doctest)]
#[doc = include_str!("../docs/benchmarks.md")]
struct BenchmarksDoctests;

/// Moved to [`queue::Backoff`].
#[deprecated(since = "0.1.0", note = "moved to `kube_fleet::queue::Backoff`")]
pub type Backoff = queue::Backoff;

/// Moved to [`queue::TokenBucket`].
#[deprecated(since = "0.1.0", note = "moved to `kube_fleet::queue::TokenBucket`")]
pub type TokenBucket = queue::TokenBucket;

/// Moved to [`queue::QueueDepth`].
#[deprecated(since = "0.1.0", note = "moved to `kube_fleet::queue::QueueDepth`")]
pub type QueueDepth = queue::QueueDepth;

/// Moved to [`identity::ClusterIdentity`].
#[deprecated(
    since = "0.1.0",
    note = "moved to `kube_fleet::identity::ClusterIdentity`"
)]
pub type ClusterIdentity = identity::ClusterIdentity;

/// Moved to [`identity::IdSource`].
#[deprecated(since = "0.1.0", note = "moved to `kube_fleet::identity::IdSource`")]
pub type IdSource = identity::IdSource;

/// Moved to [`identity::IdentityError`].
#[deprecated(
    since = "0.1.0",
    note = "moved to `kube_fleet::identity::IdentityError`"
)]
pub type IdentityError = identity::IdentityError;
