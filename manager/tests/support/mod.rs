//! Helpers shared by the manager's tests: reconciles recorded with their
//! start and end, ConfigMaps to reconcile, and sharded replicas with the
//! tests' short Lease timings.

#![allow(dead_code, unreachable_pub)]

pub mod endpoints;

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api, Client,
    api::{ObjectMeta, PostParams},
    runtime::watcher,
};
use kube_multicluster::{
    Action, Controller, Fleet, ObjectRequest,
    provider::{ProgrammaticHandle, ProgrammaticProvider},
};
use kube_multicluster_manager::{Error, LeaseParams, Manager, Ownership, ShardStatus, Sharding};
use tokio::{sync::oneshot, task::JoinHandle, time::Instant};
use tower::{BoxError, Service, service_fn};

/// How long a test waits for something that should happen.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// The tests' Lease timings: a lease of 4 s, a renew deadline of 3 s, a
/// retry period of 1 s (up to 1.2 s with jitter).
pub const LEASE: Duration = Duration::from_secs(4);
/// See [`LEASE`].
pub const RENEW_DEADLINE: Duration = Duration::from_secs(3);
/// See [`LEASE`].
pub const RETRY: Duration = Duration::from_secs(1);

/// The Leases of replica `identity`, in `default` of the cluster `client`
/// reaches, held at the tests' timings.
pub fn lease_params(identity: &str, client: Client) -> LeaseParams {
    LeaseParams::default()
        .namespace("default")
        .identity(identity)
        .client(client)
        .lease_duration(LEASE)
        .renew_deadline(RENEW_DEADLINE)
        .retry_period(RETRY)
}

/// A sharded replica of a test: its manager runs one controller, `echo`,
/// of the ConfigMaps labelled `<label>=true`, its reconciles recorded
/// under the replica's name.
pub struct Replica {
    pub name: String,
    pub status: ShardStatus,
    /// The clusters its provider offers.
    pub clusters: ProgrammaticHandle,
    pub stop: Option<oneshot::Sender<()>>,
    pub run: JoinHandle<Result<(), Error>>,
}

impl Replica {
    /// Starts replica `name`, sharding as `sharding` says, offered
    /// `clusters`, each reached with `client`.
    pub fn start(
        sharding: Sharding,
        name: &str,
        clusters: &[impl AsRef<str>],
        client: &Client,
        label: &str,
        records: &Records,
    ) -> Self {
        let fleet = Fleet::new();
        let (provider, handle) = ProgrammaticProvider::new();
        for cluster in clusters {
            handle.engage(cluster.as_ref(), client.clone());
        }
        let status = sharding.status();
        let (stop, stopped) = oneshot::channel::<()>();
        let manager = Manager::new(&fleet)
            .provider(provider)
            .sharding(sharding)
            .graceful_shutdown_on(async move {
                let _ = stopped.await;
            })
            .controller(
                Controller::<ConfigMap>::new(
                    &fleet,
                    watcher::Config::default().labels(&format!("{label}=true")),
                )
                .named("echo"),
                records.reconciler(name, Duration::from_millis(20), Duration::from_millis(300)),
            );
        Self {
            name: name.to_owned(),
            status,
            clusters: handle,
            stop: Some(stop),
            run: tokio::spawn(manager.run()),
        }
    }

    /// Stops it gracefully, and checks that it ended well owning nothing;
    /// returns its name and its stretches of ownership.
    pub async fn stop(&mut self) -> (String, Vec<Ownership>) {
        let _ = self.stop.take().expect("runs").send(());
        let ended = tokio::time::timeout(PATIENCE, &mut self.run)
            .await
            .expect("stops")
            .expect("its task");
        assert!(ended.is_ok(), "{}: {ended:?}", self.name);
        assert!(
            self.status.owned().is_empty(),
            "{} owns after stopping",
            self.name
        );
        (self.name.clone(), self.status.history())
    }

    /// Kills it: its future dropped, its Leases left to run out; returns
    /// its name and its stretches of ownership.
    pub async fn kill(&mut self) -> (String, Vec<Ownership>) {
        self.run.abort();
        let _ = (&mut self.run).await;
        (self.name.clone(), self.status.history())
    }
}

