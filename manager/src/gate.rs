//! Holds reconciles to the time a Lease is known to be held.
//!
//! A [`Validity`] says until when, on the local clock, this process may act:
//! the start of its last successful renew plus the renew deadline, which
//! ends before any other replica may take the Lease. [`GateLayer`] checks it
//! before it calls the reconciler, and stops a running reconcile (drops its
//! future) the moment the validity runs out without a renew: the
//! reconcile's future is not polled past it. Work a reconciler hands to
//! other tasks or threads is its own to stop. It also counts the reconciles
//! in flight, so that a Lease is given up only once they have stopped.

use std::{
    collections::HashMap,
    fmt,
    sync::{Arc, Mutex, MutexGuard},
    task::{Context, Poll},
};

use futures::{FutureExt, future::BoxFuture};
use kube_multicluster::{Action, ClusterName, McRequest, controller::ClusterSelector};
use kube_multicluster_layers::AsMcRequest;
use tokio::{sync::watch, time::Instant};
use tower::{BoxError, Layer, Service};

use crate::shard::key_shard;

/// The validity of each cluster this replica runs (with sharding): what
/// the reconciles' gate reads, and the sharder keeps.
pub(crate) type Shards = Arc<Mutex<HashMap<ClusterName, Arc<Validity>>>>;

/// The validity of each shard this replica holds, for the keys of the hub
/// clusters (with sharding that has hubs).
pub(crate) type HubShards = Arc<Mutex<HashMap<u32, Arc<Validity>>>>;

/// The hub clusters of a sharding: run by every replica, each key under
/// the validity of its shard.
#[derive(Clone)]
pub(crate) struct Hubs {
    pub(crate) clusters: ClusterSelector,
    pub(crate) shards: HubShards,
    /// How many shards keys are hashed onto.
    pub(crate) count: u32,
}

impl fmt::Debug for Hubs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Hubs")
            .field("count", &self.count)
            .finish_non_exhaustive()
    }
}

/// Until when reconciles may run, and how many run now.
#[derive(Debug)]
pub(crate) struct Validity {
    until: watch::Sender<Option<Instant>>,
    running: watch::Sender<usize>,
}

impl Validity {
    pub(crate) fn closed() -> Arc<Self> {
        Arc::new(Self {
            until: watch::Sender::new(None),
            running: watch::Sender::new(0),
        })
    }

    /// Reconciles may start until `until`.
    pub(crate) fn open_until(&self, until: Instant) {
        self.until.send_replace(Some(until));
    }

    /// No reconcile may start, and running ones stop.
    pub(crate) fn close(&self) {
        self.until.send_replace(None);
    }

    /// Completes once no reconcile runs under this validity.
    pub(crate) async fn drained(&self) {
        let mut running = self.running.subscribe();
        let _ = running.wait_for(|n| *n == 0).await;
    }
}

/// `mutex` locked, whether or not a holder panicked.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

fn is_open(until: Option<Instant>) -> bool {
    until.is_some_and(|until| Instant::now() < until)
}

/// Which validity a request runs under.
#[derive(Debug, Clone)]
pub(crate) enum Gate {
    /// No Lease: everything runs.
    Open,
    /// One Lease for every cluster (leader election).
    Leader(Arc<Validity>),
    /// One Lease per shard (sharding), shared by the shard's clusters; a
    /// cluster without one is closed. The keys of hub clusters run under
    /// their own shard's, and are skipped where this replica holds none.
    Shards(Shards, Option<Hubs>),
}

/// What a request runs under.
enum Lookup {
    Open,
    Under(Arc<Validity>),
    /// A hub key of a shard this replica does not hold: not run here.
    Skip,
}

impl Gate {
    /// The hub clusters, under sharding with hubs.
    pub(crate) fn hubs(&self) -> Option<&ClusterSelector> {
        match self {
            Self::Shards(_, Some(hubs)) => Some(&hubs.clusters),
            _ => None,
        }
    }

    /// Closes every validity: no reconcile starts, and running ones stop.
    /// Returns the clusters that were open under sharding.
    pub(crate) fn close(&self) -> Vec<ClusterName> {
        match self {
            Self::Open => Vec::new(),
            Self::Leader(validity) => {
                validity.close();
                Vec::new()
            }
            Self::Shards(shards, hubs) => {
                if let Some(hubs) = hubs {
                    for (_, validity) in lock(&hubs.shards).drain() {
                        validity.close();
                    }
                }
                lock(shards)
                    .drain()
                    .map(|(cluster, validity)| {
                        validity.close();
                        cluster
                    })
                    .collect()
            }
        }
    }

    fn lookup(&self, request: &McRequest) -> Lookup {
        match self {
            Self::Open => Lookup::Open,
            Self::Leader(validity) => Lookup::Under(validity.clone()),
            Self::Shards(_, Some(hubs)) if hubs.clusters.selects(&request.cluster) => {
                let shard = key_shard(request.namespace.as_deref(), &request.name, hubs.count);
                match lock(&hubs.shards).get(&shard) {
                    Some(validity) => Lookup::Under(validity.clone()),
                    None => Lookup::Skip,
                }
            }
            Self::Shards(shards, _) => Lookup::Under(
                lock(shards)
                    .get(&request.cluster)
                    .cloned()
                    .unwrap_or_else(Validity::closed),
            ),
        }
    }
}

