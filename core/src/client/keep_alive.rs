//! How long a cluster may be silent before it is asked whether it is there,
//! and how long it has to answer: one value for the fleet, a cluster's
//! client and its HTTP/2 connection.

use std::time::Duration;

/// How a silent cluster is found out: after `interval` without hearing
/// from it, it is asked, and no answer within `timeout` counts as none.
///
/// The fleet uses it for each engaged cluster (set with
/// [`FleetConfig::keep_alive`](crate::FleetConfig::keep_alive), or for one
/// cluster with [`ClusterClient::with_keep_alive`](super::ClusterClient::with_keep_alive)):
/// a cluster it has heard nothing from for `interval` (no answer to a
/// request, no data on a watch) is asked `GET /readyz`, and one that gives
/// no answer within `timeout`, or answers `5xx`, is
/// [`Unreachable`](crate::health::ClusterHealth::Unreachable). The fleet
/// looks once a second and asks at its last look before the interval is
/// up, so a cluster that hangs is found within `interval` + `timeout` of
/// the last thing heard from it, and within [`bound`](Self::bound) (a
/// second more, for the looks and the timers) whatever the load: by
/// default 10 s + 5 s + 1 s = 16 s. A client's HTTP/2 connection pings on
/// the same terms
/// ([`ClientOptions::keep_alive`](super::ClientOptions::keep_alive)), so
/// that its watches move to a new connection when it dies.
///
/// ```
/// use std::time::Duration;
/// use kube_multicluster::client::KeepAlive;
///
/// let keep_alive = KeepAlive::new(Duration::from_secs(5), Duration::from_secs(3));
/// assert_eq!(keep_alive.interval(), Duration::from_secs(5));
/// assert_eq!(keep_alive.timeout(), Duration::from_secs(3));
/// assert_eq!(keep_alive.bound(), Duration::from_secs(9));
/// assert_eq!(KeepAlive::DEFAULT.bound(), Duration::from_secs(16));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeepAlive {
    interval: Duration,
    timeout: Duration,
}

/// How often the fleet looks at its clusters' silence: part of the bound.
pub(crate) const LOOK_EVERY: Duration = Duration::from_secs(1);

impl KeepAlive {
    /// After 10 s of silence, 5 s to answer.
    pub const DEFAULT: Self = Self {
        interval: Duration::from_secs(10),
        timeout: Duration::from_secs(5),
    };

    /// Asks after `interval` of silence, and waits `timeout` for the
    /// answer.
    ///
    /// # Panics
    ///
    /// If either is zero.
    pub const fn new(interval: Duration, timeout: Duration) -> Self {
        assert!(!interval.is_zero(), "a keep-alive interval of zero");
        assert!(!timeout.is_zero(), "a keep-alive timeout of zero");
        Self { interval, timeout }
    }

    /// After how long without a word a cluster is asked.
    pub const fn interval(&self) -> Duration {
        self.interval
    }

    /// How long it has to answer.
    pub const fn timeout(&self) -> Duration {
        self.timeout
    }

    /// After how long a silent cluster is asked, as the fleet looks once a
    /// [`LOOK_EVERY`]: at its last look before the interval is up, so that
    /// the time between looks does not add to how late a hung cluster is
    /// found (it stays a margin in [`bound`](Self::bound)); never before a
    /// look's time, nor the interval if that is shorter.
    pub(crate) fn asked_after(&self) -> Duration {
        self.interval
            .saturating_sub(LOOK_EVERY)
            .max(LOOK_EVERY.min(self.interval))
    }

    /// How long after the last thing heard from a cluster that hangs the
    /// fleet calls it unreachable, at most: `interval`, then `timeout`,
    /// and a second's margin for the fleet's looks and its timers.
    pub const fn bound(&self) -> Duration {
        self.interval
            .saturating_add(self.timeout)
            .saturating_add(LOOK_EVERY)
    }
}

impl Default for KeepAlive {
    fn default() -> Self {
        Self::DEFAULT
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_silent_cluster_is_asked_at_the_last_look_before_its_interval_is_up() {
        let secs = Duration::from_secs;
        assert_eq!(KeepAlive::DEFAULT.asked_after(), secs(9));
        // Never before a look's time, nor after the interval.
        assert_eq!(KeepAlive::new(secs(1), secs(1)).asked_after(), secs(1));
        let short = Duration::from_millis(300);
        assert_eq!(KeepAlive::new(short, secs(1)).asked_after(), short);
    }
}
