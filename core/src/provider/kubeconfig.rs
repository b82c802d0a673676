//! Kubeconfigs from sources a provider does not control: parsed, checked
//! against a [`KubeconfigPolicy`], and turned into one `kube::Config` per
//! context, with errors that name where the kubeconfig came from.
//!
//! A kubeconfig can make the process that loads it run a command (an `exec`
//! credential plugin), call an `auth-provider` plugin, trust any server
//! (`insecure-skip-tls-verify`) or read files on the machine it runs on
//! (`certificate-authority`, `client-key`, `tokenFile`, ...), and it can
//! send credentials to a server over plain `http://`. From a file you wrote,
//! that is what you want; from a Secret, or a directory another party writes
//! to, it hands whoever writes there a way in. So the default policy refuses
//! all five, and a provider that reads such sources asks its user to allow
//! each one that is needed. This is stricter than kube in two ways: a context
//! that names a user the kubeconfig does not define is refused, and so is a
//! `certificate-authority` file next to `certificate-authority-data`.
//!
//! Errors name the source and the context, and the command, plugin or file
//! that was refused, never a token, a key or a command's arguments.
//!
//! ```
//! use kube_fleet::provider::kubeconfig::{self, KubeconfigPolicy};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let yaml = r#"
//! apiVersion: v1
//! kind: Config
//! clusters:
//! - name: east
//!   cluster: { server: "https://east.example.com:6443" }
//! users:
//! - name: robot
//!   user: { token: "not-logged" }
//! contexts:
//! - name: east
//!   context: { cluster: east, user: robot }
//! "#;
//! let parsed = kubeconfig::parse(yaml, "Secret fleet/east")?;
//! for (context, config) in kubeconfig::configs(&parsed, "Secret fleet/east", &KubeconfigPolicy::default()).await {
//!     let config = config?;
//!     assert_eq!(context, "east");
//!     assert_eq!(config.cluster_url.host(), Some("east.example.com"));
//! }
//! # Ok(())
//! # }
//! ```

use std::{
    hash::{BuildHasher, Hash, Hasher},
    path::Path,
    sync::OnceLock,
};

use kube::config::{KubeConfigOptions, Kubeconfig};

/// What a kubeconfig may ask for beyond a server, its CA and credentials
/// given inline. The default refuses everything below; each `allow_`
/// method allows one thing.
///
/// ```
/// use kube_fleet::provider::kubeconfig::KubeconfigPolicy;
///
/// // Clusters whose kubeconfigs log in through `aws eks get-token`.
/// let policy = KubeconfigPolicy::default().allow_exec();
/// assert_ne!(policy, KubeconfigPolicy::default());
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KubeconfigPolicy {
    exec: bool,
    auth_provider: bool,
    insecure_tls: bool,
    plain_http: bool,
    local_files: bool,
}

impl KubeconfigPolicy {
    /// Everything allowed: for kubeconfigs only you write, such as your own
    /// `~/.kube/config`.
    pub fn trusted() -> Self {
        Self {
            exec: true,
            auth_provider: true,
            insecure_tls: true,
            plain_http: true,
            local_files: true,
        }
    }

    /// Allows `exec` credential plugins: the process runs the command the
    /// kubeconfig names, with the process's rights.
    #[must_use]
    pub fn allow_exec(mut self) -> Self {
        self.exec = true;
        self
    }

    /// Allows `auth-provider` plugins (`oidc`, `gcp`, `azure`). As strong
    /// as [`allow_exec`](Self::allow_exec): the `gcp` provider runs the
    /// command its `cmd-path` names.
    #[must_use]
    pub fn allow_auth_provider(mut self) -> Self {
        self.auth_provider = true;
        self
    }

    /// Allows `insecure-skip-tls-verify`: the server's certificate is not
    /// checked, so anyone on the way can read and change the traffic.
    #[must_use]
    pub fn allow_insecure_skip_tls_verify(mut self) -> Self {
        self.insecure_tls = true;
        self
    }

    /// Allows servers reached over plain `http://`, where credentials and
    /// objects cross the network in the clear.
    #[must_use]
    pub fn allow_plain_http(mut self) -> Self {
        self.plain_http = true;
        self
    }

    /// Allows references to files on this machine: `certificate-authority`,
    /// `client-certificate`, `client-key` and `tokenFile`.
    #[must_use]
    pub fn allow_local_files(mut self) -> Self {
        self.local_files = true;
        self
    }
}

