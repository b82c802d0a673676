//! A webhook server once started: its tasks, its status, and the
//! registration it runs on request.

use std::{collections::HashMap, net::SocketAddr, sync::Arc, time::Duration};

use kube_multicluster::{ClusterName, Fleet, FleetEvent};
use prometheus_client::registry::Registry;
use tokio::task::AbortHandle;
use tokio_rustls::{
    TlsAcceptor,
    rustls::{ServerConfig, crypto::ring::default_provider},
};
use tokio_util::sync::CancellationToken;

use crate::{
    certificates::{Certificates, Loaded, Resolver},
    error::Error,
    handler::Handler,
    metrics::Metrics,
    registration::{self, Plan},
    server::{self, Shared},
};

/// How long requests in flight may take to finish once the server stops.
const DRAIN: Duration = Duration::from_secs(10);

/// The source under which a certificate that cannot be read again is
/// reported in the fleet's problems.
pub(crate) const CERTIFICATE_SOURCE: &str = "webhook certificate";

/// What [`Webhooks::start`](crate::Webhooks::start) has checked and made.
pub(crate) struct Launch<'a> {
    pub(crate) fleet: &'a Fleet,
    pub(crate) listener: std::net::TcpListener,
    pub(crate) registry: Option<&'a mut Registry>,
    pub(crate) handlers: HashMap<Arc<str>, Handler>,
    pub(crate) plan: Plan,
    pub(crate) loaded: Arc<Loaded>,
    pub(crate) certificates: &'a Certificates,
    pub(crate) unregister_on_shutdown: bool,
}

/// Starts the server's tasks: the listener, the certificate's reload and
/// the metrics' cleanup.
pub(crate) fn launch(launch: Launch<'_>) -> Result<WebhookServer, Error> {
    let Launch {
        fleet,
        listener,
        registry,
        handlers,
        plan,
        loaded,
        certificates,
        unregister_on_shutdown,
    } = launch;
    let metrics = registry.map_or_else(Metrics::unregistered, Metrics::register);
    let address = listener.local_addr().map_err(|source| Error::Bind {
        address: "the listener given".into(),
        source,
    })?;
    let bind_error = |source| Error::Bind {
        address: address.to_string(),
        source,
    };
    listener.set_nonblocking(true).map_err(bind_error)?;
    let listener = tokio::net::TcpListener::from_std(listener).map_err(bind_error)?;

    let mut config = ServerConfig::builder_with_provider(Arc::new(default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Generate(e.to_string()))?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(Resolver(loaded.clone())));
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let tls = TlsAcceptor::from(Arc::new(config));

    let names: Vec<Arc<str>> = handlers.keys().cloned().collect();
    let shared = Arc::new(Shared {
        handlers,
        tokens: plan.tokens.clone(),
        fleet: fleet.clone(),
        metrics: metrics.clone(),
    });
    let stop = CancellationToken::new();
    let alive = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let served = tokio::spawn({
        let alive = alive.clone();
        let stop = stop.clone();
        async move {
            // Told false however the task ends, a panic included.
            let _alive = Alive(alive);
            server::serve(listener, tls, shared, stop, DRAIN).await;
        }
    });
    let mut tasks = Vec::new();
    let problems = fleet.problems();
    if let Some(reload) = certificates.reload(loaded.clone(), move |error| match error {
        Some(error) => problems.report(CERTIFICATE_SOURCE, error),
        None => problems.clear(CERTIFICATE_SOURCE),
    }) {
        tasks.push(tokio::spawn(reload).abort_handle());
    }
    tasks.push(tokio::spawn(forget_leavers(fleet.clone(), metrics)).abort_handle());
    Ok(WebhookServer {
        status: WebhookStatus {
            address,
            alive,
            webhooks: names.len(),
        },
        plan: Arc::new(plan),
        loaded,
        fleet: fleet.clone(),
        names,
        stop,
        served: Some(served),
        tasks,
        unregister_on_shutdown,
    })
}

/// Removes the metrics of each cluster that leaves (and does not come
/// back at once).
async fn forget_leavers(fleet: Fleet, metrics: Metrics) {
    let mut events = fleet.subscribe().events;
    while let Some(event) = events.recv().await {
        if let FleetEvent::Disengaged(name) = event
            && fleet.get(&name).is_none()
        {
            metrics.forget(&name);
        }
    }
}

/// Sets the flag false when dropped.
struct Alive(Arc<std::sync::atomic::AtomicBool>);

