//! A fleet of real Kubernetes API servers for tests, examples and benchmarks.
//!
//! [`Envtest`] starts one etcd and any number of `kube-apiserver` processes on
//! 127.0.0.1, each a cluster of its own with its own etcd prefix, port,
//! certificates and admin credentials, as controller-runtime's envtest does
//! for one cluster. Each [`TestCluster`] hands out a ready [`kube::Client`],
//! its kubeconfig, clients for any user, [`stop`](TestCluster::stop) /
//! [`restart`](TestCluster::restart) of its API server alone, and network
//! faults, for fault tests.
//!
//! ```no_run
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use kube::{Api, api::PostParams};
//! use kube_multicluster_envtest::Envtest;
//!
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let fleet = Envtest::start(3).await?;
//! let (a, b) = (&fleet.clusters()[0], &fleet.clusters()[1]);
//!
//! let mut cm = ConfigMap::default();
//! cm.metadata.name = Some("only-in-a".into());
//! Api::<ConfigMap>::default_namespaced(a.client())
//!     .create(&PostParams::default(), &cm)
//!     .await?;
//! let in_b = Api::<ConfigMap>::default_namespaced(b.client()).get_opt("only-in-a").await?;
//! assert!(in_b.is_none());
//! # Ok(())
//! # }
//! ```
//!
//! # Faults
//!
//! Clients reach each cluster through a small TCP proxy of the cluster's own,
//! so a test can make the cluster [`hang`](TestCluster::hang) (connections
//! stay open, nothing is answered), [`cut_off`](TestCluster::cut_off)
//! (connections are closed, requests fail at once) and
//! [`restore`](TestCluster::restore) it, for every client of the cluster.
//! [`TestCluster::link`] makes a [`FaultyLink`]: a proxy of its own, whose
//! faults only its own clients see.
//!
//! ```no_run
//! use std::time::Duration;
//!
//! use k8s_openapi::api::core::v1::Namespace;
//! use kube::{Api, Client};
//! use kube_multicluster_envtest::Envtest;
//!
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let default_namespace = |client: Client| async move {
//!     let namespaces = Api::<Namespace>::all(client);
//!     tokio::time::timeout(Duration::from_secs(1), namespaces.get("default")).await
//! };
//! let fleet = Envtest::start(2).await?;
//! let (a, b) = (&fleet.clusters()[0], &fleet.clusters()[1]);
//!
//! a.hang();
//! assert!(default_namespace(a.client()).await.is_err(), "no answer in time");
//! assert!(default_namespace(b.client()).await?.is_ok(), "other clusters answer");
//! a.cut_off();
//! assert!(default_namespace(a.client()).await?.is_err(), "a connection error, at once");
//! a.restore();
//! assert!(default_namespace(a.client()).await?.is_ok());
//!
//! let link = a.link()?;
//! link.hang();
//! assert!(default_namespace(link.client()).await.is_err());
//! assert!(default_namespace(a.client()).await?.is_ok(), "the cluster's own clients answer");
//! # Ok(())
//! # }
//! ```
//!
//! # Users and groups
//!
//! [`TestCluster::client_for`] and [`TestCluster::kubeconfig_for`] sign a
//! client certificate for any user and groups with the cluster's CA; RBAC
//! decides what they may do, as in a real cluster.
//!
//! ```no_run
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use kube::{Api, api::ListParams};
//!
//! let fleet = kube_multicluster_envtest::Envtest::start(1).await?;
//! let alice = fleet.clusters()[0].client_for("alice", &["developers"])?;
//! let list = Api::<ConfigMap>::default_namespaced(alice).list(&ListParams::default()).await;
//! assert!(matches!(list, Err(kube::Error::Api(status)) if status.code == 403));
//! # Ok(())
//! # }
//! ```
//!
//! # Binaries
//!
//! The harness runs `kube-apiserver` and `etcd` from the directory in
//! `KUBEBUILDER_ASSETS` if that is set. Otherwise it builds them once with the
//! machine's `go` from the Go module proxy (the versions are
//! [`KUBERNETES_VERSION`] and [`ETCD_VERSION`]) and caches them in
//! [`Binaries::cache_dir`]; the first build takes a few minutes and reports
//! its progress on stderr, later runs start in seconds. See [`Binaries`].

#![cfg_attr(docsrs, feature(doc_cfg))]
// One `unsafe` block, in `process.rs`: arming a parent-death signal in the child.
#![deny(unsafe_code)]

mod assets;
mod cluster;
mod crd;
mod envtest;
mod error;
mod etcd;
mod fault;
mod kcp;
mod kubeconfig;
mod link;
mod metrics;
mod open_files;
mod pki;
mod process;
mod serving;

pub use assets::{ASSETS_ENV, Binaries, CACHE_ENV, ETCD_VERSION, KUBERNETES_VERSION};
pub use cluster::TestCluster;
pub use crd::{FIELD_MANAGER, crds_from_yaml, install_crds};
pub use envtest::{DEFAULT_START_TIMEOUT, Envtest, EnvtestBuilder};
pub use error::{Error, Result};
pub use kcp::{KCP_ENV, KCP_EXAMPLE_EXPORT, KCP_START_TIMEOUT, KCP_VERSION, Kcp, KcpBinary};
pub use link::FaultyLink;
pub use metrics::{metric_sum, watches_served};
pub use serving::{ServingCertificate, TestCa};
