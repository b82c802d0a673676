//! The set of webhooks a server serves and registers, and the server once
//! started.

use std::{collections::HashMap, net::SocketAddr, path::PathBuf, sync::Arc, time::Duration};

use k8s_openapi::api::admissionregistration::v1::{MutatingWebhook, WebhookClientConfig};
use kube::Resource;
use kube_fleet::{
    ClusterName, Fleet, FleetEvent,
    controller::ClusterSelector,
    rbac::{Permissions, Rule, Scope},
};
use prometheus_client::registry::Registry;
use serde::{Serialize, de::DeserializeOwned};
use tokio::{sync::watch, task::AbortHandle};
use tokio_rustls::{
    TlsAcceptor,
    rustls::{ServerConfig, crypto::ring::default_provider},
};
use tower::{BoxError, Service};

use crate::{
    admission::{AdmissionRequest, Verdict},
    certificates::{Certificates, Loaded, Resolver},
    conversion::ConversionRequest,
    error::Error,
    handler::{self, Handler, Kind},
    metrics::Metrics,
    registration::{self, Plan, ServiceRef},
    server::{self, Shared},
    token::{KeySource, Tokens},
    webhook::{Conversion, Webhook},
};

/// How long requests in flight may take to finish once the server stops.
const DRAIN: Duration = Duration::from_secs(10);

/// The source under which a certificate that cannot be read again is
/// reported in the fleet's problems.
pub(crate) const CERTIFICATE_SOURCE: &str = "webhook certificate";

/// The webhooks one server serves and registers: handlers, certificates,
/// and where each cluster reaches the server. See the [crate docs](crate).
///
/// Handlers must be `Clone`: each request is served by a clone, so that
/// requests run at once (`service_fn` of a closure that captures only
/// clonable values is).
#[must_use]
pub struct Webhooks {
    name: String,
    handlers: Vec<Handler>,
    validating: Vec<MutatingWebhook>,
    mutating: Vec<MutatingWebhook>,
    conversions: Vec<String>,
    certificates: Certificates,
    service: Option<ServiceRef>,
    url: Option<String>,
    members: ClusterSelector,
    key: KeySource,
    unregister_on_shutdown: bool,
    invalid: Vec<Error>,
}

impl std::fmt::Debug for Webhooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.handlers.iter().map(|h| &*h.name).collect();
        f.debug_struct("Webhooks")
            .field("name", &self.name)
            .field("webhooks", &names)
            .field("certificates", &self.certificates)
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

