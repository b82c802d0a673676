//! Credential plugins (a kubeconfig user's `exec`), run by this crate
//! rather than by kube.
//!
//! kube runs a plugin on a blocking thread, once for the client's TLS
//! identity and once more for its token, and cannot stop it: a plugin that
//! hangs holds its thread, and a runtime being dropped waits for it. Here a
//! plugin runs once per client, as a child process of its own process
//! group; its credential goes into the configuration in place of the
//! plugin, so kube runs nothing. A plugin that runs too long, or whose
//! build is given up (a timeout, a shutdown), is killed with its group. A
//! token that expires is renewed by running the plugin again, the same way,
//! as a request finds it about to expire.
//!
//! What a plugin prints, its arguments and its environment may hold
//! secrets: its failures say what happened (it could not start, its exit
//! status, output that is not an `ExecCredential`), never with those.

use std::{
    fmt,
    process::{ExitStatus, Stdio},
    sync::Arc,
    time::Duration,
};

use base64::{Engine, engine::general_purpose::STANDARD};
use futures::{FutureExt, future::BoxFuture};
use http::{HeaderValue, Request, header::AUTHORIZATION};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::{Config, client::Body, config::ExecConfig};
use tokio::{io::AsyncReadExt, process::Command, sync::watch};
use tower::BoxError;

/// How long a plugin may run before it is killed.
pub(crate) const PLUGIN_TIMEOUT: Duration = Duration::from_secs(30);

/// A token is renewed this long before it expires, as client-go and kube do.
const RENEW_BEFORE: SignedDuration = SignedDuration::from_secs(60);

/// Why a credential plugin gave no credential.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum PluginError {
    /// The kubeconfig's `exec` names no command.
    #[error("the credential plugin names no command")]
    NoCommand,
    /// `provideClusterInfo` is set, but there is no cluster to tell of.
    #[error("the credential plugin asks for the cluster's details, which are not known")]
    NoClusterInfo,
    /// It could not be started.
    #[error("the credential plugin could not be started ({0})")]
    Spawn(std::io::ErrorKind),
    /// Its output could not be read.
    #[error("the credential plugin's output could not be read ({0})")]
    Read(std::io::ErrorKind),
    /// It exited with a failure.
    #[error("the credential plugin failed ({0})")]
    Exit(ExitStatus),
    /// It ran too long, and was killed.
    #[error("the credential plugin gave no answer within {0:?}, and was stopped")]
    Timeout(Duration),
    /// What it printed is not an `ExecCredential`.
    #[error("the credential plugin's output is not an ExecCredential")]
    NotACredential,
    /// Its `ExecCredential` holds neither a token nor a client certificate
    /// and key.
    #[error("the credential plugin's ExecCredential holds no token, nor a certificate and key")]
    NoCredential,
    /// Its `expirationTimestamp` is not an RFC 3339 time.
    #[error("the credential plugin's expirationTimestamp is not a time")]
    BadExpiration,
}

/// What a plugin gave.
struct Credential {
    token: Option<String>,
    /// A client certificate and its key, PEM.
    identity: Option<(String, String)>,
    expires: Option<Timestamp>,
}

