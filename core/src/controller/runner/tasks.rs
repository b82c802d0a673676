//! The reconciles of a running controller as tasks: each key's current run,
//! cancelled when its cluster leaves, and how each run ended.

use std::{
    collections::HashMap,
    future::Future,
    task::{Context, Poll, ready},
};

use tokio::task::{AbortHandle, Id, JoinSet};
use tower::BoxError;

use crate::{action::Action, cluster_name::ClusterName, panic::panic_message, request::McRequest};

/// How a run ended.
pub(super) enum Ran {
    /// The service answered.
    Answered(Result<Action, BoxError>),
    /// Its cluster had left before it started, or it was cancelled since.
    Interrupted,
    /// It panicked, with this message.
    Panicked(String),
}

/// A run that ended.
pub(super) struct Ended {
    pub(super) key: McRequest,
    pub(super) ran: Ran,
    /// Whether it was the key's current run; an older one's end does not
    /// count for the key.
    pub(super) current: bool,
}

/// The reconciles running now.
#[derive(Default)]
pub(super) struct Tasks {
    running: JoinSet<(McRequest, Ran)>,
    keys: HashMap<Id, McRequest>,
    aborts: HashMap<McRequest, AbortHandle>,
}

impl Tasks {
    pub(super) fn len(&self) -> usize {
        self.running.len()
    }

    /// Runs `run` as `key`'s current run.
    pub(super) fn spawn(
        &mut self,
        key: McRequest,
        run: impl Future<Output = (McRequest, Ran)> + Send + 'static,
    ) {
        let abort = self.running.spawn(run);
        self.keys.insert(abort.id(), key.clone());
        self.aborts.insert(key, abort);
    }

    /// Cancels every run in `cluster`.
    pub(super) fn cancel(&self, cluster: &ClusterName) {
        for (key, abort) in &self.aborts {
            if key.cluster == *cluster {
                abort.abort();
            }
        }
    }

    pub(super) fn abort_all(&mut self) {
        self.running.abort_all();
    }

    /// The next run that ended.
    pub(super) fn poll_ended(&mut self, cx: &mut Context<'_>) -> Poll<Option<Ended>> {
        while let Some(joined) = ready!(self.running.poll_join_next_with_id(cx)) {
            let (id, key, ran) = match joined {
                Ok((id, (key, ran))) => (id, key, ran),
                Err(error) => {
                    let id = error.id();
                    let Some(key) = self.keys.get(&id).cloned() else {
                        continue;
                    };
                    let ran = match error.try_into_panic() {
                        Ok(panic) => Ran::Panicked(panic_message(panic.as_ref())),
                        // Cancelled: its cluster left or was replaced.
                        Err(_) => Ran::Interrupted,
                    };
                    (id, key, ran)
                }
            };
            self.keys.remove(&id);
            let current = self.aborts.get(&key).is_some_and(|a| a.id() == id);
            if current {
                self.aborts.remove(&key);
            }
            return Poll::Ready(Some(Ended { key, ran, current }));
        }
        Poll::Ready(None)
    }
}
