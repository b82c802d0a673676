//! What the provider knows of the `Cluster`s and their kubeconfig Secrets,
//! and what each change to one does.

use std::{
    collections::{HashMap, hash_map::RandomState},
    hash::BuildHasher,
    sync::Arc,
    time::Duration,
};

use futures::stream::{self, BoxStream, StreamExt};
use k8s_openapi::api::core::v1::Secret;
use kube::{ResourceExt, runtime::watcher};
use kube_fleet::provider::{
    ClusterEvent, Engagements, Problems, Seen, SourceChange,
    kubeconfig::{self, KubeconfigPolicy},
};

use crate::{ClusterObject, KUBECONFIG_KEY, KUBECONFIG_SUFFIX, Ready};

pub(crate) struct Options<K> {
    pub(crate) namespace: Option<String>,
    pub(crate) policy: KubeconfigPolicy,
    pub(crate) retry: Duration,
    pub(crate) ready: Ready<K>,
}

impl<K> Clone for Options<K> {
    fn clone(&self) -> Self {
        Self {
            namespace: self.namespace.clone(),
            policy: self.policy.clone(),
            retry: self.retry,
            ready: self.ready.clone(),
        }
    }
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

// One at a time, for a moment, on the stack.
#[allow(clippy::large_enum_variant)]
enum Input<K> {
    Event(ClusterEvent),
    Cluster(Result<watcher::Event<K>, watcher::Error>),
    Secret(Result<watcher::Event<Secret>, watcher::Error>),
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

/// The name failures of the watch of `Cluster`s are reported under.
fn clusters_source<K: ClusterObject>() -> String {
    format!("Clusters ({})", K::api_version(&()))
}

/// The name failures of the watch of kubeconfig Secrets are reported under.
fn secrets_source() -> String {
    format!("Secrets labelled {}", crate::CLUSTER_NAME_LABEL)
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
        stream::unfold(
            (self, clusters, secrets),
            |(mut state, mut clusters, mut secrets)| async move {
                loop {
                    // The watches retry for ever; they end only if dropped.
                    let input = tokio::select! {
                        event = state.engagements.next() => Input::Event(event),
                        Some(event) = clusters.next() => Input::Cluster(event),
                        Some(event) = secrets.next() => Input::Secret(event),
                    };
                    match input {
                        Input::Event(event) => return Some((event, (state, clusters, secrets))),
                        Input::Cluster(event) => state.on_cluster(event),
                        Input::Secret(event) => state.on_secret(event),
                    }
                }
            },
        )
        .boxed()
    }

    fn on_cluster(&mut self, event: Result<watcher::Event<K>, watcher::Error>) {
        let event = match event {
            Ok(event) => event,
            Err(error) => return self.problems.watch(&clusters_source::<K>(), Some(&error)),
        };
        self.problems.watch(&clusters_source::<K>(), None);
        let changes = self
            .cluster_watch
            .changes(event, |c: &K| key(c.namespace(), &c.name_any()));
        for change in changes {
            let key = match change {
                SourceChange::Applied(cluster) => {
                    let key = key(cluster.namespace(), &cluster.name_any());
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
        let event = match event {
            Ok(event) => event,
            Err(error) => return self.problems.watch(&secrets_source(), Some(&error)),
        };
        self.problems.watch(&secrets_source(), None);
        // The cluster's other Secrets (its CA, its service account keys)
        // carry the label too: they are passed over, and kept nowhere.
        let event = match event {
            watcher::Event::Apply(s) | watcher::Event::InitApply(s) if !is_kubeconfig(&s) => return,
            watcher::Event::Delete(s) if !is_kubeconfig(&s) => return,
            event => event,
        };
        let listed = self.secret_watch.listed();
        for change in self.secret_watch.changes(event, secret_key) {
            let key = match change {
                SourceChange::Applied(secret) => {
                    let key = secret_key(&secret);
                    let bytes = secret
                        .data
                        .as_ref()
                        .and_then(|data| data.get(KUBECONFIG_KEY))
                        .map(|value| value.0.as_slice())
                        .filter(|bytes| !bytes.is_empty())
                        .map(Arc::from);
                    let deleting = secret.metadata.deletion_timestamp.is_some();
                    if deleting {
                        self.secrets.remove(&key);
                    } else {
                        self.secrets.insert(key.clone(), bytes);
                    }
                    key
                }
                SourceChange::Deleted(key) => {
                    self.secrets.remove(&key);
                    key
                }
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
        let (namespace, name) = key.split_once('/').unwrap_or(("", key));
        let secret = format!("Secret {namespace}/{name}{KUBECONFIG_SUFFIX}");
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
