//! The set of webhooks a server serves and registers, and the server once
//! started.

use std::{collections::HashMap, path::PathBuf, sync::Arc};

use k8s_openapi::api::admissionregistration::v1::{MutatingWebhook, WebhookClientConfig};
use kube::Resource;
use kube_multicluster::{
    ClusterName, Fleet,
    controller::ClusterSelector,
    rbac::{Permissions, Rule, Scope},
};
use prometheus_client::registry::Registry;
use serde::{Serialize, de::DeserializeOwned};
use tower::{BoxError, Service};

use crate::{
    admission::{AdmissionRequest, Verdict},
    certificates::Certificates,
    conversion::ConversionRequest,
    error::Error,
    handler::{self, Handler, Kind},
    registration::{Plan, ServiceRef},
    running::WebhookServer,
    token::{KeySource, Tokens},
    webhook::{Conversion, Webhook},
};

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
        let handler = handler::admission::<K, S>(&webhook, Kind::Validating, service);
        self.admission::<K>(webhook, handler)
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
        let handler = handler::admission::<K, S>(&webhook, Kind::Mutating, service);
        self.admission::<K>(webhook, handler)
    }

    fn admission<K: Resource<DynamicType = ()>>(
        mut self,
        webhook: Webhook,
        handler: Handler,
    ) -> Self {
        if !self.check(&webhook.name, webhook.check()) {
            return self;
        }
        let entry = self.entry::<K>(&webhook);
        match handler.kind {
            Kind::Mutating => self.mutating.push(entry),
            _ => self.validating.push(entry),
        }
        self.handlers.push(handler);
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

    /// Whether the certificate is made at start
    /// ([`Certificates::generate`], the default): every process then has a
    /// CA of its own, so replicas that share requests cannot use it.
    pub fn generates_certificates(&self) -> bool {
        self.certificates.is_generated()
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
    /// use kube_multicluster::rbac::{Rule, Scope};
    /// use kube_multicluster_webhook::Webhooks;
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
        let handlers: HashMap<Arc<str>, Handler> = self
            .handlers
            .into_iter()
            .map(|handler| (handler.name.clone(), handler))
            .collect();
        let plan = Plan {
            name: self.name,
            validating: self.validating,
            mutating: self.mutating,
            conversions: self.conversions,
            service: self.service,
            url: url.map(|(url, _)| url),
            members: self.members,
            tokens,
            writer: writer_identity(),
        };
        crate::running::launch(crate::running::Launch {
            fleet,
            listener,
            registry,
            handlers,
            plan,
            loaded,
            certificates: &self.certificates,
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

/// This process among the server's replicas: the host's name (a Pod's
/// name) and a random suffix, so that a restart is another writer.
fn writer_identity() -> String {
    use ring::rand::SecureRandom;
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|host| host.trim().to_owned())
        .filter(|host| !host.is_empty())
        .unwrap_or_else(|| "webhook-server".to_owned());
    let mut suffix = [0u8; 4];
    let _ = ring::rand::SystemRandom::new().fill(&mut suffix);
    let suffix: String = suffix.iter().map(|b| format!("{b:02x}")).collect();
    format!("{host}-{suffix}")
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
    let (host, port) = match authority.strip_prefix('[') {
        Some(v6) => match v6.split_once(']') {
            Some((host, after)) => (host, after.strip_prefix(':')),
            None => return Err(bad("an IPv6 address without its closing ']'")),
        },
        None => match authority.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        },
    };
    if host.is_empty() || authority.contains('@') {
        return Err(bad("no host"));
    }
    if port.is_some_and(|port| port.parse::<u16>().is_err()) {
        return Err(bad(
            "the port is not a number from 0 to 65535 (an IPv6 address goes in brackets)",
        ));
    }
    // The server routes from its root: a path could only be stripped by a
    // proxy that ends TLS, which the registrations' CA bundle rules out.
    if !rest[authority.len()..].trim_matches('/').is_empty() {
        return Err(bad(
            "the server answers at its root: give the URL without a path",
        ));
    }
    Ok((url.trim_end_matches('/').to_owned(), host.to_owned()))
}
