//! The entry point: a fleet's providers, its controllers, the endpoints and
//! leader election under one shutdown.

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
};

use futures::{
    FutureExt, Stream, StreamExt,
    future::BoxFuture,
    stream::{BoxStream, FuturesUnordered},
};
use kube::Client;
use kube_fleet::{
    Action, Controller, Fleet, ObjectRequest,
    cache::Watchable,
    controller::ControllerStatus,
    provider::ClusterEvent,
    rbac::{Permissions, Rule, Scope},
};
use kube_fleet_layers::metrics::{ClientMetrics, FleetCollector, QueueDepths};
use prometheus_client::registry::Registry;
use tokio::{net::TcpListener, sync::watch};
use tower::{BoxError, Layer, Service};

use crate::{
    election::{LeaderElection, Role, default_identity, lead},
    error::Error,
    gate::{Gate, GateLayer, Validity},
    http::{Endpoints, serve},
    lease::{LeaseLock, holder_for},
    metrics::LeaderGauge,
    readiness::{Readiness, Watched},
    shard::{ShardStatus, Sharding},
    sharder::Sharder,
};

type Start = Box<
    dyn FnOnce(
            BoxFuture<'static, ()>,
            Gate,
        ) -> BoxFuture<'static, Result<(), kube_fleet::controller::Error>>
        + Send,
>;

struct Added {
    name: String,
    status: ControllerStatus,
    /// The controller's RBAC rules, read when it was added.
    permissions: Permissions,
    started: Arc<AtomicBool>,
    start: Start,
}

enum Address {
    None,
    Bind(SocketAddr),
    Listener(std::net::TcpListener),
}

/// Runs a fleet's providers, any number of controllers, the HTTP endpoints
/// and leader election under one shutdown signal, and returns the first
/// fatal error; see the [crate docs](crate).
///
/// Everything it does can be done by hand with `kube-fleet`'s own types:
/// `Fleet::run` for each provider, `Controller::run` for each controller,
/// `Controller::status` for readiness.
#[must_use]
pub struct Manager {
    fleet: Fleet,
    providers: Vec<BoxStream<'static, ClusterEvent>>,
    controllers: Vec<Added>,
    address: Address,
    registry: Registry,
    depths: QueueDepths,
    election: Option<LeaderElection>,
    sharding: Option<Sharding>,
    strict: bool,
    shutdown: Option<BoxFuture<'static, ()>>,
}

impl std::fmt::Debug for Manager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let controllers: Vec<&str> = self.controllers.iter().map(|c| c.name.as_str()).collect();
        f.debug_struct("Manager")
            .field("controllers", &controllers)
            .field("providers", &self.providers.len())
            .field("election", &self.election)
            .field("sharding", &self.sharding)
            .field("strict_readiness", &self.strict)
            .finish_non_exhaustive()
    }
}

impl Manager {
    /// A manager of `fleet`, with no provider, controller or endpoint yet.
    /// Its metrics registry holds the fleet's gauge
    /// (`kube_fleet_engaged_clusters`), each added controller's queue depth
    /// (`workqueue_depth`) and each engaged cluster's API requests
    /// (`rest_client_requests_total`, `rest_client_request_duration_seconds`;
    /// see `kube_fleet_layers::metrics::ClientMetrics`).
    pub fn new(fleet: &Fleet) -> Self {
        let mut registry = Registry::default();
        FleetCollector::register(&mut registry, fleet.clone());
        ClientMetrics::register(&mut registry, fleet.clone());
        let depths = QueueDepths::register(&mut registry);
        Self {
            fleet: fleet.clone(),
            providers: Vec::new(),
            controllers: Vec::new(),
            address: Address::None,
            registry,
            depths,
            election: None,
            sharding: None,
            strict: false,
            shutdown: None,
        }
    }

    /// The fleet the manager runs.
    pub fn fleet(&self) -> &Fleet {
        &self.fleet
    }

    /// Runs `provider` in the fleet ([`Fleet::run`]) for as long as the
    /// manager runs, on every replica: clusters are engaged whether or not
    /// this replica leads (the watches there start with the controllers,
    /// once it leads). With
    /// [sharding](Self::sharding), the fleet engages only the clusters this
    /// replica runs.
    pub fn provider(mut self, provider: impl Stream<Item = ClusterEvent> + Send + 'static) -> Self {
        self.providers.push(provider.boxed());
        self
    }