/// Why a kubeconfig, or one of its contexts, gives no cluster. Each names
/// the kubeconfig's source (a file, a Secret) as the provider gave it.
#[derive(Debug, thiserror::Error)]
pub enum KubeconfigError {
    /// The text is not a kubeconfig.
    #[error("{origin}: not a kubeconfig: {reason}")]
    Malformed {
        /// Where the kubeconfig came from.
        origin: String,
        /// What the parser said.
        reason: String,
    },
    /// A context names a cluster or user the kubeconfig does not define.
    #[error("{origin}: context {context:?} names {entry}, which the kubeconfig does not define")]
    Missing {
        /// Where the kubeconfig came from.
        origin: String,
        /// The context.
        context: String,
        /// What it names: `cluster "x"`, `user "y"`.
        entry: String,
    },
    /// The policy refuses what a context asks for.
    #[error(
        "{origin}: context {context:?} refused: it asks for {what}, which this provider does not allow \
         (KubeconfigPolicy::{allow})"
    )]
    Refused {
        /// Where the kubeconfig came from.
        origin: String,
        /// The context.
        context: String,
        /// What it asks for.
        what: String,
        /// The policy method that would allow it.
        allow: &'static str,
    },
    /// The kubeconfig could not be read.
    #[error("{origin}: cannot be read: {reason}")]
    Unreadable {
        /// Where the kubeconfig came from.
        origin: String,
        /// What the system said.
        reason: String,
    },
    /// kube could not build a configuration from the context.
    #[error("{origin}: context {context:?}: {reason}")]
    Invalid {
        /// Where the kubeconfig came from.
        origin: String,
        /// The context.
        context: String,
        /// What kube said.
        reason: String,
    },
}

impl KubeconfigError {
    /// Where the kubeconfig came from, as the provider named it.
    pub fn origin(&self) -> &str {
        match self {
            Self::Malformed { origin, .. }
            | Self::Missing { origin, .. }
            | Self::Refused { origin, .. }
            | Self::Unreadable { origin, .. }
            | Self::Invalid { origin, .. } => origin,
        }
    }

    /// What is wrong, without where the kubeconfig came from: the message
    /// for a problem reported under a name of its own (a context's
    /// cluster, say).
    ///
    /// ```
    /// use kube_fleet::provider::kubeconfig;
    ///
    /// let error = kubeconfig::parse("[", "/etc/fleet/east.yaml").unwrap_err();
    /// assert_eq!(error.origin(), "/etc/fleet/east.yaml");
    /// assert!(error.reason().starts_with("not a kubeconfig"));
    /// ```
    pub fn reason(&self) -> String {
        let text = self.to_string();
        match text
            .strip_prefix(self.origin())
            .and_then(|rest| rest.strip_prefix(": "))
        {
            Some(reason) => reason.to_owned(),
            None => text,
        }
    }
}

/// Parses `yaml` (one or more documents, merged as kubectl does), read from
/// `origin`.
///
/// # Errors
///
/// [`KubeconfigError::Malformed`] if it is not YAML of a kubeconfig, or
/// defines no context. The error gives the line and column of a syntax or
/// type error, never the text there, which may be a secret.
pub fn parse(yaml: &str, origin: &str) -> Result<Kubeconfig, KubeconfigError> {
    let malformed = |reason: String| KubeconfigError::Malformed {
        origin: origin.to_owned(),
        reason,
    };
    let kubeconfig = Kubeconfig::from_yaml(yaml).map_err(|error| match error {
        kube::config::KubeconfigError::Parse(error) => malformed(match error.location() {
            Some(at) => format!("invalid at line {}, column {}", at.line(), at.column()),
            None => "invalid YAML".to_owned(),
        }),
        // The other errors are fixed texts (a wrong kind or apiVersion).
        other => malformed(crate::client::error_chain(&other)),
    })?;
    if kubeconfig.contexts.is_empty() {
        return Err(malformed("it defines no context".to_owned()));
    }
    Ok(kubeconfig)
}

/// Reads and [`parse`]s the kubeconfig file at `path`, whose display is its
/// origin in errors. Relative paths in it (`certificate-authority`,
/// `client-certificate`, `client-key`, `tokenFile`, and an exec command
/// with a path separator) are taken from the file's directory, as kubectl
/// takes them; a policy that refuses local files still refuses them.
///
/// # Errors
///
/// [`KubeconfigError::Unreadable`] if the file cannot be read or is not
/// UTF-8, else as [`parse`].
pub fn read_file(path: &Path) -> Result<Kubeconfig, KubeconfigError> {
    let origin = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|error| KubeconfigError::Unreadable {
        origin: origin.clone(),
        reason: error.to_string(),
    })?;
    parse_file(&text, path)
}

/// [`parse`]s `text`, read from the file at `path` (its origin in errors),
/// taking relative paths in it from the file's directory as
/// [`read_file`] does.
///
/// # Errors
///
/// As [`parse`].
pub fn parse_file(text: &str, path: &Path) -> Result<Kubeconfig, KubeconfigError> {
    let origin = path.display().to_string();
    let mut kubeconfig = parse(text, &origin)?;
    if let Some(dir) = path.parent() {
        let absolute = |file: &mut Option<String>| {
            if let Some(name) = file
                && Path::new(name.as_str()).is_relative()
                && let Some(joined) = dir.join(name.as_str()).to_str()
            {
                *name = joined.to_owned();
            }
        };
        for cluster in kubeconfig
            .clusters
            .iter_mut()
            .filter_map(|c| c.cluster.as_mut())
        {
            absolute(&mut cluster.certificate_authority);
        }
        for user in kubeconfig
            .auth_infos
            .iter_mut()
            .filter_map(|u| u.auth_info.as_mut())
        {
            absolute(&mut user.client_certificate);
            absolute(&mut user.client_key);
            absolute(&mut user.token_file);
            if let Some(exec) = &mut user.exec
                && exec
                    .command
                    .as_deref()
                    .is_some_and(|command| command.contains(std::path::MAIN_SEPARATOR))
            {
                absolute(&mut exec.command);
            }
        }
    }
    Ok(kubeconfig)
}