impl Webhooks {
    /// No webhook yet; the registrations will be named `name` (a DNS
    /// label or subdomain, such as the operator's name).
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            handlers: Vec::new(),
            validating: Vec::new(),
            mutating: Vec::new(),
            conversions: Vec::new(),
            certificates: Certificates::generate(),
            service: None,
            url: None,
            members: ClusterSelector::Provided,
            key: KeySource::Random,
            unregister_on_shutdown: false,
            invalid: Vec::new(),
        }
    }

    /// The name of the registrations.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Serves `webhook` as a validating webhook of `K` with `service`: a
    /// [`Verdict::mutate`] from it is taken as an allow.
    pub fn validate<K, S>(self, webhook: Webhook, service: S) -> Self
    where
        K: Resource<DynamicType = ()>
            + Clone
            + Serialize
            + DeserializeOwned
            + Send
            + Sync
            + 'static,
        S: Service<AdmissionRequest<K>, Response = Verdict<K>> + Clone + Send + 'static,
        S::Future: Send + 'static,
        S::Error: Into<BoxError>,
    {
        self.admission(Kind::Validating, webhook, service)
    }

    /// Serves `webhook` as a mutating webhook of `K` with `service`: a
    /// [`Verdict::mutate`] is sent as the JSON patch from the object asked
    /// about to the one returned.
    pub fn mutate<K, S>(self, webhook: Webhook, service: S) -> Self
    where
        K: Resource<DynamicType = ()>
            + Clone
            + Serialize
            + DeserializeOwned
            + Send
            + Sync
            + 'static,
        S: Service<AdmissionRequest<K>, Response = Verdict<K>> + Clone + Send + 'static,
        S::Future: Send + 'static,
        S::Error: Into<BoxError>,
    {
        self.admission(Kind::Mutating, webhook, service)
    }

    fn admission<K, S>(mut self, kind: Kind, webhook: Webhook, service: S) -> Self
    where
        K: Resource<DynamicType = ()>
            + Clone
            + Serialize
            + DeserializeOwned
            + Send
            + Sync
            + 'static,
        S: Service<AdmissionRequest<K>, Response = Verdict<K>> + Clone + Send + 'static,
        S::Future: Send + 'static,
        S::Error: Into<BoxError>,
    {
        if !self.check(&webhook.name, webhook.check()) {
            return self;
        }
        let entry = self.entry::<K>(&webhook);
        match kind {
            Kind::Mutating => self.mutating.push(entry),
            _ => self.validating.push(entry),
        }
        self.handlers.push(handler::admission::<K, S>(
            &webhook.name,
            kind,
            webhook.failure_policy,
            webhook.timeout,
            service,
        ));
        self
    }

    /// Serves the conversion webhook of a CRD with `service`, and sets the
    /// CRD's `spec.conversion` in every cluster registered in. The API
    /// server waits 30 seconds for a conversion; the handler is given 24.
    pub fn convert<S>(mut self, conversion: Conversion, service: S) -> Self
    where
        S: Service<ConversionRequest, Response = Vec<serde_json::Value>> + Clone + Send + 'static,
        S::Future: Send + 'static,
        S::Error: Into<BoxError>,
    {
        if self.check(&conversion.crd, conversion.check()) {
            self.conversions.push(conversion.crd.clone());
            self.handlers
                .push(handler::conversion(&conversion.crd, service));
        }
        self
    }

    /// Where the serving certificate comes from; made at start
    /// ([`Certificates::generate`]) by default.
    pub fn certificates(mut self, certificates: Certificates) -> Self {
        self.certificates = certificates;
        self
    }

    /// Registers in the local cluster (when the fleet engages it, under
    /// [`ClusterName::local`]) through the Service `namespace/name` on
    /// `port`, which must send to the server's port.
    pub fn local_service(
        mut self,
        namespace: impl Into<String>,
        name: impl Into<String>,
        port: u16,
    ) -> Self {
        self.service = Some(ServiceRef {
            namespace: namespace.into(),
            name: name.into(),
            port,
        });
        self
    }

    /// Registers in every member cluster (every engaged cluster but the
    /// local one; see [`members`](Self::members)) through `url`, the
    /// server's address as the members' API servers reach it
    /// (`https://webhooks.example.com:9443`). Each member is given a path
    /// of its own under it, with its token.
    pub fn external_url(mut self, url: impl Into<String>) -> Self {
        self.url = Some(url.into());
        self
    }

    /// Which engaged clusters are registered in through the
    /// [external URL](Self::external_url): [`ClusterSelector::Provided`]
    /// (every member) by default; [`ClusterSelector::All`] takes the local
    /// cluster too, when it has no [Service](Self::local_service).
    pub fn members(mut self, clusters: ClusterSelector) -> Self {
        self.members = clusters;
        self
    }

    /// The key the clusters' tokens are made under. By default a random key
    /// made at start, which suits one replica; replicas that share
    /// requests (behind one Service or URL) need one key, at least
    /// [`MIN_KEY_BYTES`](crate::MIN_KEY_BYTES) long.
    pub fn token_key(mut self, key: impl Into<Vec<u8>>) -> Self {
        let key = key.into();
        if key.len() < crate::token::MIN_KEY_BYTES {
            self.invalid.push(Error::Invalid {
                name: self.name.clone(),
                reason: format!(
                    "the token key holds {} bytes; it needs at least {}",
                    key.len(),
                    crate::token::MIN_KEY_BYTES
                ),
            });
        }
        self.key = KeySource::Bytes(key);
        self
    }

    /// The token key, read from a file at start (a Secret mounted in every
    /// replica); see [`token_key`](Self::token_key).
    pub fn token_key_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.key = KeySource::File(path.into());
        self
    }

    /// Whether the replicas share a token key ([`token_key`](Self::token_key)
    /// or [`token_key_file`](Self::token_key_file) set).
    pub fn has_shared_key(&self) -> bool {
        !matches!(self.key, KeySource::Random)
    }

    /// Removes the registrations from every cluster when the server is
    /// shut down cleanly ([`WebhookServer::shutdown`], or the manager's
    /// graceful shutdown): for an operator being uninstalled. By default
    /// they stay, so that a restart does not leave the clusters unchecked.
    pub fn unregister_on_shutdown(mut self) -> Self {
        self.unregister_on_shutdown = true;
        self
    }

    /// The names of the webhooks served, validating, mutating and
    /// conversion.
    pub fn webhook_names(&self) -> Vec<&str> {
        self.handlers.iter().map(|h| &*h.name).collect()
    }

    /// The RBAC rules registration needs: on the webhook configurations it
    /// writes, and on the CRDs it converts, in the local cluster (with a
    /// [Service](Self::local_service)) and in the members (with an
    /// [external URL](Self::external_url)).
    ///
    /// ```
    /// use kube_fleet::rbac::{Rule, Scope};
    /// use kube_fleet_webhook::Webhooks;
    ///
    /// let permissions = Webhooks::new("my-operator")
    ///     .external_url("https://webhooks.example.com")
    ///     .permissions();
    /// assert!(permissions.rules(Scope::Local).is_empty());
    /// assert_eq!(
    ///     permissions.rules(Scope::Members),
    ///     [
    ///         Rule::new("admissionregistration.k8s.io", "mutatingwebhookconfigurations", ["create", "delete", "get", "patch"]),
    ///         Rule::new("admissionregistration.k8s.io", "validatingwebhookconfigurations", ["create", "delete", "get", "patch"]),
    ///     ]
    /// );
    /// ```
    pub fn permissions(&self) -> Permissions {
        let mut permissions = Permissions::new();
        let mut scopes = Vec::new();
        if self.service.is_some()
            || (self.url.is_some() && self.members.selects(&ClusterName::local()))
        {
            scopes.push(Scope::Local);
        }
        if self.url.is_some() {
            scopes.push(Scope::Members);
        }
        let verbs = ["get", "create", "patch", "delete"];
        for scope in scopes {
            for resource in [
                "validatingwebhookconfigurations",
                "mutatingwebhookconfigurations",
            ] {
                permissions.grant(
                    scope,
                    Rule::new("admissionregistration.k8s.io", resource, verbs),
                );
            }
            if !self.conversions.is_empty() {
                permissions.grant(
                    scope,
                    Rule::new(
                        "apiextensions.k8s.io",
                        "customresourcedefinitions",
                        ["get", "patch"],
                    ),
                );
            }
        }
        permissions
    }

    /// Starts serving on `listener` (each request answered on its own
    /// task), and returns the running server; registration starts with
    /// [`WebhookServer::register`]. With `registry`, the server's metrics
    /// are registered there. Call it inside a tokio runtime.
    ///
    /// Fails on a webhook the API server would refuse, a members' URL that
    /// is not `https://`, a certificate, key or token key file that cannot
    /// be read (the error names the file), or a listener that cannot be
    /// used.
    pub fn start(
        self,
        fleet: &Fleet,
        listener: std::net::TcpListener,
        registry: Option<&mut Registry>,
    ) -> Result<WebhookServer, Error> {
        if let Some(error) = self.invalid.into_iter().next() {
            return Err(error);
        }
        let url = self.url.as_deref().map(check_url).transpose()?;
        let mut hosts = Vec::new();
        if let Some((_, host)) = &url {
            hosts.push(host.clone());
        }
        if let Some(service) = &self.service {
            let (name, namespace) = (&service.name, &service.namespace);
            hosts.extend([
                name.clone(),
                format!("{name}.{namespace}"),
                format!("{name}.{namespace}.svc"),
                format!("{name}.{namespace}.svc.cluster.local"),
            ]);
        }
        let loaded = Arc::new(self.certificates.load(&hosts)?);
        let tokens = Tokens::new(&self.key)?;
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

        let handlers: HashMap<Arc<str>, Handler> = self
            .handlers
            .into_iter()
            .map(|handler| (handler.name.clone(), handler))
            .collect();
        let names = handlers.keys().cloned().collect();
        let shared = Arc::new(Shared {
            handlers,
            tokens: tokens.clone(),
            fleet: fleet.clone(),
            metrics: metrics.clone(),
        });
        let plan = Arc::new(Plan {
            name: self.name,
            validating: self.validating,
            mutating: self.mutating,
            conversions: self.conversions,
            service: self.service,
            url: url.map(|(url, _)| url),
            members: self.members,
            tokens,
        });

        let (stop, stopped) = watch::channel(false);
        let served = tokio::spawn(server::serve(listener, tls, shared, stopped, DRAIN));
        let mut tasks = Vec::new();
        let problems = fleet.problems();
        if let Some(reload) = self
            .certificates
            .reload(loaded.clone(), move |error| match error {
                Some(error) => problems.report(CERTIFICATE_SOURCE, error),
                None => problems.clear(CERTIFICATE_SOURCE),
            })
        {
            tasks.push(tokio::spawn(reload).abort_handle());
        }
        tasks.push(tokio::spawn(forget_leavers(fleet.clone(), metrics)).abort_handle());
        Ok(WebhookServer {
            address,
            plan,
            loaded,
            fleet: fleet.clone(),
            names,
            stop,
            served: Some(served),
            tasks,
            unregister_on_shutdown: self.unregister_on_shutdown,
        })
    }

    /// Records `result` of checking `name`: an error, or a name taken
    /// already, is returned by [`start`](Self::start).
    fn check(&mut self, name: &str, result: Result<(), Error>) -> bool {
        if let Err(error) = result {
            self.invalid.push(error);
            return false;
        }
        if self.handlers.iter().any(|h| &*h.name == name) {
            self.invalid.push(Error::Invalid {
                name: name.to_owned(),
                reason: "two webhooks of one server have this name".into(),
            });
            return false;
        }
        true
    }

    fn entry<K: Resource<DynamicType = ()>>(&self, webhook: &Webhook) -> MutatingWebhook {
        MutatingWebhook {
            admission_review_versions: vec!["v1".into()],
            client_config: WebhookClientConfig::default(),
            failure_policy: Some(webhook.failure_policy.as_str().into()),
            match_conditions: None,
            match_policy: Some("Equivalent".into()),
            name: webhook.name.clone(),
            namespace_selector: webhook.namespace_selector.clone(),
            object_selector: webhook.object_selector.clone(),
            reinvocation_policy: None,
            rules: Some(webhook.rules_for::<K>()),
            side_effects: "None".into(),
            timeout_seconds: Some(webhook.timeout.as_secs() as i32),
        }
    }
}

