use std::{error::Error, time::Duration};

use tokio::time::Sleep;
use tower::{
    BoxError,
    retry::{
        Policy,
        backoff::{Backoff, ExponentialBackoff, ExponentialBackoffMaker, MakeBackoff},
    },
    util::rng::HasherRng,
};

/// Retries transient API errors; see the [module docs](super).
#[derive(Debug)]
pub struct TransientErrors {
    retries_left: u32,
    min: Duration,
    max: Duration,
    backoff: ExponentialBackoff<HasherRng>,
}

impl Clone for TransientErrors {
    /// tower's `Retry` gives each request a clone of the policy. A clone gets
    /// a freshly seeded backoff, so that reconciles failing together do not
    /// retry in lockstep.
    fn clone(&self) -> Self {
        Self {
            retries_left: self.retries_left,
            min: self.min,
            max: self.max,
            backoff: backoff(self.min, self.max),
        }
    }
}

fn backoff(min: Duration, max: Duration) -> ExponentialBackoff<HasherRng> {
    // Each `HasherRng::default()` draws new keys, so each sequence differs.
    ExponentialBackoffMaker::new(min, max, 0.5, HasherRng::default())
        .expect("min <= max and max > 0")
        .make_backoff()
}

impl Default for TransientErrors {
    /// Three retries, backing off from 50 ms to 2 s with jitter.
    fn default() -> Self {
        Self::new(3)
    }
}

impl TransientErrors {
    /// At most `retries` retries per reconcile, backing off from 50 ms
    /// (doubling, up to 2 s, with jitter).
    pub fn new(retries: u32) -> Self {
        Self::with_backoff(retries, Duration::from_millis(50), Duration::from_secs(2))
    }

    /// At most `retries` retries, backing off from `min` doubling to `max`.
    ///
    /// # Panics
    /// If `min` exceeds `max` or `max` is zero.
    pub fn with_backoff(retries: u32, min: Duration, max: Duration) -> Self {
        Self {
            retries_left: retries,
            min,
            max,
            backoff: backoff(min, max),
        }
    }

    /// How long to wait before retrying after `error`, or `None` if it is
    /// not worth retrying or no retries are left.
    fn wait(&mut self, error: &(dyn Error + 'static)) -> Option<Sleep> {
        if self.retries_left == 0 {
            return None;
        }
        let wait = match classify(error)? {
            // A server that asks for a longer pause than this policy's
            // longest gets it from the queue's backoff instead.
            Retry::After(delay) if delay > self.max => return None,
            Retry::After(delay) => tokio::time::sleep(delay),
            Retry::WithBackoff => self.backoff.next_backoff(),
        };
        self.retries_left -= 1;
        Some(wait)
    }
}

enum Retry {
    After(Duration),
    WithBackoff,
}

/// Finds a kube error or a timeout anywhere in the error's chain.
fn classify(error: &(dyn Error + 'static)) -> Option<Retry> {
    let mut current = Some(error);
    while let Some(error) = current {
        if let Some(kube) = error.downcast_ref::<kube::Error>() {
            return classify_kube(kube);
        }
        if error.is::<tower::timeout::error::Elapsed>() || error.is::<tokio::time::error::Elapsed>()
        {
            return Some(Retry::WithBackoff);
        }
        current = error.source();
    }
    None
}

fn classify_kube(error: &kube::Error) -> Option<Retry> {
    match error {
        kube::Error::Api(status) => match status.code {
            // A conflict clears on the next read; an object that already
            // exists does not go away by retrying.
            409 if status.reason != "AlreadyExists" => Some(Retry::WithBackoff),
            429 => Some(
                status
                    .details
                    .as_ref()
                    .map(|d| d.retry_after_seconds)
                    .filter(|&s| s > 0)
                    .map_or(Retry::WithBackoff, |s| {
                        Retry::After(Duration::from_secs(s.into()))
                    }),
            ),
            501 => None,
            500..=599 => Some(Retry::WithBackoff),
            _ => None,
        },
        kube::Error::HyperError(_) | kube::Error::Service(_) | kube::Error::ReadEvents(_) => {
            Some(Retry::WithBackoff)
        }
        _ => None,
    }
}

impl<Req: Clone, Res> Policy<Req, Res, BoxError> for TransientErrors {
    type Future = Sleep;

    fn retry(&mut self, _: &mut Req, result: &mut Result<Res, BoxError>) -> Option<Sleep> {
        self.wait(&**result.as_ref().err()?)
    }

    fn clone_request(&mut self, request: &Req) -> Option<Req> {
        Some(request.clone())
    }
}

impl<Req: Clone, Res> Policy<Req, Res, kube::Error> for TransientErrors {
    type Future = Sleep;

    fn retry(&mut self, _: &mut Req, result: &mut Result<Res, kube::Error>) -> Option<Sleep> {
        self.wait(result.as_ref().err()?)
    }

    fn clone_request(&mut self, request: &Req) -> Option<Req> {
        Some(request.clone())
    }
}