/// The context a kubeconfig that stands for one cluster (one held in a
/// Secret, say) means: its `current-context`, or its only context.
///
/// # Errors
///
/// [`KubeconfigError::Invalid`] if it has no `current-context` and more
/// than one context, or names a `current-context` it does not define.
pub fn current_context(kubeconfig: &Kubeconfig, origin: &str) -> Result<String, KubeconfigError> {
    let invalid = |context: &str, reason: String| KubeconfigError::Invalid {
        origin: origin.to_owned(),
        context: context.to_owned(),
        reason,
    };
    match (&kubeconfig.current_context, kubeconfig.contexts.as_slice()) {
        (Some(current), contexts) if !current.is_empty() => {
            if contexts.iter().any(|c| &c.name == current) {
                Ok(current.clone())
            } else {
                Err(invalid(
                    current,
                    "it is the current-context, and the kubeconfig does not define it".to_owned(),
                ))
            }
        }
        (_, [only]) => Ok(only.name.clone()),
        (_, contexts) => Err(invalid(
            "",
            format!(
                "no current-context, and {} contexts to choose from",
                contexts.len()
            ),
        )),
    }
}

/// A number that changes when anything a context's cluster is built from
/// changes: the context and the cluster and user entries it names, as
/// written (the contents of files they name are not read). `None` if the
/// context is not there. The numbers are of this process alone: they come
/// from a hash keyed at random when the process first asks.
pub fn fingerprint(kubeconfig: &Kubeconfig, context: &str) -> Option<u64> {
    static KEYS: OnceLock<std::collections::hash_map::RandomState> = OnceLock::new();
    let named = kubeconfig.contexts.iter().find(|c| c.name == context)?;
    let entries = named.context.as_ref();
    let cluster = entries.and_then(|e| kubeconfig.clusters.iter().find(|c| c.name == e.cluster));
    let user = entries
        .and_then(|e| e.user.as_ref())
        .and_then(|user| kubeconfig.auth_infos.iter().find(|a| &a.name == user));
    let mut hasher = KEYS.get_or_init(Default::default).build_hasher();
    for part in [
        serde_json::to_vec(named),
        serde_json::to_vec(&cluster),
        serde_json::to_vec(&user),
    ] {
        part.unwrap_or_default().hash(&mut hasher);
    }
    Some(hasher.finish())
}

/// Checks the context `context` of `kubeconfig` against `policy`.
///
/// # Errors
///
/// [`KubeconfigError::Missing`] if the context, or the cluster or user it
/// names, is not there; [`KubeconfigError::Refused`] for the first thing it
/// asks for that the policy does not allow.
pub fn check(
    kubeconfig: &Kubeconfig,
    context: &str,
    origin: &str,
    policy: &KubeconfigPolicy,
) -> Result<(), KubeconfigError> {
    checked(kubeconfig, context, origin, policy).map(drop)
}

