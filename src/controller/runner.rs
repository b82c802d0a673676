//! The loop of a running controller: fleet changes, incoming requests,
//! finished reconciles, and handing ready keys to the service.

use std::{
    collections::HashMap,
    future::poll_fn,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use futures::{
    FutureExt, StreamExt,
    future::BoxFuture,
    stream::{self, BoxStream},
};
use tokio::{
    sync::mpsc,
    task::{AbortHandle, Id, JoinError, JoinSet},
    time::Sleep,
};
use tokio_stream::StreamMap;
use tower::{BoxError, Service};

use super::{Clusters, Error, trigger::Trigger};
use crate::{
    Action, Backoff, Cluster, ClusterName, Fleet, McRequest,
    fleet::{FleetEvent, Requirement, RequirementGuard},
    queue::{Outcome, Queue},
};

/// How many incoming requests one poll takes before it yields, so that a
/// flood of events cannot keep the loop from dispatching.
const INTAKE_PER_POLL: usize = 1024;

pub(super) struct Setup {
    pub(super) fleet: Fleet,
    pub(super) name: String,
    pub(super) triggers: Vec<Arc<dyn Trigger>>,
    pub(super) clusters: Clusters,
    pub(super) backoff: Backoff,
    pub(super) shutdown: BoxFuture<'static, ()>,
    pub(super) shutdown_timeout: Duration,
}

type Finished = (McRequest, Result<Action, BoxError>);

pub(super) struct Runner {
    name: String,
    triggers: Vec<Arc<dyn Trigger>>,
    clusters: Clusters,
    queue: Queue,
    /// One stream of requests per engaged cluster, merged from its triggers.
    incoming: StreamMap<ClusterName, BoxStream<'static, McRequest>>,
    fleet_events: mpsc::UnboundedReceiver<FleetEvent>,
    running: JoinSet<Finished>,
    running_keys: HashMap<Id, McRequest>,
    aborts: HashMap<McRequest, AbortHandle>,
    shutdown: BoxFuture<'static, ()>,
    shutdown_timeout: Duration,
    draining: Option<Pin<Box<Sleep>>>,
    /// Clusters engaged before the controller started; engaged on first poll.
    initial: Vec<Cluster>,
    // Keeps the fleet starting this controller's watches in new clusters.
    _requirements: Vec<RequirementGuard>,
}

impl Runner {
    pub(super) fn new(setup: Setup) -> Self {
        let Setup {
            fleet,
            name,
            triggers,
            clusters,
            backoff,
            shutdown,
            shutdown_timeout,
        } = setup;
        let requirements = triggers
            .iter()
            .map(|trigger| {
                let selection = clusters.clone();
                let trigger = trigger.clone();
                fleet.require(Requirement {
                    selects: Arc::new(move |name| selection.selects(name)),
                    start: Arc::new(move |cache| trigger.start(cache)),
                })
            })
            .collect();
        let subscription = fleet.subscribe();
        Self {
            name,
            triggers,
            clusters,
            queue: Queue::new(backoff),
            incoming: StreamMap::new(),
            fleet_events: subscription.events,
            running: JoinSet::new(),
            running_keys: HashMap::new(),
            aborts: HashMap::new(),
            shutdown,
            shutdown_timeout,
            draining: None,
            initial: subscription.clusters,
            _requirements: requirements,
        }
    }

    pub(super) async fn run<S>(mut self, mut service: S) -> Result<(), Error>
    where
        S: Service<McRequest, Response = Action> + Send + 'static,
        S::Future: Send + 'static,
        S::Error: Into<BoxError>,
    {
        tracing::info!(controller = %self.name, "controller started");
        for cluster in std::mem::take(&mut self.initial) {
            self.engage(&cluster);
        }
        let result = poll_fn(|cx| self.poll(cx, &mut service)).await;
        self.running.abort_all();
        tracing::info!(controller = %self.name, "controller stopped");
        result
    }

    fn engage(&mut self, cluster: &Cluster) {
        if !self.clusters.selects(cluster.name()) {
            return;
        }
        let requests = stream::select_all(self.triggers.iter().map(|t| t.requests(cluster)));
        // Replaces the stream of an earlier engagement of the same name.
        self.incoming
            .insert(cluster.name().clone(), requests.boxed());
    }

    fn disengage(&mut self, name: &ClusterName) {
        self.incoming.remove(name);
        self.queue.purge(name);
        for (key, abort) in &self.aborts {
            if key.cluster == *name {
                abort.abort();
            }
        }
    }

    fn poll<S>(&mut self, cx: &mut Context<'_>, service: &mut S) -> Poll<Result<(), Error>>
    where
        S: Service<McRequest, Response = Action>,
        S::Future: Send + 'static,
        S::Error: Into<BoxError>,
    {
        if self.draining.is_none() && self.shutdown.poll_unpin(cx).is_ready() {
            tracing::info!(controller = %self.name, running = self.running.len(), "shutting down: no new reconciles");
            self.draining = Some(Box::pin(tokio::time::sleep(self.shutdown_timeout)));
        }

        while let Poll::Ready(Some(event)) = self.fleet_events.poll_recv(cx) {
            match event {
                FleetEvent::Engaged(cluster) => self.engage(&cluster),
                FleetEvent::Disengaged(name) => self.disengage(&name),
            }
        }

        let mut taken = 0;
        while taken < INTAKE_PER_POLL {
            match self.incoming.poll_next_unpin(cx) {
                Poll::Ready(Some((_, request))) => self.queue.push(request),
                _ => break,
            }
            taken += 1;
        }
        if taken == INTAKE_PER_POLL {
            cx.waker().wake_by_ref();
        }

        while let Poll::Ready(Some(joined)) = self.running.poll_join_next_with_id(cx) {
            self.finished(joined);
        }

        if let Some(deadline) = &mut self.draining {
            if self.running.is_empty() {
                return Poll::Ready(Ok(()));
            }
            if deadline.as_mut().poll(cx).is_ready() {
                tracing::warn!(controller = %self.name, cancelled = self.running.len(), "shutdown timeout: cancelling running reconciles");
                return Poll::Ready(Ok(()));
            }
            return Poll::Pending;
        }

        while self.queue.poll_has_ready(cx) {
            match service.poll_ready(cx) {
                Poll::Pending => break,
                Poll::Ready(Err(error)) => {
                    return Poll::Ready(Err(Error::Service {
                        controller: self.name.clone(),
                        source: error.into(),
                    }));
                }
                Poll::Ready(Ok(())) => {
                    let key = self
                        .queue
                        .pop_ready()
                        .expect("poll_has_ready said a key is ready");
                    let reconcile = service.call(key.clone());
                    let task_key = key.clone();
                    let abort = self
                        .running
                        .spawn(async move { (task_key, reconcile.await.map_err(Into::into)) });
                    self.running_keys.insert(abort.id(), key.clone());
                    self.aborts.insert(key, abort);
                }
            }
        }
        Poll::Pending
    }

    fn finished(&mut self, joined: Result<(Id, Finished), JoinError>) {
        let (id, key, outcome) = match joined {
            Ok((id, (key, result))) => {
                let outcome = match result {
                    Ok(action) => Outcome::Success(action),
                    Err(error) => {
                        tracing::warn!(controller = %self.name, request = %key, error = %error, "reconcile failed; retrying after backoff");
                        Outcome::Failure
                    }
                };
                (id, key, Some(outcome))
            }
            Err(error) => {
                let Some(key) = self.running_keys.get(&error.id()).cloned() else {
                    return;
                };
                // A cancelled reconcile belonged to a cluster that left: its
                // key is purged and schedules nothing.
                let outcome = error.is_panic().then(|| {
                    tracing::error!(controller = %self.name, request = %key, "reconcile panicked; retrying after backoff");
                    Outcome::Failure
                });
                (error.id(), key, outcome)
            }
        };
        self.running_keys.remove(&id);
        // A run of a purged key may end after the key was queued and started
        // again; only the current run's outcome counts.
        if self.aborts.get(&key).is_some_and(|a| a.id() == id) {
            self.aborts.remove(&key);
            if let Some(outcome) = outcome {
                self.queue.complete(&key, outcome);
            }
        }
    }
}
