//! What the provider knows of the profiles and their Secrets, and what each
//! change to one does.

use std::{
    collections::{BTreeMap, HashMap, hash_map::RandomState},
    hash::{BuildHasher, Hash, Hasher},
    sync::Arc,
    time::Duration,
};

use futures::stream::BoxStream;
use k8s_openapi::api::core::v1::Secret;
use kube::{ResourceExt, runtime::watcher};
use kube_multicluster::provider::{
    self, ClusterEvent, Engagements, Problems, Seen, SourceChange,
    kubeconfig::{self, KubeconfigPolicy},
};

use crate::{
    CONSUMER_LABEL, Credentials, Healthy, PROFILE_LABEL, SECRET_KEY, v1alpha1::ClusterProfile,
};

#[derive(Clone)]
pub(crate) struct Options {
    pub(crate) credentials: Credentials,
    pub(crate) namespace: Option<String>,
    pub(crate) policy: KubeconfigPolicy,
    pub(crate) retry: Duration,
    pub(crate) healthy: Healthy,
}

/// A Secret's kubeconfig, as bytes (`None`: the key is missing or empty).
type Kubeconfig = Option<Arc<[u8]>>;

type Events<K> = BoxStream<'static, Result<watcher::Event<K>, watcher::Error>>;

/// What a profile asks for now.
struct Profile {
    healthy: bool,
    /// With access providers: its kubeconfig, or why there is none.
    kubeconfig: Option<Result<Arc<kube::config::Kubeconfig>, String>>,
}

pub(crate) struct State {
    options: Options,
    problems: Problems,
    hasher: RandomState,
    profiles: HashMap<String, Profile>,
    profile_watch: Seen,
    /// With Secrets: each profile's Secrets by name, with their kubeconfig
    /// (`None`: the key is missing or empty).
    secrets: HashMap<String, BTreeMap<String, Kubeconfig>>,
    /// The profile each Secret is for, by the Secret's `namespace/name`.
    secret_profiles: HashMap<String, String>,
    secret_watch: Seen,
    engagements: Engagements,
}

/// An object's `namespace/name`.
fn key(object: &impl ResourceExt) -> String {
    let namespace = object.namespace().unwrap_or_default();
    format!("{namespace}/{}", object.name_any())
}

impl State {
    pub(crate) fn new(options: Options, problems: Problems) -> Self {
        let engagements = Engagements::new(problems.clone(), options.retry);
        Self {
            options,
            problems,
            hasher: RandomState::new(),
            profiles: HashMap::new(),
            profile_watch: Seen::new(),
            secrets: HashMap::new(),
            secret_profiles: HashMap::new(),
            secret_watch: Seen::new(),
            engagements,
        }
    }

