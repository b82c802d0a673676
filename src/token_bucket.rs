use std::{
    fmt,
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use tokio::time::Instant;

/// A token bucket: `rate` tokens per second, at most `burst` saved up.
///
/// A controller takes one token per reconcile when it pops a key from its
/// queue (see [`controller::Config`](crate::controller::Config)); a key
/// whose tokens are not there yet stays queued. Clones share the same tokens,
/// so one bucket given to several controllers is one budget for all of them.
///
/// ```
/// use kube_fleet::{TokenBucket, controller::Config};
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
    state: Arc<Mutex<State>>,
    rate: f64,
    burst: f64,
}

struct State {
    /// Tokens available at `at`; below zero when more were taken than there were.
    tokens: f64,
    at: Instant,
}

impl fmt::Debug for TokenBucket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokenBucket")
            .field("rate", &self.rate)
            .field("burst", &self.burst)
            .finish_non_exhaustive()
    }
}

impl TokenBucket {
    /// A full bucket refilling at `rate` per second, holding at most `burst`.
    ///
    /// # Panics
    /// If `rate` is not a positive number or `burst` is zero.
    pub fn new(rate: f64, burst: u32) -> Self {
        assert!(rate > 0.0 && rate.is_finite(), "rate must be positive");
        assert!(burst > 0, "burst must be at least 1");
        Self {
            state: Arc::new(Mutex::new(State {
                tokens: f64::from(burst),
                at: Instant::now(),
            })),
            rate,
            burst: f64::from(burst),
        }
    }

    fn refilled(&self) -> MutexGuard<'_, State> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        let refill = (now - state.at).as_secs_f64() * self.rate;
        state.tokens = (state.tokens + refill).min(self.burst);
        state.at = now;
        state
    }

    /// When the next token is there: `None` if one is there now.
    pub(crate) fn next_token(&self) -> Option<Instant> {
        let state = self.refilled();
        (state.tokens < 1.0).then(|| {
            let wait = Duration::try_from_secs_f64((1.0 - state.tokens) / self.rate)
                .unwrap_or(MAX_WAIT)
                .min(MAX_WAIT);
            state.at + wait
        })
    }

    /// Takes a token, in debt if none is there: the next one then comes
    /// later.
    pub(crate) fn take(&self) {
        self.refilled().tokens -= 1.0;
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
        assert_eq!(bucket.next_token(), None);
        bucket.take();
        bucket.clone().take();
        let next = bucket.next_token().expect("clones share tokens: none left");
        assert_eq!(next - Instant::now(), Duration::from_millis(500));
        tokio::time::advance(Duration::from_millis(500)).await;
        assert_eq!(bucket.next_token(), None);
        bucket.take();
        // Taken in debt: the next token comes a whole interval later.
        bucket.take();
        assert_eq!(
            bucket.next_token().unwrap() - Instant::now(),
            Duration::from_secs(1)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_very_low_rate_waits_at_most_a_year() {
        let bucket = TokenBucket::new(1e-12, 1);
        bucket.take();
        let next = bucket.next_token().unwrap();
        assert_eq!(next - Instant::now(), MAX_WAIT);
    }
}
