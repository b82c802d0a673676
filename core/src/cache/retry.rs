//! When a failing watch tries again: after kube's backoff (0.8 s doubling
//! to 30 s, with jitter), or at once when its cluster answers again after
//! an outage, whatever it was waiting out.

use std::time::Duration;

use kube::runtime::{utils::Backoff, watcher::DefaultBackoff};
use tokio::{sync::watch, time::Instant};

/// How often, at most, a cluster answering again cuts a watch's wait
/// short: a cluster that answers and fails by turns (a load balancer with
/// one dead backend) leaves its watches to their backoff in between.
const AT_ONCE_AT_MOST_EVERY: Duration = Duration::from_secs(30);

/// The retries of one watch.
pub(super) struct Retries {
    backoff: DefaultBackoff,
    /// Changes each time the cluster answers again after it did not.
    recoveries: Option<watch::Receiver<u64>>,
    /// When a recovery last cut a wait short.
    at_once: Option<Instant>,
}

impl Retries {
    /// For a watch of the cluster whose recoveries `recoveries` tells, if
    /// any is told; those before now are not waited for.
    pub(super) fn new(mut recoveries: Option<watch::Receiver<u64>>) -> Self {
        if let Some(recoveries) = &mut recoveries {
            recoveries.borrow_and_update();
        }
        Self {
            backoff: DefaultBackoff::default(),
            recoveries,
            at_once: None,
        }
    }

    /// The watch delivered an event: its next failure starts the backoff
    /// over. (kube's watcher's `Init`, which comes before each list is
    /// asked for, tells nothing yet: not for it.)
    pub(super) fn worked(&mut self) {
        self.backoff.reset();
    }

    /// Waits until the watch may try again after a failure: its backoff,
    /// cut short when the cluster answers again after an outage (at most
    /// once every [`AT_ONCE_AT_MOST_EVERY`]). A recovery counts if it came
    /// after the attempt that failed began.
    pub(super) async fn failed(&mut self) {
        let Some(delay) = self.backoff.next() else {
            // kube's default backoff never gives up.
            return;
        };
        let sleep = tokio::time::sleep(delay);
        let may_cut = self
            .at_once
            .is_none_or(|at| at.elapsed() >= AT_ONCE_AT_MOST_EVERY);
        match &mut self.recoveries {
            Some(recoveries) if may_cut => {
                tokio::select! {
                    () = sleep => {}
                    changed = recoveries.changed() => match changed {
                        Ok(()) => {
                            tracing::debug!(backoff = ?delay, "the cluster answers again: the watch retries at once");
                            self.at_once = Some(Instant::now());
                        }
                        // No more recoveries: the backoff alone.
                        Err(_) => {
                            self.recoveries = None;
                            tokio::time::sleep(delay).await;
                        }
                    },
                }
            }
            _ => sleep.await,
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

    #[tokio::test(start_paused = true)]
    async fn a_retry_waits_out_its_backoff_until_the_cluster_answers_again() {
        let (tell, recoveries) = watch::channel(0_u64);
        let mut retries = Retries::new(Some(recoveries));
        // Backoffs grow: the sixth is at least 0.8 s × 2⁵ less jitter.
        for _ in 0..5 {
            retries.failed().await;
        }
        let began = Instant::now();
        let waiting = tokio::spawn(async move {
            retries.failed().await;
            retries
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!waiting.is_finished(), "still backing off");
        tell.send_modify(|n| *n += 1);
        let mut retries = waiting.await.unwrap();
        assert!(
            began.elapsed() < Duration::from_millis(200),
            "{:?}",
            began.elapsed()
        );

        // The backoff goes on growing, and a cluster that answers and
        // fails by turns does not cut the next waits short.
        let waiting = tokio::spawn(async move {
            let began = Instant::now();
            retries.failed().await;
            began.elapsed()
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        tell.send_modify(|n| *n += 1);
        let waited = waiting.await.unwrap();
        assert!(waited >= Duration::from_secs(25), "{waited:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_recovery_before_the_attempt_began_is_not_waited_for() {
        let (tell, recoveries) = watch::channel(0_u64);
        // Before the watch began.
        tell.send_modify(|n| *n += 1);
        let mut retries = Retries::new(Some(recoveries));
        for _ in 0..5 {
            retries.failed().await;
        }
        let began = Instant::now();
        retries.failed().await;
        assert!(
            began.elapsed() >= Duration::from_secs(10),
            "{:?}",
            began.elapsed()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_event_starts_the_backoff_over() {
        let mut retries = Retries::new(None);
        for _ in 0..5 {
            retries.failed().await;
        }
        retries.worked();
        let began = Instant::now();
        retries.failed().await;
        assert!(
            began.elapsed() <= Duration::from_secs(2),
            "{:?}",
            began.elapsed()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_cluster_gone_leaves_the_backoff_alone() {
        let (tell, recoveries) = watch::channel(0_u64);
        let mut retries = Retries::new(Some(recoveries));
        drop(tell);
        let began = Instant::now();
        retries.failed().await;
        assert!(
            began.elapsed() >= Duration::from_millis(400),
            "{:?}",
            began.elapsed()
        );
        let began = Instant::now();
        retries.failed().await;
        assert!(
            began.elapsed() >= Duration::from_millis(800),
            "no hot loop: {:?}",
            began.elapsed()
        );
    }
}
