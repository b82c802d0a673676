//! The one prefix of every name the library writes into a cluster, and of
//! every metric of its own.
//!
//! Labels, annotations and field managers the library writes all take the
//! DNS prefix [`PREFIX`] (`kube-multicluster.dev`); metrics it defines
//! (beside the controller-runtime names it shares) take [`METRIC_PREFIX`]
//! (`kube_multicluster`). The macros [`prefixed!`](crate::prefixed) and
//! [`metric_name!`](crate::metric_name) build names from them at compile
//! time, so each prefix is written once, here.

/// A name under the library's prefix, at compile time: `prefixed!()` is
/// `"kube-multicluster.dev"` and `prefixed!("shards")` is
/// `"kube-multicluster.dev/shards"`.
///
/// ```
/// use kube_multicluster::{PREFIX, prefixed};
///
/// const MARK: &str = prefixed!("mark");
/// assert_eq!(MARK, "kube-multicluster.dev/mark");
/// assert!(MARK.starts_with(PREFIX));
/// ```
#[macro_export]
macro_rules! prefixed {
    () => {
        "kube-multicluster.dev"
    };
    ($name:literal) => {
        concat!($crate::prefixed!(), "/", $name)
    };
}

/// A metric name under the library's metric prefix, at compile time:
/// `metric_name!("engaged_clusters")` is
/// `"kube_multicluster_engaged_clusters"`.
///
/// ```
/// use kube_multicluster::{METRIC_PREFIX, metric_name};
///
/// assert_eq!(metric_name!("engaged_clusters"), "kube_multicluster_engaged_clusters");
/// assert_eq!(metric_name!(), METRIC_PREFIX);
/// ```
#[macro_export]
macro_rules! metric_name {
    () => {
        "kube_multicluster"
    };
    ($name:literal) => {
        concat!($crate::metric_name!(), "_", $name)
    };
}

/// The DNS prefix of every label, annotation and field manager the library
/// writes: `kube-multicluster.dev`.
pub const PREFIX: &str = prefixed!();

/// The prefix of every metric the library defines itself:
/// `kube_multicluster` (its names are `kube_multicluster_…`).
pub const METRIC_PREFIX: &str = metric_name!();
