//! The backoff of a provider's watches.

use std::{fmt, time::Duration};

use futures::TryStream;
use kube::runtime::{
    utils::{Backoff, StreamBackoff},
    watcher::DefaultBackoff,
};

/// kube's [`DefaultBackoff`] (800 ms, doubling up to 30 s), reset only once a
/// watch has yielded something past its
/// [`Init`](kube::runtime::watcher::Event::Init).
///
/// [`StreamBackoff`] resets its backoff on every `Ok` item, and the watcher
/// yields `Ok(Init)` before each list request: a list that always fails (a
/// 403, say) would bring the delay back to its first step before every retry,
/// and the API server would be listed every 800 ms for ever. So a reset takes
/// effect only when a second comes without a failure between them: `Init`
/// then an object or `InitDone` resets it; `Init` then an error does not.
///
/// [`backoff`] applies it to a watch, in place of kube's
/// [`default_backoff`](kube::runtime::WatchStreamExt::default_backoff):
///
/// ```no_run
/// # fn example(client: kube::Client) {
/// use k8s_openapi::api::core::v1::Secret;
/// use kube::{Api, runtime::watcher};
/// use kube_multicluster::provider;
///
/// let secrets = watcher(Api::<Secret>::all(client), watcher::Config::default());
/// let secrets = provider::backoff(secrets);
/// # }
/// ```
///
/// or, around another [`Backoff`], to a stream with kube's
/// [`backoff`](kube::runtime::WatchStreamExt::backoff):
///
/// ```no_run
/// # fn example(client: kube::Client) {
/// # use k8s_openapi::api::core::v1::Secret;
/// # use kube::{Api, runtime::watcher};
/// use kube::runtime::WatchStreamExt;
/// use kube_multicluster::provider::WatchBackoff;
///
/// let secrets = watcher(Api::<Secret>::all(client), watcher::Config::default())
///     .backoff(WatchBackoff::new());
/// # }
/// ```
pub struct WatchBackoff<B = DefaultBackoff> {
    inner: B,
    /// Whether a reset came since the last failure.
    reset: bool,
}

/// Applies a [`WatchBackoff`] to `watch`, a stream of kube's
/// [`watcher`](kube::runtime::watcher()): its errors are retried after
/// kube's default delays, which start over only once a list brings
/// something back.
pub fn backoff<S: TryStream>(watch: S) -> StreamBackoff<S, WatchBackoff> {
    StreamBackoff::new(watch, WatchBackoff::new())
}

impl WatchBackoff {
    /// Around kube's [`DefaultBackoff`].
    pub fn new() -> Self {
        Self::with(DefaultBackoff::default())
    }
}

impl Default for WatchBackoff {
    fn default() -> Self {
        Self::new()
    }
}

impl<B> WatchBackoff<B> {
    /// Around `inner`, which gives the delays.
    pub fn with(inner: B) -> Self {
        Self {
            inner,
            reset: false,
        }
    }
}

impl<B> fmt::Debug for WatchBackoff<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WatchBackoff")
            .field("reset", &self.reset)
            .finish_non_exhaustive()
    }
}

impl<B: Backoff> Iterator for WatchBackoff<B> {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        self.reset = false;
        self.inner.next()
    }
}

impl<B: Backoff> Backoff for WatchBackoff<B> {
    fn reset(&mut self) {
        if self.reset {
            self.inner.reset();
        }
        self.reset = true;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use futures::{StreamExt, stream};
    use kube::runtime::watcher::{Error, Event};

    use super::*;

    /// Steps of 1 ms, 2 ms, 3 ms, ..., back to 1 ms when reset; records
    /// the delays it hands out.
    #[derive(Clone, Default)]
    struct Steps {
        step: u64,
        delays: Arc<Mutex<Vec<u64>>>,
    }

    impl Iterator for Steps {
        type Item = Duration;

        fn next(&mut self) -> Option<Duration> {
            self.step += 1;
            self.delays.lock().unwrap().push(self.step);
            Some(Duration::from_millis(self.step))
        }
    }

    impl Backoff for Steps {
        fn reset(&mut self) {
            self.step = 0;
        }
    }

    async fn delays(events: Vec<Result<Event<()>, Error>>) -> Vec<u64> {
        let steps = Steps::default();
        let delays = steps.delays.clone();
        let backoff = StreamBackoff::new(stream::iter(events), WatchBackoff::with(steps));
        backoff.collect::<Vec<_>>().await;
        delays.lock().unwrap().clone()
    }

    fn failed() -> Result<Event<()>, Error> {
        Err(Error::NoResourceVersion)
    }

    #[tokio::test]
    async fn a_list_that_keeps_failing_backs_off_further_each_time() {
        let events = (0..4).flat_map(|_| [Ok(Event::Init), failed()]).collect();
        assert_eq!(delays(events).await, [1, 2, 3, 4]);
    }

    #[tokio::test]
    async fn a_list_that_passes_resets_the_backoff() {
        let delays = delays(vec![
            Ok(Event::Init),
            failed(),
            Ok(Event::Init),
            failed(),
            Ok(Event::Init),
            Ok(Event::InitDone),
            failed(),
            Ok(Event::Init),
            Ok(Event::InitApply(())),
            Ok(Event::InitDone),
            Ok(Event::Apply(())),
            failed(),
        ])
        .await;
        assert_eq!(delays, [1, 2, 1, 1]);
    }

    #[tokio::test(start_paused = true)]
    async fn backoff_waits_kubes_default_delays_while_a_list_keeps_failing() {
        let events = (0..4).flat_map(|_| [Ok(Event::<()>::Init), failed()]);
        let start = tokio::time::Instant::now();
        backoff(stream::iter(events)).collect::<Vec<_>>().await;
        // 800 ms, 1.6 s, 3.2 s and 6.4 s, each with up to as much again of
        // jitter; reset at each `Init`, it would be at most 4 × 1.6 s.
        let waited = start.elapsed();
        assert!(waited >= Duration::from_secs(12), "waited {waited:?}");
    }
}
