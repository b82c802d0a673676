//! The consumer's access configuration: which credential plugin gets
//! credentials for the clusters each access provider reaches.

use std::{collections::BTreeMap, path::Path};

use kube::config::{
    AuthInfo, Cluster, Context, ExecConfig, Kubeconfig, NamedAuthInfo, NamedCluster, NamedContext,
    NamedExtension,
};
use serde::{Deserialize, Serialize};

use crate::v1alpha1::ClusterProfile;

/// The cluster extension whose value (a list of strings) is appended to
/// the plugin's arguments when the provider's
/// [`profileSourcedCLIArgsPolicy`](AccessProviderConfig::profile_sourced_cli_args_policy)
/// is `Append`.
pub const ADDITIONAL_ARGS_EXTENSION: &str =
    "clusterprofiles.multicluster.x-k8s.io/exec/additional-args";

/// The cluster extension whose value (an object of strings) adds to the
/// plugin's environment, as the provider's
/// [`profileSourcedEnvVarsPolicy`](AccessProviderConfig::profile_sourced_env_vars_policy)
/// says.
pub const ADDITIONAL_ENVS_EXTENSION: &str =
    "clusterprofiles.multicluster.x-k8s.io/exec/additional-envs";

/// The cluster extension kube hands a plugin whose
/// [`provideClusterInfo`](ExecConfig::provide_cluster_info) is true, as
/// `spec.cluster.config` of `KUBERNETES_EXEC_INFO`.
pub const EXEC_EXTENSION: &str = "client.authentication.k8s.io/exec";

/// The consumer's access configuration, the file format of the Cluster
/// Inventory API (`{"providers": [...]}`, JSON): for each access provider
/// name a profile may list in `status.accessProviders`, the exec
/// credential plugin that gets credentials for the clusters it reaches.
///
/// It is yours, not the profiles': the plugins it names run in the
/// controller's process with its rights. A profile only chooses among them
/// (by its access providers' names) and, where a provider's policy allows,
/// adds arguments and environment.
///
/// ```
/// use kube_multicluster_provider_cluster_inventory::AccessConfig;
///
/// let config = AccessConfig::from_json(r#"{
///   "providers": [{
///     "name": "secretreader",
///     "execConfig": {
///       "apiVersion": "client.authentication.k8s.io/v1",
///       "command": "/usr/local/bin/secretreader-plugin",
///       "provideClusterInfo": true
///     }
///   }]
/// }"#, "access.json").unwrap();
/// assert_eq!(config.providers[0].name, "secretreader");
/// ```
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct AccessConfig {
    /// The access providers, first preferred: a profile is reached through
    /// the first of these it lists.
    pub providers: Vec<AccessProviderConfig>,
}

/// One access provider of an [`AccessConfig`].
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct AccessProviderConfig {
    /// The name profiles list it by.
    pub name: String,
    /// The exec credential plugin (kubeconfig `exec` fields: `command`,
    /// `args`, `env`, `apiVersion`, `provideClusterInfo`); it runs without
    /// a terminal, whatever `interactiveMode` says.
    #[serde(
        rename = "execConfig",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub exec_config: Option<ExecConfig>,
    /// Whether a profile may add arguments to the plugin (through the
    /// [`ADDITIONAL_ARGS_EXTENSION`]); not unless set.
    #[serde(
        rename = "profileSourcedCLIArgsPolicy",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub profile_sourced_cli_args_policy: Option<ArgsPolicy>,
    /// Whether a profile may add to the plugin's environment (through the
    /// [`ADDITIONAL_ENVS_EXTENSION`]); not unless set.
    #[serde(
        rename = "profileSourcedEnvVarsPolicy",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub profile_sourced_env_vars_policy: Option<EnvPolicy>,
}

/// What a profile's additional arguments do.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
pub enum ArgsPolicy {
    /// They are ignored.
    #[default]
    #[serde(alias = "")]
    Ignore,
    /// They are appended to the plugin's own.
    Append,
}

/// What a profile's additional environment variables do. A variable that
/// chooses what runs (`PATH`, `LD_*`, `DYLD_*`, `BASH_FUNC_*`, `BASH_ENV`,
/// `ENV`, `IFS`, `SHELLOPTS`, `NODE_OPTIONS`, `PYTHON*`, `PERL*`, `RUBY*`)
/// or `KUBERNETES_EXEC_INFO` is refused whatever the policy, and the profile
/// is reported. Whatever else you allow, the plugin must treat as input from
/// whoever writes the profiles.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
pub enum EnvPolicy {
    /// They are ignored.
    #[default]
    #[serde(alias = "")]
    Ignore,
    /// They are added where the plugin's own environment does not set them.
    AppendIfNotExists,
    /// They are added, and replace the plugin's own of the same name.
    Replace,
}

