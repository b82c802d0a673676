//! Whether an engaged cluster is well, from what the fleet already sees of
//! it: whether its API server answers its client, and whether its cache's
//! watches run.

use std::{fmt, time::Duration};

/// The health of one engaged cluster
/// ([`Cluster::health`](crate::Cluster::health); every cluster's with
/// [`FleetStatus::health`](crate::FleetStatus::health)).
///
/// It is read from what the cluster's client and cache see: a cluster whose
/// requests get no answer (its connection refused, reset or timed out, a
/// gateway's `502`-`504` or a watch broken off, with its readiness check
/// failing too), or that has been silent for its
/// [`KeepAlive`](crate::client::KeepAlive)'s interval and does not answer
/// within its timeout, is [`Unreachable`](Self::Unreachable), and is asked
/// whether it is ready (`GET /readyz`) until it answers again. A cluster
/// that hangs is unreachable within
/// [`KeepAlive::bound`](crate::client::KeepAlive::bound) of the last thing
/// heard from it: 16 s by default. One that answers but where a watch fails
/// (a type it does not serve, a right missing, or a watch whose retry has
/// not run again yet) is [`Degraded`](Self::Degraded): when a cluster
/// answers again after an outage, its watches retry at once, and it is
/// `Healthy` again once each of them runs (its retry answered, and
/// running for a second).
///
/// ```no_run
/// # fn example(fleet: kube_multicluster::Fleet) {
/// use kube_multicluster::health::ClusterHealth;
///
/// for (cluster, health) in fleet.status().health {
///     match health {
///         ClusterHealth::Healthy => {}
///         ClusterHealth::Degraded { cause } => eprintln!("{cluster}: degraded: {cause}"),
///         ClusterHealth::Unreachable { down_for, cause } => {
///             eprintln!("{cluster}: no answer for {down_for:?}: {cause}")
///         }
///         _ => {}
///     }
/// }
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClusterHealth {
    /// It answers, and each of its cache's watches runs.
    Healthy,
    /// It answers, but something fails there.
    Degraded {
        /// What fails: each failing watch, with its error.
        cause: String,
    },
    /// Its API server gives no answer.
    Unreachable {
        /// For how long: since the last thing heard from it (an answer,
        /// data on a watch), not since that was noticed.
        down_for: Duration,
        /// What the request that found it found.
        cause: String,
    },
}

impl ClusterHealth {
    /// `healthy`, `degraded` or `unreachable`: the `state` label of
    /// `kube_multicluster_cluster_health`.
    pub fn state(&self) -> &'static str {
        match self {
            Self::Healthy => "healthy",
            Self::Degraded { .. } => "degraded",
            Self::Unreachable { .. } => "unreachable",
        }
    }

    /// Whether it is [`Healthy`](Self::Healthy).
    pub fn is_healthy(&self) -> bool {
        matches!(self, Self::Healthy)
    }
}

impl fmt::Display for ClusterHealth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Healthy => f.write_str("healthy"),
            Self::Degraded { cause } => write!(f, "degraded: {cause}"),
            Self::Unreachable { down_for, cause } => {
                write!(f, "unreachable for {}s: {cause}", down_for.as_secs())
            }
        }
    }
}