/// The kubeconfig of the context `context` alone (its context, cluster and
/// user), once checked: what kube then loads is exactly what was checked.
fn checked(
    kubeconfig: &Kubeconfig,
    context: &str,
    origin: &str,
    policy: &KubeconfigPolicy,
) -> Result<Kubeconfig, KubeconfigError> {
    let missing = |entry: String| KubeconfigError::Missing {
        origin: origin.to_owned(),
        context: context.to_owned(),
        entry,
    };
    let refused = |what: String, allow: &'static str| KubeconfigError::Refused {
        origin: origin.to_owned(),
        context: context.to_owned(),
        what,
        allow,
    };
    let named_context = kubeconfig
        .contexts
        .iter()
        .find(|c| c.name == context)
        .ok_or_else(|| missing(format!("context {context:?}")))?;
    let named = named_context
        .context
        .as_ref()
        .ok_or_else(|| KubeconfigError::Invalid {
            origin: origin.to_owned(),
            context: context.to_owned(),
            reason: "the context names no cluster".to_owned(),
        })?;
    let named_cluster = kubeconfig
        .clusters
        .iter()
        .find(|c| c.name == named.cluster)
        .filter(|c| c.cluster.is_some())
        .ok_or_else(|| missing(format!("cluster {:?}", named.cluster)))?;
    let cluster = named_cluster.cluster.as_ref().expect("filtered above");
    let named_user = match &named.user {
        Some(user) => Some(
            kubeconfig
                .auth_infos
                .iter()
                .find(|a| &a.name == user)
                .filter(|a| a.auth_info.is_some())
                .ok_or_else(|| missing(format!("user {user:?}")))?,
        ),
        None => None,
    };
    let user = named_user.and_then(|u| u.auth_info.as_ref());
    let server = cluster.server.as_deref().unwrap_or_default();
    if !policy.plain_http && !server.to_ascii_lowercase().starts_with("https://") {
        let scheme = server
            .split_once("://")
            .map_or("no scheme", |(scheme, _)| scheme);
        return Err(refused(
            format!("a server that is not https ({scheme})"),
            "allow_plain_http",
        ));
    }
    if cluster.insecure_skip_tls_verify == Some(true) && !policy.insecure_tls {
        return Err(refused(
            "insecure-skip-tls-verify".to_owned(),
            "allow_insecure_skip_tls_verify",
        ));
    }
    if let Some(user) = user {
        if let Some(exec) = &user.exec
            && !policy.exec
        {
            // The command only: its arguments may carry secrets.
            let command = exec.command.as_deref().unwrap_or("(none)");
            return Err(refused(
                format!("an exec credential plugin (command {command:?})"),
                "allow_exec",
            ));
        }
        if let Some(provider) = &user.auth_provider
            && !policy.auth_provider
        {
            return Err(refused(
                format!("an auth-provider plugin ({:?})", provider.name),
                "allow_auth_provider",
            ));
        }
    }
    if !policy.local_files {
        let files = [
            (
                "certificate-authority",
                cluster.certificate_authority.as_ref(),
            ),
            (
                "client-certificate",
                user.and_then(|u| u.client_certificate.as_ref()),
            ),
            ("client-key", user.and_then(|u| u.client_key.as_ref())),
            ("tokenFile", user.and_then(|u| u.token_file.as_ref())),
        ];
        if let Some((field, path)) = files.iter().find_map(|(f, p)| Some((f, (*p)?))) {
            return Err(refused(
                format!("a file on this machine ({field} {path:?})"),
                "allow_local_files",
            ));
        }
    }
    // A plugin never shares this process's terminal: what it prints would
    // reach the process's own stderr, and it could wait on its stdin.
    let mut named_user = named_user.cloned();
    if let Some(exec) = named_user
        .as_mut()
        .and_then(|u| u.auth_info.as_mut())
        .and_then(|u| u.exec.as_mut())
    {
        exec.interactive_mode = Some(kube::config::ExecInteractiveMode::Never);
    }
    Ok(Kubeconfig {
        clusters: vec![named_cluster.clone()],
        auth_infos: named_user.into_iter().collect(),
        contexts: vec![named_context.clone()],
        current_context: Some(context.to_owned()),
        ..Kubeconfig::default()
    })
}

/// How long building a client may take, and how long its credential
/// plugin may run (then it is killed).
pub const CLIENT_TIMEOUT: std::time::Duration = crate::client::PLUGIN_TIMEOUT;

/// A client (see [`client::client`](crate::client::client)) for the
/// context `context` of the kubeconfig from `origin`, given up after
/// [`CLIENT_TIMEOUT`].
///
/// A credential plugin (`exec`) of the context's user runs once, as a
/// process of its own process group, and its credential (a client
/// certificate, or a token) takes its place in the client; a token that
/// expires is renewed by running the plugin again as requests need it. A
/// plugin that runs longer than [`CLIENT_TIMEOUT`], or whose build is
/// dropped (the program shuts down, say), is killed with its process
/// group, and nothing waits for it.
///
/// # Errors
///
/// [`KubeconfigError::Invalid`] if no client can be built. A credential
/// plugin that fails is reported by what happened (it could not start,
/// its exit status, output that is not an `ExecCredential`, its time ran
/// out), never with its command line, environment or output, which may
/// carry secrets.
pub async fn client(
    config: kube::Config,
    origin: &str,
    context: &str,
) -> Result<kube::Client, KubeconfigError> {
    let invalid = |reason: String| KubeconfigError::Invalid {
        origin: origin.to_owned(),
        context: context.to_owned(),
        reason,
    };
    // One deadline for the whole build: the turn, the plugin, the rest.
    let deadline = tokio::time::Instant::now() + CLIENT_TIMEOUT;
    let too_long = || {
        invalid(format!(
            "no client: building it took longer than {CLIENT_TIMEOUT:?}"
        ))
    };
    // One build at a time for a source: a retry waits for the try before it.
    let slot = Slot::of(origin, context);
    let Ok(turn) = tokio::time::timeout_at(deadline, slot.lock.clone().lock_owned()).await else {
        return Err(too_long());
    };
    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
    if left.is_zero() {
        return Err(too_long());
    }
    let (config, token) = crate::client::resolve_exec(config, left)
        .await
        .map_err(|error| {
            invalid(format!(
                "no client: its credentials could not be obtained: {error}"
            ))
        })?;
    // What is left reads files (certificates, a CA): off the async threads.
    let built = tokio::time::timeout_at(
        deadline,
        tokio::task::spawn_blocking(move || {
            let _turn = (turn, slot);
            crate::client::ClientOptions::default().client_with(config, token)
        }),
    )
    .await;
    match built {
        Ok(Ok(Ok(client))) => Ok(client),
        Ok(Ok(Err(kube::Error::Auth(_)))) => Err(invalid(
            "no client: its credentials could not be obtained (a token or certificate file \
             could not be read)"
                .to_owned(),
        )),
        // The outermost message only: TLS material that does not parse,
        // say, without what a cause might quote.
        Ok(Ok(Err(error))) => Err(invalid(format!("no client: {error}"))),
        Ok(Err(_)) => Err(invalid("no client: building it panicked".to_owned())),
        Err(_) => Err(too_long()),
    }
}