#[derive(serde::Deserialize)]
struct ExecCredential {
    status: Option<Status>,
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct Status {
    expiration_timestamp: Option<String>,
    token: Option<String>,
    client_certificate_data: Option<String>,
    client_key_data: Option<String>,
}

/// Runs the plugin of `config`'s user, if kube would (no auth provider,
/// basic auth, token or token file comes first), and puts what it gives in
/// its place, within `limit`. A token that expires comes back as an
/// [`ExecToken`] to renew it, for the client's stack; the configuration
/// then carries no credential of its own.
pub(crate) async fn resolve(
    mut config: Config,
    limit: Duration,
) -> Result<(Config, Option<ExecToken>), PluginError> {
    let user = &config.auth_info;
    let first = user.auth_provider.is_some()
        || (user.username.is_some() && user.password.is_some())
        || user.token.is_some()
        || user.token_file.is_some();
    let Some(exec) = config.auth_info.exec.clone().filter(|_| !first) else {
        return Ok((config, None));
    };
    let credential = run(&exec, limit).await?;
    let user = &mut config.auth_info;
    user.exec = None;
    // A certificate and key win over a token, as kube has it.
    if let Some((certificate, key)) = credential.identity {
        user.client_certificate_data = Some(STANDARD.encode(certificate));
        user.client_key_data = Some(STANDARD.encode(key).into());
        return Ok((config, None));
    }
    let token = credential.token.ok_or(PluginError::NoCredential)?;
    match credential.expires {
        None => {
            user.token = Some(token.into());
            Ok((config, None))
        }
        Some(expires) => Ok((config, Some(ExecToken::new(exec, token, expires)))),
    }
}

/// The plugin's process group: killed on drop unless disarmed.
struct Group {
    id: Option<u32>,
}

impl Drop for Group {
    fn drop(&mut self) {
        // `kill_on_drop` kills the plugin itself; this, what it started.
        #[cfg(unix)]
        if let Some(pid) = self
            .id
            .take()
            .and_then(|id| rustix::process::Pid::from_raw(id as i32))
            && let Err(error) =
                rustix::process::kill_process_group(pid, rustix::process::Signal::KILL)
        {
            tracing::debug!(group = pid.as_raw_nonzero().get(), %error, "could not kill a credential plugin's process group");
        }
    }
}

/// Runs `exec` once, within `limit`.
async fn run(exec: &ExecConfig, limit: Duration) -> Result<Credential, PluginError> {
    let program = exec.command.as_deref().ok_or(PluginError::NoCommand)?;
    let mut command = Command::new(program);
    command.args(exec.args.iter().flatten());
    for variable in exec.env.iter().flatten() {
        if let (Some(name), Some(value)) = (variable.get("name"), variable.get("value")) {
            command.env(name, value);
        }
    }
    let cluster = match exec.provide_cluster_info {
        true => Some(exec.cluster.as_ref().ok_or(PluginError::NoClusterInfo)?),
        false => None,
    };
    // Never interactive: a plugin does not share this process's terminal.
    let mut spec = serde_json::json!({ "interactive": false });
    if let Some(cluster) = cluster {
        spec["cluster"] = serde_json::to_value(cluster).unwrap_or_default();
    }
    let info = serde_json::json!({
        "apiVersion": exec.api_version,
        "kind": "ExecCredential",
        "spec": spec,
    });
    command.env("KUBERNETES_EXEC_INFO", info.to_string());
    for name in exec.drop_env.iter().flatten() {
        command.env_remove(name);
    }
    command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    #[cfg(unix)]
    command.process_group(0);
    let mut child = command.spawn().map_err(|e| PluginError::Spawn(e.kind()))?;
    // Dropped before `child`: the group goes while the plugin, not yet
    // reaped, still holds its id.
    let mut group = Group { id: child.id() };
    let output = tokio::time::timeout(limit, async {
        let mut stdout = Vec::new();
        if let Some(mut pipe) = child.stdout.take() {
            pipe.read_to_end(&mut stdout)
                .await
                .map_err(|e| PluginError::Read(e.kind()))?;
        }
        let status = child
            .wait()
            .await
            .map_err(|e| PluginError::Read(e.kind()))?;
        Ok::<_, PluginError>((status, stdout))
    })
    .await;
    if child.id().is_none() {
        // Reaped: its id may be another process's already.
        group.id = None;
    }
    let (status, stdout) = output.map_err(|_| PluginError::Timeout(limit))??;
    if !status.success() {
        return Err(PluginError::Exit(status));
    }
    // client-go reads it as YAML, of which JSON is a part.
    let credential: ExecCredential =
        serde_saphyr::from_slice(&stdout).map_err(|_| PluginError::NotACredential)?;
    let status = credential.status.ok_or(PluginError::NoCredential)?;
    let expires = status
        .expiration_timestamp
        .map(|at| at.parse::<Timestamp>())
        .transpose()
        .map_err(|_| PluginError::BadExpiration)?;
    let identity = status.client_certificate_data.zip(status.client_key_data);
    if identity.is_none() && status.token.is_none() {
        return Err(PluginError::NoCredential);
    }
    Ok(Credential {
        token: status.token,
        identity,
        expires,
    })
}

/// A token from a credential plugin that expires: put on each request, and
/// renewed by running the plugin again in a task of its own, one run at a
/// time, once less than a minute is left. Requests go on with the token
/// they have while it is still good, and wait for the renewal only once it
/// has expired. A renewal that fails is not tried again for
/// [`RENEW_RETRY`]: requests that need it meanwhile fail with its error. A
/// tower `AsyncPredicate`.
#[derive(Clone)]
pub(crate) struct ExecToken {
    exec: Arc<ExecConfig>,
    state: Arc<std::sync::Mutex<TokenState>>,
    /// Changes each time a renewal ends.
    renewals: watch::Sender<u64>,
}

struct TokenState {
    token: String,
    expires: Timestamp,
    renewing: bool,
    /// When the last renewal failed, and with what.
    failed: Option<(tokio::time::Instant, PluginError)>,
}

/// How long a failed renewal is not tried again.
const RENEW_RETRY: Duration = Duration::from_secs(5);

impl fmt::Debug for ExecToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExecToken").finish_non_exhaustive()
    }
}

