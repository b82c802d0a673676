//! What a fleet does on its own, set once when it is made.

use std::time::Duration;

use super::duplicates::Duplicates;
use crate::{
    cache::InitialLists,
    client::{KeepAlive, RequestBudget},
    health::Settling,
};

/// How a [`Fleet`](super::Fleet) treats its clusters, given once to
/// [`Fleet::with_config`](super::Fleet::with_config); every field has a
/// default ([`FleetConfig::default`]), so set only those you change.
///
/// ```
/// use std::time::Duration;
/// use kube_multicluster::{Duplicates, Fleet, FleetConfig, client::RequestBudget, health::Settling};
///
/// let fleet = Fleet::with_config(FleetConfig {
///     initial_lists: 16,
///     request_budget: RequestBudget::DEFAULT.writes(100.0, 200),
///     set_aside_after: Some(Duration::from_secs(300)),
///     settling: Settling::new(Duration::from_secs(10), Duration::from_secs(600)),
///     duplicates: Duplicates::Ignore,
///     ..FleetConfig::default()
/// });
/// assert_eq!(fleet.config().initial_lists, 16);
/// assert_eq!(fleet.status().initial_lists.limit(), 16);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct FleetConfig {
    /// At most this many watches list at once across all the fleet's
    /// clusters (default [`InitialLists::DEFAULT`]; at least one): a watch
    /// takes a permit before it lists and gives it back once its list is
    /// done or failed; see [`InitialLists`]. Lower it to spare the memory
    /// of an engage storm and the API servers it lists; raise it if many
    /// clusters list slowly. The watches of a
    /// [`HostCache`](crate::cache::HostCache), one per type for all its
    /// namespaces, are not bounded by it.
    pub initial_lists: usize,
    /// The request budget of each cluster (default
    /// [`RequestBudget::DEFAULT`]), unless its
    /// [`ClusterClient`](crate::client::ClusterClient) has one of its own
    /// ([`ClusterClient::with_budget`](crate::client::ClusterClient::with_budget),
    /// or a provider's,
    /// [`provider::with_request_budget`](crate::provider::with_request_budget)).
    /// Each cluster has its own: one that spends its budget holds back no
    /// other.
    pub request_budget: RequestBudget,
    /// When a cluster the fleet has heard nothing from is asked whether it
    /// is ready (`GET /readyz`), and how long it has to answer before it is
    /// [unreachable](crate::health::ClusterHealth::Unreachable); `None`
    /// never asks a cluster for being silent (but one whose client has
    /// [terms of its own](crate::client::ClusterClient::with_keep_alive)).
    /// Default [`KeepAlive::DEFAULT`]: a cluster that hangs, or is gone
    /// where nothing else asks it, is unreachable within
    /// [`KeepAlive::bound`] (16 s) of the last thing heard from it. Every
    /// answer a cluster's client gets, and every bit of data on its
    /// watches, counts as hearing from it, so a busy cluster is never asked.
    pub keep_alive: Option<KeepAlive>,
    /// Set aside a cluster that has not answered for this long (default
    /// `None`: a cluster that does not answer stays engaged until its
    /// provider says otherwise).
    ///
    /// A cluster set aside is disengaged: it is not in
    /// [`Fleet::get`](super::Fleet::get) or
    /// [`Fleet::clusters`](super::Fleet::clusters), subscribers see
    /// [`FleetEvent::Disengaged`](super::FleetEvent::Disengaged), and
    /// controllers stop its watches and forget its keys, so its cache's
    /// memory is freed and its retries stop. The fleet keeps what it was
    /// engaged with and goes on asking it whether it is ready (every few
    /// seconds); once it has answered for its [settling](Self::settling)
    /// time, the fleet engages it again under its name with the same
    /// client, and controllers start over there (a full list, every key
    /// reconciled). Meanwhile it is in
    /// [`FleetStatus::set_aside`](super::FleetStatus::set_aside) and
    /// [`FleetStatus::damping`](super::FleetStatus::damping) and, as
    /// `Unreachable` (or `Settling` while it answers), in
    /// [`FleetStatus::health`](super::FleetStatus::health). Its provider need do
    /// nothing: an engage of its name replaces it, a disengage forgets it.
    /// A namespace of a host ([`Fleet::engage_view`](super::Fleet::engage_view))
    /// is not set aside: its watches are its host's, shared with the other
    /// namespaces.
    pub set_aside_after: Option<Duration>,
    /// How long a cluster [set aside](Self::set_aside_after) must answer,
    /// without a miss, before it is engaged again: the first time 5 s, and
    /// twice as long each time it flaps (stops answering less than the cap
    /// after it was engaged again, and is set aside for it), up to 5 min
    /// (default [`Settling::DEFAULT`]). A cluster that answers and fails by
    /// turns is so engaged again at most
    /// [`Settling::most_engagements`] times while it flaps (3 in a minute
    /// by default) rather than at each answer, each engagement a full list
    /// of every watch. Used only with `set_aside_after`.
    pub settling: Settling,
    /// What the fleet does when two names it engages are one cluster
    /// (default [`Duplicates::Warn`]).
    pub duplicates: Duplicates,
    /// A budget for the bytes the caches of all the fleet's clusters hold
    /// (default `None`: no budget, and nothing counted): while they hold
    /// more, no watch starts its first list, so an engage storm, or a
    /// restart before thousands of clusters, fills the caches only as far
    /// as the budget, and the clusters beyond it wait, engaged, until room
    /// frees up (a cluster leaves, objects are deleted). A first list that
    /// would take the caches past the budget is dropped, all of it, not
    /// kept half-way, and made again once as much room as it took is
    /// free (a list that did not fit waits for twice what it had read, and
    /// any first list for a sixteenth of the budget, 64 KiB at most); one
    /// larger than the whole budget is never made. Lists after a
    /// watch's first (once it expired, say) replace what it holds and are
    /// never dropped, and a synced store may grow past the budget as its
    /// objects change: the budget bounds what the fleet takes on, not what
    /// its clusters hold.
    ///
    /// Each object counts the length of its `Debug` text as the store keeps
    /// it (after `managedFields` and any transform are dropped), which for
    /// the kinds of `k8s-openapi` names every field, set or not, much as the
    /// object's memory holds them (escaped characters count twice); see
    /// [`InitialLists::cached_bytes`](crate::cache::InitialLists::cached_bytes).
    /// A watch that waits for room is told in
    /// [`Fleet::problems`](super::Fleet::problems) (under `cluster "<name>":
    /// <apiVersion> <kind>`, with its namespace and selectors if any), in its
    /// cluster's health (`Degraded`), in
    /// [`InitialLists::waiting_for_room`](crate::cache::InitialLists::waiting_for_room)
    /// and in the manager's `kube_multicluster_cache_waiting_watches`. The
    /// watches of a [`HostCache`](crate::cache::HostCache) are not counted.
    pub cache_budget: Option<usize>,
}

impl Default for FleetConfig {
    fn default() -> Self {
        Self {
            initial_lists: InitialLists::DEFAULT,
            request_budget: RequestBudget::DEFAULT,
            keep_alive: Some(KeepAlive::DEFAULT),
            set_aside_after: None,
            settling: Settling::DEFAULT,
            duplicates: Duplicates::Warn,
            cache_budget: None,
        }
    }
}