    pub(crate) fn events(
        self,
        profiles: Events<ClusterProfile>,
        secrets: Events<Secret>,
    ) -> BoxStream<'static, ClusterEvent> {
        provider::drive(
            self,
            |state| &mut state.engagements,
            (profiles, Self::on_profile),
            (secrets, Self::on_secret),
        )
    }

    fn on_profile(&mut self, event: Result<watcher::Event<ClusterProfile>, watcher::Error>) {
        let source = "ClusterProfiles (multicluster.x-k8s.io/v1alpha1)";
        self.problems.watched(source, &event);
        let Ok(event) = event else { return };
        for change in self.profile_watch.changes(event, key) {
            let key = match change {
                SourceChange::Applied(profile) => {
                    let key = key(&profile);
                    let healthy = profile.metadata.deletion_timestamp.is_none()
                        && (self.options.healthy)(&profile);
                    let kubeconfig = match &self.options.credentials {
                        Credentials::Access(access) if healthy => {
                            Some(access.kubeconfig(&profile).map(Arc::new))
                        }
                        _ => None,
                    };
                    self.profiles.insert(
                        key.clone(),
                        Profile {
                            healthy,
                            kubeconfig,
                        },
                    );
                    key
                }
                SourceChange::Deleted(key) => {
                    self.profiles.remove(&key);
                    key
                }
            };
            self.update(&key);
        }
    }

    fn on_secret(&mut self, event: Result<watcher::Event<Secret>, watcher::Error>) {
        let source = format!("Secrets labelled {CONSUMER_LABEL}");
        self.problems.watched(&source, &event);
        let Ok(event) = event else { return };
        let listed = self.secret_watch.listed();
        for change in self.secret_watch.changes(event, key) {
            let (secret_key, now) = match change {
                SourceChange::Applied(secret) => {
                    let namespace = secret.namespace().unwrap_or_default();
                    let profile = secret.labels().get(PROFILE_LABEL).filter(|p| !p.is_empty());
                    let bytes = kubeconfig::secret_bytes(&secret, SECRET_KEY);
                    let deleting = secret.metadata.deletion_timestamp.is_some();
                    let now = profile.filter(|_| !deleting);
                    let now = now.map(|p| (format!("{namespace}/{p}"), bytes));
                    (key(&secret), now)
                }
                SourceChange::Deleted(secret_key) => (secret_key, None),
            };
            // Off the profile it was for, if another, and onto the one it
            // is for, each brought in line once.
            let name = secret_key.split_once('/').map_or("", |(_, n)| n).to_owned();
            let before = self.secret_profiles.remove(&secret_key);
            if let Some(before) = &before
                && now.as_ref().is_none_or(|(profile, _)| profile != before)
            {
                if let Some(secrets) = self.secrets.get_mut(before) {
                    secrets.remove(&name);
                    if secrets.is_empty() {
                        self.secrets.remove(before);
                    }
                }
                self.update(before);
            }
            if let Some((profile, bytes)) = now {
                self.secret_profiles.insert(secret_key, profile.clone());
                self.secrets
                    .entry(profile.clone())
                    .or_default()
                    .insert(name, bytes);
                self.update(&profile);
            }
        }
        if !listed && self.secret_watch.listed() {
            // Profiles without a Secret are told of only now.
            let keys: Vec<String> = self.profiles.keys().cloned().collect();
            keys.iter().for_each(|key| self.update(key));
        }
    }

    /// Brings the cluster `key` in line with its profile (and Secret).
    fn update(&mut self, key: &str) {
        let source = format!("ClusterProfile {key}");
        let Some(profile) = self.profiles.get(key).filter(|p| p.healthy) else {
            // Not there, leaving, or not healthy (yet): nothing to report.
            self.engagements.unwant(key);
            self.problems.clear(&source);
            return;
        };
        let policy = self.options.policy.clone();
        match (&self.options.credentials, &profile.kubeconfig) {
            (Credentials::Access(_), Some(Ok(kubeconfig))) => {
                let hash = {
                    let mut hasher = self.hasher.build_hasher();
                    let value = serde_json::to_value(&**kubeconfig).unwrap_or_default();
                    canonical(&value, &mut hasher);
                    hasher.finish()
                };
                let kubeconfig = kubeconfig.clone();
                let origin = format!(
                    "{source}: access provider {:?}",
                    kubeconfig.current_context.as_deref().unwrap_or_default()
                );
                self.engagements.want(key, source, hash, move || {
                    let (kubeconfig, policy, origin) =
                        (kubeconfig.clone(), policy.clone(), origin.clone());
                    async move { kubeconfig::current_client(&kubeconfig, &origin, &policy).await }
                });
            }
            (Credentials::Access(_), problem) => {
                self.engagements.unwant(key);
                let problem = match problem {
                    Some(Err(problem)) => problem.clone(),
                    _ => "gives no kubeconfig".to_owned(),
                };
                self.problems.report(&source, problem);
            }
            (Credentials::Secrets { consumer }, _) => {
                let secrets = self.secrets.get(key);
                let (namespace, profile_name) = key.split_once('/').unwrap_or(("", key));
                let labels = format!("{CONSUMER_LABEL}={consumer}, {PROFILE_LABEL}={profile_name}");
                match secrets
                    .map(|s| s.iter().collect::<Vec<_>>())
                    .unwrap_or_default()[..]
                {
                    [] if !self.secret_watch.listed() => self.engagements.unwant(key),
                    [] => {
                        self.engagements.unwant(key);
                        self.problems.report(
                            &source,
                            format!(
                                "is healthy, but no Secret in its namespace is labelled {labels}"
                            ),
                        );
                    }
                    [(name, None)] => {
                        // A version built from bytes it no longer holds
                        // is never engaged, even if its build is under way.
                        self.engagements.hold(key);
                        self.problems.report(
                            &source,
                            format!(
                                "its Secret {name} has no key {SECRET_KEY:?}, or it is empty: \
                             a cluster engaged from it before is left as it was"
                            ),
                        )
                    }
                    [(name, Some(bytes))] => {
                        let hash = self.hasher.hash_one(&**bytes);
                        let bytes = bytes.clone();
                        let origin =
                            format!("{source}: Secret {namespace}/{name}, key {SECRET_KEY:?}");
                        self.engagements.want(key, source, hash, move || {
                            let (bytes, policy, origin) =
                                (bytes.clone(), policy.clone(), origin.clone());
                            async move { kubeconfig::bytes_client(&bytes, &origin, &policy).await }
                        });
                    }
                    ref several => {
                        let names: Vec<&str> = several.iter().map(|(n, _)| n.as_str()).collect();
                        self.engagements.unwant(key);
                        self.problems.report(
                            &source,
                            format!(
                                "{} Secrets are labelled {labels} ({}), and one is wanted",
                                names.len(),
                                names.join(", ")
                            ),
                        );
                    }
                }
            }
        }
    }
}

