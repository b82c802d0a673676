//! A fleet of real Kubernetes API servers for tests, examples and benchmarks.
//!
//! [`Envtest`] starts one etcd and any number of `kube-apiserver` processes on
//! 127.0.0.1, each a cluster of its own with its own etcd prefix, port,
//! certificates and admin credentials, as controller-runtime's envtest does
//! for one cluster. Each [`TestCluster`] hands out a ready [`kube::Client`],
//! its kubeconfig, and [`stop`](TestCluster::stop) /
//! [`restart`](TestCluster::restart) of its API server alone, for fault tests.
//!
//! ```no_run
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use kube::{Api, api::PostParams};
//! use kube_fleet_envtest::Envtest;
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
//! # Binaries
//!
//! The harness runs `kube-apiserver` and `etcd` from the directory in
//! `KUBEBUILDER_ASSETS` if that is set. Otherwise it builds them once with the
//! machine's `go` from the Go module proxy (the versions are
//! [`KUBERNETES_VERSION`] and [`ETCD_VERSION`]) and caches them in
//! [`Binaries::cache_dir`]; the first build takes a few minutes and reports
//! its progress on stderr, later runs start in seconds. See [`Binaries`].

// One `unsafe` block, in `process.rs`: arming a parent-death signal in the child.
#![deny(unsafe_code)]

mod assets;
mod cluster;
mod crd;
mod envtest;
mod error;
mod etcd;
mod kubeconfig;
mod pki;
mod process;

pub use assets::{ASSETS_ENV, Binaries, CACHE_ENV, ETCD_VERSION, KUBERNETES_VERSION};
pub use cluster::TestCluster;
pub use crd::{crds_from_yaml, install_crds};
pub use envtest::{DEFAULT_START_TIMEOUT, Envtest, EnvtestBuilder};
pub use error::{Error, Result};
