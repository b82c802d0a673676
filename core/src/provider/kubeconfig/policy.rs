//! What a kubeconfig may ask for, and the check that holds a context to it.

use kube::config::Kubeconfig;

use super::error::KubeconfigError;

/// What a kubeconfig may ask for beyond a server, its CA and credentials
/// given inline. The default refuses everything below; each `allow_`
/// method allows one thing.
///
/// ```
/// use kube_multicluster::provider::kubeconfig::KubeconfigPolicy;
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
pub(super) fn checked(
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
        .ok_or_else(|| KubeconfigError::invalid(origin, context, "the context names no cluster"))?;
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
