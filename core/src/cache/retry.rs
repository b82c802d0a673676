//! A watch's failures: how each is logged, and when the watch tries again:
//! after kube's backoff (0.8 s doubling to 30 s, with jitter), or at once
//! when its cluster answers again after an outage, whatever it was waiting
//! out.

use std::time::Duration;

use futures::{Stream, StreamExt};

use kube::{
    Resource,
    runtime::{
        utils::Backoff,
        watcher::{self, DefaultBackoff, Event},
    },
};
use tokio::{sync::watch, time::Instant};

use super::state::FailureLog;
use crate::cluster_name::ClusterName;

/// How often, at most, a cluster answering again cuts a watch's wait
/// short and starts its backoff over: a cluster that answers and fails by
/// turns (a load balancer with one dead backend) leaves its watches to
/// their backoff in between, and a recovery that comes sooner is acted on
/// when this time is up (or the backoff ends, if that is sooner).
const AT_ONCE_AT_MOST_EVERY: Duration = Duration::from_secs(30);

/// The failures and retries of one watch.
pub(super) struct Retries {
    backoff: DefaultBackoff,
    /// Changes each time the cluster answers again after it did not.
    recoveries: Option<watch::Receiver<u64>>,
    /// When a recovery last cut a wait short.
    at_once: Option<Instant>,
    /// How its failures are logged.
    log: FailureLog,
}

impl Retries {
    /// For a watch of `K` (described by `dyntype`) in `cluster`, whose
    /// recoveries `recoveries` tells, if any is told; those before now are
    /// not waited for.
    pub(super) fn of<K: Resource>(
        cluster: ClusterName,
        dyntype: &K::DynamicType,
        recoveries: Option<watch::Receiver<u64>>,
    ) -> Self {
        let kind = K::kind(dyntype).into_owned();
        let log = FailureLog::new(cluster, kind, K::api_version(dyntype).into_owned());
        Self::new(log, recoveries)
    }

    fn new(log: FailureLog, mut recoveries: Option<watch::Receiver<u64>>) -> Self {
        if let Some(recoveries) = &mut recoveries {
            recoveries.borrow_and_update();
        }
        Self {
            backoff: DefaultBackoff::default(),
            recoveries,
            at_once: None,
            log,
        }
    }

    /// The watch worked: it delivered an event, or its retry ran a while.
    /// Its next failure is news, starts the backoff over, and waits for no
    /// recovery from before now.
    fn worked(&mut self) {
        self.log.recovered();
        self.backoff.reset();
        if let Some(recoveries) = &mut self.recoveries {
            recoveries.borrow_and_update();
        }
    }

    /// The watch's next event from `events`, and whether it says the watch
    /// works. Each failure before it is logged (see [`FailureLog::failed`]),
    /// its reason handed to `fail`, and waited out; the retry that failed
    /// had run a while if `resumed` says so.
    pub(super) async fn next<K>(
        &mut self,
        events: &mut (impl Stream<Item = watcher::Result<Event<K>>> + Unpin),
        resumed: impl Fn() -> bool,
        fail: impl Fn(&str),
    ) -> Option<(Event<K>, bool)> {
        loop {
            match events.next().await? {
                // kube's watcher's `Init` comes before each list is asked
                // for, and tells nothing yet.
                Ok(Event::Init) => return Some((Event::Init, false)),
                Ok(event) => {
                    self.worked();
                    return Some((event, true));
                }
                Err(error) => {
                    if resumed() {
                        self.worked();
                    }
                    fail(&self.log.failed(&error));
                    self.wait().await;
                }
            }
        }
    }

