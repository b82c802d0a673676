//! What the provider knows of the Secrets, and what each change to one does.

use std::{
    collections::{HashMap, HashSet, VecDeque, hash_map::RandomState},
    hash::BuildHasher,
};

use futures::stream::{self, BoxStream, StreamExt};
use k8s_openapi::api::core::v1::Secret;
use kube::{ResourceExt, runtime::watcher};
use kube_fleet::{
    ClusterName,
    provider::{
        ClusterEvent, Problems,
        kubeconfig::{self, KubeconfigPolicy},
    },
};

#[derive(Clone, Debug)]
pub(crate) struct Options {
    pub(crate) namespace: String,
    pub(crate) selector: String,
    pub(crate) key: String,
    pub(crate) policy: KubeconfigPolicy,
    pub(crate) retry: std::time::Duration,
}

/// Why a Secret's kubeconfig gave no client.
enum Failure {
    /// Not a usable kubeconfig, or refused by the policy: not tried again
    /// until it changes.
    Refused(String),
    /// Fine, but no client came of it now (a credential plugin failed).
    Unavailable(String),
}

pub(crate) struct State {
    options: Options,
    problems: Problems,
    hasher: RandomState,
    /// The Secrets whose cluster is engaged, with the hash of the
    /// kubeconfig it was engaged from.
    engaged: HashMap<String, u64>,
    /// The hash of each Secret's kubeconfig that gave no cluster, and why,
    /// so that it is not tried again until it changes.
    refused: HashMap<String, (u64, String)>,
    /// The Secrets whose kubeconfig is fine but gave no client (a
    /// credential plugin failed, say), tried again every `retry`.
    unavailable: HashMap<String, Secret>,
    /// The Secrets seen since a relist began.
    relisted: Option<HashSet<String>>,
    ready: VecDeque<ClusterEvent>,
}

type Secrets = BoxStream<'static, Result<watcher::Event<Secret>, watcher::Error>>;

impl State {
    pub(crate) fn new(options: Options, problems: Problems) -> Self {
        Self {
            options,
            problems,
            hasher: RandomState::new(),
            engaged: HashMap::new(),
            refused: HashMap::new(),
            unavailable: HashMap::new(),
            relisted: None,
            ready: VecDeque::new(),
        }
    }

