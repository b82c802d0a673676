//! What the fleet can say of its clusters at one moment.

use crate::{
    cache::InitialLists,
    cluster_name::ClusterName,
    health::{ClusterHealth, Damping},
};

use super::Duplicate;

/// The fleet at one moment: each cluster's health, the clusters set aside,
/// the names held back or engaged twice, and the fleet's lists in flight.
/// Read with [`Fleet::status`](super::Fleet::status).
///
/// ```
/// let status = kube_multicluster::Fleet::new().status();
/// assert!(status.health.is_empty());
/// assert!(status.set_aside.is_empty() && status.duplicates.is_empty());
/// assert_eq!(status.initial_lists.in_flight(), 0);
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct FleetStatus {
    /// The health of every engaged cluster, and of every cluster
    /// [set aside](super::FleetConfig::set_aside_after) (`Unreachable`, or
    /// `Settling` once it answers again), by name, sorted: see
    /// [`ClusterHealth`].
    pub health: Vec<(ClusterName, ClusterHealth)>,
    /// The clusters set aside for want of an answer, sorted: see
    /// [`FleetConfig::set_aside_after`](super::FleetConfig::set_aside_after).
    pub set_aside: Vec<ClusterName>,
    /// Each cluster set aside, sorted as [`set_aside`](Self::set_aside):
    /// how many times it has flapped, and how long it must answer before it
    /// is engaged again (see [`Settling`](crate::health::Settling)).
    pub damping: Vec<(ClusterName, Damping)>,
    /// Every name offered for a cluster engaged under another: engaged too
    /// ([`Duplicates::Warn`](super::Duplicates::Warn)) or held back
    /// ([`Duplicates::EngageOnce`](super::Duplicates::EngageOnce)).
    pub duplicates: Vec<Duplicate>,
    /// The bound on the fleet's lists in flight, and how many list and
    /// wait now (a live handle: it reads the current figures each time).
    pub initial_lists: InitialLists,
}
