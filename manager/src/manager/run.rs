//! [`Manager::run`], in the steps it takes: decide who may reconcile
//! (everyone, the leader, or each cluster's shard), serve the endpoints,
//! start the providers, wait to lead, run the controllers until they stop,
//! hand the Lease back, and close the endpoints.
//!
//! One file of a little over 500 lines, on purpose: the steps hand each
//! other the run's state (the gate, the election, the server), and are
//! read in the order they run.

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use futures::{
    FutureExt, StreamExt,
    future::{BoxFuture, Shared},
    stream::{BoxStream, FuturesUnordered},
};
use kube::Client;
use kube_multicluster::{Fleet, provider::ClusterEvent};
use prometheus_client::registry::Registry;
use tokio::{net::TcpListener, sync::watch};
use tokio_util::sync::CancellationToken;

use super::{
    Added, Address, Manager,
    stop::{StopGuard, Tasks},
};
use crate::{
    election::{LeaderElection, Role, default_identity, lead},
    error::Error,
    gate::{Gate, HubShards, Hubs, Shards, Validity},
    http::{Endpoints, serve},
    lease::{LeaseLock, holder_for},
    metrics::{LeaderGauge, ShardGauge},
    readiness::{Readiness, Watched},
    shard::{ShardStatus, Sharding},
    sharder::{Rejoins, Sharder},
    timing::LeaseParams,
};

/// How long the controllers' cancelled reconciles may take to end before
/// the Lease is left to expire rather than released.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// Who may reconcile, and what keeps it so.
struct Coordination {
    /// Whether a reconcile may run: always, while leading, or in the
    /// clusters this replica's shard owns.
    gate: Gate,
    /// While leading: the Lease is valid, and reconciles started under it.
    validity: Arc<Validity>,
    role_sender: watch::Sender<Role>,
    role: watch::Receiver<Role>,
    /// The leader election or the sharder, which runs as it is polled.
    elector: Option<BoxFuture<'static, Result<(), Error>>>,
    /// The leader election's Lease, as `namespace/name`.
    lease: Option<String>,
    stop_election: CancellationToken,
    /// Whether the Lease may be released as the run ends.
    release: Arc<AtomicBool>,
    shard_status: Option<ShardStatus>,
    /// The providers, unless the sharder took them to offer their clusters.
    providers: Option<Vec<BoxStream<'static, ClusterEvent>>>,
}

/// How the endpoints' server task ended: `Err` with a panic's message.
type Ended = Shared<BoxFuture<'static, Result<(), String>>>;

/// The endpoints' server, while it runs.
struct Serving {
    /// Told to stop as the run returns.
    stop: CancellationToken,
    /// Where it listens, and how it ended.
    served: Option<(SocketAddr, Ended)>,
    /// Ready only if the server ends before it is told to (it panicked).
    failed: BoxFuture<'static, Error>,
}

