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

use crate::panic::lock;

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
    /// The token it gave a moment ago has expired already.
    #[error("the credential plugin's token has expired already")]
    Expired,
    /// Renewing its token was cut short (its runtime stopped).
    #[error("renewing the credential plugin's token was cut short")]
    Interrupted,
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
            .and_then(|id| rustix::process::Pid::from_raw(i32::try_from(id).ok()?))
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
    /// When the last renewal ended, and why it failed, if it did.
    renewed: Option<(tokio::time::Instant, Option<PluginError>)>,
}

/// How long after a renewal no other starts: a failed one is not tried
/// again sooner, nor is a token renewed again that came back short-lived.
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

/// A renewal under way: however it ends (done, panicked, or dropped with
/// its runtime), requests waiting for it are told.
struct Renewal {
    token: ExecToken,
    outcome: Option<Result<(String, Option<Timestamp>), PluginError>>,
}

impl Drop for Renewal {
    fn drop(&mut self) {
        {
            let mut state = lock(&self.token.state);
            state.renewing = false;
            let failed = match self.outcome.take() {
                Some(Ok((token, expires))) => {
                    state.token = token;
                    // One that no longer says when it expires is kept, as
                    // a first token without an expiry is.
                    state.expires = expires.unwrap_or(Timestamp::MAX);
                    None
                }
                Some(Err(error)) => Some(error),
                None => Some(PluginError::Interrupted),
            };
            if let Some(error) = &failed {
                tracing::warn!(%error, "renewing a credential plugin's token failed; tried again in {RENEW_RETRY:?}");
            }
            state.renewed = Some((tokio::time::Instant::now(), failed));
        }
        self.token.renewals.send_modify(|n| *n += 1);
    }
}

impl ExecToken {
    fn new(exec: ExecConfig, token: String, expires: Timestamp) -> Self {
        let state = TokenState {
            token,
            expires,
            renewing: false,
            renewed: None,
        };
        Self {
            exec: Arc::new(exec),
            state: Arc::new(std::sync::Mutex::new(state)),
            renewals: watch::Sender::new(0),
        }
    }

    /// What to do now, starting a renewal where one is due.
    fn next(&self) -> Next {
        let now = Timestamp::now();
        let start = {
            let mut state = lock(&self.state);
            let expired = now >= state.expires;
            let due = now.saturating_add(RENEW_BEFORE).unwrap_or(Timestamp::MAX) >= state.expires;
            let recent = state
                .renewed
                .as_ref()
                .filter(|(at, _)| at.elapsed() < RENEW_RETRY);
            match (due, state.renewing, recent) {
                (false, _, _) => return Next::Use(state.token.clone()),
                (true, true, _) if expired => return Next::Wait,
                (true, true, _) => return Next::Use(state.token.clone()),
                // Renewed a moment ago: what it gave (or why it failed)
                // stands until the interval has passed.
                (true, false, Some((_, failed))) if expired => {
                    return Next::Fail(failed.clone().unwrap_or(PluginError::Expired));
                }
                (true, false, Some(_)) => return Next::Use(state.token.clone()),
                (true, false, None) => {
                    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
                        return Next::Fail(PluginError::Interrupted);
                    };
                    state.renewing = true;
                    (runtime, expired, state.token.clone())
                }
            }
        };
        // Spawned with the lock let go: a renewal dropped at once (its
        // runtime shutting down) takes it to say so.
        let (runtime, expired, token) = start;
        let renewal = Renewal {
            token: self.clone(),
            outcome: None,
        };
        runtime.spawn(renewal.run());
        if expired {
            Next::Wait
        } else {
            Next::Use(token)
        }
    }

    async fn header(&self) -> Result<HeaderValue, BoxError> {
        let token = loop {
            let mut renewals = self.renewals.subscribe();
            match self.next() {
                Next::Use(token) => break token,
                Next::Fail(error) => return Err(error.into()),
                // Woken when the renewal ends, whichever way.
                Next::Wait => {
                    let waited = RENEW_RETRY + PLUGIN_TIMEOUT;
                    if tokio::time::timeout(waited, renewals.changed())
                        .await
                        .is_err()
                    {
                        return Err(PluginError::Timeout(PLUGIN_TIMEOUT).into());
                    }
                }
            }
        };
        let mut value = HeaderValue::from_str(&format!("Bearer {token}"))
            .map_err(|_| "the credential plugin's token is not a valid header value")?;
        value.set_sensitive(true);
        Ok(value)
    }
}

