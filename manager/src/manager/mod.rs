//! The entry point: a fleet's providers, its controllers, the endpoints and
//! leader election under one shutdown.

mod run;
mod stop;
#[cfg(feature = "webhooks")]
mod webhooks;

use std::{
    net::SocketAddr,
    sync::{Arc, atomic::AtomicBool},
};

use futures::{FutureExt, Stream, StreamExt, future::BoxFuture, stream::BoxStream};
use kube_multicluster::{
    Action, Controller, Duplicates, Fleet, ObjectRequest,
    cache::Watchable,
    controller::ControllerStatus,
    identity::ClusterIdentity,
    provider::ClusterEvent,
    rbac::{Permissions, Rule, Scope},
};
use kube_multicluster_layers::metrics::{ClientMetrics, FleetCollector, WorkqueueMetrics};
use prometheus_client::registry::Registry;
use tower::{BoxError, Layer, Service};

use crate::{
    election::LeaderElection,
    gate::{Gate, GateLayer},
    shard::Sharding,
};

type Start = Box<
    dyn FnOnce(
            BoxFuture<'static, ()>,
            Gate,
        ) -> BoxFuture<'static, Result<(), kube_multicluster::controller::Error>>
        + Send,
>;

struct Added {
    name: String,
    status: ControllerStatus,
    /// The controller's RBAC rules, read when it was added.
    permissions: Permissions,
    started: Arc<AtomicBool>,
    start: Start,
    /// Its watches kept synced from the manager's start, for a controller
    /// configured as a warm standby.
    warm: Option<kube_multicluster::controller::WarmUp>,
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
/// Everything it does can be done by hand with `kube-multicluster`'s own types:
/// `Fleet::run` for each provider, `Controller::run` for each controller,
/// `Controller::status` for readiness.
#[must_use]
pub struct Manager {
    fleet: Fleet,
    providers: Vec<BoxStream<'static, ClusterEvent>>,
    controllers: Vec<Added>,
    address: Address,
    registry: Registry,
    workqueues: WorkqueueMetrics,
    election: Option<LeaderElection>,
    sharding: Option<Sharding>,
    strict: bool,
    shutdown: Option<BoxFuture<'static, ()>>,
    /// Bumped when this replica takes shards that hold hub keys: each
    /// controller then queues every key again.
    taken: tokio::sync::watch::Sender<u64>,
    #[cfg(feature = "webhooks")]
    webhooks: Option<webhooks::Setup>,
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
    /// Its metrics registry holds the fleet's gauges
    /// (`kube_multicluster_engaged_clusters`, `kube_multicluster_cluster_health`), each
    /// added controller's queue per cluster (`workqueue_depth` and the other
    /// workqueue metrics; see `kube_multicluster_layers::metrics::WorkqueueMetrics`)
    /// and each engaged cluster's API requests
    /// (`rest_client_requests_total`, `rest_client_request_duration_seconds`;
    /// see `kube_multicluster_layers::metrics::ClientMetrics`).
    pub fn new(fleet: &Fleet) -> Self {
        let mut registry = Registry::default();
        FleetCollector::register(&mut registry, fleet.clone());
        ClientMetrics::register(&mut registry, fleet.clone());
        let workqueues = WorkqueueMetrics::register(&mut registry);
        Self {
            fleet: fleet.clone(),
            providers: Vec::new(),
            controllers: Vec::new(),
            address: Address::None,
            registry,
            workqueues,
            election: None,
            sharding: None,
            strict: false,
            shutdown: None,
            taken: tokio::sync::watch::Sender::new(0),
            #[cfg(feature = "webhooks")]
            webhooks: None,
        }
    }

    /// The fleet the manager runs.
    pub fn fleet(&self) -> &Fleet {
        &self.fleet
    }

    /// Runs `provider` in the fleet ([`Fleet::run`]) for as long as the
    /// manager runs, on every replica: clusters are engaged whether or not
    /// this replica leads (the watches there start with the controllers,
    /// once it leads, or at once for a controller configured as a
    /// [warm standby](kube_multicluster::controller::Config::warm_standby)). With
    /// [sharding](Self::sharding), the fleet engages only the clusters this
    /// replica runs, and the [hubs](crate::Sharding::hub).
    pub fn provider(mut self, provider: impl Stream<Item = ClusterEvent> + Send + 'static) -> Self {
        self.providers.push(provider.boxed());
        self
    }

