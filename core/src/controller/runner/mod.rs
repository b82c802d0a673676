//! The loop of a running controller: fleet changes, incoming requests,
//! finished reconciles, and handing admitted keys to the service.
//!
//! One `Runner` per running controller, its work split by concern:
//! [`membership`] (clusters joining and leaving, the sync gate),
//! [`intake`] (requests checked and queued), [`tasks`] (reconciles started,
//! supervised and finished) and [`outcome`] (what a failure means for its
//! key).

mod catch_up;
mod intake;
mod membership;
mod outcome;
mod tasks;
#[cfg(test)]
mod tests;

use std::{
    collections::{HashMap, HashSet},
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
    task::{AbortHandle, Id, JoinSet},
    time::Sleep,
};
use tokio_stream::StreamMap;
use tower::{BoxError, Service};

use super::{
    ClusterSelector, ControllerStatus, Error, ErrorPolicy,
    config::Config,
    trigger::{Trigger, WatchTrigger},
};
use crate::{
    action::Action,
    cache::{SharedWatch, Watchable},
    cluster::Cluster,
    cluster_name::ClusterName,
    fleet::{Fleet, FleetEvent},
    object_request::ObjectRequest,
    queue::{Queue, QueueDepth, QueueMetrics},
    request::McRequest,
};
use catch_up::CatchUp;
use membership::{ClusterItem, watched_anywhere};
use tasks::Finished;

/// How many incoming requests one poll takes before it yields, so that a
/// flood of events cannot keep the loop from dispatching.
const INTAKE_PER_POLL: usize = 1024;

/// How many names of unknown clusters the runner remembers having warned
/// about; past that it forgets them all and may warn again.
const UNKNOWN_REMEMBERED: usize = 1024;

pub(super) struct Setup<K: Watchable> {
    pub(super) fleet: Fleet,
    pub(super) error_policy: Option<ErrorPolicy>,
    pub(super) name: String,
    /// The watch of the controlled type, and how its changes become keys.
    pub(super) own: Arc<WatchTrigger<K>>,
    /// The watches of owned and related types.
    pub(super) related: Vec<Arc<dyn Trigger>>,
    pub(super) clusters: ClusterSelector,
    pub(super) config: Config,
    pub(super) shutdown: BoxFuture<'static, ()>,
    /// Requests from outside the fleet's watches.
    pub(super) external: BoxStream<'static, McRequest>,
    /// Signals to reconcile everything the controller knows.
    pub(super) reconcile_all: BoxStream<'static, ()>,
    pub(super) queue_depth: QueueDepth,
    pub(super) queue_metrics: Option<QueueMetrics>,
    pub(super) status: ControllerStatus,
}

pub(super) struct Runner<K: Watchable> {
    name: Arc<str>,
    error_policy: Option<ErrorPolicy>,
    fleet: Fleet,
    /// The watch of the controlled type: the keys, and each reconcile's
    /// object.
    own: Arc<WatchTrigger<K>>,
    related: Vec<Arc<dyn Trigger>>,
    selection: ClusterSelector,
    queue: Queue,
    /// One stream per served cluster: its sync, then its triggers' requests.
    incoming: StreamMap<ClusterName, BoxStream<'static, ClusterItem>>,
    external: stream::Fuse<BoxStream<'static, McRequest>>,
    reconcile_all: stream::Fuse<BoxStream<'static, ()>>,
    fleet_events: mpsc::UnboundedReceiver<FleetEvent>,
    /// Every engaged cluster the controller knows of, served or not.
    engaged: HashMap<ClusterName, Cluster>,
    /// The watch of the controlled type in each served cluster.
    controlled: HashMap<ClusterName, Arc<SharedWatch<K>>>,
    /// Problems with requests already warned about, per cluster.
    misaddressed: HashSet<(ClusterName, &'static str)>,
    /// Clusters not in the fleet that requests named, warned about once.
    unknown: HashSet<ClusterName>,
    running: JoinSet<Finished>,
    running_keys: HashMap<Id, McRequest>,
    aborts: HashMap<McRequest, AbortHandle>,
    shutdown: BoxFuture<'static, ()>,
    shutdown_timeout: Duration,
    sync_timeout: Duration,
    draining: Option<Pin<Box<Sleep>>>,
    /// Clusters engaged before the controller started; engaged on first poll.
    initial: Vec<Cluster>,
    queue_depth: QueueDepth,
    status: ControllerStatus,
    /// Clusters held until their watches show the controller's writes.
    catch_up: CatchUp<K>,
}

impl<K: Watchable> Drop for Runner<K> {
    fn drop(&mut self) {
        for name in self.incoming.keys() {
            self.status.remove(name);
        }
    }
}

impl<K: Watchable> Runner<K> {
    pub(super) fn new(setup: Setup<K>) -> Self {
        let Setup {
            fleet,
            error_policy,
            name,
            own,
            related,
            clusters,
            config,
            shutdown,
            external,
            reconcile_all,
            queue_depth,
            queue_metrics,
            status,
        } = setup;
        let name: Arc<str> = name.into();
        let mut queue = Queue::new(config.backoff, config.limits);
        if let Some(metrics) = queue_metrics {
            metrics.name(name.clone());
            queue.count_in(metrics);
        }
        status.configure(watched_anywhere(&clusters, &related), config.sync_timeout);
        let subscription = fleet.subscribe();
        let catch_up = CatchUp::new(&name, config.read_your_writes);
        Self {
            name,
            error_policy,
            fleet,
            own,
            related,
            selection: clusters,
            queue,
            incoming: StreamMap::new(),
            external: external.fuse(),
            reconcile_all: reconcile_all.fuse(),
            fleet_events: subscription.events,
            engaged: HashMap::new(),
            controlled: HashMap::new(),
            misaddressed: HashSet::new(),
            unknown: HashSet::new(),
            running: JoinSet::new(),
            running_keys: HashMap::new(),
            aborts: HashMap::new(),
            shutdown,
            shutdown_timeout: config.shutdown_timeout,
            sync_timeout: config.sync_timeout,
            draining: None,
            initial: subscription.clusters,
            queue_depth,
            status,
            catch_up,
        }
    }

