//! The reconciles of a running controller: started for admitted keys while
//! the service is ready, supervised as tasks, cancelled when their cluster
//! leaves, and their outcomes handed back to the queue.

use std::task::{Context, Poll};

use tokio::task::{Id, JoinError};
use tower::{BoxError, Service};

use super::{Runner, catch_up::awaiting};
use crate::{
    action::Action,
    cache::Watchable,
    client::{Reconciling, reconciling},
    controller::Error,
    object_request::ObjectRequest,
    panic::{contain, panic_message},
    queue::Outcome,
    reason::ReconcileReason,
    request::McRequest,
};

/// A reconcile's key and its result; `None` if its cluster had left (or was
/// replaced) before it started.
pub(super) type Finished = (McRequest, Option<Result<Action, BoxError>>);

impl<K: Watchable> Runner<K> {
    pub(super) fn poll_finished(&mut self, cx: &mut Context<'_>) -> bool {
        let mut progress = false;
        while let Poll::Ready(Some(joined)) = self.running.poll_join_next_with_id(cx) {
            self.finished(joined);
            progress = true;
        }
        progress
    }

    /// Starts a reconcile for each key the queue admits while the service
    /// is ready. A panic in the service's `poll_ready` or `call` fails the
    /// key at hand, which is retried after its backoff.
    pub(super) fn dispatch<S>(
        &mut self,
        cx: &mut Context<'_>,
        service: &mut S,
    ) -> Result<bool, Error>
    where
        S: Service<ObjectRequest<K>, Response = Action>,
        S::Future: Send + 'static,
        S::Error: Into<BoxError>,
    {
        let mut progress = false;
        let writer = self.writer();
        while let Poll::Ready(next) = self.queue.poll_pop_ready(cx) {
            let awaited = awaiting(&self.engaged, writer.as_ref(), next.cluster());
            if !awaited.is_empty() {
                // Its watches (or those its keys' reconciles wrote to)
                // have not shown what the controller wrote: its keys wait,
                // and other clusters' go on.
                let paused = next.cluster().clone();
                next.pause();
                self.catch_up(&paused, awaited);
                progress = true;
                continue;
            }
            match contain(|| service.poll_ready(cx)) {
                // The key stays first in line.
                Ok(Poll::Pending) => break,
                Ok(Poll::Ready(Err(error))) => {
                    return Err(Error::Service {
                        controller: self.name.to_string(),
                        source: error.into(),
                    });
                }
                Ok(Poll::Ready(Ok(()))) => {
                    let (key, reason) = next.pop();
                    self.start(service, key, reason);
                }
                Err(message) => {
                    let (key, _) = next.pop();
                    self.panicked(&key, "poll_ready", &message);
                }
            }
            progress = true;
        }
        Ok(progress)
    }

    /// Calls the ready service with `key`, just taken out of the queue.
    fn start<S>(&mut self, service: &mut S, key: McRequest, reason: ReconcileReason)
    where
        S: Service<ObjectRequest<K>, Response = Action>,
        S::Future: Send + 'static,
        S::Error: Into<BoxError>,
    {
        let Some(cluster) = self.engaged.get(&key.cluster).cloned() else {
            // A key is queued only for a known cluster, and its purge goes
            // with the cluster: nothing to run it against.
            tracing::debug!(controller = %self.name, request = %key, "no cluster for a queued key; dropped");
            self.queue
                .complete(&key, Outcome::Success(Action::await_change()));
            return;
        };
        if !cluster.is_engaged() {
            self.interrupted(&key);
            return;
        }
        let watch = self.controlled.get(&key.cluster);
        let mut request = ObjectRequest::read(cluster.clone(), key.clone(), watch)
            .with_reason(reason)
            .with_controller(self.name.clone());
        request.object = self.fresher(&key, request.object.take());
        // What the cluster clients it writes through refuse to make a
        // child of in other clusters (see `OwnerReferenceAcross`), and
        // record its writes under.
        let owner = Reconciling {
            cluster: key.cluster.clone(),
            reachability: cluster.shared_reachability().clone(),
            object: request.object.clone().map(|object| object as _),
            writer: self.writer(),
        };
        let reconcile = match contain(|| service.call(request)) {
            Ok(reconcile) => reconcile,
            Err(message) => return self.panicked(&key, "call", &message),
        };
        let task_key = key.clone();
        let abort = self.running.spawn(async move {
            // Nothing starts in a cluster after it has left.
            if !cluster.is_engaged() {
                return (task_key, None);
            }
            let result = reconciling(owner, reconcile).await;
            (task_key, Some(result.map_err(Into::into)))
        });
        self.running_keys.insert(abort.id(), key.clone());
        self.aborts.insert(key, abort);
    }

    /// The key's run did not start or was cut short because its cluster left
    /// or was replaced. A disengage has purged the key, and the queue drops
    /// it; a replacement runs it again against the new cluster. If the runner
    /// has not yet heard which of the two it was, the key's cluster is held
    /// until it has.
    pub(super) fn interrupted(&mut self, key: &McRequest) {
        self.queue.complete(key, Outcome::Interrupted);
        let pending = self
            .engaged
            .get(&key.cluster)
            .is_some_and(|cluster| !cluster.is_engaged());
        if pending {
            self.queue.hold(&key.cluster);
        }
    }

    fn panicked(&mut self, key: &McRequest, during: &str, message: &str) {
        tracing::error!(controller = %self.name, request = %key, during, %message, "reconcile service panicked; retrying after backoff");
        self.queue.complete(key, Outcome::Failure(None));
    }

    pub(super) fn finished(&mut self, joined: Result<(Id, Finished), JoinError>) {
        let (id, key, outcome) = match joined {
            Ok((id, (key, Some(Ok(action))))) => (id, key, Outcome::Success(action)),
            Ok((id, (key, Some(Err(error))))) => {
                let outcome = self.failed(&key, &*error);
                (id, key, outcome)
            }
            Ok((id, (key, None))) => (id, key, Outcome::Interrupted),
            Err(error) => {
                let id = error.id();
                let Some(key) = self.running_keys.get(&id).cloned() else {
                    return;
                };
                let outcome = match error.try_into_panic() {
                    Ok(panic) => {
                        let message = panic_message(panic.as_ref());
                        tracing::error!(controller = %self.name, request = %key, %message, "reconcile panicked; retrying after backoff");
                        Outcome::Failure(None)
                    }
                    // Cancelled: its cluster left or was replaced.
                    Err(_) => Outcome::Interrupted,
                };
                (id, key, outcome)
            }
        };
        self.running_keys.remove(&id);
        // Only the run the queue knows as the key's current one counts.
        if self.aborts.get(&key).is_some_and(|a| a.id() == id) {
            self.aborts.remove(&key);
            match outcome {
                Outcome::Interrupted => self.interrupted(&key),
                outcome => self.queue.complete(&key, outcome),
            }
        }
    }
}