    /// Runs `controller` with `service` ([`Controller::run`]) once this
    /// replica leads (at once without leader election), until the manager
    /// stops. The manager sets the controller's graceful shutdown: a
    /// signal given to the controller itself is replaced. A controller
    /// configured with
    /// [`Config::warm_standby`](kube_multicluster::controller::Config::warm_standby)
    /// has its watches kept synced from the manager's start, while this
    /// replica waits for the Lease, so that it reconciles at once on taking
    /// over ([`Controller::warm_up`]).
    pub fn controller<K, S>(mut self, controller: Controller<K>, service: S) -> Self
    where
        K: Watchable,
        S: Service<ObjectRequest<K>, Response = Action> + Send + 'static,
        S::Future: Send + 'static,
        S::Error: Into<BoxError>,
    {
        self.workqueues.add(controller.queue_metrics());
        let name = controller.name().to_owned();
        let status = controller.status();
        let permissions = controller.permissions();
        let warm = controller
            .config()
            .is_warm_standby()
            .then(|| controller.warm_up());
        // With hubs, the keys of the shards this replica takes run again.
        let taken = futures::stream::unfold(self.taken.subscribe(), |mut taken| async move {
            taken.changed().await.ok()?;
            Some(((), taken))
        });
        let controller = controller.reconcile_all_on(taken);
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
            warm,
        });
        self
    }

    /// Serves `/healthz`, `/readyz` and `/metrics` over HTTP on `address`
    /// (none by default). An address that cannot be bound ends
    /// [`run`](Self::run) at once with [`Error::Serve`](crate::Error::Serve).
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

    /// Serves `webhooks` over HTTPS on `address`, on every replica from the
    /// start of [`run`](Self::run) (admission must not wait for a leader),
    /// and writes their registrations from the replica that reconciles:
    /// the leader with [leader election](Self::leader_election), each
    /// replica for the clusters its fleet engages with
    /// [sharding](Self::sharding), or the only one. `/readyz` says whether
    /// the server serves, and `/metrics` carries its metrics
    /// (`controller_runtime_webhook_requests_total` and the rest; see the
    /// "Webhooks" chapter).
    ///
    /// With leader election or sharding, replicas share requests and must
    /// share the tokens' key
    /// ([`Webhooks::token_key_file`](kube_multicluster_webhook::Webhooks::token_key_file))
    /// and the certificate
    /// ([`Certificates::files`](kube_multicluster_webhook::Certificates::files)):
    /// without them, [`run`](Self::run) ends at once with
    /// [`Error::Invalid`](crate::Error::Invalid). A replica writes the
    /// registrations only while it leads, and with
    /// [`unregister_on_shutdown`](kube_multicluster_webhook::Webhooks::unregister_on_shutdown)
    /// removes them at a graceful stop before it lets the Lease go. A certificate or key
    /// file that cannot be read, or a webhook the API server would refuse,
    /// ends it with [`Error::Webhooks`](crate::Error::Webhooks) naming it.
    #[cfg(feature = "webhooks")]
    #[cfg_attr(docsrs, doc(cfg(feature = "webhooks")))]
    pub fn webhooks(
        mut self,
        webhooks: kube_multicluster_webhook::Webhooks,
        address: SocketAddr,
    ) -> Self {
        self.webhooks = Some(webhooks::Setup {
            webhooks,
            listener: webhooks::Listener::Bind(address),
        });
        self
    }

    /// Serves `webhooks` on a listener bound already (for port 0); see
    /// [`webhooks`](Self::webhooks).
    #[cfg(feature = "webhooks")]
    #[cfg_attr(docsrs, doc(cfg(feature = "webhooks")))]
    pub fn webhooks_on(
        mut self,
        webhooks: kube_multicluster_webhook::Webhooks,
        listener: std::net::TcpListener,
    ) -> Self {
        self.webhooks = Some(webhooks::Setup {
            webhooks,
            listener: webhooks::Listener::Bound(listener),
        });
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
    /// reached through another [`LeaseParams::client`](crate::LeaseParams::client)
    /// lives in that client's cluster: a note says so, since the rules
    /// then belong there. Unless the fleet ignores
    /// [duplicates](kube_multicluster::Duplicates::Ignore), `get` on `namespaces`
    /// and on `about.k8s.io` `clusterproperties` in every cluster as well
    /// ([`ClusterIdentity::rules`]): the fleet reads each cluster's identity
    /// to find one cluster under two names.
    ///
    /// ```
    /// use k8s_openapi::api::core::v1::ConfigMap;
    /// use kube::runtime::watcher;
    /// use kube_multicluster::{Action, Controller, Fleet, ObjectRequest, rbac::{Rule, Scope}};
    /// use kube_multicluster_manager::{LeaderElection, LeaseParams, Manager};
    /// use tower::{BoxError, service_fn};
    ///
    /// // Names that are one cluster are its providers' to keep apart.
    /// let fleet = Fleet::with_config(kube_multicluster::FleetConfig { duplicates: kube_multicluster::Duplicates::Ignore, ..kube_multicluster::FleetConfig::default() });
    /// let manager = Manager::new(&fleet)
    ///     .leader_election(LeaderElection::new("my-operator").lease(LeaseParams::default().namespace("operators")))
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
        if self.fleet.config().duplicates != Duplicates::Ignore {
            // The fleet reads each cluster's identity to find one cluster
            // under two names.
            for rule in ClusterIdentity::rules() {
                permissions.grant(Scope::Local, rule.clone());
                permissions.grant(Scope::Members, rule);
            }
        }
        if let Some(election) = &self.election {
            let leases = Rule::new("coordination.k8s.io", "leases", ["get", "create", "update"]);
            permissions.grant(Scope::Local, leases);
            if election.lease.client.is_some() {
                let namespace = match &election.lease.namespace {
                    Some(namespace) => format!("namespace {namespace}"),
                    None => "its client's default namespace".to_owned(),
                };
                permissions.note(format!(
                    "the leader election Lease {} is reached through its own client: if that is not the local cluster, the leases rules belong in the Lease's cluster instead, and a Role in {namespace} suffices there",
                    election.name
                ));
            }
        }
        #[cfg(feature = "webhooks")]
        if let Some(setup) = &self.webhooks {
            permissions.merge(setup.webhooks.permissions());
        }
        if let Some(sharding) = &self.sharding {
            let leases = Rule::new(
                "coordination.k8s.io",
                "leases",
                ["get", "list", "create", "update", "delete"],
            );
            permissions.grant(Scope::Local, leases);
            if sharding.lease.client.is_some() {
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
    /// # use kube_multicluster::Fleet;
    /// # use kube_multicluster_manager::Manager;
    /// let yaml = Manager::new(&Fleet::new()).rbac_yaml("my-operator");
    /// assert!(yaml.contains("kind: ClusterRole\nmetadata:\n  name: my-operator-member\n"));
    /// // The fleet reads each cluster's identity.
    /// assert!(yaml.contains("- clusterproperties"));
    /// ```
    pub fn rbac_yaml(&self, name: &str) -> String {
        self.permissions().to_yaml(name)
    }
}