    /// Runs `controller` with `service` ([`Controller::run`]) once this
    /// replica leads (at once without leader election), until the manager
    /// stops. The manager sets the controller's graceful shutdown: a
    /// signal given to the controller itself is replaced.
    pub fn controller<K, S>(mut self, controller: Controller<K>, service: S) -> Self
    where
        K: Watchable,
        S: Service<ObjectRequest<K>, Response = Action> + Send + 'static,
        S::Future: Send + 'static,
        S::Error: Into<BoxError>,
    {
        self.depths.add(controller.queue_depth());
        let name = controller.name().to_owned();
        let status = controller.status();
        let permissions = controller.permissions();
        let start: Start = Box::new(move |shutdown, gate| {
            controller
                .graceful_shutdown_on(shutdown)
                .run(GateLayer::new(gate).layer(service))
                .boxed()
        });
        self.controllers.push(Added {
            name,
            status,
            permissions,
            started: Arc::new(AtomicBool::new(false)),
            start,
        });
        self
    }

    /// Serves `/healthz`, `/readyz` and `/metrics` over HTTP on `address`
    /// (none by default). An address that cannot be bound ends
    /// [`run`](Self::run) at once with [`Error::Serve`].
    pub fn endpoints(mut self, address: SocketAddr) -> Self {
        self.address = Address::Bind(address);
        self
    }

    /// Serves the endpoints on a listener bound already: for port 0, whose
    /// number the caller learns from the listener.
    pub fn endpoints_on(mut self, listener: std::net::TcpListener) -> Self {
        self.address = Address::Listener(listener);
        self
    }

    /// The registry `/metrics` encodes: register the layers' metrics here
    /// (`ReconcileMetrics::new(manager.registry())`) or your own.
    pub fn registry(&mut self) -> &mut Registry {
        &mut self.registry
    }

    /// Runs the controllers only while this replica holds the Lease of
    /// `election`; see [`LeaderElection`].
    pub fn leader_election(mut self, election: LeaderElection) -> Self {
        self.election = Some(election);
        self
    }

    /// Splits the clusters the providers offer across the replicas that
    /// share `sharding`'s name, each run by one replica at a time; see
    /// [`Sharding`]. It replaces leader election: set one or the other.
    pub fn sharding(mut self, sharding: Sharding) -> Self {
        self.sharding = Some(sharding);
        self
    }

    /// Makes `/readyz` answer 503 while any cluster cannot sync. By default
    /// such a cluster is named in the body but the process stays ready, so
    /// that one broken cluster does not take the operator out of service.
    pub fn strict_readiness(mut self) -> Self {
        self.strict = true;
        self
    }

    /// Stops gracefully when `signal` completes: the controllers start no
    /// new reconcile and let running ones finish (within their shutdown
    /// timeout), then the Lease is released and [`run`](Self::run) returns
    /// `Ok`.
    pub fn graceful_shutdown_on(
        mut self,
        signal: impl Future<Output = ()> + Send + 'static,
    ) -> Self {
        self.shutdown = Some(signal.boxed());
        self
    }

    /// The RBAC rules the operator needs: every added controller's
    /// ([`Controller::permissions`], as it was when added), and, with
    /// [leader election](Self::leader_election), `get`, `create` and
    /// `update` on `coordination.k8s.io` Leases in the local cluster (with
    /// [sharding](Self::sharding), `list` and `delete` as well). A Lease
    /// reached through [`LeaderElection::client`] or [`Sharding::client`]
    /// lives in that client's cluster: a note says so, since the rules
    /// then belong there.
    ///
    /// ```
    /// use k8s_openapi::api::core::v1::ConfigMap;
    /// use kube::runtime::watcher;
    /// use kube_fleet::{Action, Controller, Fleet, ObjectRequest, rbac::{Rule, Scope}};
    /// use kube_fleet_manager::{LeaderElection, Manager};
    /// use tower::{BoxError, service_fn};
    ///
    /// let fleet = Fleet::new();
    /// let manager = Manager::new(&fleet)
    ///     .leader_election(LeaderElection::new("my-operator").namespace("operators"))
    ///     .controller(
    ///         Controller::<ConfigMap>::new(&fleet, watcher::Config::default())
    ///             .writes::<ConfigMap>(&["patch"]),
    ///         service_fn(|_: ObjectRequest<ConfigMap>| async {
    ///             Ok::<_, BoxError>(Action::await_change())
    ///         }),
    ///     );
    /// let permissions = manager.permissions();
    /// assert_eq!(
    ///     permissions.rules(Scope::Local),
    ///     [
    ///         Rule::new("", "configmaps", ["get", "list", "patch", "watch"]),
    ///         Rule::new("coordination.k8s.io", "leases", ["create", "get", "update"]),
    ///     ]
    /// );
    /// assert_eq!(
    ///     permissions.rules(Scope::Members),
    ///     [Rule::new("", "configmaps", ["get", "list", "patch", "watch"])]
    /// );
    /// ```
    pub fn permissions(&self) -> Permissions {
        let mut permissions = Permissions::new();
        for added in &self.controllers {
            permissions.merge(added.permissions.clone());
        }
        if let Some(election) = &self.election {
            let leases = Rule::new("coordination.k8s.io", "leases", ["get", "create", "update"]);
            permissions.grant(Scope::Local, leases);
            if election.client.is_some() {
                let namespace = match &election.namespace {
                    Some(namespace) => format!("namespace {namespace}"),
                    None => "its client's default namespace".to_owned(),
                };
                permissions.note(format!(
                    "the leader election Lease {} is reached through its own client: if that is not the local cluster, the leases rules belong in the Lease's cluster instead, and a Role in {namespace} suffices there",
                    election.name
                ));
            }
        }
        if let Some(sharding) = &self.sharding {
            let leases = Rule::new(
                "coordination.k8s.io",
                "leases",
                ["get", "list", "create", "update", "delete"],
            );
            permissions.grant(Scope::Local, leases);
            if sharding.client.is_some() {
                permissions.note(format!(
                    "the sharding Leases of {:?} are reached through their own client: if that is not the local cluster, the leases rules belong in that cluster instead",
                    sharding.name
                ));
            }
        }
        permissions
    }

