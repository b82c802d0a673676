//! The loop of a running controller: fleet changes, incoming requests,
//! finished reconciles, and handing admitted keys to the service.

use std::{
    any::Any,
    collections::{HashMap, HashSet},
    future::poll_fn,
    panic::{AssertUnwindSafe, catch_unwind},
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use futures::{
    FutureExt, StreamExt,
    future::{BoxFuture, join_all},
    stream::{self, BoxStream},
};
use tokio::{
    sync::mpsc,
    task::{AbortHandle, Id, JoinError, JoinSet},
    time::Sleep,
};
use tokio_stream::StreamMap;
use tower::{BoxError, Service};

use super::{
    Clusters, Config, ControllerStatus, Error, ErrorPolicy, QueueDepth,
    deliver::{Deliver, Misaddressed},
    trigger::{Dest, Started, Trigger},
};
use crate::{
    action::Action,
    client::{error_chain, is_unanswered},
    cluster::Cluster,
    cluster_name::ClusterName,
    error::TerminalError,
    fleet::{Fleet, FleetEvent},
    panic::panic_message,
    queue::{Lane, Outcome, Queue},
    reason::ReconcileReason,
    request::{McRequest, ObjectKey},
};

/// Asks the error policy, so that a panic in it counts as no answer.
fn contained_policy(
    policy: &ErrorPolicy,
    key: &McRequest,
    error: &(dyn std::error::Error + Send + Sync + 'static),
) -> Option<Action> {
    catch_unwind(AssertUnwindSafe(|| policy(key, error))).unwrap_or_else(|panic| {
        let message = panic_message(panic.as_ref());
        tracing::error!(request = %key, %message, "the error policy panicked; using the backoff");
        None
    })
}

/// The clusters where the controller runs any watch: its own selection,
/// and those of its triggers that have their own.
fn watched_anywhere(controller: &Clusters, triggers: &[Arc<dyn Trigger>]) -> Clusters {
    let own: Vec<Clusters> = triggers
        .iter()
        .skip(1)
        .filter_map(|trigger| trigger.clusters().cloned())
        .collect();
    if own.is_empty() {
        return controller.clone();
    }
    let controller = controller.clone();
    Clusters::matching(move |name| {
        controller.selects(name) || own.iter().any(|clusters| clusters.selects(name))
    })
}

/// How many incoming requests one poll takes before it yields, so that a
/// flood of events cannot keep the loop from dispatching.
const INTAKE_PER_POLL: usize = 1024;

/// How many names of unknown clusters the runner remembers having warned
/// about; past that it forgets them all and may warn again.
const UNKNOWN_REMEMBERED: usize = 1024;

pub(super) struct Setup {
    pub(super) fleet: Fleet,
    pub(super) error_policy: Option<ErrorPolicy>,
    pub(super) name: String,
    pub(super) triggers: Vec<Arc<dyn Trigger>>,
    pub(super) clusters: Clusters,
    pub(super) config: Config,
    pub(super) shutdown: BoxFuture<'static, ()>,
    /// Requests from outside the fleet's watches.
    pub(super) external: BoxStream<'static, McRequest>,
    /// Signals to reconcile everything the controller knows.
    pub(super) reconcile_all: BoxStream<'static, ()>,
    pub(super) queue_depth: QueueDepth,
    pub(super) status: ControllerStatus,
}

/// What a served cluster's stream tells the runner.
enum ClusterItem {
    /// Every watch of the controller there has synced: its keys may run.
    Synced,
    /// The sync timeout passed again without that.
    StillSyncing,
    /// The cluster answers again after it gave no answer.
    Answering,
    Request(Dest, Lane, ReconcileReason),
}

/// A reconcile's key and its result; `None` if its cluster had left (or was
/// replaced) before it started.
type Finished = (McRequest, Option<Result<Action, BoxError>>);

pub(super) struct Runner {
    name: String,
    error_policy: Option<ErrorPolicy>,
    fleet: Fleet,
    triggers: Vec<Arc<dyn Trigger>>,
    selection: Clusters,
    queue: Queue,
    /// One stream per served cluster: its sync, then its triggers' requests.
    incoming: StreamMap<ClusterName, BoxStream<'static, ClusterItem>>,
    external: stream::Fuse<BoxStream<'static, McRequest>>,
    reconcile_all: stream::Fuse<BoxStream<'static, ()>>,
    fleet_events: mpsc::UnboundedReceiver<FleetEvent>,
    /// Every engaged cluster the controller knows of, served or not.
    engaged: HashMap<ClusterName, Cluster>,
    /// The watch of the controlled type in each served cluster.
    controlled: HashMap<ClusterName, Arc<dyn Any + Send + Sync>>,
    /// Requests are for objects of the controlled type, so only for the
    /// clusters where the controller watches it.
    needs_watch: bool,
    /// Checks and normalizes a request before it is queued.
    admit: Box<dyn Fn(McRequest) -> Result<McRequest, Misaddressed> + Send + Sync>,
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
}

impl Drop for Runner {
    fn drop(&mut self) {
        for name in self.incoming.keys() {
            self.status.remove(name);
        }
    }
}

impl Runner {
    pub(super) fn new(setup: Setup) -> Self {
        let Setup {
            fleet,
            error_policy,
            name,
            triggers,
            clusters,
            config,
            shutdown,
            external,
            reconcile_all,
            queue_depth,
            status,
        } = setup;
        status.configure(watched_anywhere(&clusters, &triggers), config.sync_timeout);
        let subscription = fleet.subscribe();
        Self {
            name,
            error_policy,
            fleet,
            triggers,
            selection: clusters,
            queue: Queue::new(config.backoff, config.limits),
            incoming: StreamMap::new(),
            external: external.fuse(),
            reconcile_all: reconcile_all.fuse(),
            fleet_events: subscription.events,
            engaged: HashMap::new(),
            controlled: HashMap::new(),
            needs_watch: false,
            admit: Box::new(Ok),
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
        }
    }

    pub(super) async fn run<S, D>(mut self, mut service: S, deliver: D) -> Result<(), Error>
    where
        D: Deliver,
        S: Service<D::Request, Response = Action> + Send + 'static,
        S::Future: Send + 'static,
        S::Error: Into<BoxError>,
    {
        tracing::info!(controller = %self.name, "controller started");
        self.needs_watch = D::NEEDS_WATCH;
        let deliver = Arc::new(deliver);
        self.admit = Box::new({
            let deliver = deliver.clone();
            move |key| deliver.admit(key)
        });
        for cluster in std::mem::take(&mut self.initial) {
            self.engage(cluster);
        }
        let result = poll_fn(|cx| {
            let step = self.poll(cx, &mut service, &*deliver);
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
    fn poll<S, D>(
        &mut self,
        cx: &mut Context<'_>,
        service: &mut S,
        deliver: &D,
    ) -> Poll<Result<(), Error>>
    where
        D: Deliver,
        S: Service<D::Request, Response = Action>,
        S::Future: Send + 'static,
        S::Error: Into<BoxError>,
    {
        self.poll_shutdown(cx);
        self.poll_fleet(cx);
        self.poll_intake(cx);
        loop {
            let mut progress = self.poll_finished(cx);
            if let Some(done) = self.poll_draining(cx) {
                return done;
            }
            match self.dispatch(cx, service, deliver) {
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

    /// Takes what the clusters' streams and the outside have sent, half the
    /// budget each, so that neither a flood of watch events nor of external
    /// requests starves the other.
    fn poll_intake(&mut self, cx: &mut Context<'_>) {
        let clusters_left_more =
            (0..INTAKE_PER_POLL / 2).all(|_| match self.incoming.poll_next_unpin(cx) {
                Poll::Ready(Some((name, item))) => {
                    self.cluster_item(name, item);
                    true
                }
                _ => false,
            });
        let outside_left_more =
            (0..INTAKE_PER_POLL / 2).all(|_| match self.external.poll_next_unpin(cx) {
                Poll::Ready(Some(request)) => {
                    self.accept(request, Lane::Changed, ReconcileReason::External);
                    true
                }
                _ => false,
            });
        while let Poll::Ready(Some(())) = self.reconcile_all.poll_next_unpin(cx) {
            self.queue_everything();
        }
        if clusters_left_more || outside_left_more {
            // The budget ran out: come back for the rest soon.
            cx.waker().wake_by_ref();
        }
    }

    /// Queues every object of the controlled type in every cluster it works in.
    fn queue_everything(&mut self) {
        let Some(controlled) = self.triggers.first().cloned() else {
            return;
        };
        let clusters: Vec<Cluster> = self
            .engaged
            .values()
            .filter(|cluster| self.selection.selects(cluster.name()))
            .cloned()
            .collect();
        let mut queued = 0;
        for cluster in clusters {
            for request in controlled.known(&cluster) {
                queued += 1;
                self.accept(request, Lane::Listed, ReconcileReason::ReconcileAll);
            }
        }
        tracing::info!(controller = %self.name, queued, "reconciling everything");
    }

    fn poll_finished(&mut self, cx: &mut Context<'_>) -> bool {
        let mut progress = false;
        while let Poll::Ready(Some(joined)) = self.running.poll_join_next_with_id(cx) {
            self.finished(joined);
            progress = true;
        }
        progress
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

    /// Starts a reconcile for each key the queue admits while the service
    /// is ready. A panic in the service's `poll_ready` or `call` fails the
    /// key at hand, which is retried after its backoff.
    fn dispatch<S, D>(
        &mut self,
        cx: &mut Context<'_>,
        service: &mut S,
        deliver: &D,
    ) -> Result<bool, Error>
    where
        D: Deliver,
        S: Service<D::Request, Response = Action>,
        S::Future: Send + 'static,
        S::Error: Into<BoxError>,
    {
        let mut progress = false;
        while self.queue.poll_has_ready(cx) {
            match catch_unwind(AssertUnwindSafe(|| service.poll_ready(cx))) {
                Ok(Poll::Pending) => break,
                Ok(Poll::Ready(Err(error))) => {
                    return Err(Error::Service {
                        controller: self.name.clone(),
                        source: error.into(),
                    });
                }
                Ok(Poll::Ready(Ok(()))) => self.start(service, deliver),
                Err(panic) => {
                    let (key, _) = self.queue.pop_ready().expect("the queue admitted a key");
                    self.panicked(&key, "poll_ready", panic.as_ref());
                }
            }
            progress = true;
        }
        Ok(progress)
    }

    /// Calls the ready service with the next admitted key.
    fn start<S, D>(&mut self, service: &mut S, deliver: &D)
    where
        D: Deliver,
        S: Service<D::Request, Response = Action>,
        S::Future: Send + 'static,
        S::Error: Into<BoxError>,
    {
        let (key, reason) = self.queue.pop_ready().expect("the queue admitted a key");
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
        let request = deliver.request(
            key.clone(),
            reason,
            &cluster,
            self.controlled.get(&key.cluster),
        );
        let reconcile = match catch_unwind(AssertUnwindSafe(|| service.call(request))) {
            Ok(reconcile) => reconcile,
            Err(panic) => return self.panicked(&key, "call", panic.as_ref()),
        };
        let task_key = key.clone();
        let abort = self.running.spawn(async move {
            // Nothing starts in a cluster after it has left.
            if !cluster.is_engaged() {
                return (task_key, None);
            }
            (task_key, Some(reconcile.await.map_err(Into::into)))
        });
        self.running_keys.insert(abort.id(), key.clone());
        self.aborts.insert(key, abort);
    }

    /// The key's run did not start or was cut short because its cluster left
    /// or was replaced. A disengage has purged the key, and the queue drops
    /// it; a replacement runs it again against the new cluster. If the runner
    /// has not yet heard which of the two it was, the key's cluster is held
    /// until it has.
    fn interrupted(&mut self, key: &McRequest) {
        self.queue.complete(key, Outcome::Interrupted);
        let pending = self
            .engaged
            .get(&key.cluster)
            .is_some_and(|cluster| !cluster.is_engaged());
        if pending {
            self.queue.hold(&key.cluster);
        }
    }

    fn panicked(&mut self, key: &McRequest, during: &str, panic: &(dyn std::any::Any + Send)) {
        let message = panic_message(panic);
        tracing::error!(controller = %self.name, request = %key, during, %message, "reconcile service panicked; retrying after backoff");
        self.queue.complete(key, Outcome::Failure(None));
    }

    /// Starts serving `cluster` if the controller selects it: subscribes to
    /// its triggers' watches there and holds its keys until they sync.
    fn engage(&mut self, cluster: Cluster) {
        let name = cluster.name().clone();
        // A cluster that left already: the event that ended it follows.
        if !cluster.is_engaged()
            || self
                .engaged
                .get(&name)
                .is_some_and(|known| known.same_engagement(&cluster))
        {
            return;
        }
        self.unknown.remove(&name);
        self.misaddressed.retain(|(cluster, _)| *cluster != name);
        if self.engaged.insert(name.clone(), cluster.clone()).is_some() {
            // Replaced under the same name: runs against the old one stop.
            self.cancel_running(&name);
        }
        self.controlled.remove(&name);
        // The controlled type is watched where the controller works; each
        // other type where its own selection, or else the controller's, says.
        let controlled = self.selection.selects(&name);
        let started: Vec<Started> = self
            .triggers
            .iter()
            .enumerate()
            .filter(|(i, trigger)| match trigger.clusters() {
                Some(clusters) if *i > 0 => clusters.selects(&name),
                _ => controlled,
            })
            .map(|(_, trigger)| trigger.start(&cluster))
            .collect();
        if started.is_empty() {
            // Held only if a run was interrupted before this event came.
            self.queue.unserve(&name);
            return;
        }
        let watches: Vec<_> = started.iter().map(|s| s.watch.clone()).collect();
        if controlled {
            self.controlled
                .insert(name.clone(), started[0].shared.clone());
        }
        let recoveries = cluster.reachability().recoveries();
        self.status.start(cluster, watches.clone());
        if controlled || !self.needs_watch {
            self.queue.hold(&name);
        } else {
            // Only related watches run here, and no key can be queued for
            // it: it takes no part in the queue's fair share.
            self.queue.unserve(&name);
        }
        if controlled {
            // Held with the cluster's other keys until its watches sync.
            self.joined(&name);
        }
        let synced = Box::pin(join_all(watches.iter().map(|w| w.synced())));
        let timeout = self.sync_timeout;
        let gate = stream::unfold(Some(synced), move |synced| async move {
            let mut synced = synced?;
            tokio::select! {
                _ = &mut synced => Some((ClusterItem::Synced, None)),
                () = tokio::time::sleep(timeout) => Some((ClusterItem::StillSyncing, Some(synced))),
            }
        });
        // Subscribed only once the cluster is served: nothing piles up unread
        // while one of the watches cannot sync.
        let subscribes: Vec<_> = started.into_iter().map(|s| s.subscribe).collect();
        let requests = stream::once(async move {
            stream::select_all(subscribes.into_iter().map(|subscribe| subscribe()))
        })
        .flatten()
        .map(|(request, lane, reason)| ClusterItem::Request(request, lane, reason));
        // Its keys that failed for want of an answer run as soon as it
        // answers again, rather than after their backoff.
        let answering = stream::unfold(recoveries, |mut recoveries| async move {
            recoveries.changed().await.ok()?;
            Some((ClusterItem::Answering, recoveries))
        });
        // Replaces the stream of an earlier engagement of the same name.
        self.incoming.insert(
            name,
            stream::select(gate.chain(requests), answering).boxed(),
        );
    }

    /// Queues, in `joined`, what every object that watches mapping across
    /// clusters hold now asks for there.
    fn joined(&mut self, joined: &ClusterName) {
        let mut requests = Vec::new();
        for (i, trigger) in self.triggers.iter().enumerate() {
            for source in self.engaged.values() {
                let watched = match trigger.clusters() {
                    Some(clusters) if i > 0 => clusters.selects(source.name()),
                    _ => self.selection.selects(source.name()),
                };
                if watched {
                    requests.extend(trigger.joined(joined, source));
                }
            }
        }
        for request in requests {
            self.accept(request, Lane::Listed, ReconcileReason::Listed);
        }
    }

    fn disengage(&mut self, name: &ClusterName) {
        // The fleet ends an engagement before it says so. One that is still
        // live was learned from the fleet ahead of its own event: this event
        // ended an older one.
        if self.engaged.get(name).is_some_and(Cluster::is_engaged) {
            return;
        }
        self.engaged.remove(name);
        self.controlled.remove(name);
        if self.incoming.remove(name).is_some() {
            self.status.remove(name);
        }
        self.queue.purge(name);
        self.cancel_running(name);
    }

    fn cancel_running(&self, cluster: &ClusterName) {
        for (key, abort) in &self.aborts {
            if key.cluster == *cluster {
                abort.abort();
            }
        }
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
                    tracing::warn!(controller = %self.name, %status, "watches have not synced; the cluster's keys wait");
                }
            }
            ClusterItem::Request(Dest::One(request), lane, reason) => {
                self.accept(request, lane, reason);
            }
            ClusterItem::Request(Dest::Across(to, key), lane, reason) => {
                self.accept_across(&to, &key, lane, &reason);
            }
        }
    }

    /// Queues a request, if its cluster is in the fleet. A cluster the
    /// runner has not heard of yet but the fleet has is engaged first, so
    /// its keys wait for its watches like any other.
    fn accept(&mut self, request: McRequest, lane: Lane, reason: ReconcileReason) {
        // The cluster the fleet has may be replaced while it is engaged here;
        // then `engage` skips it and the fleet has its successor.
        while !self.engaged.contains_key(&request.cluster) {
            match self.fleet.get(&request.cluster) {
                Some(cluster) => self.engage(cluster),
                None => {
                    return self
                        .unknown_cluster(&request, "is not in the fleet (never engaged, or left)");
                }
            }
        }
        if self.needs_watch && !self.selection.selects(&request.cluster) {
            return self
                .unknown_cluster(&request, "is not one where the controller watches its type");
        }
        match (self.admit)(request) {
            Ok(request) => self.queue.push(request, lane, reason),
            Err((request, problem)) => self.misaddressed(&request, problem),
        }
    }

    /// Queues the request for `key` in every engaged cluster that `to`
    /// selects and where the controller watches its type.
    fn accept_across(
        &mut self,
        to: &Clusters,
        key: &ObjectKey,
        lane: Lane,
        reason: &ReconcileReason,
    ) {
        let clusters: Vec<ClusterName> = self
            .engaged
            .keys()
            .filter(|name| to.selects(name) && self.selection.selects(name))
            .cloned()
            .collect();
        for cluster in clusters {
            self.accept(key.clone().in_cluster(cluster), lane, reason.clone());
        }
    }

    fn misaddressed(&mut self, request: &McRequest, problem: &'static str) {
        if self.misaddressed.insert((request.cluster.clone(), problem)) {
            tracing::warn!(controller = %self.name, %request, "request {problem}; dropped, and further such requests for this cluster too");
            if self.misaddressed.len() > UNKNOWN_REMEMBERED {
                self.misaddressed.clear();
            }
        }
    }

    fn unknown_cluster(&mut self, request: &McRequest, why: &str) {
        if self.unknown.insert(request.cluster.clone()) {
            tracing::warn!(controller = %self.name, %request, "request names a cluster that {why}; dropped, and further requests for it too");
            if self.unknown.len() > UNKNOWN_REMEMBERED {
                self.unknown.clear();
                self.unknown.insert(request.cluster.clone());
            }
        }
    }

    /// What a reconcile's error means for its key: nothing more until it
    /// changes if the error is terminal; otherwise what the error policy
    /// says, or the key's backoff.
    fn failed(
        &mut self,
        key: &McRequest,
        error: &(dyn std::error::Error + Send + Sync + 'static),
    ) -> Outcome {
        let reason = error_chain(error);
        if TerminalError::is_in(error) {
            tracing::error!(controller = %self.name, request = %key, error = %reason, "reconcile failed for good; it runs again when it changes");
            return Outcome::Success(Action::await_change());
        }
        // A key that fails again as it did last time is not news: told at
        // `DEBUG` until its error changes or it succeeds.
        let again = self.queue.failed_again(key, &reason);
        let chosen = self
            .error_policy
            .as_ref()
            .and_then(|policy| contained_policy(policy, key, error));
        match chosen.map(|action| action.requeue_after()) {
            Some(None) => {
                tracing::error!(controller = %self.name, request = %key, error = %reason, "reconcile failed; by the error policy it runs again when it changes");
                Outcome::Success(Action::await_change())
            }
            Some(Some(after)) => {
                if again {
                    tracing::debug!(controller = %self.name, request = %key, error = %reason, ?after, "reconcile failed again, as before; retrying when the error policy says");
                } else {
                    tracing::warn!(controller = %self.name, request = %key, error = %reason, ?after, "reconcile failed; retrying when the error policy says");
                }
                Outcome::Failure(Some(after))
            }
            // The cluster's own transitions are logged once, as it stops
            // and starts answering (`client::reachability`).
            None if is_unanswered(error) => {
                tracing::debug!(controller = %self.name, request = %key, error = %reason, "reconcile failed: the cluster gives no answer; retrying after backoff, or once it answers");
                Outcome::Unanswered
            }
            None if again => {
                tracing::debug!(controller = %self.name, request = %key, error = %reason, "reconcile failed again, as before; retrying after backoff");
                Outcome::Failure(None)
            }
            None => {
                tracing::warn!(controller = %self.name, request = %key, error = %reason, "reconcile failed; retrying after backoff");
                Outcome::Failure(None)
            }
        }
    }

    fn finished(&mut self, joined: Result<(Id, Finished), JoinError>) {
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

#[cfg(test)]
mod tests {
    use std::sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    };

    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::runtime::watcher;
    use tokio::time::Instant;
    use tokio_stream::wrappers::UnboundedReceiverStream;
    use tower::{ServiceBuilder, service_fn};

    use crate::{
        backoff::Backoff,
        controller::{Controller, Error},
    };

    /// A client whose requests go nowhere: the cluster is in the fleet, and
    /// no watch runs there (the controller selects only the local cluster).
    fn idle_client() -> kube::Client {
        let (service, _handle) = tower_test::mock::pair::<
            http::Request<kube::client::Body>,
            http::Response<kube::client::Body>,
        >();
        kube::Client::new(service, "default")
    }

    use super::*;

    /// A controller over an empty fleet, fed requests through a channel.
    fn fed_controller() -> (Controller<ConfigMap>, mpsc::UnboundedSender<McRequest>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let fleet = Fleet::new();
        // The requests name cluster "c", which must be in the fleet.
        fleet.engage("c", idle_client());
        let no_jitter = Backoff {
            jitter: 0.0,
            ..Backoff::default()
        };
        let controller = Controller::<ConfigMap>::new(&fleet, watcher::Config::default())
            .clusters(Clusters::Local)
            .with_config(Config::default().backoff(no_jitter))
            .reconcile_on(UnboundedReceiverStream::new(rx));
        (controller, tx)
    }

    fn key(name: &str) -> McRequest {
        McRequest::new("c", Some("ns"), name)
    }

    async fn until(what: &str, condition: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(3600);
        while !condition() {
            assert!(Instant::now() < deadline, "never: {what}");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn pulls_a_key_only_when_the_service_is_ready() {
        let (controller, requests) = fed_controller();
        let (running, most, done) = (
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicUsize::new(0)),
        );
        let service = ServiceBuilder::new()
            .concurrency_limit(2)
            .service(service_fn({
                let (running, most, done) = (running.clone(), most.clone(), done.clone());
                move |_: McRequest| {
                    let (running, most, done) = (running.clone(), most.clone(), done.clone());
                    async move {
                        let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(now, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        running.fetch_sub(1, Ordering::SeqCst);
                        done.fetch_add(1, Ordering::SeqCst);
                        Ok::<_, BoxError>(Action::await_change())
                    }
                }
            }));
        for i in 0..10 {
            requests.send(key(&i.to_string())).unwrap();
        }
        let started = Instant::now();
        let task = tokio::spawn(controller.run_raw(service));
        until("all ran", || done.load(Ordering::SeqCst) == 10).await;
        assert_eq!(
            most.load(Ordering::SeqCst),
            2,
            "never more than the limit in flight"
        );
        assert!(started.elapsed() >= Duration::from_millis(500));
        task.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn an_error_sends_the_key_back_after_its_backoff_and_success_ends_it() {
        let (controller, requests) = fed_controller();
        let calls = Arc::new(Mutex::new(Vec::new()));
        let service = service_fn({
            let calls = calls.clone();
            move |_: McRequest| {
                let mut calls = calls.lock().unwrap();
                calls.push(Instant::now());
                let fail = calls.len() <= 3;
                async move {
                    if fail {
                        Err::<Action, BoxError>("not yet".into())
                    } else {
                        Ok(Action::await_change())
                    }
                }
            }
        });
        requests.send(key("flaky")).unwrap();
        let task = tokio::spawn(controller.run_raw(service));
        until("four calls", || calls.lock().unwrap().len() == 4).await;
        tokio::time::sleep(Duration::from_secs(60)).await;
        let calls = calls.lock().unwrap().clone();
        assert_eq!(calls.len(), 4, "no call after the success");
        let gaps: Vec<_> = calls.windows(2).map(|w| w[1] - w[0]).collect();
        let ms = Duration::from_millis;
        assert_eq!(gaps, [ms(5), ms(10), ms(20)]);
        task.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn a_panicking_reconcile_is_retried_and_other_keys_keep_running() {
        let (controller, requests) = fed_controller();
        let calls = Arc::new(Mutex::new(Vec::<String>::new()));
        let service = service_fn({
            let calls = calls.clone();
            move |request: McRequest| {
                let first = {
                    let mut calls = calls.lock().unwrap();
                    calls.push(request.name.clone());
                    calls.iter().filter(|n| **n == request.name).count() == 1
                };
                async move {
                    if request.name == "boom" && first {
                        panic!("reconcile bug");
                    }
                    Ok::<_, BoxError>(Action::await_change())
                }
            }
        });
        requests.send(key("boom")).unwrap();
        requests.send(key("fine")).unwrap();
        let task = tokio::spawn(controller.run_raw(service));
        until("boom retried", || {
            calls
                .lock()
                .unwrap()
                .iter()
                .filter(|n| *n == "boom")
                .count()
                == 2
        })
        .await;
        tokio::time::sleep(Duration::from_secs(60)).await;
        let mut calls = calls.lock().unwrap().clone();
        calls.sort();
        assert_eq!(calls, ["boom", "boom", "fine"]);
        assert!(!task.is_finished(), "the controller keeps running");
        task.abort();
    }

    /// A service that panics in `poll_ready` or `call` the first time it
    /// is asked to, and records the keys it is called with after that.
    #[derive(Clone)]
    struct PanicsOnce {
        in_poll_ready: bool,
        panicked: Arc<AtomicBool>,
        called: Arc<Mutex<Vec<String>>>,
    }

    impl Service<McRequest> for PanicsOnce {
        type Response = Action;
        type Error = BoxError;
        type Future = futures::future::Ready<Result<Action, BoxError>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
            if self.in_poll_ready && !self.panicked.swap(true, Ordering::SeqCst) {
                panic!("poll_ready bug");
            }
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, request: McRequest) -> Self::Future {
            if !self.in_poll_ready && !self.panicked.swap(true, Ordering::SeqCst) {
                panic!("call bug");
            }
            self.called.lock().unwrap().push(request.name);
            futures::future::ready(Ok(Action::await_change()))
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_panic_in_poll_ready_or_call_fails_one_key_and_the_controller_goes_on() {
        for in_poll_ready in [true, false] {
            let (controller, requests) = fed_controller();
            let service = PanicsOnce {
                in_poll_ready,
                panicked: Arc::default(),
                called: Arc::default(),
            };
            let called = service.called.clone();
            requests.send(key("first")).unwrap();
            requests.send(key("second")).unwrap();
            let task = tokio::spawn(controller.run_raw(service));
            until("both keys ran", || called.lock().unwrap().len() == 2).await;
            tokio::time::sleep(Duration::from_secs(60)).await;
            let mut called = called.lock().unwrap().clone();
            called.sort();
            assert_eq!(called, ["first", "second"], "the failed key was retried");
            assert!(!task.is_finished(), "the controller keeps running");
            task.abort();
        }
    }

    /// A controller of cluster "c" in `fleet`, fed through a channel, that
    /// counts the reconciles that start; the first one of key "hang" hangs.
    fn counting_controller(
        fleet: &Fleet,
    ) -> (
        Controller<ConfigMap>,
        mpsc::UnboundedSender<McRequest>,
        Arc<AtomicUsize>,
    ) {
        let (tx, rx) = mpsc::unbounded_channel();
        let controller = Controller::<ConfigMap>::new(fleet, watcher::Config::default())
            .clusters(Clusters::Local)
            .reconcile_on(UnboundedReceiverStream::new(rx));
        (controller, tx, Arc::default())
    }

    fn hangs_first(
        started: Arc<AtomicUsize>,
    ) -> impl Service<McRequest, Response = Action, Error = BoxError, Future: Send + 'static>
    + Send
    + 'static {
        service_fn(move |request: McRequest| {
            let started = started.clone();
            async move {
                let n = started.fetch_add(1, Ordering::SeqCst);
                if request.name == "hang" && n == 0 {
                    std::future::pending::<()>().await;
                }
                Ok::<_, BoxError>(Action::await_change())
            }
        })
    }

    #[tokio::test(start_paused = true)]
    async fn a_run_cut_short_by_a_replacement_runs_again_against_the_new_cluster() {
        let fleet = Fleet::new();
        fleet.engage("c", idle_client());
        let (controller, requests, started) = counting_controller(&fleet);
        requests.send(key("hang")).unwrap();
        let task = tokio::spawn(controller.run_raw(hangs_first(started.clone())));
        until("it runs", || started.load(Ordering::SeqCst) == 1).await;
        // The same name, another client: the running reconcile is cancelled
        // and the key runs again.
        fleet.engage("c", idle_client());
        until("it runs again", || started.load(Ordering::SeqCst) == 2).await;
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(started.load(Ordering::SeqCst), 2);
        task.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_of_a_disengaged_cluster_never_runs_in_a_successor_of_the_same_name() {
        let fleet = Fleet::new();
        fleet.engage("c", idle_client());
        let (controller, requests, started) = counting_controller(&fleet);
        requests.send(key("hang")).unwrap();
        let task = tokio::spawn(controller.run_raw(hangs_first(started.clone())));
        until("it runs", || started.load(Ordering::SeqCst) == 1).await;
        // Both before the controller hears of either.
        fleet.disengage("c");
        fleet.engage("c", idle_client());
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(started.load(Ordering::SeqCst), 1, "purged, not resurrected");
        task.abort();
    }

    /// Replaces cluster "c" in the fleet from inside its first `poll_ready`,
    /// so that the key the controller then takes belongs to a cluster that
    /// has just been replaced, before the controller hears of it.
    struct ReplacesOnReady {
        fleet: Fleet,
        replaced: bool,
        started: Arc<AtomicUsize>,
    }

    impl Service<McRequest> for ReplacesOnReady {
        type Response = Action;
        type Error = BoxError;
        type Future = futures::future::Ready<Result<Action, BoxError>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
            if !std::mem::replace(&mut self.replaced, true) {
                self.fleet.engage("c", idle_client());
            }
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: McRequest) -> Self::Future {
            self.started.fetch_add(1, Ordering::SeqCst);
            futures::future::ready(Ok(Action::await_change()))
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_taken_while_its_cluster_is_being_replaced_runs_against_the_new_one() {
        let fleet = Fleet::new();
        fleet.engage("c", idle_client());
        let (controller, requests, started) = counting_controller(&fleet);
        requests.send(key("x")).unwrap();
        let service = ReplacesOnReady {
            fleet: fleet.clone(),
            replaced: false,
            started: started.clone(),
        };
        let task = tokio::spawn(controller.run_raw(service));
        until("it runs", || started.load(Ordering::SeqCst) == 1).await;
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(
            started.load(Ordering::SeqCst),
            1,
            "once, not lost, not twice"
        );
        task.abort();
    }

    /// Log lines written while the test runs, for checking what a user sees.
    #[derive(Clone, Default)]
    struct Logs(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Logs {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[tokio::test(start_paused = true)]
    async fn requests_for_a_cluster_outside_the_fleet_are_dropped_with_one_warning() {
        let logs = Logs::default();
        let subscriber = tracing_subscriber::fmt()
            .with_writer({
                let logs = logs.clone();
                move || logs.clone()
            })
            .with_max_level(tracing::Level::WARN)
            .with_ansi(false)
            .finish();
        let _logging = tracing::subscriber::set_default(subscriber);
        let (controller, requests) = fed_controller();
        let (service, calls) = {
            let calls = Arc::new(AtomicUsize::new(0));
            let counted = calls.clone();
            let service = service_fn(move |_: McRequest| {
                counted.fetch_add(1, Ordering::SeqCst);
                async { Ok::<_, BoxError>(Action::await_change()) }
            });
            (service, calls)
        };
        for name in ["a", "b", "c"] {
            requests
                .send(McRequest::new("nowhere", Some("ns"), name))
                .unwrap();
        }
        requests.send(key("known")).unwrap();
        let task = tokio::spawn(controller.run_raw(service));
        until("the known cluster's key ran", || {
            calls.load(Ordering::SeqCst) == 1
        })
        .await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(
            calls.load(Ordering::SeqCst),
            1,
            "none for the unknown cluster"
        );
        let logs = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
        let warnings: Vec<_> = logs
            .lines()
            .filter(|l| l.contains("not in the fleet"))
            .collect();
        assert_eq!(warnings.len(), 1, "{logs}");
        assert!(warnings[0].contains("cluster://nowhere/ns/a"), "{logs}");
        task.abort();
    }

    /// A service that always fails with `error()`, recording when it runs.
    fn always_failing(
        error: fn() -> BoxError,
    ) -> (
        impl Service<McRequest, Response = Action, Error = BoxError, Future: Send + 'static>
        + Send
        + 'static,
        Arc<Mutex<Vec<Instant>>>,
    ) {
        let calls = Arc::new(Mutex::new(Vec::new()));
        let recorded = calls.clone();
        let service = service_fn(move |_: McRequest| {
            recorded.lock().unwrap().push(Instant::now());
            async move { Err::<Action, BoxError>(error()) }
        });
        (service, calls)
    }

    #[tokio::test(start_paused = true)]
    async fn a_terminal_error_is_not_retried_until_the_key_comes_again() {
        let (controller, requests) = fed_controller();
        let (service, calls) =
            always_failing(|| crate::error::TerminalError::new("bad spec").into());
        requests.send(key("broken")).unwrap();
        let task = tokio::spawn(controller.run_raw(service));
        until("it ran", || calls.lock().unwrap().len() == 1).await;
        tokio::time::sleep(Duration::from_secs(3600)).await;
        assert_eq!(calls.lock().unwrap().len(), 1, "not retried");
        // A change brings it back.
        requests.send(key("broken")).unwrap();
        until("it ran again", || calls.lock().unwrap().len() == 2).await;
        task.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn the_error_policy_chooses_when_a_failed_key_runs_again() {
        let (controller, requests) = fed_controller();
        let controller = controller.error_policy(|request, error| {
            assert_eq!(error.to_string(), "throttled");
            match request.name.as_str() {
                "later" => Some(Action::requeue(Duration::from_secs(7))),
                "never" => Some(Action::await_change()),
                "boom" => panic!("policy bug"),
                _ => None,
            }
        });
        let (service, calls) = {
            let calls = Arc::new(Mutex::new(Vec::<(String, Instant)>::new()));
            let recorded = calls.clone();
            let service = service_fn(move |request: McRequest| {
                recorded
                    .lock()
                    .unwrap()
                    .push((request.name, Instant::now()));
                async { Err::<Action, BoxError>("throttled".into()) }
            });
            (service, calls)
        };
        for name in ["later", "never", "boom", "default"] {
            requests.send(key(name)).unwrap();
        }
        let task = tokio::spawn(controller.run_raw(service));
        tokio::time::sleep(Duration::from_secs(15)).await;
        task.abort();
        let calls = calls.lock().unwrap().clone();
        let times = |name: &str| -> Vec<Instant> {
            calls
                .iter()
                .filter(|(n, _)| n == name)
                .map(|(_, t)| *t)
                .collect()
        };
        let later = times("later");
        assert_eq!(later.len(), 3, "at 0, 7 and 14 s");
        assert_eq!(later[1] - later[0], Duration::from_secs(7));
        assert_eq!(times("never").len(), 1);
        // A panicking policy, or none, means the backoff: many quick retries.
        assert!(times("boom").len() > 5);
        assert!(times("default").len() > 5);
    }

    #[tokio::test(start_paused = true)]
    async fn graceful_shutdown_lets_running_reconciles_finish_and_starts_no_new_ones() {
        let (signal, shutdown) = tokio::sync::oneshot::channel::<()>();
        let (controller, requests) = fed_controller();
        let controller = controller.graceful_shutdown_on(async move {
            let _ = shutdown.await;
        });
        let finished = Arc::new(Mutex::new(Vec::new()));
        let service = ServiceBuilder::new()
            .concurrency_limit(1)
            .service(service_fn({
                let finished = finished.clone();
                move |request: McRequest| {
                    let finished = finished.clone();
                    async move {
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        finished.lock().unwrap().push(request.name);
                        Ok::<_, BoxError>(Action::await_change())
                    }
                }
            }));
        requests.send(key("first")).unwrap();
        requests.send(key("second")).unwrap();
        let task = tokio::spawn(controller.run_raw(service));
        tokio::time::sleep(Duration::from_millis(500)).await;
        signal.send(()).unwrap();
        let result: Result<(), Error> = task.await.unwrap();
        result.unwrap();
        assert_eq!(*finished.lock().unwrap(), ["first"]);
    }

    #[tokio::test(start_paused = true)]
    async fn graceful_shutdown_cancels_reconciles_that_outlast_the_timeout() {
        let (controller, requests) = fed_controller();
        let controller = controller
            .graceful_shutdown_on(tokio::time::sleep(Duration::from_millis(100)))
            .with_config(Config::default().shutdown_timeout(Duration::from_secs(2)));
        let dropped = Arc::new(AtomicBool::new(false));
        let service = service_fn({
            let dropped = dropped.clone();
            move |_: McRequest| {
                let guard = DropFlag(dropped.clone());
                async move {
                    let _guard = guard;
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                    Ok::<_, BoxError>(Action::await_change())
                }
            }
        });
        requests.send(key("stuck")).unwrap();
        let started = Instant::now();
        controller.run_raw(service).await.unwrap();
        let took = started.elapsed();
        assert!(
            took >= Duration::from_millis(2100) && took < Duration::from_secs(3),
            "{took:?}"
        );
        tokio::task::yield_now().await;
        assert!(
            dropped.load(Ordering::SeqCst),
            "the stuck reconcile was cancelled"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_queue_depth_counts_keys_waiting_not_running() {
        let (controller, requests) = fed_controller();
        let depth = controller.queue_depth();
        let service = ServiceBuilder::new()
            .concurrency_limit(1)
            .service(service_fn(|_: McRequest| async {
                tokio::time::sleep(Duration::from_secs(1)).await;
                Ok::<_, BoxError>(Action::await_change())
            }));
        for i in 0..5 {
            requests.send(key(&i.to_string())).unwrap();
        }
        let task = tokio::spawn(controller.run_raw(service));
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(depth.get(), 4, "one runs, four wait");
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(depth.get(), 0);
        task.abort();
    }

    struct DropFlag(Arc<AtomicBool>);

    impl Drop for DropFlag {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }
}