    pub(crate) fn events(self, secrets: Secrets) -> BoxStream<'static, ClusterEvent> {
        stream::unfold((self, secrets), |(mut state, mut secrets)| async move {
            loop {
                if let Some(event) = state.ready.pop_front() {
                    return Some((event, (state, secrets)));
                }
                if state.unavailable.is_empty() {
                    // The watch retries for ever; it ends only if dropped.
                    let event = secrets.next().await?;
                    state.handle(event).await;
                    continue;
                }
                tokio::select! {
                    event = secrets.next() => state.handle(event?).await,
                    () = tokio::time::sleep(state.options.retry) => state.retry().await,
                }
            }
        })
        .boxed()
    }

    fn watch_source(&self) -> String {
        format!("Secrets in namespace {}", self.options.namespace)
    }

    fn source(&self, name: &str) -> String {
        format!("Secret {}/{name}", self.options.namespace)
    }

    async fn handle(&mut self, event: Result<watcher::Event<Secret>, watcher::Error>) {
        let event = match event {
            Ok(event) => {
                self.problems.clear(&self.watch_source());
                event
            }
            Err(error) => {
                self.problems.report(
                    self.watch_source(),
                    format!(
                        "the watch of Secrets ({}) fails, and is retried: {}",
                        self.options.selector,
                        kube_fleet::provider::describe(&error)
                    ),
                );
                return;
            }
        };
        match event {
            watcher::Event::Init => self.relisted = Some(HashSet::new()),
            watcher::Event::InitApply(secret) => {
                if let Some(relisted) = &mut self.relisted {
                    relisted.insert(secret.name_any());
                }
                self.apply(&secret).await;
            }
            watcher::Event::InitDone => {
                let relisted = self.relisted.take().unwrap_or_default();
                let gone: Vec<String> = self
                    .engaged
                    .keys()
                    .chain(self.refused.keys())
                    .filter(|name| !relisted.contains(*name))
                    .cloned()
                    .collect();
                for name in gone {
                    self.gone(&name);
                }
                // Secrets deleted while the watch was down take their
                // problems with them.
                let prefix = self.source("");
                self.problems.retain(|source| {
                    source
                        .strip_prefix(&prefix)
                        .is_none_or(|name| relisted.contains(name))
                });
            }
            watcher::Event::Apply(secret) => self.apply(&secret).await,
            watcher::Event::Delete(secret) => self.gone(&secret.name_any()),
        }
    }

    async fn apply(&mut self, secret: &Secret) {
        let name = secret.name_any();
        let source = self.source(&name);
        if secret.metadata.deletion_timestamp.is_some() {
            self.gone(&name);
            return;
        }
        let bytes = secret
            .data
            .as_ref()
            .and_then(|data| data.get(&self.options.key))
            .map(|value| value.0.as_slice())
            .filter(|bytes| !bytes.is_empty());
        let Some(bytes) = bytes else {
            self.problems.report(
                source,
                format!(
                    "has no key {:?}, or it is empty: skipped, and a cluster it gave before is left as it was",
                    self.options.key
                ),
            );
            return;
        };
        let hash = self.hasher.hash_one(bytes);
        if self.engaged.get(&name) == Some(&hash) {
            // Its labels or annotations, or another key: nothing to do.
            self.problems.clear(&source);
            return;
        }
        if let Some((refused, problem)) = self.refused.get(&name)
            && *refused == hash
        {
            // The same again (after its key was missing a while, say).
            self.problems.report(&source, problem);
            return;
        }
        self.unavailable.remove(&name);
        match self.client(bytes, &source).await {
            Ok(client) => {
                self.problems.clear(&source);
                self.refused.remove(&name);
                let again = self.engaged.insert(name.clone(), hash).is_some();
                tracing::info!(secret = %source, again, "engaging a cluster from a kubeconfig Secret");
                self.ready.push_back(ClusterEvent::Engage {
                    name: ClusterName::new(name),
                    client,
                });
            }
            Err(Failure::Refused(problem)) => {
                self.problems.report(&source, &problem);
                self.refused.insert(name.clone(), (hash, problem));
                self.disengage(&name);
            }
            Err(Failure::Unavailable(problem)) => {
                let retry = self.options.retry;
                self.problems
                    .report(&source, format!("{problem} (tried again every {retry:?})"));
                self.unavailable.insert(name.clone(), secret.clone());
                self.disengage(&name);
            }
        }
    }

    /// Tries again the Secrets that gave no client.
    async fn retry(&mut self) {
        let secrets: Vec<Secret> = self.unavailable.drain().map(|(_, s)| s).collect();
        for secret in secrets {
            self.apply(&secret).await;
        }
    }

    /// A client for the kubeconfig in `bytes`, or the problem with it.
    async fn client(&self, bytes: &[u8], source: &str) -> Result<kube::Client, Failure> {
        let key = &self.options.key;
        let origin = format!("{source}, key {key:?}");
        let refused = |text: String| Failure::Refused(text);
        let text = std::str::from_utf8(bytes)
            .map_err(|_| refused(format!("{origin}: not a kubeconfig: it is not UTF-8 text")))?;
        let parsed = kubeconfig::parse(text, &origin).map_err(|e| refused(e.to_string()))?;
        let context =
            kubeconfig::current_context(&parsed, &origin).map_err(|e| refused(e.to_string()))?;
        // That context alone: the others are not this cluster's business.
        let missing = || refused(format!("{origin}: context {context:?} is not there"));
        let alone = kubeconfig::only(&parsed, &context).ok_or_else(missing)?;
        let configs = kubeconfig::configs(&alone, &origin, &self.options.policy).await;
        let config = configs
            .into_iter()
            .next()
            .ok_or_else(missing)?
            .1
            .map_err(|e| refused(e.to_string()))?;
        kubeconfig::client(config, &origin, &context)
            .await
            .map_err(|e| Failure::Unavailable(e.to_string()))
    }

    /// The Secret `name` is gone, or leaving.
    fn gone(&mut self, name: &str) {
        self.refused.remove(name);
        self.unavailable.remove(name);
        self.problems.clear(&self.source(name));
        self.disengage(name);
    }

    fn disengage(&mut self, name: &str) {
        if self.engaged.remove(name).is_some() {
            tracing::info!(secret = %self.source(name), "disengaging a cluster from a kubeconfig Secret");
            self.ready.push_back(ClusterEvent::Disengage {
                name: ClusterName::new(name),
            });
        }
    }
}