/// The URL without a trailing `/`, and its host.
fn check_url(url: &str) -> Result<(String, String), Error> {
    let bad = |reason: &str| Error::Url {
        url: url.to_owned(),
        reason: reason.to_owned(),
    };
    let rest = url
        .strip_prefix("https://")
        .ok_or_else(|| bad("the API servers call webhooks over https:// only"))?;
    if rest.contains(['?', '#']) {
        return Err(bad("a webhook URL may carry no query or fragment"));
    }
    let authority = rest.split('/').next().unwrap_or_default();
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or_default(),
        None => authority
            .rsplit_once(':')
            .map_or(authority, |(host, _)| host),
    };
    if host.is_empty() || authority.contains('@') {
        return Err(bad("no host"));
    }
    Ok((url.trim_end_matches('/').to_owned(), host.to_owned()))
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

/// A webhook server, serving from [`Webhooks::start`] until it is
/// [shut down](Self::shutdown) or dropped.
pub struct WebhookServer {
    address: SocketAddr,
    plan: Arc<Plan>,
    loaded: Arc<Loaded>,
    fleet: Fleet,
    names: Vec<Arc<str>>,
    stop: watch::Sender<bool>,
    served: Option<tokio::task::JoinHandle<()>>,
    tasks: Vec<AbortHandle>,
    unregister_on_shutdown: bool,
}

