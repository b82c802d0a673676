//! Clients built from a checked context, one build at a time per source,
//! within [`CLIENT_TIMEOUT`].

use std::sync::OnceLock;

use kube::config::{KubeConfigOptions, Kubeconfig};

use super::{
    error::KubeconfigError,
    parse::{current_context, parse_bytes},
    policy::{KubeconfigPolicy, checked},
};
use crate::{client::ClusterClient, provider::build_error::BuildError};

/// How long building a client may take, and how long its credential
/// plugin may run (then it is killed).
pub const CLIENT_TIMEOUT: std::time::Duration = crate::client::PLUGIN_TIMEOUT;

/// A client (see [`client::cluster_client`](crate::client::cluster_client)) for the
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
) -> Result<ClusterClient, KubeconfigError> {
    let invalid = |reason: String| KubeconfigError::invalid(origin, context, reason);
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

/// A client for the one cluster a kubeconfig held as bytes (a Secret's
/// value) stands for: [`parse_bytes`], then [`current_client`].
///
/// # Errors
///
/// [`BuildError::Refused`](BuildError::Refused) if the bytes are not
/// a kubeconfig, or as [`current_client`].
pub async fn bytes_client(
    bytes: &[u8],
    origin: &str,
    policy: &KubeconfigPolicy,
) -> Result<ClusterClient, BuildError> {
    let parsed = parse_bytes(bytes, origin)?;
    current_client(&parsed, origin, policy).await
}

/// A client for the one cluster a kubeconfig stands for (one held in a
/// Secret, say): its [`current_context`], checked against `policy` and
/// built with [`client`]. The other contexts are not looked at.
///
/// # Errors
///
/// [`BuildError::Refused`](BuildError::Refused) if there is no
/// usable current context, or the policy refuses it;
/// [`BuildError::Unavailable`](BuildError::Unavailable) if it is
/// fine but gives no client now (an allowed credential plugin fails).
///
/// ```
/// use kube_multicluster::provider::{BuildError, kubeconfig::{self, KubeconfigPolicy}};
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
) -> Result<ClusterClient, BuildError> {
    let context = current_context(kubeconfig, origin)?;
    let alone = checked(kubeconfig, &context, origin, policy)?;
    let config = load(alone, &context, origin).await?;
    client(config, origin, &context)
        .await
        .map_err(|error| BuildError::Unavailable(error.to_string()))
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

pub(super) fn slots() -> std::sync::MutexGuard<'static, Slots> {
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
            let reason = "another context of that name comes first";
            Err(KubeconfigError::invalid(origin, &name, reason))
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
        .map_err(|error| {
            KubeconfigError::invalid(origin, context, crate::client::error_chain(&error))
        })
}