/// Why an access configuration cannot be used; each names the file.
#[derive(Debug, thiserror::Error)]
pub enum AccessConfigError {
    /// The file cannot be read.
    #[error("access configuration {origin}: cannot be read: {source}")]
    Unreadable {
        /// The file.
        origin: String,
        /// What the system said.
        source: std::io::Error,
    },
    /// The text is not an access configuration.
    #[error("access configuration {origin}: not an access configuration: {reason}")]
    Malformed {
        /// The file.
        origin: String,
        /// What is wrong, with the line and column.
        reason: String,
    },
}

impl AccessConfig {
    /// Reads the access configuration in the JSON file `path`.
    ///
    /// # Errors
    ///
    /// [`AccessConfigError`] naming the file, if it cannot be read or is
    /// not a usable access configuration (see [`from_json`](Self::from_json)).
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, AccessConfigError> {
        let path = path.as_ref();
        let origin = path.display().to_string();
        let text =
            std::fs::read_to_string(path).map_err(|source| AccessConfigError::Unreadable {
                origin: origin.clone(),
                source,
            })?;
        Self::from_json(&text, &origin)
    }

    /// Parses an access configuration from JSON read from `origin`.
    ///
    /// # Errors
    ///
    /// [`AccessConfigError::Malformed`] if it is not JSON of an access
    /// configuration, or a provider has no name, a name an earlier one
    /// has, or no `execConfig` with a `command`.
    pub fn from_json(text: &str, origin: &str) -> Result<Self, AccessConfigError> {
        let malformed = |reason: String| AccessConfigError::Malformed {
            origin: origin.to_owned(),
            reason,
        };
        let config: Self = serde_json::from_str(text).map_err(|error| {
            // The position alone: the text there may be a secret.
            malformed(format!(
                "{} at line {} column {}",
                match error.classify() {
                    serde_json::error::Category::Data => "unexpected content",
                    serde_json::error::Category::Eof => "it ends too soon",
                    _ => "not JSON",
                },
                error.line(),
                error.column()
            ))
        })?;
        for (index, provider) in config.providers.iter().enumerate() {
            if provider.name.is_empty() {
                return Err(malformed(format!("provider {index} has no name")));
            }
            if config.providers[..index]
                .iter()
                .any(|p| p.name == provider.name)
            {
                return Err(malformed(format!(
                    "provider {:?} is named twice",
                    provider.name
                )));
            }
            let command = provider
                .exec_config
                .as_ref()
                .and_then(|e| e.command.as_deref());
            if command.is_none_or(str::is_empty) {
                return Err(malformed(format!(
                    "provider {:?} has no execConfig with a command",
                    provider.name
                )));
            }
        }
        Ok(config)
    }