impl Renewal {
    /// Runs the plugin once; what it gives, or why it failed, is kept as
    /// the renewal ends.
    async fn run(mut self) {
        let renewed = run(&self.token.exec, PLUGIN_TIMEOUT)
            .await
            .and_then(|fresh| Ok((fresh.token.ok_or(PluginError::NoCredential)?, fresh.expires)));
        self.outcome = Some(renewed);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A plugin that notes each run in `runs`, waits `wait`, then gives the
    /// token `t2` expiring at `expires`.
    fn plugin(runs: &std::path::Path, wait: &str, expires: &str) -> ExecConfig {
        let script = format!(
            "echo run >> '{}'; {wait}; echo '{{\"apiVersion\":\"client.authentication.k8s.io/v1\",\
             \"kind\":\"ExecCredential\",\"status\":{{\"token\":\"t2\",\"expirationTimestamp\":\"{expires}\"}}}}'",
            runs.display()
        );
        ExecConfig {
            api_version: Some("client.authentication.k8s.io/v1".into()),
            command: Some("sh".into()),
            args: Some(vec!["-c".into(), script]),
            ..ExecConfig::default()
        }
    }

    fn runs(path: &std::path::Path) -> usize {
        std::fs::read_to_string(path).map_or(0, |text| text.lines().count())
    }

    fn dir(what: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("exec-{what}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[tokio::test]
    async fn requests_go_on_with_the_token_in_hand_while_it_is_renewed() {
        let dir = dir("renew");
        let ran = dir.join("runs");
        let later = Timestamp::now()
            .saturating_add(SignedDuration::from_secs(3600))
            .unwrap();
        let token = ExecToken::new(
            plugin(&ran, "sleep 1", &later.to_string()),
            "t1".into(),
            Timestamp::now()
                .saturating_add(SignedDuration::from_secs(30))
                .unwrap(),
        );
        // Due, not expired: the token in hand, at once.
        let began = tokio::time::Instant::now();
        assert_eq!(token.header().await.unwrap(), "Bearer t1");
        assert_eq!(token.header().await.unwrap(), "Bearer t1");
        assert!(began.elapsed() < Duration::from_millis(500));
        let mut renewals = token.renewals.subscribe();
        renewals.changed().await.unwrap();
        assert_eq!(token.header().await.unwrap(), "Bearer t2");
        assert_eq!(runs(&ran), 1, "one renewal for both requests");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn a_renewal_that_gives_an_expired_token_fails_rather_than_runs_again() {
        let dir = dir("expired");
        let ran = dir.join("runs");
        let token = ExecToken::new(
            plugin(&ran, "true", "2000-01-01T00:00:00Z"),
            "t1".into(),
            Timestamp::UNIX_EPOCH,
        );
        let failed = token.header().await.unwrap_err();
        assert!(failed.to_string().contains("expired already"), "{failed}");
        let again = token.header().await.unwrap_err();
        assert!(again.to_string().contains("expired already"), "{again}");
        assert_eq!(runs(&ran), 1, "the plugin ran again at once");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn a_plugin_that_exits_and_one_that_prints_garbage_are_told_apart() {
        let exits = ExecConfig {
            command: Some("sh".into()),
            args: Some(vec!["-c".into(), "echo secret-output; exit 3".into()]),
            ..ExecConfig::default()
        };
        let Err(exited) = run(&exits, PLUGIN_TIMEOUT).await else {
            panic!("a credential from a failing plugin");
        };
        assert_eq!(
            exited.to_string(),
            "the credential plugin failed (exit status: 3)"
        );
        let garbage = ExecConfig {
            command: Some("sh".into()),
            args: Some(vec!["-c".into(), "echo '{ secret-output'".into()]),
            ..ExecConfig::default()
        };
        let Err(printed) = run(&garbage, PLUGIN_TIMEOUT).await else {
            panic!("a credential from garbage");
        };
        assert_eq!(printed, PluginError::NotACredential);
        let hangs = ExecConfig {
            command: Some("sleep".into()),
            args: Some(vec!["30".into()]),
            ..ExecConfig::default()
        };
        let Err(hung) = run(&hangs, Duration::from_millis(200)).await else {
            panic!("a credential from a plugin that hangs");
        };
        assert_eq!(hung, PluginError::Timeout(Duration::from_millis(200)));
    }
}