    /// [`permissions`](Self::permissions) as YAML for `kubectl apply`: the
    /// ClusterRole `name` for the local cluster and `name-member` for the
    /// member clusters ([`Permissions::to_yaml`]). Bind each to the
    /// operator's identity in its clusters.
    ///
    /// ```
    /// # use kube_fleet::Fleet;
    /// # use kube_fleet_manager::Manager;
    /// let yaml = Manager::new(&Fleet::new()).rbac_yaml("my-operator");
    /// assert!(yaml.contains("kind: ClusterRole\nmetadata:\n  name: my-operator-member\nrules: []\n"));
    /// ```
    pub fn rbac_yaml(&self, name: &str) -> String {
        self.permissions().to_yaml(name)
    }

    /// Runs everything until the shutdown signal, or until the first fatal
    /// error: a controller that fails, leadership lost, the endpoints' server
    /// panicking. On an error the controllers are stopped before it returns.
    /// The endpoints answer until the controllers have stopped, and are
    /// closed when it returns: their port is free again and no connection
    /// is answered any more. A `run` future dropped rather than awaited to
    /// its end closes them a moment later, as their tasks are next polled.
    pub async fn run(self) -> Result<(), Error> {
        let Self {
            fleet,
            providers,
            controllers,
            address,
            mut registry,
            depths: _,
            election,
            sharding,
            strict,
            shutdown,
        } = self;
        if let (Some(election), Some(sharding)) = (&election, &sharding) {
            return Err(Error::Invalid {
                what: format!(
                    "leader election on {:?} and sharding {:?}",
                    election.name, sharding.name
                ),
                reason: "sharding replaces leader election: choose one".into(),
            });
        }
        let validity = Validity::closed();
        let role_sender = match &election {
            Some(election) => election.status.sender(),
            None => watch::Sender::new(Role::Leading),
        };
        let role = role_sender.subscribe();
        let (stop_election, election_stopped) = watch::channel(false);
        let release = Arc::new(AtomicBool::new(true));
        let mut elector: Option<BoxFuture<'static, Result<(), Error>>> = None;
        let mut lease = None;
        if let Some(election) = election {
            election.validate()?;
            let (client, namespace, identity) = lease_site(
                election.client,
                election.namespace,
                election.identity,
                || format!("leader election Lease {:?}", election.name),
            )
            .await?;
            let lock = LeaseLock::new(
                client,
                &namespace,
                &election.name,
                &holder_for(&identity),
                election.timings.lease_duration,
            );
            lease = Some(lock.key());
            LeaderGauge::register(&mut registry, election.name.clone(), role.clone());
            role_sender.send_replace(Role::Standby);
            elector = Some(
                lead(
                    lock,
                    election.timings,
                    validity.clone(),
                    role_sender.clone(),
                    election_stopped.clone(),
                    release.clone(),
                )
                .boxed(),
            );
        }
        let mut gate = if elector.is_some() {
            Gate::Leader(validity.clone())
        } else {
            Gate::Open
        };
        let mut providers = Some(providers);
        let mut shard_status = None;
        if let Some(sharding) = sharding {
            sharding.validate()?;
            let (client, namespace, identity) = lease_site(
                sharding.client,
                sharding.namespace,
                sharding.identity,
                || format!("sharding {:?}", sharding.name),
            )
            .await?;
            let shards = crate::gate::Shards::default();
            gate = Gate::Shards(shards.clone());
            shard_status = Some(sharding.status.clone());
            let sharder = Sharder::new(
                fleet.clone(),
                client,
                namespace,
                sharding.name,
                identity,
                sharding.timings,
                shards,
                sharding.status,
            );
            let offers = futures::stream::select_all(providers.take().unwrap_or_default()).boxed();
            elector = Some(sharder.run(offers, election_stopped.clone()).boxed());
        }

        // From here on, however `run` ends (its future dropped included),
        // no reconcile starts after and the statuses say so.
        let _stop = StopGuard {
            fleet: fleet.clone(),
            gate: gate.clone(),
            role: role_sender,
            shards: shard_status,
            started: controllers.iter().map(|c| c.started.clone()).collect(),
        };

        let readiness = Readiness {
            controllers: controllers
                .iter()
                .map(|added| Watched {
                    name: added.name.clone(),
                    status: added.status.clone(),
                    started: added.started.clone(),
                })
                .collect(),
            election: lease.clone().map(|lease| (lease, role.clone())),
            strict,
        };
        let endpoints = Arc::new(Endpoints {
            readiness,
            registry,
        });
        let listener = match address {
            Address::None => None,
            Address::Bind(address) => Some(
                TcpListener::bind(address)
                    .await
                    .map_err(|source| Error::Serve { address, source })?,
            ),
            Address::Listener(listener) => {
                let address = listener
                    .local_addr()
                    .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
                let listener = listener
                    .set_nonblocking(true)
                    .and_then(|()| TcpListener::from_std(listener))
                    .map_err(|source| Error::Serve { address, source })?;
                Some(listener)
            }
        };
        let mut tasks = Tasks::default();
        // Told to stop as `run` returns, the server closes its listener and
        // ends its connections; `run` waits for that.
        let (stop_serving, serving_stops) = watch::channel(false);
        let mut served = None;
        let mut server = match listener {
            Some(listener) => {
                let address = listener
                    .local_addr()
                    .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
                tracing::info!(%address, "serving /healthz, /readyz and /metrics");
                let handle = tokio::spawn(serve(listener, endpoints.clone(), serving_stops));
                tasks.0.push(handle.abort_handle());
                let ended = handle
                    .map(|ended| ended.map_err(|error| error.to_string()))
                    .boxed()
                    .shared();
                served = Some((address, ended.clone()));
                async move {
                    // Only a panic ends it before it is told to.
                    let reason = ended
                        .await
                        .err()
                        .unwrap_or_else(|| "the server ended".to_owned());
                    Error::Serve {
                        address,
                        source: std::io::Error::other(reason),
                    }
                }
                .boxed()
            }
            None => futures::future::pending().boxed(),
        };
        let result = async {
            for provider in providers.into_iter().flatten() {
                let fleet = fleet.clone();
                let run = tokio::spawn(async move { fleet.run(provider).await });
                tasks.0.push(run.abort_handle());
            }
            let mut shutdown = shutdown.unwrap_or_else(|| futures::future::pending().boxed());
            let mut elector_done = elector.is_none();
            let mut elector = elector.unwrap_or_else(|| futures::future::pending().boxed());

            // Wait to lead.
            if let Some(lease) = &lease {
                tracing::info!(%lease, "waiting to lead");
                let mut leading = role.clone();
                tokio::select! {
                    result = &mut elector => return result,
                    error = &mut server => {
                        let _ = stop_election.send(true);
                        let _ = elector.await;
                        return Err(error);
                    }
                    () = &mut shutdown => {
                        let _ = stop_election.send(true);
                        return elector.await;
                    }
                    _ = async { leading.wait_for(|role| *role == Role::Leading).await.is_ok() } => {}
                }
            }

            // Lead: run the controllers until they stop.
            let (halt, halted) = watch::channel(false);
            let mut running: FuturesUnordered<_> = controllers
                .into_iter()
                .map(|added| {
                    let mut halted = halted.clone();
                    let signal = async move {
                        let _ = halted.wait_for(|halt| *halt).await;
                    }
                    .boxed();
                    added.started.store(true, Ordering::SeqCst);
                    let handle = tokio::spawn((added.start)(signal, gate.clone()));
                    tasks.0.push(handle.abort_handle());
                    let name = added.name;
                    let started = added.started;
                    async move {
                        let ended = handle.await;
                        started.store(false, Ordering::SeqCst);
                        (name, ended)
                    }
                })
                .collect();
            let mut error: Option<Error> = None;
            let mut halting = false;
            loop {
                if running.is_empty() && (halting || error.is_some()) {
                    break;
                }
                tokio::select! {
                    () = &mut shutdown, if !halting => {
                        tracing::info!("shutting down");
                        halting = true;
                    }
                    Some((controller, ended)) = running.next() => match ended {
                        Ok(Ok(())) => {
                            if !halting {
                                tracing::info!(%controller, "controller stopped");
                            }
                        }
                        Ok(Err(source)) => {
                            error.get_or_insert(Error::Controller { controller, source });
                            halting = true;
                        }
                        Err(join) => {
                            error.get_or_insert(Error::Panicked { controller, message: join.to_string() });
                            halting = true;
                        }
                    },
                    result = &mut elector, if !elector_done => {
                        elector_done = true;
                        if let Err(lost) = result {
                            error.get_or_insert(lost);
                        }
                        halting = true;
                    }
                    failed = &mut server => {
                        error.get_or_insert(failed);
                        halting = true;
                        server = futures::future::pending().boxed();
                    }
                }
                if halting {
                    let _ = halt.send(true);
                }
            }
            // The controllers have returned; a reconcile they cancelled ends
            // as its task is next polled. Only then may the Lease go.
            if tokio::time::timeout(std::time::Duration::from_secs(5), validity.drained())
                .await
                .is_err()
            {
                tracing::warn!("reconciles still running 5 s after the controllers stopped");
                // Another replica must not start while they might run: the
                // Lease is left to expire rather than released.
                release.store(false, Ordering::SeqCst);
            }
            let _ = stop_election.send(true);
            if !elector_done && let Err(lost) = elector.await {
                error.get_or_insert(lost);
            }
            match error {
                Some(error) => Err(error),
                None => Ok(()),
            }
        }
        .await;
        // Closed before `run` returns: the port is free again and no
        // connection, kept alive or new, is answered.
        let _ = stop_serving.send(true);
        let mut result = result;
        if let Some((address, served)) = served
            && let Err(reason) = served.await
        {
            // A panic while nothing watched the server (the controllers
            // stopping, the Lease going) is reported all the same.
            result = result.and(Err(Error::Serve {
                address,
                source: std::io::Error::other(reason),
            }));
        }
        drop(endpoints);
        result
    }
}

