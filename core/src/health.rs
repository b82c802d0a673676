//! Whether an engaged cluster is well, from what the fleet already sees of
//! it: whether its API server answers its client, and whether its cache's
//! watches run.

use std::{fmt, time::Duration};

/// The health of one engaged cluster
/// ([`Cluster::health`](crate::Cluster::health); every cluster's with
/// [`Fleet::health`](crate::Fleet::health)).
///
/// It is read from what the cluster's client and cache see: a cluster whose
/// requests get no answer (its connection refused, reset or timed out, a
/// gateway's `502`-`504` with its readiness check failing too) is
/// [`Unreachable`](Self::Unreachable), and is asked whether it is ready
/// (`GET /readyz`) until it answers again; one that answers but where a
/// watch fails (a type it does not serve, a right missing) is
/// [`Degraded`](Self::Degraded). A watch that has not failed again for two
/// minutes, or that failed for want of an answer before the cluster
/// answered again, counts as resumed.
///
/// ```no_run
/// # fn example(fleet: kube_fleet::Fleet) {
/// use kube_fleet::health::ClusterHealth;
///
/// for (cluster, health) in fleet.health() {
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
    /// It answers, and its cache's watches run.
    Healthy,
    /// It answers, but something fails there.
    Degraded {
        /// What fails: each failing watch, with its error.
        cause: String,
    },
    /// Its API server gives no answer.
    Unreachable {
        /// For how long.
        down_for: Duration,
        /// What the request that found it found.
        cause: String,
    },
}

impl ClusterHealth {
    /// `healthy`, `degraded` or `unreachable`: the `state` label of
    /// `kube_fleet_cluster_health`.
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

/// After how long without hearing anything from a cluster the fleet asks
/// it whether it is ready (`GET /readyz`), by default
/// ([`Fleet::with_idle_probe`](crate::Fleet::with_idle_probe)).
///
/// Every answer to a request of the cluster's client counts as hearing
/// from it (a watch's events do not; its restarts, every few minutes, do),
/// so a cluster with work in hand is not asked; an idle one is asked about
/// once a minute. A probe that gets no answer within 35 s (5 s, and the
/// time a credential plugin may take to renew its token first) marks the
/// cluster down. A hung connection is found sooner by its HTTP/2 PINGs
/// ([`ClientOptions::keep_alive`](crate::client::ClientOptions::keep_alive));
/// the probe finds what they cannot: an API server that holds its
/// connections but is not ready (its etcd gone, say), and clients without
/// PINGs (HTTP/1.1).
pub const IDLE_PROBE_AFTER: Duration = Duration::from_secs(60);
