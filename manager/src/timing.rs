//! Where the Leases are kept and how long one lasts and is renewed
//! ([`LeaseParams`], shared by leader election and sharding), and jitter.
//! Below the Leases, the election and the sharder, which all keep time by
//! it.

use std::{
    hash::{BuildHasher, RandomState},
    time::Duration,
};

use kube::Client;

use crate::error::Error;

/// Where a replica keeps its Leases and how it holds them: for
/// [`LeaderElection::lease`](crate::LeaderElection::lease) and
/// [`Sharding::lease`](crate::Sharding::lease) alike.
///
/// ```
/// use std::time::Duration;
/// use kube_multicluster_manager::{LeaderElection, LeaseParams};
///
/// let lease = LeaseParams::default()
///     .namespace("operators")
///     .lease_duration(Duration::from_secs(20));
/// let election = LeaderElection::new("my-operator").lease(lease);
/// assert!(election.validate().is_ok());
/// ```
#[derive(Clone, Default)]
pub struct LeaseParams {
    pub(crate) namespace: Option<String>,
    pub(crate) identity: Option<String>,
    pub(crate) client: Option<Client>,
    pub(crate) timings: Timings,
}

impl std::fmt::Debug for LeaseParams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseParams")
            .field("namespace", &self.namespace)
            .field("identity", &self.identity)
            .field("client", &self.client.is_some())
            .field("timings", &self.timings)
            .finish()
    }
}

impl LeaseParams {
    /// The namespace of the Leases (default: the client's namespace).
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = Some(namespace.into());
        self
    }

    /// This replica's identity (default: the host name, then `_` and a
    /// random suffix, so that two processes on one host differ). A Lease
    /// records it followed by `_` and a nonce of this run; sharding ranks
    /// replicas by its hash.
    pub fn identity(mut self, identity: impl Into<String>) -> Self {
        self.identity = Some(identity.into());
        self
    }

    /// The client of the cluster that holds the Leases (default: the local
    /// cluster's, from `Client::try_default`).
    pub fn client(mut self, client: Client) -> Self {
        self.client = Some(client);
        self
    }

    /// How long a Lease lasts without a renew before another replica may
    /// take it (default 15 s; whole seconds).
    pub fn lease_duration(mut self, duration: Duration) -> Self {
        self.timings.lease_duration = duration;
        self
    }

    /// How long a holder tries to renew before it lets go: the leader stops
    /// leading, a replica stops running the shard's clusters (default
    /// 10 s); shorter than the lease duration.
    pub fn renew_deadline(mut self, deadline: Duration) -> Self {
        self.timings.renew_deadline = deadline;
        self
    }

    /// How often a holder renews, and a waiting replica tries to take a
    /// Lease or looks at the others' (default 2 s); the renew deadline must
    /// exceed 1.2 times this.
    pub fn retry_period(mut self, period: Duration) -> Self {
        self.timings.retry_period = period;
        self
    }
}

/// How long a Lease lasts, how long its holder tries to renew it before it
/// stops, and how often it tries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Timings {
    pub(crate) lease_duration: Duration,
    pub(crate) renew_deadline: Duration,
    pub(crate) retry_period: Duration,
}

impl Default for Timings {
    fn default() -> Self {
        Self {
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

impl Timings {
    pub(crate) fn validate(&self, what: &str) -> Result<(), Error> {
        let Self {
            lease_duration,
            renew_deadline,
            retry_period,
        } = *self;
        let problem = if retry_period.is_zero() {
            Some("the retry period must be more than zero".to_owned())
        } else if lease_duration <= renew_deadline {
            Some(format!(
                "the lease duration ({lease_duration:?}) must be longer than the renew deadline ({renew_deadline:?})"
            ))
        } else if renew_deadline.as_secs_f64() <= 1.2 * retry_period.as_secs_f64() {
            Some(format!(
                "the renew deadline ({renew_deadline:?}) must be longer than 1.2 times the retry period ({retry_period:?})"
            ))
        } else if lease_duration.subsec_nanos() != 0 {
            Some(format!(
                "the lease duration ({lease_duration:?}) must be whole seconds, as a Lease records it"
            ))
        } else {
            None
        };
        match problem {
            Some(reason) => Err(Error::Invalid {
                what: what.to_owned(),
                reason,
            }),
            None => Ok(()),
        }
    }

    /// How long one request to the API server may take: half the renew
    /// deadline, at least a second, so that one hung request leaves time
    /// for another.
    pub(crate) fn request_timeout(&self) -> Duration {
        (self.renew_deadline / 2).max(Duration::from_secs(1))
    }
}

/// A random number from the standard library's randomly keyed hasher.
pub(crate) fn random() -> u64 {
    RandomState::new().hash_one(std::time::SystemTime::now())
}

/// `period`, stretched by up to a fifth at random, so that replicas do not
/// try in step.
pub(crate) fn jittered(period: Duration) -> Duration {
    period.mul_f64(1.0 + (random() % 1000) as f64 / 5000.0)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{Timings, jittered};

    #[test]
    fn timings_follow_client_go_rules() {
        let ok = Timings {
            lease_duration: Duration::from_secs(4),
            renew_deadline: Duration::from_secs(3),
            retry_period: Duration::from_secs(1),
        };
        assert!(ok.validate("x").is_ok());
        assert!(Timings::default().validate("x").is_ok());
        let too_short_lease = Timings {
            lease_duration: Duration::from_secs(3),
            ..ok
        };
        let err = too_short_lease
            .validate("election")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("election") && err.contains("longer than the renew deadline"),
            "{err}"
        );
        let retry_too_long = Timings {
            retry_period: Duration::from_millis(2600),
            ..ok
        };
        assert!(retry_too_long.validate("x").is_err());
        let fractional = Timings {
            lease_duration: Duration::from_millis(4500),
            ..ok
        };
        assert!(fractional.validate("x").is_err());
    }

    #[test]
    fn jitter_adds_at_most_a_fifth() {
        for _ in 0..100 {
            let d = jittered(Duration::from_secs(10));
            assert!(
                d >= Duration::from_secs(10) && d <= Duration::from_secs(12),
                "{d:?}"
            );
        }
    }
}
