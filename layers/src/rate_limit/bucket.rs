use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio::time::Instant;

/// The longest a request waits for a token, however low the rate: tokio's
/// timers reach about two years.
const MAX_WAIT: Duration = Duration::from_secs(365 * 24 * 60 * 60);

/// A token bucket: `rate` tokens per second, at most `burst` saved up.
/// Clones share the same tokens.
///
/// ```
/// use kube_fleet_layers::rate_limit::TokenBucket;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let bucket = TokenBucket::new(2.0, 2);
/// assert!(bucket.reserve().is_zero());
/// assert!(bucket.reserve().is_zero());
/// // The third waits for the next token: half a second at 2 per second.
/// assert_eq!(bucket.clone().reserve().as_millis(), 500);
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct TokenBucket {
    state: Arc<Mutex<State>>,
    rate: f64,
    burst: f64,
}

#[derive(Debug)]
struct State {
    /// Tokens available at `at`; negative when later requests have already
    /// reserved tokens that are yet to come.
    tokens: f64,
    at: Instant,
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

    /// Takes a token and says how long to wait before using it: zero if one
    /// was available. Reservations are served in order; a wait is at most a
    /// year.
    pub fn reserve(&self) -> Duration {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        let refilled = (now - state.at).as_secs_f64() * self.rate;
        state.tokens = (state.tokens + refilled).min(self.burst) - 1.0;
        state.at = now;
        if state.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::try_from_secs_f64(-state.tokens / self.rate)
                .unwrap_or(MAX_WAIT)
                .min(MAX_WAIT)
        }
    }

    /// Returns a reserved token that was not used (its request was cancelled).
    pub(crate) fn give_back(&self) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.tokens = (state.tokens + 1.0).min(self.burst);
    }
}
