//! The loop of a running controller: fleet changes, incoming requests,
//! finished reconciles, and handing admitted keys to the service.
//!
//! One `Runner` per running controller. Its parts each own their state and
//! answer the loop through a few methods: [`members`] (the clusters it
//! knows and serves, each served cluster's stream with its sync gate),
//! [`intake`] (requests from outside, and those dropped), [`tasks`] (the
//! running reconciles), [`outcome`] (what a failure means for its key),
//! [`catch_up`] (waiting for the controller's own writes to show) and
//! [`stop`] (the graceful stop). The runner itself wires them to the queue
//! and the status: this file takes things in, `dispatch.rs` hands keys out
//! and takes their outcomes back.

mod catch_up;
mod dispatch;
mod intake;
mod members;
mod outcome;
mod stop;
mod tasks;
#[cfg(test)]
mod tests;

use std::{
    future::poll_fn,
    sync::Arc,
    task::{Context, Poll},
};

use futures::{future::BoxFuture, stream::BoxStream};
use tower::{BoxError, Service};

use super::{
    ClusterSelector, ControllerStatus, Error, ErrorPolicy,
    config::Config,
    trigger::{Dest, Trigger, WatchTrigger},
};
use crate::{
    action::Action,
    cache::{WatchState, Watchable},
    cluster::Cluster,
    cluster_name::ClusterName,
    fleet::{Fleet, FleetEvent},
    object_request::ObjectRequest,
    queue::{Lane, Queue, QueueDepth, QueueMetrics},
    reason::ReconcileReason,
    request::McRequest,
};
use catch_up::CatchUp;
use intake::Intake;
use members::{ClusterItem, Members};
use outcome::Failures;
use stop::{Drain, Stop};
use tasks::Tasks;

/// How many incoming requests one poll takes before it yields, so that a
/// flood of events cannot keep the loop from dispatching.
const INTAKE_PER_POLL: usize = 1024;

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
    queue: Queue,
    queue_depth: QueueDepth,
    status: ControllerStatus,
    members: Members<K>,
    intake: Intake,
    tasks: Tasks,
    failures: Failures,
    /// Clusters held until their watches show the controller's writes.
    catch_up: CatchUp<K>,
    stop: Stop,
}

impl<K: Watchable> Drop for Runner<K> {
    fn drop(&mut self) {
        for name in self.members.served() {
            self.status.remove(name);
        }
    }
}

impl<K: Watchable> Runner<K> {
    pub(super) fn new(setup: Setup<K>) -> Self {
        let name: Arc<str> = setup.name.into();
        let config = setup.config;
        let mut queue = Queue::new(config.backoff, config.limits);
        if let Some(metrics) = setup.queue_metrics {
            metrics.name(name.clone());
            queue.count_in(metrics);
        }
        let members = Members::new(
            setup.fleet,
            setup.own,
            setup.related,
            setup.clusters,
            config.sync_timeout,
        );
        setup
            .status
            .configure(members.watched_anywhere(), config.sync_timeout);
        Self {
            queue,
            queue_depth: setup.queue_depth,
            status: setup.status,
            members,
            intake: Intake::new(name.clone(), setup.external, setup.reconcile_all),
            tasks: Tasks::default(),
            failures: Failures {
                controller: name.clone(),
                policy: setup.error_policy,
            },
            catch_up: CatchUp::new(&name, config.read_your_writes),
            stop: Stop::new(setup.shutdown, config.shutdown_timeout),
            name,
        }
    }

