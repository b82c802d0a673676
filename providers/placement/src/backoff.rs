//! The backoff of the watches of the decisions.

use std::time::Duration;

use kube::runtime::{utils::Backoff, watcher::DefaultBackoff};

/// kube's [`DefaultBackoff`], reset only once a watch has yielded
/// something past its [`Init`](kube::runtime::watcher::Event::Init).
///
/// [`StreamBackoff`](kube::runtime::utils::StreamBackoff) resets its
/// backoff on every `Ok` item, and the watcher yields `Ok(Init)` before
/// each list request: a list that always fails (a 403, say) would bring the
/// delay back to its first step before every retry, and the hub would be
/// listed every 800 ms for ever. So a reset takes effect only when a second
/// comes without a failure between them: `Init` then an object or
/// `InitDone` resets it; `Init` then an error does not.
pub(crate) struct WatchBackoff<B = DefaultBackoff> {
    inner: B,
    /// Whether a reset came since the last failure.
    reset: bool,
}

impl WatchBackoff {
    pub(crate) fn new() -> Self {
        Self::with(DefaultBackoff::default())
    }
}

impl<B> WatchBackoff<B> {
    fn with(inner: B) -> Self {
        Self {
            inner,
            reset: false,
        }
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
    use kube::runtime::{
        utils::StreamBackoff,
        watcher::{Error, Event},
    };

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
}
