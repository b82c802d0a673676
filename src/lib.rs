//! Kubernetes controllers that reconcile across a dynamic fleet of clusters.
//!
//! A reconciler is written once, as a `tower::Service` of
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
//! use kube_multicluster::{Action, Controller, Fleet, ObjectRequest, provider::LocalProvider};
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
//! use kube_multicluster::{Action, Controller, Fleet, ObjectRequest, controller::Watch};
//! use tower::{BoxError, service_fn};
//!
//! # async fn example(fleet: Fleet) -> Result<(), kube_multicluster::controller::Error> {
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
//! Tests and examples run against real API servers started by
//! `kube_multicluster::envtest` (the `envtest` feature).
//!
//! # Clients and TLS
//!
//! Build each cluster's client with [`client::cluster_client`] from its
//! `kube::Config` and engage it: one HTTP/2 connection carries all of the
//! cluster's watches and requests, where kube's own client opens an
//! HTTP/1.1 connection per watch and per request in flight. The fleet
//! finishes it into the cluster's `kube::Client`; [`client::client`] gives
//! a finished one from the same configuration.
//!
//! The clusters' clients use the TLS backend you pick, through kube's own
//! features: by default rustls with ring (the features `rustls-tls` and
//! `ring`); `aws-lc-rs` instead of `ring`; or OpenSSL with
//! `default-features = false, features = ["openssl-tls"]`, whose clients
//! speak HTTP/1.1 only.
//!
//! # Features
//!
//! This crate is the runtime (every item at its root and in its modules
//! comes from `kube-multicluster-core`), and re-exports the other crates of
//! the project behind a feature each. The list below is the one in this
//! crate's `Cargo.toml`:
//!
#![doc = document_features::document_features!()]
//!
//! A controller that runs under the manager on kind clusters, tested on a
//! local fleet, with a clone of the repository beside it (the crates are
//! not on crates.io yet):
//!
//! ```toml
//! [dependencies]
//! kube-multicluster = { path = "../kube-multicluster", features = ["manager", "provider-kind"] }
//!
//! [dev-dependencies]
//! kube-multicluster = { path = "../kube-multicluster", features = ["envtest"] }
//! ```
#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]

#[doc(inline)]
pub use kube_multicluster_core::*;

#[cfg(feature = "layers")]
#[cfg_attr(docsrs, doc(cfg(feature = "layers")))]
#[doc(inline)]
pub use kube_multicluster_layers as layers;

#[cfg(feature = "manager")]
#[cfg_attr(docsrs, doc(cfg(feature = "manager")))]
#[doc(inline)]
pub use kube_multicluster_manager as manager;

#[cfg(feature = "webhooks")]
#[cfg_attr(docsrs, doc(cfg(feature = "webhooks")))]
#[doc(inline)]
pub use kube_multicluster_webhook as webhook;

#[cfg(feature = "envtest")]
#[cfg_attr(docsrs, doc(cfg(feature = "envtest")))]
#[doc(inline)]
pub use kube_multicluster_envtest as envtest;

/// The cluster providers, each behind its `provider-*` feature. The
/// runtime's own ([`provider::LocalProvider`],
/// [`provider::ProgrammaticProvider`]) need none.
pub mod providers {
    #[cfg(feature = "provider-cluster-api")]
    #[cfg_attr(docsrs, doc(cfg(feature = "provider-cluster-api")))]
    #[doc(inline)]
    pub use kube_multicluster_provider_cluster_api as cluster_api;
    #[cfg(feature = "provider-cluster-inventory")]
    #[cfg_attr(docsrs, doc(cfg(feature = "provider-cluster-inventory")))]
    #[doc(inline)]
    pub use kube_multicluster_provider_cluster_inventory as cluster_inventory;
    #[cfg(feature = "provider-file")]
    #[cfg_attr(docsrs, doc(cfg(feature = "provider-file")))]
    #[doc(inline)]
    pub use kube_multicluster_provider_file as file;
    #[cfg(feature = "provider-kcp")]
    #[cfg_attr(docsrs, doc(cfg(feature = "provider-kcp")))]
    #[doc(inline)]
    pub use kube_multicluster_provider_kcp as kcp;
    #[cfg(feature = "provider-kind")]
    #[cfg_attr(docsrs, doc(cfg(feature = "provider-kind")))]
    #[doc(inline)]
    pub use kube_multicluster_provider_kind as kind;
    #[cfg(feature = "provider-multi")]
    #[cfg_attr(docsrs, doc(cfg(feature = "provider-multi")))]
    #[doc(inline)]
    pub use kube_multicluster_provider_multi as multi;
    #[cfg(feature = "provider-namespace")]
    #[cfg_attr(docsrs, doc(cfg(feature = "provider-namespace")))]
    #[doc(inline)]
    pub use kube_multicluster_provider_namespace as namespace;
    #[cfg(feature = "provider-placement")]
    #[cfg_attr(docsrs, doc(cfg(feature = "provider-placement")))]
    #[doc(inline)]
    pub use kube_multicluster_provider_placement as placement;
    #[cfg(feature = "provider-secret")]
    #[cfg_attr(docsrs, doc(cfg(feature = "provider-secret")))]
    #[doc(inline)]
    pub use kube_multicluster_provider_secret as secret;
}

/// The README's code, compiled with the doc tests so that what it shows
/// keeps working.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

/// The webhooks chapter's code, compiled with the doc tests.
#[cfg(doctest)]
#[doc = include_str!("../docs/webhooks.md")]
struct WebhooksDoctests;

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

/// The operations guide's code, compiled with the doc tests.
#[cfg(doctest)]
#[doc = include_str!("../docs/operations.md")]
struct OperationsDoctests;