impl std::fmt::Debug for WebhookServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookServer")
            .field("address", &self.address)
            .field("webhooks", &self.names)
            .finish_non_exhaustive()
    }
}

impl WebhookServer {
    /// Where the server listens.
    pub fn local_addr(&self) -> SocketAddr {
        self.address
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
    /// been told to stop, or its task ended.
    pub fn is_serving(&self) -> bool {
        !*self.stop.borrow() && self.served.as_ref().is_some_and(|s| !s.is_finished())
    }

    /// Writes the registrations in every engaged cluster that is
    /// registered in, and keeps them current for as long as the future is
    /// polled: in each cluster that joins, again when the CA bundle
    /// changes, retried while a cluster refuses (reported in the fleet's
    /// [`problems`](Fleet::problems) under `webhook registration in cluster
    /// "<name>"`), and removed from a cluster that leaves while it still
    /// answers. Dropped, it stops writing; what it wrote stays.
    ///
    /// With several replicas, run it in one at a time (the leader).
    pub fn register(&self) -> impl Future<Output = ()> + Send + 'static {
        registration::follow(
            self.fleet.clone(),
            self.plan.clone(),
            self.loaded.ca_bundle(),
        )
    }

    /// Removes the registrations from every engaged cluster registered in,
    /// touching nothing that is not this server's; returns the clusters
    /// where that failed, with why.
    pub async fn unregister(&self) -> Vec<(ClusterName, String)> {
        registration::unregister_all(&self.fleet, &self.plan).await
    }

    /// Whether [`shutdown`](Self::shutdown) removes the registrations
    /// ([`Webhooks::unregister_on_shutdown`]).
    pub fn unregisters_on_shutdown(&self) -> bool {
        self.unregister_on_shutdown
    }

    /// Stops accepting connections, lets the requests in flight finish
    /// (for at most ten seconds), and, if
    /// [asked](Webhooks::unregister_on_shutdown), removes the
    /// registrations first.
    pub async fn shutdown(mut self) {
        if self.unregister_on_shutdown {
            for (cluster, error) in self.unregister().await {
                tracing::warn!(cluster = cluster.as_str(), %error, "removing the webhook registrations at shutdown");
            }
        }
        self.stop.send_replace(true);
        if let Some(served) = self.served.take() {
            let _ = served.await;
        }
    }
}

impl Drop for WebhookServer {
    fn drop(&mut self) {
        self.stop.send_replace(true);
        for task in &self.tasks {
            task.abort();
        }
    }
}