/// The cluster, namespace and identity of a Lease: those given, or the
/// local cluster's client, its default namespace, and a random identity on
/// this host. `what` names the Lease in an error.
async fn lease_site(
    client: Option<Client>,
    namespace: Option<String>,
    identity: Option<String>,
    what: impl FnOnce() -> String,
) -> Result<(Client, String, String), Error> {
    let client = match client {
        Some(client) => client,
        None => Client::try_default()
            .await
            .map_err(|source| Error::Client {
                what: what(),
                source,
            })?,
    };
    let namespace = namespace.unwrap_or_else(|| client.default_namespace().to_owned());
    let identity = identity.unwrap_or_else(default_identity);
    Ok((client, namespace, identity))
}

/// Stops what `run` started when it returns or its future is dropped:
/// closes the gates, so that no reconcile starts after and running ones
/// stop when next polled; ends the sharding status's stretches of
/// ownership; says the replica no longer leads; and marks the controllers
/// as not running. After a return all this has happened already, and it
/// changes nothing.
struct StopGuard {
    /// The fleet, whose sharded clusters the guard disengages.
    fleet: Fleet,
    gate: Gate,
    role: watch::Sender<Role>,
    shards: Option<ShardStatus>,
    started: Vec<Arc<AtomicBool>>,
}

impl Drop for StopGuard {
    fn drop(&mut self) {
        // The clusters this replica ran as a shard: with the run gone,
        // nothing renews their Leases, so they leave the fleet, their
        // watches with them.
        for cluster in self.gate.close() {
            self.fleet.disengage(&cluster);
        }
        if let Some(status) = &self.shards {
            status.stopped(tokio::time::Instant::now());
        }
        self.role.send_replace(Role::Stopped);
        for started in &self.started {
            started.store(false, Ordering::SeqCst);
        }
    }
}

/// Aborts the manager's tasks when it returns or is dropped.
#[derive(Default)]
struct Tasks(Vec<tokio::task::AbortHandle>);

impl Drop for Tasks {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}