/// A reconcile refused or stopped because this process no longer knows it
/// holds the Lease that covers the cluster: leader election was lost, or
/// the cluster's shard moved to another replica.
#[derive(Debug, thiserror::Error)]
#[error(
    "cluster {cluster}: this replica does not hold the Lease for it; the reconcile did not run on"
)]
pub struct NotHolder {
    /// The request's cluster.
    pub cluster: ClusterName,
}

/// Wraps a reconciler so that it runs only while the manager holds the
/// Lease that covers the request's cluster; see the [module docs](self).
#[derive(Debug, Clone)]
pub(crate) struct GateLayer {
    gate: Gate,
}

impl GateLayer {
    pub(crate) fn new(gate: Gate) -> Self {
        Self { gate }
    }
}

impl<S> Layer<S> for GateLayer {
    type Service = Gated<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Gated {
            inner,
            gate: self.gate.clone(),
        }
    }
}

/// The service of [`GateLayer`].
#[derive(Clone)]
pub(crate) struct Gated<S> {
    inner: S,
    gate: Gate,
}

impl<S> fmt::Debug for Gated<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gated").field("gate", &self.gate).finish()
    }
}

/// Counts one reconcile in flight while it lives.
struct Running(Arc<Validity>);

impl Running {
    fn enter(validity: Arc<Validity>) -> Self {
        validity.running.send_modify(|n| *n += 1);
        Self(validity)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.0.running.send_modify(|n| *n -= 1);
    }
}

impl<S, R> Service<R> for Gated<S>
where
    R: AsMcRequest,
    S: Service<R, Response = Action>,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<S::Response, BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: R) -> Self::Future {
        let cluster = request.mc_request().cluster.clone();
        let validity = match self.gate.lookup(request.mc_request()) {
            Lookup::Open => {
                return self
                    .inner
                    .call(request)
                    .map(|r| r.map_err(Into::into))
                    .boxed();
            }
            // Another replica runs it; taking the shard queues it again.
            Lookup::Skip => return futures::future::ready(Ok(Action::await_change())).boxed(),
            Lookup::Under(validity) => validity,
        };
        // Counted before the check, so that a Lease is not given up between
        // the check and the call.
        let running = Running::enter(validity.clone());
        let mut until = validity.until.subscribe();
        if !is_open(*until.borrow_and_update()) {
            return futures::future::ready(Err(NotHolder { cluster }.into())).boxed();
        }
        let reconcile = self.inner.call(request);
        async move {
            let _running = running;
            let mut reconcile = std::pin::pin!(reconcile);
            loop {
                let Some(deadline) = (*until.borrow_and_update()).filter(|u| Instant::now() < *u)
                else {
                    return Err(NotHolder { cluster }.into());
                };
                // The deadline first: a reconcile woken at it is not polled.
                tokio::select! {
                    biased;
                    _ = tokio::time::sleep_until(deadline) => {}
                    done = async {
                        // Checked again just before each poll: a wake-up that
                        // came late finds the deadline passed.
                        std::future::poll_fn(|cx| {
                            if Instant::now() >= deadline {
                                return std::task::Poll::Ready(None);
                            }
                            reconcile.as_mut().poll(cx).map(Some)
                        })
                        .await
                    } => match done {
                        Some(done) => return done.map_err(Into::into),
                        None => return Err(NotHolder { cluster }.into()),
                    },
                    changed = until.changed() => {
                        if changed.is_err() {
                            return Err(NotHolder { cluster }.into());
                        }
                    }
                }
            }
        }
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use kube_multicluster::{Action, McRequest};
    use tokio::time::Instant;
    use tower::{BoxError, Layer, ServiceExt, service_fn};

    use super::{Gate, GateLayer, Validity};

    fn request() -> McRequest {
        McRequest::new("east", Some("ns"), "x")
    }

    #[tokio::test(start_paused = true)]
    async fn a_closed_gate_never_calls_the_reconciler() {
        let validity = Validity::closed();
        let service = GateLayer::new(Gate::Leader(validity.clone())).layer(service_fn(
            |_: McRequest| async { Err::<Action, BoxError>("called while closed".into()) },
        ));
        let error = service.oneshot(request()).await.expect_err("refused");
        assert!(error.to_string().contains("cluster east"), "{error}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_reconcile_stops_when_its_validity_runs_out_and_goes_on_while_renewed() {
        let validity = Validity::closed();
        validity.open_until(Instant::now() + Duration::from_secs(3));
        let slow = |_: McRequest| async {
            tokio::time::sleep(Duration::from_secs(5)).await;
            Ok::<_, BoxError>(Action::await_change())
        };
        let gated = GateLayer::new(Gate::Leader(validity.clone())).layer(service_fn(slow));
        let started = Instant::now();
        let stopped = gated.clone().oneshot(request()).await;
        assert!(stopped.is_err());
        assert_eq!(started.elapsed(), Duration::from_secs(3));
        validity.drained().await;

        // Renewed along the way: it runs to the end.
        validity.open_until(Instant::now() + Duration::from_secs(3));
        let renewer = tokio::spawn({
            let validity = validity.clone();
            async move {
                for _ in 0..4 {
                    tokio::time::sleep(Duration::from_secs(2)).await;
                    validity.open_until(Instant::now() + Duration::from_secs(3));
                }
            }
        });
        assert!(gated.clone().oneshot(request()).await.is_ok());
        renewer.abort();

        // Closed by hand: stopped at once, and counted out.
        validity.open_until(Instant::now() + Duration::from_secs(30));
        let running = tokio::spawn(gated.oneshot(request()));
        tokio::time::sleep(Duration::from_secs(1)).await;
        validity.close();
        assert!(running.await.unwrap().is_err());
        validity.drained().await;
    }
}