    pub(super) async fn run<S>(mut self, mut service: S) -> Result<(), Error>
    where
        S: Service<ObjectRequest<K>, Response = Action> + Send + 'static,
        S::Future: Send + 'static,
        S::Error: Into<BoxError>,
    {
        tracing::info!(controller = %self.name, "controller started");
        for cluster in std::mem::take(&mut self.initial) {
            self.engage(cluster);
        }
        let result = poll_fn(|cx| {
            let step = self.poll(cx, &mut service);
            self.queue_depth.set(self.queue.waiting());
            step
        })
        .await;
        self.running.abort_all();
        tracing::info!(controller = %self.name, "controller stopped");
        result
    }

    /// One pass: shutdown, fleet changes, intake, then finished reconciles
    /// and dispatch until nothing moves. Each wait registers this task's
    /// waker after the last change it saw.
    fn poll<S>(&mut self, cx: &mut Context<'_>, service: &mut S) -> Poll<Result<(), Error>>
    where
        S: Service<ObjectRequest<K>, Response = Action>,
        S::Future: Send + 'static,
        S::Error: Into<BoxError>,
    {
        self.poll_shutdown(cx);
        self.poll_fleet(cx);
        self.poll_intake(cx);
        loop {
            let mut progress = self.poll_finished(cx) | self.poll_caught_up(cx);
            if let Some(done) = self.poll_draining(cx) {
                return done;
            }
            match self.dispatch(cx, service) {
                Ok(dispatched) => progress |= dispatched,
                Err(error) => return Poll::Ready(Err(error)),
            }
            if !progress {
                return Poll::Pending;
            }
        }
    }

    fn poll_shutdown(&mut self, cx: &mut Context<'_>) {
        if self.draining.is_none() && self.shutdown.poll_unpin(cx).is_ready() {
            tracing::info!(controller = %self.name, running = self.running.len(), "shutting down: no new reconciles");
            self.draining = Some(Box::pin(tokio::time::sleep(self.shutdown_timeout)));
        }
    }

    fn poll_fleet(&mut self, cx: &mut Context<'_>) {
        while let Poll::Ready(Some(event)) = self.fleet_events.poll_recv(cx) {
            match event {
                FleetEvent::Engaged(cluster) => self.engage(cluster),
                FleetEvent::Disengaged(name) => self.disengage(&name),
            }
        }
    }

    /// While shutting down: done once nothing runs or the timeout passes.
    fn poll_draining(&mut self, cx: &mut Context<'_>) -> Option<Poll<Result<(), Error>>> {
        let deadline = self.draining.as_mut()?;
        if self.running.is_empty() {
            return Some(Poll::Ready(Ok(())));
        }
        if deadline.as_mut().poll(cx).is_ready() {
            tracing::warn!(controller = %self.name, cancelled = self.running.len(), "shutdown timeout: cancelling running reconciles");
            return Some(Poll::Ready(Ok(())));
        }
        Some(Poll::Pending)
    }
}
