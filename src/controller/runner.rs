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

use super::{Clusters, Error, QueueDepth, trigger::Trigger};
use crate::{
    Action, Backoff, Cluster, ClusterName, Fleet, McRequest,
    fleet::{FleetEvent, Requirement, RequirementGuard},
    queue::{Outcome, Queue},
};

/// How many incoming requests one poll takes before it yields, so that a
/// flood of events cannot keep the loop from dispatching.
const INTAKE_PER_POLL: usize = 1024;

/// Moves up to `budget` requests from `next` into the queue; returns whether
/// the budget ran out (more may be waiting).
fn poll_intake(
    queue: &mut Queue,
    budget: usize,
    mut next: impl FnMut() -> Poll<Option<McRequest>>,
) -> bool {
    for _ in 0..budget {
        match next() {
            Poll::Ready(Some(request)) => queue.push(request),
            _ => return false,
        }
    }
    true
}

pub(super) struct Setup {
    pub(super) fleet: Fleet,
    pub(super) name: String,
    pub(super) triggers: Vec<Arc<dyn Trigger>>,
    pub(super) clusters: Clusters,
    pub(super) backoff: Backoff,
    pub(super) shutdown: BoxFuture<'static, ()>,
    pub(super) shutdown_timeout: Duration,
    /// Requests from outside the fleet's watches.
    pub(super) external: BoxStream<'static, McRequest>,
    pub(super) queue_depth: QueueDepth,
}

type Finished = (McRequest, Result<Action, BoxError>);

pub(super) struct Runner {
    name: String,
    triggers: Vec<Arc<dyn Trigger>>,
    clusters: Clusters,
    queue: Queue,
    /// One stream of requests per engaged cluster, merged from its triggers.
    incoming: StreamMap<ClusterName, BoxStream<'static, McRequest>>,
    external: stream::Fuse<BoxStream<'static, McRequest>>,
    fleet_events: mpsc::UnboundedReceiver<FleetEvent>,
    running: JoinSet<Finished>,
    running_keys: HashMap<Id, McRequest>,
    aborts: HashMap<McRequest, AbortHandle>,
    shutdown: BoxFuture<'static, ()>,
    shutdown_timeout: Duration,
    draining: Option<Pin<Box<Sleep>>>,
    /// Clusters engaged before the controller started; engaged on first poll.
    initial: Vec<Cluster>,
    queue_depth: QueueDepth,
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
            external,
            queue_depth,
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
            external: external.fuse(),
            fleet_events: subscription.events,
            running: JoinSet::new(),
            running_keys: HashMap::new(),
            aborts: HashMap::new(),
            shutdown,
            shutdown_timeout,
            draining: None,
            initial: subscription.clusters,
            queue_depth,
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

    fn engage(&mut self, cluster: &Cluster) {
        if !self.clusters.selects(cluster.name()) {
            return;
        }
        // No request leaves this cluster before every watch of the controller
        // there has synced, so a reconcile never reads a half-filled cache
        // (the fleet waits for them too, but not for a controller that
        // started after the cluster was engaged).
        let synced = join_all(self.triggers.iter().map(|t| t.start(cluster.cache())));
        let (triggers, cluster_for_stream) = (self.triggers.clone(), cluster.clone());
        let requests = stream::once(synced)
            .map(move |_| {
                stream::select_all(triggers.iter().map(|t| t.requests(&cluster_for_stream)))
            })
            .flatten();
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

        // Half the intake for each source, so that neither a flood of watch
        // events nor of external requests starves the other.
        let from_clusters = poll_intake(&mut self.queue, INTAKE_PER_POLL / 2, || {
            self.incoming
                .poll_next_unpin(cx)
                .map(|r| r.map(|(_, request)| request))
        });
        let from_outside = poll_intake(&mut self.queue, INTAKE_PER_POLL / 2, || {
            self.external.poll_next_unpin(cx)
        });
        if from_clusters || from_outside {
            cx.waker().wake_by_ref();
        }

        // Until nothing moves: a finished reconcile may make its key ready
        // again, and each wait below must have registered this task's waker
        // after the last change (an empty JoinSet registers none).
        loop {
            let mut progress = false;
            while let Poll::Ready(Some(joined)) = self.running.poll_join_next_with_id(cx) {
                self.finished(joined);
                progress = true;
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
                        progress = true;
                    }
                }
            }
            if !progress {
                return Poll::Pending;
            }
        }
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
                (id, key, outcome)
            }
            Err(error) => {
                let Some(key) = self.running_keys.get(&error.id()).cloned() else {
                    return;
                };
                // A cancelled reconcile belonged to a cluster that left.
                let outcome = if error.is_panic() {
                    tracing::error!(controller = %self.name, request = %key, "reconcile panicked; retrying after backoff");
                    Outcome::Failure
                } else {
                    Outcome::Cancelled
                };
                (error.id(), key, outcome)
            }
        };
        self.running_keys.remove(&id);
        // Only the run the queue knows as the key's current one counts.
        if self.aborts.get(&key).is_some_and(|a| a.id() == id) {
            self.aborts.remove(&key);
            self.queue.complete(&key, outcome);
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

    use crate::{Controller, controller::Error};

    use super::*;

    /// A controller over an empty fleet, fed requests through a channel.
    fn fed_controller() -> (Controller<ConfigMap>, mpsc::UnboundedSender<McRequest>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let controller = Controller::<ConfigMap>::new(&Fleet::new(), watcher::Config::default())
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
        let task = tokio::spawn(controller.run(service));
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
        let task = tokio::spawn(controller.run(service));
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
        let task = tokio::spawn(controller.run(service));
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
        let task = tokio::spawn(controller.run(service));
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
            .shutdown_timeout(Duration::from_secs(2));
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
        controller.run(service).await.unwrap();
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
        let task = tokio::spawn(controller.run(service));
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