impl Manager {
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
            workqueues: _,
            election,
            sharding,
            strict,
            shutdown,
            taken,
            #[cfg(feature = "webhooks")]
            webhooks,
        } = self;
        let Coordination {
            gate,
            validity,
            role_sender,
            role,
            elector,
            lease,
            stop_election,
            release,
            shard_status,
            providers,
        } = coordinate(&fleet, providers, election, sharding, taken, &mut registry).await?;
        #[cfg(feature = "webhooks")]
        let replicated = lease.is_some() || shard_status.is_some();

        // From here on, however `run` ends (its future dropped included),
        // no reconcile starts after and the statuses say so.
        let _stop = StopGuard {
            fleet: fleet.clone(),
            gate: gate.clone(),
            role: role_sender,
            shards: shard_status,
            started: controllers.iter().map(|c| c.started.clone()).collect(),
        };

        // Served by every replica, from the start.
        #[cfg(feature = "webhooks")]
        let mut webhooks = match webhooks {
            Some(setup) => Some(super::webhooks::Running::start(
                setup,
                &fleet,
                &mut registry,
                replicated,
            )?),
            None => None,
        };
        #[allow(unused_mut)]
        let mut readiness = readiness(&fleet, &controllers, lease.clone(), &role, strict);
        #[cfg(feature = "webhooks")]
        {
            readiness.webhooks = webhooks.as_ref().map(|w| w.status());
        }
        let endpoints = Arc::new(Endpoints {
            readiness,
            registry,
        });
        let listener = bind(address).await?;
        let mut tasks = Tasks::default();
        let mut serving = start_serving(listener, endpoints.clone(), &mut tasks);
        let mut controllers = controllers;
        let result = async {
            // Warm standbys' watches follow the fleet from the start.
            for warm in controllers.iter_mut().filter_map(|c| c.warm.take()) {
                let run = tokio::spawn(warm);
                tasks.0.push(run.abort_handle());
            }
            for provider in providers.into_iter().flatten() {
                let fleet = fleet.clone();
                let run = tokio::spawn(async move { fleet.run(provider).await });
                tasks.0.push(run.abort_handle());
            }
            // Registered by whoever reconciles: each replica for its own
            // clusters with sharding, the only one without an election.
            #[cfg(feature = "webhooks")]
            if lease.is_none()
                && let Some(webhooks) = &mut webhooks
            {
                webhooks.register(&mut tasks, role.clone());
            }
            let mut shutdown = shutdown.unwrap_or_else(|| futures::future::pending().boxed());
            let mut elector_done = elector.is_none();
            let mut elector = elector.unwrap_or_else(|| futures::future::pending().boxed());
            if let Some(lease) = &lease
                && let Some(ended) = wait_to_lead(
                    lease,
                    &role,
                    &mut elector,
                    &mut serving.failed,
                    &mut shutdown,
                    &stop_election,
                )
                .await
            {
                return ended;
            }
            // The leader, from here on.
            #[cfg(feature = "webhooks")]
            if let Some(webhooks) = &mut webhooks {
                webhooks.register(&mut tasks, role.clone());
            }
            let mut error = run_controllers(
                controllers,
                &gate,
                &mut tasks,
                &mut shutdown,
                &mut elector,
                &mut elector_done,
                &mut serving.failed,
            )
            .await;
            // Before the Lease goes, and while it is renewed: the next
            // leader's writes are its own. Leadership lost meanwhile ends
            // the removal where it is.
            #[cfg(feature = "webhooks")]
            if let Some(webhooks) = &mut webhooks {
                let clean = error.is_none();
                tokio::select! {
                    () = webhooks.stop_registering(clean) => {}
                    result = &mut elector, if !elector_done => {
                        elector_done = true;
                        if let Err(lost) = result {
                            error.get_or_insert(lost);
                        }
                    }
                }
            }
            hand_back(&validity, &release, &stop_election).await;
            if !elector_done && let Err(lost) = elector.await {
                error.get_or_insert(lost);
            }
            match error {
                Some(error) => Err(error),
                None => Ok(()),
            }
        }
        .await;
        #[cfg(feature = "webhooks")]
        if let Some(webhooks) = webhooks {
            webhooks.end(result.is_ok()).await;
        }
        let result = close(serving, result).await;
        drop(endpoints);
        result
    }
}

