//! What the provider knows of the `Cluster`s and their kubeconfig Secrets,
//! and what each change to one does.

use std::{
    collections::{HashMap, hash_map::RandomState},
    hash::BuildHasher,
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

use crate::{ClusterObject, KUBECONFIG_KEY, KUBECONFIG_SUFFIX, Ready};

#[derive(Clone)]
pub(crate) struct Options<K> {
    pub(crate) namespace: Option<String>,
    pub(crate) policy: KubeconfigPolicy,
    pub(crate) retry: Duration,
    pub(crate) ready: Ready<K>,
}

type Events<K> = BoxStream<'static, Result<watcher::Event<K>, watcher::Error>>;

/// A kubeconfig Secret's key, as bytes (`None`: the key is missing or
/// empty).
type Kubeconfig = Option<Arc<[u8]>>;

pub(crate) struct State<K> {
    options: Options<K>,
    problems: Problems,
    hasher: RandomState,
    /// Whether each `Cluster` (by `namespace/name`) is ready now.
    clusters: HashMap<String, bool>,
    cluster_watch: Seen,
    /// Each kubeconfig Secret's kubeconfig, by its cluster's
    /// `namespace/name`.
    secrets: HashMap<String, Kubeconfig>,
    secret_watch: Seen,
    engagements: Engagements,
}

fn key(namespace: Option<String>, name: &str) -> String {
    format!("{}/{name}", namespace.unwrap_or_default())
}

/// The `namespace/name` of the cluster a Secret is the kubeconfig of, if
/// it is one.
fn secret_key(secret: &Secret) -> String {
    let name = secret.name_any();
    let cluster = name.strip_suffix(KUBECONFIG_SUFFIX).unwrap_or(&name);
    key(secret.namespace(), cluster)
}

fn is_kubeconfig(secret: &Secret) -> bool {
    secret.metadata.name.as_deref().is_some_and(|name| {
        name.len() > KUBECONFIG_SUFFIX.len() && name.ends_with(KUBECONFIG_SUFFIX)
    })
}

impl<K: ClusterObject> State<K> {
    pub(crate) fn new(options: Options<K>, problems: Problems) -> Self {
        let engagements = Engagements::new(problems.clone(), options.retry);
        Self {
            options,
            problems,
            hasher: RandomState::new(),
            clusters: HashMap::new(),
            cluster_watch: Seen::new(),
            secrets: HashMap::new(),
            secret_watch: Seen::new(),
            engagements,
        }
    }

    pub(crate) fn events(
        self,
        clusters: Events<K>,
        secrets: Events<Secret>,
    ) -> BoxStream<'static, ClusterEvent> {
        provider::drive(
            self,
            |state| &mut state.engagements,
            (clusters, Self::on_cluster),
            (secrets, Self::on_secret),
        )
    }

    fn on_cluster(&mut self, event: Result<watcher::Event<K>, watcher::Error>) {
        let source = format!("Clusters ({})", K::api_version(&()));
        self.problems.watched(&source, &event);
        let Ok(event) = event else { return };
        let cluster_key = |c: &K| key(c.namespace(), &c.name_any());
        for change in self.cluster_watch.changes(event, cluster_key) {
            let key = match change {
                SourceChange::Applied(cluster) => {
                    let key = cluster_key(&cluster);
                    let ready = cluster.meta().deletion_timestamp.is_none()
                        && (self.options.ready)(&cluster);
                    self.clusters.insert(key.clone(), ready);
                    key
                }
                SourceChange::Deleted(key) => {
                    self.clusters.remove(&key);
                    key
                }
            };
            self.update(&key);
        }
    }

    fn on_secret(&mut self, event: Result<watcher::Event<Secret>, watcher::Error>) {
        let source = format!("Secrets labelled {}", crate::CLUSTER_NAME_LABEL);
        self.problems.watched(&source, &event);
        let Ok(event) = event else { return };
        // The cluster's other Secrets (its CA, its service account keys)
        // carry the label too: they are passed over, and kept nowhere.
        let event = match event {
            watcher::Event::Apply(s) | watcher::Event::InitApply(s) if !is_kubeconfig(&s) => return,
            watcher::Event::Delete(s) if !is_kubeconfig(&s) => return,
            event => event,
        };
        let listed = self.secret_watch.listed();
        for change in self.secret_watch.changes(event, secret_key) {
            let (key, now) = match change {
                SourceChange::Applied(secret) => {
                    let bytes = kubeconfig::secret_bytes(&secret, KUBECONFIG_KEY);
                    let deleting = secret.metadata.deletion_timestamp.is_some();
                    (secret_key(&secret), (!deleting).then_some(bytes))
                }
                SourceChange::Deleted(key) => (key, None),
            };
            match now {
                Some(bytes) => self.secrets.insert(key.clone(), bytes),
                None => self.secrets.remove(&key),
            };
            self.update(&key);
        }
        if !listed && self.secret_watch.listed() {
            // Clusters without a Secret are told of only now.
            let keys: Vec<String> = self.clusters.keys().cloned().collect();
            keys.iter().for_each(|key| self.update(key));
        }
    }

    /// Brings the cluster `key` in line with its `Cluster` and Secret.
    fn update(&mut self, key: &str) {
        let source = format!("Cluster {key}");
        let Some(true) = self.clusters.get(key) else {
            // Not there, leaving, or not ready (yet): nothing to report.
            self.engagements.unwant(key);
            self.problems.clear(&source);
            return;
        };
        let secret = format!("Secret {key}{KUBECONFIG_SUFFIX}");
        match self.secrets.get(key) {
            None if !self.secret_watch.listed() => self.engagements.unwant(key),
            None => {
                self.engagements.unwant(key);
                self.problems.report(
                    &source,
                    format!(
                        "is ready, but its kubeconfig {secret} is not there \
                         (read only when labelled {}; key {KUBECONFIG_KEY:?})",
                        crate::CLUSTER_NAME_LABEL
                    ),
                );
            }
            Some(None) => {
                // A version built from bytes it no longer holds is never
                // engaged, even if its build is under way.
                self.engagements.hold(key);
                self.problems.report(
                    &source,
                    format!(
                        "{secret} has no key {KUBECONFIG_KEY:?}, or it is empty: \
                         a cluster engaged from it before is left as it was"
                    ),
                );
            }
            Some(Some(bytes)) => {
                let hash = self.hasher.hash_one(&**bytes);
                let bytes = bytes.clone();
                let policy = self.options.policy.clone();
                let origin = format!("{source}: {secret}, key {KUBECONFIG_KEY:?}");
                self.engagements.want(key, source, hash, move || {
                    let (bytes, policy, origin) = (bytes.clone(), policy.clone(), origin.clone());
                    async move { kubeconfig::bytes_client(&bytes, &origin, &policy).await }
                });
            }
        }
    }
}