impl Drop for Alive {
    fn drop(&mut self) {
        self.0.store(false, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Whether a webhook server serves, for a readiness check: cheap to clone,
/// and kept apart from the server so that it can be read while the server
/// is owned elsewhere.
#[derive(Clone, Debug)]
pub struct WebhookStatus {
    address: SocketAddr,
    alive: Arc<std::sync::atomic::AtomicBool>,
    webhooks: usize,
}

impl WebhookStatus {
    /// Whether the server accepts connections: false once it has stopped,
    /// however that came.
    pub fn is_serving(&self) -> bool {
        self.alive.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Where it listens.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// How many webhooks it serves.
    pub fn webhooks(&self) -> usize {
        self.webhooks
    }
}

/// A webhook server, serving from [`Webhooks::start`](crate::Webhooks::start) until it is
/// [shut down](Self::shutdown) or dropped.
pub struct WebhookServer {
    status: WebhookStatus,
    plan: Arc<Plan>,
    loaded: Arc<Loaded>,
    fleet: Fleet,
    names: Vec<Arc<str>>,
    stop: CancellationToken,
    served: Option<tokio::task::JoinHandle<()>>,
    tasks: Vec<AbortHandle>,
    unregister_on_shutdown: bool,
}

impl std::fmt::Debug for WebhookServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookServer")
            .field("address", &self.status.address)
            .field("webhooks", &self.names)
            .finish_non_exhaustive()
    }
}

impl WebhookServer {
    /// Where the server listens.
    pub fn local_addr(&self) -> SocketAddr {
        self.status.address
    }

    /// The CA bundle (PEM) written into the registrations now.
    pub fn ca_bundle(&self) -> String {
        self.loaded.ca_bundle().borrow().to_string()
    }

    /// The certificate chain served now, DER-encoded, the serving
    /// certificate first.
    pub fn certificate_chain(&self) -> Vec<Vec<u8>> {
        self.loaded
            .chain()
            .into_iter()
            .map(|cert| cert.as_ref().to_vec())
            .collect()
    }

    /// Where `cluster` is registered to send `webhook`'s requests: its URL
    /// (or, through the local Service, the Service's address and path),
    /// with the cluster's token. `None` for a cluster not registered in, or
    /// a webhook not served.
    pub fn registered_address(&self, cluster: &ClusterName, webhook: &str) -> Option<String> {
        (self.plan.selects(cluster) && self.names.iter().any(|n| &**n == webhook))
            .then(|| self.plan.address_of(cluster, webhook))
    }

    /// Whether the server still accepts connections: false once it has
    /// stopped, however that came.
    pub fn is_serving(&self) -> bool {
        self.status.is_serving()
    }

    /// A handle that tells whether the server serves, apart from it.
    pub fn status(&self) -> WebhookStatus {
        self.status.clone()
    }

    /// Writes the registrations in every engaged cluster that is
    /// registered in, and keeps them current for as long as the future is
    /// polled: in each cluster that joins, again when the CA bundle
    /// changes and every five minutes or so, retried while a cluster
    /// refuses (reported in the fleet's [`problems`](Fleet::problems) under
    /// `webhook registration in cluster "<name>"`, cleared when the future
    /// is dropped). A cluster that leaves has the webhook configurations
    /// this process wrote removed while it still answers; a CRD's
    /// conversion stays. Dropped, it stops writing; what it wrote stays.
    ///
    /// With several replicas, run it in one at a time (the leader).
    pub fn register(&self) -> impl Future<Output = ()> + Send + 'static {
        registration::follow(
            self.fleet.clone(),
            self.plan.clone(),
            self.loaded.ca_bundle(),
        )
    }

    /// Removes the registrations, conversions included, from every engaged
    /// cluster registered in, whichever process of this server wrote them,
    /// touching nothing that is not this server's; returns the clusters
    /// where that failed, with why. For an uninstall.
    pub async fn unregister(&self) -> Vec<(ClusterName, String)> {
        registration::unregister_all(&self.fleet, &self.plan).await
    }

    /// Whether [`shutdown`](Self::shutdown) removes the registrations
    /// ([`Webhooks::unregister_on_shutdown`](crate::Webhooks::unregister_on_shutdown)).
    pub fn unregisters_on_shutdown(&self) -> bool {
        self.unregister_on_shutdown
    }

    /// Stops accepting connections, lets the requests in flight finish
    /// (for at most ten seconds), and, if
    /// [asked](crate::Webhooks::unregister_on_shutdown), removes the
    /// registrations first.
    pub async fn shutdown(self) {
        if self.unregister_on_shutdown {
            for (cluster, error) in self.unregister().await {
                tracing::warn!(cluster = cluster.as_str(), %error, "removing the webhook registrations at shutdown");
            }
        }
        self.stop().await;
    }

    /// Stops accepting connections and lets the requests in flight finish
    /// (for at most ten seconds), leaving the registrations as they are.
    pub async fn stop(mut self) {
        self.stop.cancel();
        if let Some(served) = self.served.take() {
            let _ = served.await;
        }
    }
}

impl Drop for WebhookServer {
    fn drop(&mut self) {
        self.stop.cancel();
        for task in &self.tasks {
            task.abort();
        }
    }
}
