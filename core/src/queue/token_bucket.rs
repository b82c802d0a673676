use std::{
    fmt,
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio::time::Instant;

use crate::panic::lock;

/// A token bucket: `rate` tokens per second, at most `burst` saved up.
///
/// A controller takes one token per reconcile when it pops a key from its
/// queue (see [`controller::Config`](crate::controller::Config)); a key
/// whose tokens are not there yet stays queued. Clones share the same tokens,
/// so one bucket given to several controllers is one budget for all of them.
///
/// ```
/// use kube_multicluster::{controller::Config, queue::TokenBucket};
///
/// // At most 50 reconciles per second (bursts of 100) across two controllers...
/// let shared = TokenBucket::new(50.0, 100);
/// let first = Config::default().rate_limit(shared.clone());
/// let second = Config::default().rate_limit(shared);
/// // ...and 10 per second (bursts of 20) in each cluster for the first.
/// let first = first.cluster_rate_limit(10.0, 20);
/// # drop((first, second));
/// ```
#[derive(Clone)]
pub struct TokenBucket {
    tokens: Arc<Mutex<Tokens>>,
}

impl fmt::Debug for TokenBucket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let tokens = lock(&self.tokens);
        f.debug_struct("TokenBucket")
            .field("rate", &tokens.rate)
            .field("burst", &tokens.burst)
            .finish_non_exhaustive()
    }
}

impl TokenBucket {
    /// A full bucket refilling at `rate` per second, holding at most `burst`.
    ///
    /// # Panics
    /// If `rate` is not a positive number or `burst` is zero.
    pub fn new(rate: f64, burst: u32) -> Self {
        Self {
            tokens: Arc::new(Mutex::new(Tokens::full(rate, burst))),
        }
    }

    /// Takes a token if one is there at `now`; otherwise says when one will be.
    pub(crate) fn try_take(&self, now: Instant) -> Result<(), Instant> {
        lock(&self.tokens).try_take(now)
    }
}

/// The state of a bucket, for one owner: a cluster's bucket in a queue is
/// used by that queue alone and needs no lock.
#[derive(Debug)]
pub(crate) struct Tokens {
    /// Tokens available at `at`.
    tokens: f64,
    at: Instant,
    rate: f64,
    burst: f64,
}

impl Tokens {
    /// A full bucket; panics as [`TokenBucket::new`] does.
    pub(crate) fn full(rate: f64, burst: u32) -> Self {
        assert!(rate > 0.0 && rate.is_finite(), "rate must be positive");
        assert!(burst > 0, "burst must be at least 1");
        Self {
            tokens: f64::from(burst),
            at: Instant::now(),
            rate,
            burst: f64::from(burst),
        }
    }

    /// Takes a token if one is there at `now`; otherwise says when one will be.
    pub(crate) fn try_take(&mut self, now: Instant) -> Result<(), Instant> {
        if now > self.at {
            let refill = (now - self.at).as_secs_f64() * self.rate;
            self.tokens = (self.tokens + refill).min(self.burst);
            self.at = now;
        }
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            return Ok(());
        }
        let wait = Duration::try_from_secs_f64((1.0 - self.tokens) / self.rate)
            .unwrap_or(MAX_WAIT)
            .min(MAX_WAIT);
        Err(self.at + wait)
    }
}

/// The longest a key waits for a token, however low the rate: tokio's timers
/// reach about two years.
const MAX_WAIT: Duration = Duration::from_secs(365 * 24 * 60 * 60);

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_bucket_gives_its_burst_then_one_token_per_interval() {
        let bucket = TokenBucket::new(2.0, 2);
        assert!(bucket.try_take(Instant::now()).is_ok());
        assert!(bucket.clone().try_take(Instant::now()).is_ok());
        let next = bucket
            .try_take(Instant::now())
            .expect_err("clones share tokens: none left");
        assert_eq!(next - Instant::now(), Duration::from_millis(500));
        tokio::time::advance(Duration::from_millis(500)).await;
        assert!(bucket.try_take(Instant::now()).is_ok());
        assert!(bucket.try_take(Instant::now()).is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn a_very_low_rate_waits_at_most_a_year() {
        let mut tokens = Tokens::full(1e-12, 1);
        tokens.try_take(Instant::now()).unwrap();
        let next = tokens.try_take(Instant::now()).unwrap_err();
        assert_eq!(next - Instant::now(), MAX_WAIT);
    }
}
