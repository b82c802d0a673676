//! Whether an engaged cluster is well, from what the fleet already sees of
//! it: whether its API server answers its client, and whether its cache's
//! watches run; and how long a cluster set aside must answer before it is
//! engaged again ([`Settling`]).

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
/// not run again yet), or whose first list waits for room in the fleet's
/// [cache budget](crate::FleetConfig::cache_budget), is
/// [`Degraded`](Self::Degraded): when a cluster
/// answers again after an outage, its watches retry at once, and it is
/// `Healthy` again once each of them runs (its retry answered, and
/// running for a second). A cluster
/// [set aside](crate::FleetConfig::set_aside_after) is `Unreachable` in
/// [`FleetStatus::health`](crate::FleetStatus::health), and
/// [`Settling`](Self::Settling) once it answers again, until it is engaged
/// again.
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
    /// It was [set aside](crate::FleetConfig::set_aside_after) for want of
    /// an answer and answers again: the fleet engages it again once it has
    /// answered, without a miss, for `settling` (see [`Settling`]).
    Settling {
        /// For how long it has answered without a miss.
        answering_for: Duration,
        /// For how long it must, before it is engaged again.
        settling: Duration,
    },
}

impl ClusterHealth {
    /// `healthy`, `degraded`, `unreachable` or `settling`: the `state`
    /// label of `kube_multicluster_cluster_health`.
    pub fn state(&self) -> &'static str {
        match self {
            Self::Healthy => "healthy",
            Self::Degraded { .. } => "degraded",
            Self::Unreachable { .. } => "unreachable",
            Self::Settling { .. } => "settling",
        }
    }

    /// Whether it is [`Healthy`](Self::Healthy).
    pub fn is_healthy(&self) -> bool {
        matches!(self, Self::Healthy)
    }
}

/// How long a cluster [set aside](crate::FleetConfig::set_aside_after)
/// must answer, without a miss, before the fleet engages it again: `first`,
/// doubled each time it flaps, up to `cap`.
///
/// Each engagement costs a full list of every watch there and a reconcile
/// of every key, so a cluster that answers and fails by turns is held back
/// until it has shown that it stays. Once a cluster set aside answers
/// again, the fleet asks it `GET /readyz` at each of its looks (once a
/// second); when it has answered for its settling time, and every ask
/// meanwhile was answered, it is engaged again. A miss (an ask unanswered,
/// or answered `5xx`, or any outage seen between two looks) starts the
/// settling time over.
///
/// A cluster *flaps* when it stops answering less than `cap` after it was
/// engaged again (it was last heard from then) and is set aside for it: its
/// next settling time doubles (`first`, 2 × `first`, 4 × `first`, …, at
/// most `cap`). A cluster engaged again that is not set aside within `cap`
/// is forgotten: set aside later, it settles for `first` again. What the
/// fleet remembers of a cluster goes when its provider disengages or
/// engages its name anew.
///
/// So a cluster that flaps for `T` from its first set-aside on is engaged
/// again at most [`most_engagements(T)`](Self::most_engagements) times: the
/// largest `n` whose settling times `s₀ + s₁ + … + sₙ₋₁` fit in `T`, since
/// each engagement waits out its own. With the default (5 s doubling to
/// 5 min), at most 3 in a minute (5 + 10 + 20 s) and 6 in ten (315 s for
/// the first six, then one per 5 min), where a cluster engaged again at
/// its first answer could be engaged again every few seconds.
///
/// ```
/// use std::time::Duration;
/// use kube_multicluster::health::Settling;
///
/// let secs = Duration::from_secs;
/// let settling = Settling::new(secs(5), secs(300));
/// assert_eq!(settling, Settling::DEFAULT);
/// assert_eq!(settling.after_flaps(0), secs(5));
/// assert_eq!(settling.after_flaps(3), secs(40));
/// assert_eq!(settling.after_flaps(9), secs(300));
/// assert_eq!(settling.most_engagements(secs(60)), 3);
/// assert_eq!(settling.most_engagements(secs(600)), 6);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settling {
    first: Duration,
    cap: Duration,
}

impl Settling {
    /// 5 s, doubling to 5 min. Five seconds are five of the fleet's asks,
    /// enough to find a link that drops every few seconds, and little
    /// beside the outage that set the cluster aside; five minutes is the
    /// most a cluster back for good waits after flapping long, and at most
    /// one full list per five minutes is what a cluster that flaps for ever
    /// costs.
    pub const DEFAULT: Self = Self {
        first: Duration::from_secs(5),
        cap: Duration::from_secs(300),
    };