/// Parses a kubeconfig held as bytes (a Secret's value), read from
/// `origin`; see [`parse`].
///
/// # Errors
///
/// [`KubeconfigError::Malformed`] if the bytes are not UTF-8 text, or
/// [`parse`] fails.
pub fn parse_bytes(bytes: &[u8], origin: &str) -> Result<Kubeconfig, KubeconfigError> {
    let text = std::str::from_utf8(bytes).map_err(|_| KubeconfigError::Malformed {
        origin: origin.to_owned(),
        reason: "it is not UTF-8 text".to_owned(),
    })?;
    parse(text, origin)
}

/// A client for the one cluster a kubeconfig held as bytes (a Secret's
/// value) stands for: [`parse_bytes`], then [`current_client`].
///
/// # Errors
///
/// [`BuildError::Refused`](super::BuildError::Refused) if the bytes are not
/// a kubeconfig, or as [`current_client`].
pub async fn bytes_client(
    bytes: &[u8],
    origin: &str,
    policy: &KubeconfigPolicy,
) -> Result<kube::Client, super::BuildError> {
    let parsed = parse_bytes(bytes, origin)?;
    current_client(&parsed, origin, policy).await
}

/// A client for the one cluster a kubeconfig stands for (one held in a
/// Secret, say): its [`current_context`], checked against `policy` and
/// built with [`client`]. The other contexts are not looked at.
///
/// # Errors
///
/// [`BuildError::Refused`](super::BuildError::Refused) if there is no
/// usable current context, or the policy refuses it;
/// [`BuildError::Unavailable`](super::BuildError::Unavailable) if it is
/// fine but gives no client now (an allowed credential plugin fails).
///
/// ```
/// use kube_fleet::provider::{BuildError, kubeconfig::{self, KubeconfigPolicy}};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let yaml = br#"{"apiVersion": "v1", "kind": "Config",
///   "clusters": [{"name": "a", "cluster": {"server": "http://a.example.com"}}],
///   "contexts": [{"name": "a", "context": {"cluster": "a"}}]}"#;
/// let parsed = kubeconfig::parse_bytes(yaml, "Secret fleet/a").unwrap();
/// let refused = kubeconfig::current_client(&parsed, "Secret fleet/a", &KubeconfigPolicy::default()).await;
/// assert!(matches!(refused, Err(BuildError::Refused(text)) if text.contains("not https")));
/// # }
/// ```
pub async fn current_client(
    kubeconfig: &Kubeconfig,
    origin: &str,
    policy: &KubeconfigPolicy,
) -> Result<kube::Client, super::BuildError> {
    let context = current_context(kubeconfig, origin)?;
    let alone = checked(kubeconfig, &context, origin, policy)?;
    let config = load(alone, &context, origin).await?;
    client(config, origin, &context)
        .await
        .map_err(|error| super::BuildError::Unavailable(error.to_string()))
}

/// The turn of one source and context to build a client: one build at a
/// time each, its credential plugin included; the blocking part that
/// follows holds the turn until it ends, whether or not anyone still waits
/// for it.
struct Slot {
    key: String,
    lock: std::sync::Arc<tokio::sync::Mutex<()>>,
}

type Slots = std::collections::HashMap<String, std::sync::Arc<tokio::sync::Mutex<()>>>;

fn slots() -> std::sync::MutexGuard<'static, Slots> {
    static SLOTS: OnceLock<std::sync::Mutex<Slots>> = OnceLock::new();
    SLOTS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Slot {
    fn of(origin: &str, context: &str) -> Self {
        let key = format!("{origin}\u{0}{context}");
        let lock = slots().entry(key.clone()).or_default().clone();
        Self { key, lock }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut slots = slots();
        // Forgotten once nobody holds or waits for it: the map's own
        // reference and this one are all that is left.
        if std::sync::Arc::strong_count(&self.lock) <= 2 {
            slots.remove(&self.key);
        }
    }
}

/// The kubeconfig of the context `context` alone: that context, the
/// cluster and the user it names, and `context` as the current context.
/// `None` if the context is not there.
pub fn only(kubeconfig: &Kubeconfig, context: &str) -> Option<Kubeconfig> {
    let named = kubeconfig.contexts.iter().find(|c| c.name == context)?;
    let entries = named.context.as_ref();
    Some(Kubeconfig {
        clusters: entries
            .and_then(|e| kubeconfig.clusters.iter().find(|c| c.name == e.cluster))
            .into_iter()
            .cloned()
            .collect(),
        auth_infos: entries
            .and_then(|e| e.user.as_ref())
            .and_then(|user| kubeconfig.auth_infos.iter().find(|a| &a.name == user))
            .into_iter()
            .cloned()
            .collect(),
        contexts: vec![named.clone()],
        current_context: Some(context.to_owned()),
        ..Kubeconfig::default()
    })
}