/// One reconcile: who ran it, in which cluster, from when until when (the
/// end is set when its future is dropped, finished or stopped).
#[derive(Debug, Clone)]
pub struct Span {
    pub replica: String,
    pub cluster: String,
    pub start: Instant,
    pub end: Option<Instant>,
}

/// Every reconcile of every replica of a test, in the order they started.
#[derive(Debug, Clone, Default)]
pub struct Records(Arc<Mutex<Vec<Span>>>);

/// A span under way: it ends when this is dropped.
pub struct Ending {
    records: Records,
    index: usize,
}

impl Drop for Ending {
    fn drop(&mut self) {
        self.records.lock()[self.index].end = Some(Instant::now());
    }
}

impl Records {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Span>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts a span of `replica` under `what`, ended when the guard goes.
    pub fn begin(&self, replica: &str, what: String) -> Ending {
        let index = {
            let mut spans = self.lock();
            spans.push(Span {
                replica: replica.to_owned(),
                cluster: what,
                start: Instant::now(),
                end: None,
            });
            spans.len() - 1
        };
        Ending {
            records: self.clone(),
            index,
        }
    }

    pub fn all(&self) -> Vec<Span> {
        self.lock().clone()
    }

    pub fn of(&self, replica: &str) -> Vec<Span> {
        self.all()
            .into_iter()
            .filter(|s| s.replica == replica)
            .collect()
    }

    /// A reconciler that records each reconcile as `replica`'s, takes
    /// `work`, and comes back to the object after `again`: a replica that
    /// runs reconciles all the time.
    pub fn reconciler(
        &self,
        replica: &str,
        work: Duration,
        again: Duration,
    ) -> impl Service<
        ObjectRequest<ConfigMap>,
        Response = Action,
        Error = BoxError,
        Future: Send + 'static,
    > + Send
    + 'static {
        self.reconciler_by(replica, work, again, |request| {
            request.cluster.name().to_string()
        })
    }

    /// [`reconciler`](Self::reconciler), each span recorded under what
    /// `what` says of its request (its cluster, or its key) in
    /// [`Span::cluster`].
    pub fn reconciler_by(
        &self,
        replica: &str,
        work: Duration,
        again: Duration,
        what: fn(&ObjectRequest<ConfigMap>) -> String,
    ) -> impl Service<
        ObjectRequest<ConfigMap>,
        Response = Action,
        Error = BoxError,
        Future: Send + 'static,
    > + Send
    + 'static {
        let records = self.clone();
        let replica = replica.to_owned();
        service_fn(move |request: ObjectRequest<ConfigMap>| {
            let records = records.clone();
            let replica = replica.clone();
            async move {
                let _ending = records.begin(&replica, what(&request));
                tokio::time::sleep(work).await;
                Ok::<_, BoxError>(Action::requeue(again))
            }
        })
    }

    /// Waits until `replica` has started a reconcile after `after`, and
    /// returns when it started.
    pub async fn first_after(&self, replica: &str, after: Instant) -> Instant {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(span) = self
                .of(replica)
                .into_iter()
                .find(|span| span.start >= after)
            {
                return span.start;
            }
            assert!(Instant::now() < deadline, "{replica} never reconciled");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Asserts that no reconcile of one replica overlapped one of another in
/// the same cluster. A reconcile that has not ended runs on for ever.
pub fn assert_no_overlap(spans: &[Span]) {
    let before = |end: Option<Instant>, start: Instant| end.is_some_and(|end| end <= start);
    for (i, a) in spans.iter().enumerate() {
        for b in &spans[i + 1..] {
            if a.replica == b.replica || a.cluster != b.cluster {
                continue;
            }
            assert!(
                before(a.end, b.start) || before(b.end, a.start),
                "{} and {} reconciled {} at once: {a:?} and {b:?}",
                a.replica,
                b.replica,
                a.cluster
            );
        }
    }
}

/// Creates `count` ConfigMaps labelled `label=true` in `default`.
pub async fn config_maps(client: Client, label: &str, count: usize) {
    let api = Api::<ConfigMap>::namespaced(client, "default");
    for i in 0..count {
        let config_map = ConfigMap {
            metadata: ObjectMeta {
                name: Some(format!("{label}-{i}")),
                labels: Some([(label.to_owned(), "true".to_owned())].into()),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        };
        api.create(&PostParams::default(), &config_map)
            .await
            .expect("a ConfigMap");
    }
}
