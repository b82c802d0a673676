//! The entries a parent's status holds of clusters not engaged yet, kept
//! for a while after a [`Gather`](super::Gather) starts.

use std::{
    collections::HashSet,
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio::time::Instant;

use crate::panic::lock;

/// After a controller starts, its parents are reconciled before the
/// provider has engaged the clusters again: an entry of a cluster not read
/// yet is kept (marked stale) for the grace, unless the cluster was read
/// since the start and then left. The names read are held only while the
/// grace lasts, so they are bounded by the clusters engaged in that time.
#[derive(Debug, Clone)]
pub(super) struct StartupGrace {
    grace: Duration,
    started: Instant,
    /// The entries' names of the clusters read since the start.
    seen: Arc<Mutex<HashSet<String>>>,
}

impl StartupGrace {
    pub(super) fn new(grace: Duration) -> Self {
        Self {
            grace,
            started: Instant::now(),
            seen: Arc::default(),
        }
    }

    pub(super) fn grace(&self) -> Duration {
        self.grace
    }

    pub(super) fn is_over(&self) -> bool {
        self.started.elapsed() >= self.grace
    }

    /// The clusters of the entries `read` are read now.
    pub(super) fn read<'a>(&self, read: impl IntoIterator<Item = &'a str>) {
        let mut seen = lock(&self.seen);
        if self.is_over() {
            // Nothing is kept any more: what was seen no longer matters.
            *seen = HashSet::new();
        } else {
            seen.extend(read.into_iter().map(str::to_owned));
        }
    }

    /// Whether the entry `name`, of a cluster not read now, is kept: within
    /// the grace, if its cluster has not been read since the start (once
    /// read, a cluster that is no longer has left the fleet).
    pub(super) fn keeps(&self, name: &str) -> bool {
        !self.is_over() && !lock(&self.seen).contains(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn an_entry_is_kept_within_the_grace_unless_its_cluster_was_read_and_left() {
        let grace = StartupGrace::new(Duration::from_secs(60));
        assert!(grace.keeps("member-1"), "not engaged yet");
        grace.read(["member-1"]);
        assert!(!grace.keeps("member-1"), "read, then gone: it left");
        assert!(grace.keeps("member-2"));
        tokio::time::advance(Duration::from_secs(60)).await;
        assert!(!grace.keeps("member-2"), "the grace is over");
        grace.read(["member-2"]);
        assert!(lock(&grace.seen).is_empty(), "nothing held after the grace");
    }
}
