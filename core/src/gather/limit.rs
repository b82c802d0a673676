//! At most one write per parent per interval.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio::time::Instant;

use crate::{panic::lock, request::McRequest};

/// When each parent was last written, for as long as that holds a write
/// back: a parent is forgotten once its interval has passed, so that what
/// is held is bounded by the parents written in the last interval, deleted
/// ones included.
#[derive(Debug, Clone)]
pub(super) struct WriteLimit {
    interval: Duration,
    written: Arc<Mutex<HashMap<McRequest, Instant>>>,
}

impl WriteLimit {
    pub(super) fn new(interval: Duration) -> Self {
        Self {
            interval,
            written: Arc::default(),
        }
    }

    pub(super) fn interval(&self) -> Duration {
        self.interval
    }

    /// Takes `parent`'s slot for a write now, so that no other write of it
    /// starts within the interval; else how long until one may.
    /// [`release`](Self::release) gives the slot back if the write fails.
    pub(super) fn reserve(&self, parent: &McRequest) -> Result<(), Duration> {
        let now = Instant::now();
        let mut written = lock(&self.written);
        written.retain(|_, at| now.duration_since(*at) < self.interval);
        if let Some(at) = written.get(parent) {
            return Err(self.interval - now.duration_since(*at));
        }
        if !self.interval.is_zero() {
            written.insert(parent.clone(), now);
        }
        Ok(())
    }

    /// The write `reserve` let through failed: `parent` may be written again
    /// at once.
    pub(super) fn release(&self, parent: &McRequest) {
        lock(&self.written).remove(parent);
    }

    /// `parent` is gone.
    pub(super) fn forget(&self, parent: &McRequest) {
        lock(&self.written).remove(parent);
    }

    /// How many parents are held.
    pub(super) fn len(&self) -> usize {
        lock(&self.written).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_parent_is_written_at_most_once_per_interval_and_then_forgotten() {
        let limit = WriteLimit::new(Duration::from_secs(1));
        let (a, b) = (
            McRequest::new("", None::<String>, "a"),
            McRequest::new("", None::<String>, "b"),
        );
        assert_eq!(limit.reserve(&a), Ok(()));
        tokio::time::advance(Duration::from_millis(300)).await;
        assert_eq!(limit.reserve(&a), Err(Duration::from_millis(700)));
        assert_eq!(limit.reserve(&b), Ok(()));
        tokio::time::advance(Duration::from_millis(700)).await;
        assert_eq!(limit.len(), 2);
        tokio::time::advance(Duration::from_millis(300)).await;
        assert_eq!(limit.reserve(&b), Ok(()));
        assert_eq!(limit.len(), 1, "a, whose interval passed, is forgotten");
        limit.forget(&b);
        assert_eq!(limit.len(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn two_writes_that_check_at_once_do_not_both_go_and_a_failed_one_gives_its_slot_back() {
        let limit = WriteLimit::new(Duration::from_secs(1));
        let a = McRequest::new("", None::<String>, "a");
        // Two reconciles of one parent, each checking before the other
        // writes: only the first goes.
        assert_eq!(limit.reserve(&a), Ok(()));
        assert_eq!(limit.reserve(&a), Err(Duration::from_secs(1)));
        // Its apply failed: the next may write at once.
        limit.release(&a);
        assert_eq!(limit.reserve(&a), Ok(()));
        // No limit: nothing is held.
        let none = WriteLimit::new(Duration::ZERO);
        assert_eq!(none.reserve(&a), Ok(()));
        assert_eq!(none.reserve(&a), Ok(()));
        assert_eq!(none.len(), 0);
    }
}