    /// `first`, doubling to `cap`. `Settling::new(Duration::ZERO,
    /// Duration::ZERO)` engages a cluster set aside again at the first
    /// look that finds it answering, and counts no flaps.
    ///
    /// # Panics
    ///
    /// If `first` is longer than `cap`.
    pub const fn new(first: Duration, cap: Duration) -> Self {
        assert!(
            first.as_nanos() <= cap.as_nanos(),
            "a first settling time longer than its cap"
        );
        Self { first, cap }
    }

    /// How long a cluster set aside for the first time (or after it was
    /// forgotten) must answer.
    pub const fn first(&self) -> Duration {
        self.first
    }

    /// The longest settling time; also how long a cluster engaged again is
    /// remembered, and how soon after it stopping to answer is a flap.
    pub const fn cap(&self) -> Duration {
        self.cap
    }

    /// How long a cluster that has flapped `flaps` times must answer:
    /// `first` × 2^`flaps`, at most `cap`.
    pub fn after_flaps(&self, flaps: u32) -> Duration {
        let doubled = 1u32
            .checked_shl(flaps)
            .and_then(|times| self.first.checked_mul(times));
        doubled.map_or(self.cap, |settling| settling.min(self.cap))
    }

    /// The most times a cluster that flaps for `flapping_for`, from its
    /// first set-aside on, is engaged again (`u32::MAX` for a zero `first`,
    /// which bounds nothing).
    pub fn most_engagements(&self, flapping_for: Duration) -> u32 {
        if self.first.is_zero() {
            return u32::MAX;
        }
        let (mut engagements, mut waited) = (0u32, Duration::ZERO);
        loop {
            let settling = self.after_flaps(engagements);
            if settling == self.cap {
                // One per `cap` from here on.
                let left = flapping_for.saturating_sub(waited).as_nanos() / self.cap.as_nanos();
                let left = u32::try_from(left).unwrap_or(u32::MAX);
                return engagements.saturating_add(left);
            }
            match waited.checked_add(settling) {
                Some(total) if total <= flapping_for => waited = total,
                _ => return engagements,
            }
            engagements += 1;
        }
    }
}

impl Default for Settling {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// What the fleet remembers of a cluster set aside: how many times it has
/// flapped, and so how long it must answer before it is engaged again (see
/// [`Settling`]); in [`FleetStatus::damping`](crate::FleetStatus::damping).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Damping {
    /// How many times it has flapped since it was last forgotten.
    pub flaps: u32,
    /// How long it must answer, without a miss, before it is engaged
    /// again: [`Settling::after_flaps`] of `flaps`.
    pub settling: Duration,
}

impl fmt::Display for ClusterHealth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Healthy => f.write_str("healthy"),
            Self::Degraded { cause } => write!(f, "degraded: {cause}"),
            Self::Unreachable { down_for, cause } => {
                write!(f, "unreachable for {}s: {cause}", down_for.as_secs())
            }
            Self::Settling {
                answering_for,
                settling,
            } => write!(
                f,
                "set aside, answering for {}s of the {}s it must before it is engaged again",
                answering_for.as_secs(),
                settling.as_secs()
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settling_doubles_to_its_cap_and_bounds_the_engagements() {
        let secs = Duration::from_secs;
        let settling = Settling::DEFAULT;
        let times: Vec<_> = (0..8).map(|flaps| settling.after_flaps(flaps)).collect();
        let expected = [5, 10, 20, 40, 80, 160, 300, 300].map(secs);
        assert_eq!(times, expected);
        assert_eq!(settling.after_flaps(u32::MAX), secs(300));
        for (flapping_for, most) in [(4, 0), (5, 1), (34, 2), (35, 3), (60, 3), (75, 4)] {
            assert_eq!(
                settling.most_engagements(secs(flapping_for)),
                most,
                "{flapping_for} s"
            );
        }
        // One per cap once the cap is reached: 315 s for the first six.
        assert_eq!(settling.most_engagements(secs(315 + 600)), 8);
        let none = Settling::new(Duration::ZERO, Duration::ZERO);
        assert_eq!(none.after_flaps(3), Duration::ZERO);
        assert_eq!(none.most_engagements(secs(60)), u32::MAX);
    }
}
