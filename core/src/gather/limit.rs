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

    /// `Ok` if `parent` may be written now; else how long until it may.
    pub(super) fn check(&self, parent: &McRequest) -> Result<(), Duration> {
        let now = Instant::now();
        let mut written = lock(&self.written);
        written.retain(|_, at| now.duration_since(*at) < self.interval);
        match written.get(parent) {
            Some(at) => Err(self.interval - now.duration_since(*at)),
            None => Ok(()),
        }
    }

    /// `parent` was written now.
    pub(super) fn wrote(&self, parent: &McRequest) {
        if !self.interval.is_zero() {
            lock(&self.written).insert(parent.clone(), Instant::now());
        }
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
        assert_eq!(limit.check(&a), Ok(()));
        limit.wrote(&a);
        tokio::time::advance(Duration::from_millis(300)).await;
        assert_eq!(limit.check(&a), Err(Duration::from_millis(700)));
        assert_eq!(limit.check(&b), Ok(()));
        limit.wrote(&b);
        tokio::time::advance(Duration::from_millis(700)).await;
        assert_eq!(limit.check(&a), Ok(()));
        assert_eq!(limit.len(), 1, "a, whose interval passed, is forgotten");
        limit.forget(&b);
        assert_eq!(limit.len(), 0);
    }
}