/// Hashes `value` with the keys of each object in order, so that the same
/// kubeconfig hashes the same however its maps were filled.
fn canonical(value: &serde_json::Value, hasher: &mut impl Hasher) {
    match value {
        serde_json::Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            "{".hash(hasher);
            for key in keys {
                key.hash(hasher);
                canonical(&map[key], hasher);
            }
            "}".hash(hasher);
        }
        serde_json::Value::Array(items) => {
            "[".hash(hasher);
            items.iter().for_each(|item| canonical(item, hasher));
            "]".hash(hasher);
        }
        other => other.to_string().hash(hasher),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ADDITIONAL_ENVS_EXTENSION, AccessConfig};

    #[test]
    fn a_kubeconfig_with_profile_environment_hashes_the_same_every_time() {
        let access = AccessConfig::from_json(
            r#"{"providers": [{"name": "a", "execConfig": {"command": "p",
                "env": [{"name": "OWN", "value": "1"}]},
                "profileSourcedEnvVarsPolicy": "AppendIfNotExists"}]}"#,
            "test",
        )
        .unwrap();
        let profile: ClusterProfile = serde_json::from_value(serde_json::json!({
            "apiVersion": "multicluster.x-k8s.io/v1alpha1",
            "kind": "ClusterProfile",
            "metadata": { "name": "p", "namespace": "fleet" },
            "spec": { "clusterManager": { "name": "test" } },
            "status": { "accessProviders": [{ "name": "a", "cluster": {
                "server": "https://a",
                "extensions": [{ "name": ADDITIONAL_ENVS_EXTENSION,
                    "extension": { "MODE": "x", "REGION": "eu", "TIER": "1" } }],
            }}]},
        }))
        .unwrap();
        let keys = RandomState::new();
        let hash = || {
            let value = serde_json::to_value(access.kubeconfig(&profile).unwrap()).unwrap();
            let mut hasher = keys.build_hasher();
            canonical(&value, &mut hasher);
            hasher.finish()
        };
        let first = hash();
        assert!((0..100).all(|_| hash() == first));
    }
}