/// What a request does about the token.
enum Next {
    Use(String),
    Fail(PluginError),
    Wait,
}

impl ExecToken {
    fn new(exec: ExecConfig, token: String, expires: Timestamp) -> Self {
        let state = TokenState {
            token,
            expires,
            renewing: false,
            failed: None,
        };
        Self {
            exec: Arc::new(exec),
            state: Arc::new(std::sync::Mutex::new(state)),
            renewals: watch::Sender::new(0),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, TokenState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// What to do now, starting a renewal where one is due.
    fn next(&self) -> Next {
        let now = Timestamp::now();
        let mut state = self.state();
        let expired = now >= state.expires;
        let due = now.saturating_add(RENEW_BEFORE).unwrap_or(Timestamp::MAX) >= state.expires;
        if due && !state.renewing {
            match &state.failed {
                Some((at, error)) if at.elapsed() < RENEW_RETRY => {
                    if expired {
                        return Next::Fail(error.clone());
                    }
                }
                _ => {
                    state.renewing = true;
                    tokio::spawn(self.clone().renew());
                }
            }
        }
        if expired {
            Next::Wait
        } else {
            Next::Use(state.token.clone())
        }
    }

    /// Runs the plugin once, and keeps what it gives or why it failed.
    async fn renew(self) {
        let renewed = run(&self.exec, PLUGIN_TIMEOUT)
            .await
            .and_then(|fresh| Ok((fresh.token.ok_or(PluginError::NoCredential)?, fresh.expires)));
        {
            let mut state = self.state();
            state.renewing = false;
            match renewed {
                Ok((token, expires)) => {
                    state.token = token;
                    // One that no longer says when it expires is kept, as a
                    // first token without an expiry is.
                    state.expires = expires.unwrap_or(Timestamp::MAX);
                    state.failed = None;
                }
                Err(error) => {
                    tracing::warn!(%error, "renewing a credential plugin's token failed; tried again in {RENEW_RETRY:?}");
                    state.failed = Some((tokio::time::Instant::now(), error));
                }
            }
        }
        self.renewals.send_modify(|n| *n += 1);
    }

    async fn header(&self) -> Result<HeaderValue, BoxError> {
        let token = loop {
            let mut renewals = self.renewals.subscribe();
            match self.next() {
                Next::Use(token) => break token,
                Next::Fail(error) => return Err(error.into()),
                // Woken when the renewal ends, whichever way.
                Next::Wait => {
                    let _ = renewals.changed().await;
                }
            }
        };
        let mut value = HeaderValue::from_str(&format!("Bearer {token}"))
            .map_err(|_| "the credential plugin's token is not a valid header value")?;
        value.set_sensitive(true);
        Ok(value)
    }
}

impl tower::filter::AsyncPredicate<Request<Body>> for ExecToken {
    type Future = BoxFuture<'static, Result<Request<Body>, BoxError>>;
    type Request = Request<Body>;

    fn check(&mut self, mut request: Request<Body>) -> Self::Future {
        let token = self.clone();
        async move {
            let value = token.header().await?;
            request.headers_mut().insert(AUTHORIZATION, value);
            Ok(request)
        }
        .boxed()
    }
}