/// A `kube::Config` for each context of `kubeconfig` that `policy` allows,
/// or why there is none, by context name, in the kubeconfig's order. One
/// bad context does not keep the others from loading; a context whose name
/// an earlier one has is an error of its own.
///
/// A `kube::Config`'s `Debug` output shows an allowed exec plugin's
/// arguments and an auth-provider's tokens: do not log it.
pub async fn configs(
    kubeconfig: &Kubeconfig,
    origin: &str,
    policy: &KubeconfigPolicy,
) -> Vec<(String, Result<kube::Config, KubeconfigError>)> {
    let mut configs: Vec<(String, Result<kube::Config, KubeconfigError>)> = Vec::new();
    for context in &kubeconfig.contexts {
        let name = context.name.clone();
        let config = if configs.iter().any(|(seen, _)| *seen == name) {
            Err(KubeconfigError::Invalid {
                origin: origin.to_owned(),
                context: name.clone(),
                reason: "another context of that name comes first".to_owned(),
            })
        } else {
            match checked(kubeconfig, &name, origin, policy) {
                Ok(alone) => load(alone, &name, origin).await,
                Err(error) => Err(error),
            }
        };
        configs.push((name, config));
    }
    configs
}

async fn load(
    kubeconfig: Kubeconfig,
    context: &str,
    origin: &str,
) -> Result<kube::Config, KubeconfigError> {
    let options = KubeConfigOptions {
        context: Some(context.to_owned()),
        ..KubeConfigOptions::default()
    };
    kube::Config::from_custom_kubeconfig(kubeconfig, &options)
        .await
        .map_err(|error| KubeconfigError::Invalid {
            origin: origin.to_owned(),
            context: context.to_owned(),
            reason: crate::client::error_chain(&error),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "s3cr3t-t0ken";

    /// A kubeconfig with contexts `good`, `exec`, `insecure`, `files`,
    /// `no-cluster`, `no-user`, `plain` and a second `good`.
    fn kubeconfig() -> String {
        format!(
            r#"
apiVersion: v1
kind: Config
clusters:
- name: a
  cluster: {{ server: "https://a.example.com:6443" }}
- name: insecure
  cluster: {{ server: "https://b.example.com", insecure-skip-tls-verify: true }}
- name: ca-file
  cluster: {{ server: "https://c.example.com", certificate-authority: /etc/ca.pem }}
- name: plain
  cluster: {{ server: "http://d.example.com" }}
users:
- name: token
  user: {{ token: {TOKEN} }}
- name: exec
  user:
    exec:
      apiVersion: client.authentication.k8s.io/v1
      command: get-token
      args: ["--token={TOKEN}"]
contexts:
- {{ name: good, context: {{ cluster: a, user: token }} }}
- {{ name: exec, context: {{ cluster: a, user: exec }} }}
- {{ name: insecure, context: {{ cluster: insecure, user: token }} }}
- {{ name: files, context: {{ cluster: ca-file, user: token }} }}
- {{ name: no-cluster, context: {{ cluster: gone, user: token }} }}
- {{ name: no-user, context: {{ cluster: a, user: gone }} }}
- {{ name: plain, context: {{ cluster: plain, user: token }} }}
- {{ name: good, context: {{ cluster: insecure, user: token }} }}
"#
        )
    }

    async fn outcomes(policy: &KubeconfigPolicy) -> Vec<(String, Result<String, String>)> {
        let parsed = parse(&kubeconfig(), "Secret fleet/edge").unwrap();
        configs(&parsed, "Secret fleet/edge", policy)
            .await
            .into_iter()
            .map(|(context, config)| {
                let config = config
                    .map(|c| c.cluster_url.to_string())
                    .map_err(|e| format!("{e} / {e:?}"));
                (context, config)
            })
            .collect()
    }

    #[tokio::test]
    async fn by_default_only_plain_contexts_load_and_each_refusal_names_its_source() {
        let outcomes = outcomes(&KubeconfigPolicy::default()).await;
        let error = |context: &str| {
            outcomes
                .iter()
                .find(|(c, _)| c == context)
                .and_then(|(_, r)| r.clone().err())
                .unwrap_or_else(|| panic!("{context} should fail"))
        };
        assert_eq!(outcomes[0].0, "good");
        assert!(
            outcomes[0]
                .1
                .as_ref()
                .is_ok_and(|url| url.contains("a.example.com"))
        );
        for (context, says) in [
            ("exec", "exec credential plugin (command \"get-token\")"),
            ("exec", "allow_exec"),
            ("insecure", "insecure-skip-tls-verify"),
            ("files", "certificate-authority \"/etc/ca.pem\""),
            ("no-cluster", "cluster \"gone\""),
            ("no-user", "user \"gone\""),
            ("plain", "a server that is not https (http)"),
        ] {
            let error = error(context);
            assert!(error.starts_with("Secret fleet/edge: context"), "{error}");
            assert!(error.contains(says), "{context}: {error}");
        }
        let goods: Vec<_> = outcomes.iter().filter(|(c, _)| c == "good").collect();
        assert!(
            matches!(&goods[..], [(_, Ok(_)), (_, Err(e))] if e.contains("another context of that name comes first")),
            "{goods:?}"
        );
        for (_, outcome) in &outcomes {
            let text = format!("{outcome:?}");
            assert!(!text.contains(TOKEN), "a secret leaked: {text}");
        }
    }

    #[tokio::test]
    async fn each_allowance_lets_its_context_through() {
        let policy = KubeconfigPolicy::default()
            .allow_exec()
            .allow_insecure_skip_tls_verify();
        let outcomes = outcomes(&policy).await;
        let ok = |context: &str| outcomes.iter().any(|(c, r)| c == context && r.is_ok());
        assert!(ok("good") && ok("exec") && ok("insecure"));
        assert!(!ok("files"), "local files are still refused");
        assert!(!ok("plain"), "plain HTTP is still refused");
        assert!(!ok("no-cluster") && !ok("no-user"));
    }

    #[test]
    fn a_parse_error_gives_where_never_what() {
        for yaml in [
            format!("users:\n- name: u\n  user:\n    token: \"{TOKEN}\n"),
            format!("users:\n- name: u\n  user:\n    token: [{TOKEN}]\n"),
            format!(
                "users:\n- name: u\n  user:\n    exec:\n      command: x\n      interactiveMode: {TOKEN}\n"
            ),
        ] {
            let error = parse(&yaml, "Secret fleet/edge").unwrap_err();
            let text = format!("{error} / {error:?}");
            assert!(!text.contains(TOKEN), "a secret leaked: {text}");
            assert!(text.contains("line"), "{text}");
        }
    }

    #[test]
    fn a_kubeconfig_without_contexts_is_malformed() {
        for yaml in ["", "hello: world", "current-context: x"] {
            let error = parse(yaml, "Secret fleet/edge").unwrap_err().to_string();
            assert!(error.ends_with("defines no context"), "{yaml:?}: {error}");
        }
    }

    #[test]
    fn malformed_text_is_reported_with_its_source() {
        let error = parse("clusters: [ {", "file /tmp/broken.yaml").unwrap_err();
        assert!(
            error
                .to_string()
                .starts_with("file /tmp/broken.yaml: not a kubeconfig:"),
            "{error}"
        );
    }

    #[test]
    fn a_file_s_relative_paths_are_taken_from_its_directory() {
        let dir = std::env::temp_dir().join(format!("kubeconfig-read-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("fleet.kubeconfig");
        std::fs::write(
            &path,
            r#"
clusters:
- name: a
  cluster: { server: "https://a.example.com", certificate-authority: ca.crt }
users:
- name: u
  user: { tokenFile: /abs/token, exec: { command: ./bin/login, apiVersion: client.authentication.k8s.io/v1 } }
contexts:
- name: a
  context: { cluster: a, user: u }
"#,
        )
        .unwrap();
        let read = read_file(&path).unwrap();
        let cluster = read.clusters[0].cluster.as_ref().unwrap();
        assert_eq!(
            cluster.certificate_authority.as_deref(),
            dir.join("ca.crt").to_str()
        );
        let user = read.auth_infos[0].auth_info.as_ref().unwrap();
        assert_eq!(user.token_file.as_deref(), Some("/abs/token"));
        assert_eq!(
            user.exec.as_ref().unwrap().command.as_deref(),
            dir.join("./bin/login").to_str()
        );
        let missing = read_file(&dir.join("nothing")).unwrap_err();
        assert!(matches!(missing, KubeconfigError::Unreadable { .. }));
        assert!(missing.to_string().contains("nothing"), "{missing}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_current_context_is_the_named_one_or_the_only_one() {
        let mut parsed = parse(&kubeconfig(), "test").unwrap();
        let many = current_context(&parsed, "test").unwrap_err();
        assert!(many.to_string().contains("no current-context"), "{many}");
        parsed.current_context = Some("exec".into());
        assert_eq!(current_context(&parsed, "test").unwrap(), "exec");
        parsed.current_context = Some("gone".into());
        assert!(current_context(&parsed, "test").is_err());
        parsed.current_context = None;
        parsed.contexts.truncate(1);
        assert_eq!(current_context(&parsed, "test").unwrap(), "good");
    }

    #[test]
    fn a_fingerprint_changes_with_the_entries_a_context_uses_only() {
        let parsed = parse(&kubeconfig(), "test").unwrap();
        let before = fingerprint(&parsed, "good").unwrap();
        assert_eq!(fingerprint(&parsed, "good"), Some(before));
        assert_eq!(fingerprint(&parsed, "nothing"), None);
        let mut other_changed = parsed.clone();
        other_changed.clusters[1].cluster.as_mut().unwrap().server = Some("https://c".into());
        assert_eq!(fingerprint(&other_changed, "good"), Some(before));
        let mut own_changed = parsed.clone();
        own_changed.clusters[0].cluster.as_mut().unwrap().server = Some("https://c".into());
        assert_ne!(fingerprint(&own_changed, "good"), Some(before));
    }

    #[tokio::test]
    async fn a_failing_credential_plugin_is_reported_without_its_command_line_or_output() {
        let yaml = r#"
clusters:
- name: a
  cluster: { server: "https://127.0.0.1:1" }
users:
- name: u
  user:
    exec:
      apiVersion: client.authentication.k8s.io/v1
      command: sh
      args: ["-c", "echo out-SECRET-1; echo err-SECRET-2 >&2; exit 1", "arg-SECRET-3"]
      env: [{ name: PASSWORD, value: env-SECRET-4 }]
      interactiveMode: Never
contexts:
- name: a
  context: { cluster: a, user: u }
"#;
        let parsed = parse(yaml, "test").unwrap();
        let policy = KubeconfigPolicy::default().allow_exec();
        let (_, config) = configs(&parsed, "test", &policy).await.remove(0);
        let Err(error) = client(config.unwrap(), "test", "a").await else {
            panic!("a client despite a failing plugin");
        };
        let text = format!("{error} {error:?}");
        assert!(text.contains("credentials could not be obtained"), "{text}");
        assert!(!text.contains("SECRET"), "{text}");
    }

    #[test]
    fn a_context_alone_holds_its_entries_only() {
        let parsed = parse(&kubeconfig(), "test").unwrap();
        let alone = only(&parsed, "good").unwrap();
        assert_eq!(alone.contexts.len(), 1);
        assert_eq!(alone.clusters.len(), 1);
        assert_eq!(alone.auth_infos.len(), 1);
        assert_eq!(alone.current_context.as_deref(), Some("good"));
        assert!(only(&parsed, "nothing").is_none());
    }

    /// A plugin that works at first, with a token that has expired, then
    /// fails: the refresh's error reaches requests (and so the watches'
    /// logs and status), and says nothing of the command, env or output.
    #[tokio::test]
    async fn a_plugin_failing_at_refresh_is_reported_without_its_secrets() {
        let dir = std::env::temp_dir().join(format!("kubeconfig-refresh-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ran = dir.join("ran");
        let script = format!(
            "echo x >> {m}; if [ $(wc -l < {m}) -gt 1 ]; then echo out-SECRET-1; echo err-SECRET-2 >&2; exit 1; fi; \
             echo '{{\"apiVersion\":\"client.authentication.k8s.io/v1\",\"kind\":\"ExecCredential\",\"status\":{{\"token\":\"t\",\"expirationTimestamp\":\"2000-01-01T00:00:00Z\"}}}}'",
            m = ran.display()
        );
        let yaml = format!(
            r#"
clusters:
- name: a
  cluster: {{ server: "https://127.0.0.1:1" }}
users:
- name: u
  user:
    exec:
      apiVersion: client.authentication.k8s.io/v1
      command: sh
      args: ["-c", {script:?}, "arg-SECRET-3"]
      env: [{{ name: PASSWORD, value: env-SECRET-4 }}]
contexts:
- name: a
  context: {{ cluster: a, user: u }}
"#
        );
        let parsed = parse(&yaml, "test").unwrap();
        let policy = KubeconfigPolicy::default().allow_exec();
        let (_, config) = configs(&parsed, "test", &policy).await.remove(0);
        let Ok(client) = client(config.unwrap(), "test", "a").await else {
            panic!("the first runs work");
        };
        let error = client.apiserver_version().await.unwrap_err();
        let text = crate::client::error_chain(&error);
        assert!(text.contains("credentials could not be obtained"), "{text}");
        assert!(!text.contains("SECRET"), "{text}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn one_build_at_a_time_for_a_source_however_many_tries_wait() {
        let dir = std::env::temp_dir().join(format!("kube-fleet-turns-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("log");
        let plugin = dir.join("plugin");
        std::fs::write(
            &plugin,
            format!(
                "#!/bin/sh\necho start >> '{log}'\nsleep 1\necho end >> '{log}'\n\
                 echo '{{\"apiVersion\":\"client.authentication.k8s.io/v1\",\"kind\":\"ExecCredential\",\"status\":{{\"token\":\"t\"}}}}'\n",
                log = log.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&plugin, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        let yaml = format!(
            r#"{{"apiVersion": "v1", "kind": "Config",
              "clusters": [{{"name": "a", "cluster": {{"server": "https://a.example.com"}}}}],
              "users": [{{"name": "a", "user": {{"exec": {{"apiVersion": "client.authentication.k8s.io/v1", "command": "{}"}}}}}}],
              "contexts": [{{"name": "a", "context": {{"cluster": "a", "user": "a"}}}}]}}"#,
            plugin.display()
        );
        let parsed = parse(&yaml, "Secret x/turns").unwrap();
        let policy = KubeconfigPolicy::default().allow_exec();
        let (first, second) = tokio::join!(
            current_client(&parsed, "Secret x/turns", &policy),
            current_client(&parsed, "Secret x/turns", &policy),
        );
        assert!(first.is_ok() && second.is_ok());
        let runs = std::fs::read_to_string(&log).unwrap();
        assert!(runs.lines().count() >= 4, "{runs}");
        assert!(
            !runs.contains("start\nstart"),
            "two plugins ran at once: {runs}"
        );
        assert!(slots().is_empty(), "a turn kept after its builds ended");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