    pub(super) async fn run<S>(mut self, mut service: S) -> Result<(), Error>
    where
        S: Service<ObjectRequest<K>, Response = Action> + Send + 'static,
        S::Future: Send + 'static,
        S::Error: Into<BoxError>,
    {
        tracing::info!(controller = %self.name, "controller started");
        for cluster in self.members.take_initial() {
            self.engage(cluster);
        }
        let result = poll_fn(|cx| {
            let step = self.poll(cx, &mut service);
            self.queue_depth.set(self.queue.waiting());
            step
        })
        .await;
        self.tasks.abort_all();
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
        if self.stop.poll_asked(cx) {
            tracing::info!(controller = %self.name, running = self.tasks.len(), "shutting down: no new reconciles");
        }
        while let Poll::Ready(Some(event)) = self.members.poll_fleet(cx) {
            match event {
                FleetEvent::Engaged(cluster) => self.engage(cluster),
                FleetEvent::Disengaged(name) => self.disengage(&name),
            }
        }
        self.poll_intake(cx);
        loop {
            let mut progress = self.poll_finished(cx);
            progress |= self
                .catch_up
                .poll_caught_up(cx, |name| self.queue.resume(name));
            match self.stop.poll_drain(cx, self.tasks.len()) {
                Drain::Running => {}
                Drain::Draining => return Poll::Pending,
                Drain::Done => return Poll::Ready(Ok(())),
                Drain::TimedOut => {
                    tracing::warn!(controller = %self.name, cancelled = self.tasks.len(), "shutdown timeout: cancelling running reconciles");
                    return Poll::Ready(Ok(()));
                }
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

    /// Takes what the clusters' streams and the outside have sent, half the
    /// budget each, so that neither a flood of watch events nor of external
    /// requests starves the other.
    fn poll_intake(&mut self, cx: &mut Context<'_>) {
        let clusters_left_more =
            (0..INTAKE_PER_POLL / 2).all(|_| match self.members.poll_item(cx) {
                Poll::Ready(Some((name, item))) => {
                    self.cluster_item(name, item);
                    true
                }
                _ => false,
            });
        let outside_left_more =
            (0..INTAKE_PER_POLL / 2).all(|_| match self.intake.poll_external(cx) {
                Poll::Ready(Some(request)) => {
                    self.accept(request, Lane::Changed, ReconcileReason::External);
                    true
                }
                _ => false,
            });
        if self.intake.poll_reconcile_all(cx) {
            let everything = self.members.everything();
            tracing::info!(controller = %self.name, queued = everything.len(), "reconciling everything");
            for request in everything {
                self.accept(request, Lane::Listed, ReconcileReason::BulkReconcile);
            }
        }
        if clusters_left_more || outside_left_more {
            // The budget ran out: come back for the rest soon.
            cx.waker().wake_by_ref();
        }
    }

    /// Starts serving `cluster` if the controller selects it: subscribes to
    /// its triggers' watches there and holds its keys until they sync.
    fn engage(&mut self, cluster: Cluster) {
        let writer = self.catch_up.writer().map(|writer| writer.name.clone());
        let Some(engaged) = self.members.engage(&cluster, writer) else {
            return;
        };
        let name = &engaged.name;
        self.intake.forget(name);
        if engaged.replaced {
            // Replaced under the same name: runs against the old one stop.
            self.tasks.cancel(name);
        }
        // A wait for the old one's watches ends for nothing.
        if self.catch_up.forget(name) {
            self.queue.resume(name);
        }
        if engaged.watches.is_empty() {
            // Held only if a run was interrupted before this event came.
            self.queue.unserve(name);
            return;
        }
        if engaged.controlled {
            self.catch_up.serve(&cluster);
        }
        self.status.start(cluster, engaged.watches);
        if engaged.controlled {
            // Held with the cluster's other keys until its watches sync,
            // with what watches mapping across clusters ask for there.
            self.queue.hold(name);
            for request in self.members.joined(name) {
                self.accept(request, Lane::Listed, ReconcileReason::Listed);
            }
        } else {
            // Only related watches run here, and no key can be queued for
            // it: it takes no part in the queue's fair share.
            self.queue.unserve(name);
        }
    }

    fn disengage(&mut self, name: &ClusterName) {
        let Some(served) = self.members.disengage(name) else {
            return;
        };
        if served {
            self.status.remove(name);
        }
        self.queue.purge(name);
        self.catch_up.forget(name);
        self.tasks.cancel(name);
    }

    fn cluster_item(&mut self, name: ClusterName, item: ClusterItem) {
        match item {
            ClusterItem::Synced => {
                tracing::info!(controller = %self.name, cluster = %name, "watches synced; serving the cluster");
                self.queue.release(&name);
                self.status.serve(&name);
            }
            ClusterItem::Answering => {
                let woken = self.queue.answering(&name);
                if woken > 0 {
                    tracing::info!(controller = %self.name, cluster = %name, keys = woken, "the cluster answers again: its keys that failed for want of an answer run now");
                }
            }
            ClusterItem::StillSyncing => {
                if let Some(status) = self.status.cluster(name.as_str()) {
                    let failing = status
                        .watches
                        .iter()
                        .any(|w| matches!(w.state, WatchState::Failing { .. }));
                    if failing {
                        tracing::warn!(controller = %self.name, %status, "watches have not synced; the cluster's keys wait");
                    } else {
                        // Late for want of a permit to list: the fleet's
                        // lists in flight tell it, not one line per cluster.
                        tracing::debug!(controller = %self.name, %status, "watches wait to list; the cluster's keys wait");
                    }
                }
            }
            ClusterItem::Request(Dest::One(request), lane, reason) => {
                self.accept(request, lane, reason);
            }
            ClusterItem::Request(Dest::Across(to, key), lane, reason) => {
                // In every engaged cluster that `to` selects and where the
                // controller watches its type.
                for cluster in self.members.across(&to) {
                    self.accept(key.clone().in_cluster(cluster), lane, reason.clone());
                }
            }
        }
    }

    /// Queues a request, if its cluster is in the fleet. A cluster the
    /// runner has not heard of yet but the fleet has is engaged first, so
    /// its keys wait for its watches like any other.
    fn accept(&mut self, request: McRequest, lane: Lane, reason: ReconcileReason) {
        // The cluster the fleet has may be replaced while it is engaged here;
        // then `engage` skips it and the fleet has its successor.
        while let Some(in_fleet) = self.members.unseen_in_fleet(&request.cluster) {
            match in_fleet {
                Some(cluster) => self.engage(cluster),
                None => {
                    return self
                        .intake
                        .unknown_cluster(&request, "is not in the fleet (never engaged, or left)");
                }
            }
        }
        if !self.members.selects(&request.cluster) {
            return self
                .intake
                .unknown_cluster(&request, "is not one where the controller watches its type");
        }
        match self.members.address(request) {
            Ok(request) => self.queue.push(request, lane, reason),
            Err((request, problem)) => self.intake.misaddressed(&request, problem),
        }
    }
}