/// Who may reconcile: with leader election, the leader, once its Lease is
/// taken (the election is made ready to run, not started); with sharding,
/// each cluster's owner (the sharder takes the providers, to offer their
/// clusters); otherwise everyone. Both at once are refused.
async fn coordinate(
    fleet: &Fleet,
    providers: Vec<BoxStream<'static, ClusterEvent>>,
    election: Option<LeaderElection>,
    sharding: Option<Sharding>,
    taken: watch::Sender<u64>,
    registry: &mut Registry,
) -> Result<Coordination, Error> {
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
    let stop_election = CancellationToken::new();
    let release = Arc::new(AtomicBool::new(true));
    let mut elector: Option<BoxFuture<'static, Result<(), Error>>> = None;
    let mut lease = None;
    if let Some(election) = election {
        election.validate()?;
        let what = format!("leader election Lease {:?}", election.name);
        let (client, namespace, identity) = lease_site(&election.lease, what).await?;
        let lock = LeaseLock::new(
            client,
            &namespace,
            &election.name,
            &holder_for(&identity),
            election.lease.timings.lease_duration,
        );
        lease = Some(lock.key());
        LeaderGauge::register(registry, election.name.clone(), role.clone());
        role_sender.send_replace(Role::Standby);
        elector = Some(
            lead(
                lock,
                election.lease.timings,
                validity.clone(),
                role_sender.clone(),
                stop_election.clone(),
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
        let what = format!("sharding {:?}", sharding.name);
        let (client, namespace, identity) = lease_site(&sharding.lease, what).await?;
        let shards = Shards::default();
        let rejoin_after = sharding.rejoin_wait();
        let hubs = sharding.hubs.map(|clusters| Hubs {
            clusters,
            shards: HubShards::default(),
            count: sharding.shards,
        });
        gate = Gate::Shards(shards.clone(), hubs.clone());
        shard_status = Some(sharding.status.clone());
        ShardGauge::register(
            registry,
            sharding.name.clone(),
            sharding.shards,
            sharding.status.clone(),
            hubs.as_ref().map(|hubs| hubs.shards.clone()),
        );
        let sharder = Sharder::new(
            fleet.clone(),
            client,
            namespace,
            sharding.name,
            sharding.shards,
            identity,
            sharding.lease.timings,
            shards,
            sharding.status,
            Rejoins::new(rejoin_after),
            (hubs, taken),
        );
        let offers = futures::stream::select_all(providers.take().unwrap_or_default()).boxed();
        elector = Some(sharder.run(offers, stop_election.clone()).boxed());
    }
    Ok(Coordination {
        gate,
        validity,
        role_sender,
        role,
        elector,
        lease,
        stop_election,
        release,
        shard_status,
        providers,
    })
}

/// What `/readyz` reports on: each controller, and the election.
fn readiness(
    fleet: &Fleet,
    controllers: &[Added],
    lease: Option<String>,
    role: &watch::Receiver<Role>,
    strict: bool,
) -> Readiness {
    Readiness {
        fleet: fleet.clone(),
        controllers: controllers
            .iter()
            .map(|added| Watched {
                name: added.name.clone(),
                status: added.status.clone(),
                started: added.started.clone(),
            })
            .collect(),
        election: lease.map(|lease| (lease, role.clone())),
        strict,
        #[cfg(feature = "webhooks")]
        webhooks: None,
    }
}

/// The endpoints' listener, if they are served.
async fn bind(address: Address) -> Result<Option<TcpListener>, Error> {
    Ok(match address {
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
    })
}

/// Serves the endpoints on `listener` until told to stop: then the server
/// closes its listener and ends its connections.
fn start_serving(
    listener: Option<TcpListener>,
    endpoints: Arc<Endpoints>,
    tasks: &mut Tasks,
) -> Serving {
    let stop = CancellationToken::new();
    let Some(listener) = listener else {
        return Serving {
            stop,
            served: None,
            failed: futures::future::pending().boxed(),
        };
    };
    let address = listener
        .local_addr()
        .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
    tracing::info!(%address, "serving /healthz, /readyz and /metrics");
    let handle = tokio::spawn(serve(listener, endpoints, stop.clone()));
    tasks.0.push(handle.abort_handle());
    let ended = handle
        .map(|ended| ended.map_err(|error| error.to_string()))
        .boxed()
        .shared();
    let failed = {
        let ended = ended.clone();
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
    };
    Serving {
        stop,
        served: Some((address, ended)),
        failed,
    }
}

/// Waits until this replica leads. `Some` of how the run ends if it ends
/// first: the election ended (failed), or the server failed or the
/// shutdown came (each of these two stops the election and waits for it).
async fn wait_to_lead(
    lease: &str,
    role: &watch::Receiver<Role>,
    elector: &mut BoxFuture<'static, Result<(), Error>>,
    server: &mut BoxFuture<'static, Error>,
    shutdown: &mut BoxFuture<'static, ()>,
    stop_election: &CancellationToken,
) -> Option<Result<(), Error>> {
    tracing::info!(%lease, "waiting to lead");
    let mut leading = role.clone();
    tokio::select! {
        result = &mut *elector => Some(result),
        error = &mut *server => {
            stop_election.cancel();
            let _ = elector.await;
            Some(Err(error))
        }
        () = &mut *shutdown => {
            stop_election.cancel();
            Some(elector.await)
        }
        _ = async { leading.wait_for(|role| *role == Role::Leading).await.is_ok() } => None,
    }
}

/// Runs the controllers until each has returned: told to stop by the
/// shutdown signal, by the first controller that fails or panics, by the
/// election or the sharder ending, or by the server failing. The first
/// error, if any.
async fn run_controllers(
    controllers: Vec<Added>,
    gate: &Gate,
    tasks: &mut Tasks,
    shutdown: &mut BoxFuture<'static, ()>,
    elector: &mut BoxFuture<'static, Result<(), Error>>,
    elector_done: &mut bool,
    server: &mut BoxFuture<'static, Error>,
) -> Option<Error> {
    let halt = CancellationToken::new();
    let mut running: FuturesUnordered<_> = controllers
        .into_iter()
        .map(|added| {
            let signal = halt.clone().cancelled_owned().boxed();
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
            () = &mut *shutdown, if !halting => {
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
            result = &mut *elector, if !*elector_done => {
                *elector_done = true;
                if let Err(lost) = result {
                    error.get_or_insert(lost);
                }
                halting = true;
            }
            failed = &mut *server => {
                error.get_or_insert(failed);
                halting = true;
                *server = futures::future::pending().boxed();
            }
        }
        if halting {
            halt.cancel();
        }
    }
    error
}

/// Once the controllers have returned: waits for the reconciles they
/// cancelled to end (each as its task is next polled), and only then lets
/// the Lease go, by stopping the election. If they do not end in time, the
/// Lease is left to expire rather than released, so that another replica
/// cannot start while they might still run.
async fn hand_back(validity: &Validity, release: &AtomicBool, stop_election: &CancellationToken) {
    if tokio::time::timeout(DRAIN_TIMEOUT, validity.drained())
        .await
        .is_err()
    {
        tracing::warn!(timeout = ?DRAIN_TIMEOUT, "reconciles still running after the controllers stopped");
        release.store(false, Ordering::SeqCst);
    }
    stop_election.cancel();
}

/// Closes the endpoints before `run` returns, so that the port is free
/// again and no connection, kept alive or new, is answered; a server that
/// panicked while nothing watched it (the controllers stopping, the Lease
/// going) is reported all the same.
async fn close(serving: Serving, result: Result<(), Error>) -> Result<(), Error> {
    serving.stop.cancel();
    if let Some((address, served)) = serving.served
        && let Err(reason) = served.await
    {
        return result.and(Err(Error::Serve {
            address,
            source: std::io::Error::other(reason),
        }));
    }
    result
}

/// The cluster, namespace and identity of a Lease: those given, or the
/// local cluster's client, its default namespace, and a random identity on
/// this host. `what` names the Lease in an error.
async fn lease_site(lease: &LeaseParams, what: String) -> Result<(Client, String, String), Error> {
    let client = match lease.client.clone() {
        Some(client) => client,
        None => Client::try_default()
            .await
            .map_err(|source| Error::Client { what, source })?,
    };
    let namespace = lease
        .namespace
        .clone()
        .unwrap_or_else(|| client.default_namespace().to_owned());
    let identity = lease.identity.clone().unwrap_or_else(default_identity);
    Ok((client, namespace, identity))
}