    /// The kubeconfig that reaches `profile` through the first of this
    /// configuration's providers it lists: its endpoint, and that
    /// provider's plugin with what the profile may add to it.
    ///
    /// # Errors
    ///
    /// Why there is none (the profile lists none of the providers, or an
    /// additional-arguments or -environment extension is not of the right
    /// form), for a problem report.
    pub fn kubeconfig(&self, profile: &ClusterProfile) -> Result<Kubeconfig, String> {
        let listed = profile.access_providers();
        let Some((config, access)) = self.providers.iter().find_map(|config| {
            let access = listed.iter().find(|a| a.name == config.name)?;
            Some((config, *access))
        }) else {
            let names = |names: Vec<&str>| {
                if names.is_empty() {
                    "none".to_owned()
                } else {
                    names.join(", ")
                }
            };
            return Err(format!(
                "lists no access provider this consumer is configured for (it lists: {}; configured: {})",
                names(listed.iter().map(|a| a.name.as_str()).collect()),
                names(self.providers.iter().map(|p| p.name.as_str()).collect()),
            ));
        };
        let mut exec = config.exec_config.clone().unwrap_or_default();
        let extensions = access.cluster.extensions.as_deref().unwrap_or_default();
        for extension in extensions {
            match extension.name.as_str() {
                ADDITIONAL_ARGS_EXTENSION => {
                    if config.profile_sourced_cli_args_policy != Some(ArgsPolicy::Append) {
                        continue;
                    }
                    let args: Vec<String> = serde_json::from_value(extension.extension.clone())
                        .map_err(|_| {
                            format!(
                                "its extension {ADDITIONAL_ARGS_EXTENSION} is not a list of strings"
                            )
                        })?;
                    exec.args.get_or_insert_with(Vec::new).extend(args);
                }
                ADDITIONAL_ENVS_EXTENSION => {
                    let policy = config.profile_sourced_env_vars_policy.unwrap_or_default();
                    if policy == EnvPolicy::Ignore {
                        continue;
                    }
                    let envs: BTreeMap<String, String> = serde_json::from_value(
                        extension.extension.clone(),
                    )
                    .map_err(|_| {
                        format!(
                            "its extension {ADDITIONAL_ENVS_EXTENSION} is not an object of strings"
                        )
                    })?;
                    if let Some(name) = envs.keys().find(|name| !profile_may_set(name)) {
                        return Err(format!(
                            "its extension {ADDITIONAL_ENVS_EXTENSION} sets {name:?}, which a profile may not set \
                             (it would choose what the plugin runs)"
                        ));
                    }
                    add_env(&mut exec, envs, policy);
                }
                _ => {}
            }
        }
        let cluster = &access.cluster;
        let name = access.name.clone();
        Ok(Kubeconfig {
            clusters: vec![NamedCluster {
                name: name.clone(),
                cluster: Some(Cluster {
                    server: Some(cluster.server.clone()),
                    insecure_skip_tls_verify: cluster.insecure_skip_tls_verify,
                    certificate_authority: cluster.certificate_authority.clone(),
                    certificate_authority_data: cluster.certificate_authority_data.clone(),
                    proxy_url: cluster.proxy_url.clone(),
                    disable_compression: cluster.disable_compression,
                    tls_server_name: cluster.tls_server_name.clone(),
                    extensions: cluster.extensions.as_ref().map(|all| {
                        all.iter()
                            .map(|e| NamedExtension {
                                name: e.name.clone(),
                                extension: e.extension.clone(),
                            })
                            .collect()
                    }),
                    ..Cluster::default()
                }),
                ..NamedCluster::default()
            }],
            auth_infos: vec![NamedAuthInfo {
                name: name.clone(),
                auth_info: Some(AuthInfo {
                    exec: Some(exec),
                    ..AuthInfo::default()
                }),
                other: BTreeMap::new(),
            }],
            contexts: vec![NamedContext {
                name: name.clone(),
                context: Some(Context {
                    cluster: name.clone(),
                    user: Some(name.clone()),
                    ..Context::default()
                }),
                ..NamedContext::default()
            }],
            current_context: Some(name),
            ..Kubeconfig::default()
        })
    }
}

/// Whether a profile may set the variable `name` for a plugin: not one
/// that chooses what runs (`PATH`, the dynamic loader's, a shell's or an
/// interpreter's start-up variables) or what kube tells the plugin.
fn profile_may_set(name: &str) -> bool {
    const REFUSED: &[&str] = &[
        "PATH",
        "IFS",
        "ENV",
        "BASH_ENV",
        "SHELLOPTS",
        "NODE_OPTIONS",
        "KUBERNETES_EXEC_INFO",
    ];
    const REFUSED_PREFIXES: &[&str] = &["LD_", "DYLD_", "BASH_FUNC_", "PYTHON", "PERL", "RUBY"];
    let upper = name.to_ascii_uppercase();
    !REFUSED.contains(&upper.as_str()) && !REFUSED_PREFIXES.iter().any(|p| upper.starts_with(p))
}