    /// Waits until the watch may try again after a failure: its backoff,
    /// cut short when the cluster answers again after an outage (then the
    /// backoff starts over), at most once every [`AT_ONCE_AT_MOST_EVERY`].
    /// A recovery counts if it came after the attempt that failed began.
    /// (Without a wait kube's watcher retries a failing cluster in a hot
    /// loop.)
    pub(super) async fn wait(&mut self) {
        let Some(delay) = self.backoff.next() else {
            // kube's default backoff never gives up.
            return;
        };
        let deadline = Instant::now() + delay;
        let recovered = match &mut self.recoveries {
            None => {
                tokio::time::sleep_until(deadline).await;
                false
            }
            Some(recoveries) => tokio::select! {
                () = tokio::time::sleep_until(deadline) => false,
                changed = recoveries.changed() => match changed {
                    Ok(()) => true,
                    // No more recoveries: the backoff alone.
                    Err(_) => {
                        self.recoveries = None;
                        tokio::time::sleep_until(deadline).await;
                        false
                    }
                },
            },
        };
        if recovered {
            let allowed = self
                .at_once
                .map_or_else(Instant::now, |at| at + AT_ONCE_AT_MOST_EVERY);
            if allowed < deadline {
                // Cut short: now, or once the last cut is far enough back.
                tokio::time::sleep_until(allowed).await;
                tracing::debug!(backoff = ?delay, "the cluster answers again: the watch retries now");
                self.at_once = Some(Instant::now());
                self.backoff.reset();
            } else {
                tokio::time::sleep_until(deadline).await;
            }
        }
        // The next attempt begins: only a recovery after it counts.
        if let Some(recoveries) = &mut self.recoveries {
            recoveries.borrow_and_update();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn retries(recoveries: Option<watch::Receiver<u64>>) -> Retries {
        let log = FailureLog::new("east".into(), "ConfigMap".into(), "v1".into());
        Retries::new(log, recoveries)
    }

    /// Fails `retries` `times` times, each wait waited out.
    async fn fail(retries: &mut Retries, times: usize) {
        for _ in 0..times {
            retries.wait().await;
        }
    }

    /// How long `retries`' next wait lasts, with no recovery during it.
    async fn next_wait(retries: &mut Retries) -> Duration {
        let began = Instant::now();
        retries.wait().await;
        began.elapsed()
    }

    /// How long `retries`' next wait lasts when the cluster answers again
    /// `after` into it.
    async fn wait_with_recovery(
        retries: Retries,
        tell: &watch::Sender<u64>,
        after: Duration,
    ) -> (Duration, Retries) {
        let began = Instant::now();
        let waiting = tokio::spawn(async move {
            let mut retries = retries;
            retries.wait().await;
            (began.elapsed(), retries)
        });
        tokio::time::sleep(after).await;
        tell.send_modify(|n| *n += 1);
        waiting.await.unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn a_retry_waits_out_its_backoff_until_the_cluster_answers_again() {
        let (tell, recoveries) = watch::channel(0_u64);
        let mut retries = retries(Some(recoveries));
        // Backoffs grow: the sixth is at least 0.8 s × 2⁵ less jitter.
        fail(&mut retries, 5).await;
        let (waited, mut retries) =
            wait_with_recovery(retries, &tell, Duration::from_millis(100)).await;
        assert!(waited < Duration::from_millis(200), "{waited:?}");

        // And it starts over: the next wait is the first backoff's (an
        // answer followed by `410 Gone` relists soon).
        let waited = next_wait(&mut retries).await;
        assert!(waited <= Duration::from_secs(2), "{waited:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_cluster_that_answers_and_fails_by_turns_cuts_a_wait_short_once_in_thirty_seconds() {
        let (tell, recoveries) = watch::channel(0_u64);
        let mut retries = retries(Some(recoveries));
        fail(&mut retries, 5).await;
        let (_, retries) = wait_with_recovery(retries, &tell, Duration::from_millis(100)).await;
        let began = Instant::now();
        let (mut retries, mut waits) = (retries, Vec::new());
        // It fails again and again, answering again each time.
        while began.elapsed() < Duration::from_secs(29) {
            let (waited, back) =
                wait_with_recovery(retries, &tell, Duration::from_millis(10)).await;
            waits.push(waited);
            retries = back;
        }
        // Its backoff, not the recoveries: a handful of retries.
        assert!(waits.len() <= 6, "{waits:?}");
        // Then the next recovery cuts the wait short again.
        let (waited, _) = wait_with_recovery(retries, &tell, Duration::from_millis(10)).await;
        assert!(waited <= Duration::from_secs(30), "{waited:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_recovery_while_the_watch_worked_is_not_waited_for() {
        let (tell, recoveries) = watch::channel(0_u64);
        let mut retries = retries(Some(recoveries));
        tell.send_modify(|n| *n += 1);
        retries.worked();
        fail(&mut retries, 5).await;
        let waited = next_wait(&mut retries).await;
        assert!(waited >= Duration::from_secs(10), "{waited:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_recovery_before_the_attempt_began_is_not_waited_for() {
        let (tell, recoveries) = watch::channel(0_u64);
        // Before the watch began.
        tell.send_modify(|n| *n += 1);
        let mut retries = retries(Some(recoveries));
        fail(&mut retries, 5).await;
        let waited = next_wait(&mut retries).await;
        assert!(waited >= Duration::from_secs(10), "{waited:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn an_event_starts_the_backoff_over() {
        let mut retries = retries(None);
        fail(&mut retries, 5).await;
        retries.worked();
        let waited = next_wait(&mut retries).await;
        assert!(waited <= Duration::from_secs(2), "{waited:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_cluster_gone_leaves_the_backoff_alone() {
        let (tell, recoveries) = watch::channel(0_u64);
        let mut retries = retries(Some(recoveries));
        drop(tell);
        let waited = next_wait(&mut retries).await;
        assert!(waited >= Duration::from_millis(400), "{waited:?}");
        let waited = next_wait(&mut retries).await;
        assert!(
            waited >= Duration::from_millis(800),
            "no hot loop: {waited:?}"
        );
    }
}
