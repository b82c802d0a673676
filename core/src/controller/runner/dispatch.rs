//! Keys handed out and taken back: each key the queue admits becomes a
//! reconcile while the service is ready (or waits for the controller's own
//! writes to show), and each ended reconcile's outcome goes back to the
//! queue.

use std::task::{Context, Poll};

use tower::{BoxError, Service};

use super::{
    Runner,
    tasks::{Ended, Ran},
};
use crate::{
    action::Action,
    cache::Watchable,
    client::{Reconciling, reconciling},
    controller::Error,
    object_request::ObjectRequest,
    panic::contain,
    queue::Outcome,
    reason::ReconcileReason,
    request::McRequest,
};

impl<K: Watchable> Runner<K> {
    /// Takes back every reconcile that ended: its outcome goes to the
    /// queue. Whether any did.
    pub(super) fn poll_finished(&mut self, cx: &mut Context<'_>) -> bool {
        let mut progress = false;
        while let Poll::Ready(Some(Ended { key, ran, current })) = self.tasks.poll_ended(cx) {
            progress = true;
            let outcome = match ran {
                Ran::Answered(Ok(action)) => Outcome::Success(action),
                Ran::Answered(Err(error)) => self.failures.failed(&mut self.queue, &key, &*error),
                Ran::Interrupted => Outcome::Interrupted,
                Ran::Panicked(message) => {
                    tracing::error!(controller = %self.name, request = %key, %message, "reconcile panicked; retrying after backoff");
                    Outcome::Failure(None)
                }
            };
            // Only the run the queue knows as the key's current one counts.
            if current {
                match outcome {
                    Outcome::Interrupted => self.interrupted(&key),
                    outcome => self.queue.complete(&key, outcome),
                }
            }
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
        while let Poll::Ready(next) = self.queue.poll_pop_ready(cx) {
            let awaited = self
                .catch_up
                .awaiting(self.members.engaged(), next.cluster());
            if !awaited.is_empty() {
                // Its watches (or those its keys' reconciles wrote to)
                // have not shown what the controller wrote: its keys wait
                // until they do, and other clusters' go on.
                let paused = next.cluster().clone();
                next.pause();
                let cluster = self.members.engaged().get(&paused).cloned();
                let dyntype = self.members.dyntype();
                if !cluster.is_some_and(|cluster| self.catch_up.start(cluster, awaited, dyntype)) {
                    self.queue.resume(&paused);
                }
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
        let Some(cluster) = self.members.engaged().get(&key.cluster).cloned() else {
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
        let watch = self.members.controlled(&key.cluster);
        let mut request = ObjectRequest::read(cluster.clone(), key.clone(), watch)
            .with_reason(reason)
            .with_controller(self.name.clone());
        request.object = self.catch_up.fresher(&key, request.object.take());
        // What the cluster clients it writes through refuse to make a
        // child of in other clusters (see `OwnerReferenceAcross`), and
        // record its writes under.
        let owner = Reconciling {
            cluster: key.cluster.clone(),
            reachability: cluster.reachability().clone(),
            object: request.object.clone().map(|object| object as _),
            writer: self.catch_up.writer(),
        };
        let reconcile = match contain(|| service.call(request)) {
            Ok(reconcile) => reconcile,
            Err(message) => return self.panicked(&key, "call", &message),
        };
        let task_key = key.clone();
        self.tasks.spawn(key, async move {
            // Nothing starts in a cluster after it has left.
            if !cluster.is_engaged() {
                return (task_key, Ran::Interrupted);
            }
            let result = reconciling(owner, reconcile).await;
            (task_key, Ran::Answered(result.map_err(Into::into)))
        });
    }

    /// The key's run did not start or was cut short because its cluster left
    /// or was replaced. A disengage has purged the key, and the queue drops
    /// it; a replacement runs it again against the new cluster. If the runner
    /// has not yet heard which of the two it was, the key's cluster is held
    /// until it has.
    fn interrupted(&mut self, key: &McRequest) {
        self.queue.complete(key, Outcome::Interrupted);
        let pending = self
            .members
            .engaged()
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
}
