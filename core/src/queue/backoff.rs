use std::{
    hash::{BuildHasher, RandomState},
    time::Duration,
};

/// How a failing key is retried: exponentially, per key, with jitter.
///
/// The `n`-th consecutive failure of a key delays its next run by
/// `base * 2^(n-1)`, capped at `max`, then stretched by a random fraction of
/// up to `jitter` (0.1: up to 10% longer), so that keys failing together do
/// not retry in lockstep. A success forgets the failures. The default, as
/// client-go's, starts at 5 ms and stops doubling at 1000 s, with 10% jitter.
///
/// ```
/// use std::time::Duration;
/// use kube_multicluster::queue::Backoff;
///
/// let backoff = Backoff::default();
/// assert_eq!(backoff.delay(1), Duration::from_millis(5));
/// assert_eq!(backoff.delay(3), Duration::from_millis(20));
/// assert_eq!(backoff.delay(40), Duration::from_secs(1000));
/// // What a retry waits: the delay, and up to `jitter` more.
/// let wait = backoff.jittered(3, 0.5);
/// assert!(wait >= Duration::from_millis(20) && wait <= Duration::from_millis(22));
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    /// Delay after the first failure.
    pub base: Duration,
    /// The longest delay before jitter.
    pub max: Duration,
    /// The largest random stretch, as a fraction of the delay (0 for none).
    pub jitter: f64,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            base: Duration::from_millis(5),
            max: Duration::from_secs(1000),
            jitter: 0.1,
        }
    }
}

impl Backoff {
    /// The delay after `failures` consecutive failures (at least one),
    /// before jitter.
    pub fn delay(&self, failures: u32) -> Duration {
        let doublings = failures.saturating_sub(1).min(63);
        self.base
            .checked_mul(1u32.checked_shl(doublings).unwrap_or(u32::MAX))
            .map_or(self.max, |delay| delay.min(self.max))
    }

    /// The delay after `failures` failures, stretched by `random` (in 0..=1)
    /// times the jitter.
    pub fn jittered(&self, failures: u32, random: f64) -> Duration {
        let delay = self.delay(failures);
        // A jitter that is not a number counts as none, rather than panicking.
        let jitter = if self.jitter.is_finite() {
            self.jitter.clamp(0.0, 1.0)
        } else {
            0.0
        };
        let stretch = jitter * random.clamp(0.0, 1.0);
        delay.saturating_add(delay.mul_f64(stretch))
    }
}

/// Numbers in 0..1 for jitter, from the standard library's randomly seeded
/// hasher: enough to spread retries, no generator crate needed.
#[derive(Debug)]
pub(crate) struct Jitter {
    seed: RandomState,
    counter: u64,
}

impl Jitter {
    pub(crate) fn new() -> Self {
        Self {
            seed: RandomState::new(),
            counter: 0,
        }
    }

    pub(crate) fn next(&mut self) -> f64 {
        self.counter = self.counter.wrapping_add(1);
        let bits = self.seed.hash_one(self.counter) >> 11;
        bits as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_caps() {
        let backoff = Backoff::default();
        assert_eq!(backoff.delay(0), Duration::from_millis(5));
        assert_eq!(backoff.delay(2), Duration::from_millis(10));
        assert_eq!(
            backoff.delay(18),
            Duration::from_millis(5 << 17).min(backoff.max)
        );
        assert_eq!(backoff.delay(u32::MAX), Duration::from_secs(1000));
    }

    #[test]
    fn jitter_spreads_retries_within_the_stated_fraction() {
        let backoff = Backoff {
            jitter: 0.5,
            ..Backoff::default()
        };
        let mut jitter = Jitter::new();
        let waits: Vec<_> = (0..1000)
            .map(|_| backoff.jittered(4, jitter.next()))
            .collect();
        let (low, high) = (Duration::from_millis(40), Duration::from_millis(60));
        assert!(waits.iter().all(|w| *w >= low && *w <= high), "{waits:?}");
        let distinct: std::collections::HashSet<_> = waits.iter().collect();
        assert!(distinct.len() > 900, "retries are spread, not in lockstep");
        let none = Backoff {
            jitter: 0.0,
            ..Backoff::default()
        };
        assert_eq!(none.jittered(4, 0.99), low);
    }
}
