//! When a failing watch tries again: after kube's backoff (0.8 s doubling
//! to 30 s, with jitter), or at once when its cluster answers again after
//! an outage, whatever it was waiting out.

use kube::runtime::{utils::Backoff, watcher::DefaultBackoff};
use tokio::sync::watch;

/// The retries of one watch.
pub(super) struct Retries {
    backoff: DefaultBackoff,
    /// Changes each time the cluster answers again after it did not.
    recoveries: Option<watch::Receiver<u64>>,
}

impl Retries {
    /// For a watch of the cluster whose recoveries `recoveries` tells, if
    /// any is told.
    pub(super) fn new(recoveries: Option<watch::Receiver<u64>>) -> Self {
        Self {
            backoff: DefaultBackoff::default(),
            recoveries,
        }
    }

    /// The watch works: its next failure starts the backoff over, and a
    /// recovery from before now is not waited for.
    pub(super) fn worked(&mut self) {
        self.backoff.reset();
        if let Some(recoveries) = &mut self.recoveries {
            recoveries.borrow_and_update();
        }
    }

    /// Waits until the watch may try again after a failure: its backoff,
    /// cut short when the cluster answers again (then the backoff starts
    /// over), or when it has answered again since the watch last worked.
    pub(super) async fn failed(&mut self) {
        let Some(delay) = self.backoff.next() else {
            // kube's default backoff never gives up.
            return;
        };
        let sleep = tokio::time::sleep(delay);
        let Some(recoveries) = &mut self.recoveries else {
            return sleep.await;
        };
        tokio::select! {
            () = sleep => {}
            changed = recoveries.changed() => match changed {
                Ok(()) => {
                    tracing::debug!(backoff = ?delay, "the cluster answers again: the watch retries at once");
                    self.backoff.reset();
                }
                // No more recoveries: the backoff alone.
                Err(_) => {
                    self.recoveries = None;
                    tokio::time::sleep(delay).await;
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::time::Instant;

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

        // And it starts over: the next wait is the first backoff's.
        let began = Instant::now();
        retries.failed().await;
        assert!(
            began.elapsed() <= Duration::from_secs(2),
            "{:?}",
            began.elapsed()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_recovery_before_the_watch_last_worked_is_not_waited_for() {
        let (tell, recoveries) = watch::channel(0_u64);
        let mut retries = Retries::new(Some(recoveries));
        tell.send_modify(|n| *n += 1);
        retries.worked();
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