fn add_env(exec: &mut ExecConfig, envs: BTreeMap<String, String>, policy: EnvPolicy) {
    let list = exec.env.get_or_insert_with(Vec::new);
    for (name, value) in envs {
        let existing = list
            .iter()
            .position(|e| e.get("name").map(String::as_str) == Some(name.as_str()));
        let entry = std::collections::HashMap::from([
            ("name".to_owned(), name),
            ("value".to_owned(), value),
        ]);
        match (existing, policy) {
            (None, _) => list.push(entry),
            (Some(at), EnvPolicy::Replace) => list[at] = entry,
            (Some(_), _) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profile(status: serde_json::Value) -> ClusterProfile {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "multicluster.x-k8s.io/v1alpha1",
            "kind": "ClusterProfile",
            "metadata": { "name": "p", "namespace": "fleet" },
            "spec": { "clusterManager": { "name": "test" } },
            "status": status,
        }))
        .unwrap()
    }

    fn config(json: serde_json::Value) -> AccessConfig {
        AccessConfig::from_json(&json.to_string(), "access.json").unwrap()
    }

    #[test]
    fn the_first_configured_provider_the_profile_lists_is_used_and_access_providers_win() {
        let config = config(serde_json::json!({ "providers": [
            { "name": "a", "execConfig": { "command": "plugin-a" } },
            { "name": "b", "execConfig": { "command": "plugin-b" } },
        ]}));
        let profile = profile(serde_json::json!({
            "credentialProviders": [{ "name": "a", "cluster": { "server": "https://old" } }],
            "accessProviders": [
                { "name": "b", "cluster": { "server": "https://b" } },
                { "name": "a", "cluster": { "server": "https://new" } },
            ],
        }));
        let kubeconfig = config.kubeconfig(&profile).unwrap();
        let cluster = kubeconfig.clusters[0].cluster.as_ref().unwrap();
        assert_eq!(cluster.server.as_deref(), Some("https://new"));
        let exec = kubeconfig.auth_infos[0]
            .auth_info
            .as_ref()
            .unwrap()
            .exec
            .as_ref()
            .unwrap();
        assert_eq!(exec.command.as_deref(), Some("plugin-a"));
    }

    #[test]
    fn a_profile_adds_arguments_and_environment_only_where_allowed() {
        let status = serde_json::json!({ "accessProviders": [{ "name": "a", "cluster": {
            "server": "https://a",
            "extensions": [
                { "name": ADDITIONAL_ARGS_EXTENSION, "extension": ["--region", "eu"] },
                { "name": ADDITIONAL_ENVS_EXTENSION, "extension": { "MODE": "profile", "EXTRA": "1" } },
            ],
        }}]});
        let exec_of = |config: AccessConfig| {
            let kubeconfig = config.kubeconfig(&profile(status.clone())).unwrap();
            kubeconfig.auth_infos[0]
                .auth_info
                .clone()
                .unwrap()
                .exec
                .unwrap()
        };
        let plugin = serde_json::json!({
            "command": "p", "args": ["--own"], "env": [{ "name": "MODE", "value": "own" }],
        });
        let ignored = exec_of(config(serde_json::json!({ "providers": [
            { "name": "a", "execConfig": plugin },
        ]})));
        assert_eq!(ignored.args.unwrap(), ["--own"]);
        assert_eq!(ignored.env.unwrap().len(), 1);
        let appended = exec_of(config(serde_json::json!({ "providers": [{
            "name": "a", "execConfig": plugin,
            "profileSourcedCLIArgsPolicy": "Append",
            "profileSourcedEnvVarsPolicy": "AppendIfNotExists",
        }]})));
        assert_eq!(appended.args.unwrap(), ["--own", "--region", "eu"]);
        let env = appended.env.unwrap();
        assert_eq!(env.len(), 2);
        assert_eq!(env[0]["value"], "own");
        let replaced = exec_of(config(serde_json::json!({ "providers": [{
            "name": "a", "execConfig": plugin, "profileSourcedEnvVarsPolicy": "Replace",
        }]})));
        assert_eq!(replaced.env.unwrap()[0]["value"], "profile");
        let path = profile(
            serde_json::json!({ "accessProviders": [{ "name": "a", "cluster": {
                "server": "https://a",
                "extensions": [{ "name": ADDITIONAL_ENVS_EXTENSION, "extension": { "PATH": "/tmp/evil" } }],
            }}]}),
        );
        let refused = config(serde_json::json!({ "providers": [{
            "name": "a", "execConfig": plugin, "profileSourcedEnvVarsPolicy": "Replace",
        }]}))
        .kubeconfig(&path)
        .unwrap_err();
        assert!(refused.contains("sets \"PATH\""), "{refused}");
    }

    #[test]
    fn bad_configurations_are_refused_naming_the_file_and_provider() {
        let error = |json: &str| {
            AccessConfig::from_json(json, "/etc/access.json")
                .unwrap_err()
                .to_string()
        };
        assert!(error("{ \"providers\": [").contains("/etc/access.json"));
        let missing = error(r#"{"providers": [{"name": "a"}]}"#);
        assert!(
            missing.contains("provider \"a\" has no execConfig with a command"),
            "{missing}"
        );
        let twice = error(
            r#"{"providers": [{"name": "a", "execConfig": {"command": "x"}},
            {"name": "a", "execConfig": {"command": "y"}}]}"#,
        );
        assert!(twice.contains("named twice"), "{twice}");
        let config = config(serde_json::json!({ "providers": [
            { "name": "a", "execConfig": { "command": "x" } },
        ]}));
        let none = config
            .kubeconfig(&profile(serde_json::json!({ "accessProviders": [{ "name": "z", "cluster": { "server": "https://z" } }] })))
            .unwrap_err();
        assert!(none.contains("it lists: z; configured: a"), "{none}");
    }
}
