//! Kubeconfigs parsed from text, files and bytes, with errors that name
//! their source, and what a provider reads from one: its current context,
//! a context alone, and a fingerprint of what a context is built from.

use std::{
    hash::{BuildHasher, Hash, Hasher},
    path::Path,
    sync::{Arc, OnceLock},
};

use k8s_openapi::api::core::v1::Secret;
use kube::config::Kubeconfig;

use super::error::KubeconfigError;

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

/// The bytes `secret` holds under `key`, unless the key is missing or
/// empty: a kubeconfig for [`bytes_client`](super::bytes_client), say.
pub fn secret_bytes(secret: &Secret, key: &str) -> Option<Arc<[u8]>> {
    let value = secret.data.as_ref()?.get(key)?;
    (!value.0.is_empty()).then(|| Arc::from(value.0.as_slice()))
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
    let invalid = |context: &str, reason: String| KubeconfigError::invalid(origin, context, reason);
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
