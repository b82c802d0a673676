//! What the provider knows of the Secrets, and what each change to one does.

use std::{collections::hash_map::RandomState, hash::BuildHasher};

use futures::stream::{self, BoxStream, StreamExt};
use k8s_openapi::api::core::v1::Secret;
use kube::{ResourceExt, runtime::watcher};
use kube_multicluster::provider::{
    self, ClusterEvent, Engagements, Problems, Seen, SourceChange,
    kubeconfig::{self, KubeconfigPolicy},
};

#[derive(Clone, Debug)]
pub(crate) struct Options {
    pub(crate) namespace: String,
    pub(crate) selector: String,
    pub(crate) key: String,
    pub(crate) policy: KubeconfigPolicy,
    pub(crate) retry: std::time::Duration,
}

pub(crate) struct State {
    options: Options,
    problems: Problems,
    hasher: RandomState,
    watch: Seen,
    /// The clusters wanted, each from the version of its Secret's
    /// kubeconfig, and the clients being built for them.
    engagements: Engagements,
}

type Secrets = BoxStream<'static, Result<watcher::Event<Secret>, watcher::Error>>;

impl State {
    pub(crate) fn new(options: Options, problems: Problems) -> Self {
        let engagements = Engagements::new(problems.clone(), options.retry);
        Self {
            options,
            problems,
            hasher: RandomState::new(),
            watch: Seen::new(),
            engagements,
        }
    }

    pub(crate) fn events(self, secrets: Secrets) -> BoxStream<'static, ClusterEvent> {
        provider::drive(
            self,
            |state| &mut state.engagements,
            (secrets, Self::handle),
            (stream::empty().boxed(), |_, ()| {}),
        )
    }

    fn watch_source(&self) -> String {
        format!("Secrets in namespace {}", self.options.namespace)
    }

    fn source(&self, name: &str) -> String {
        format!("Secret {}/{name}", self.options.namespace)
    }

    fn handle(&mut self, event: Result<watcher::Event<Secret>, watcher::Error>) {
        match &event {
            Err(error) => {
                let reason = kube_multicluster::client::error_chain(error);
                let selector = &self.options.selector;
                let problem =
                    format!("the watch of Secrets ({selector}) fails, and is retried: {reason}");
                self.problems.report(self.watch_source(), problem);
            }
            Ok(_) => self.problems.watched(&self.watch_source(), &event),
        }
        let Ok(event) = event else { return };
        for change in self.watch.changes(event, ResourceExt::name_any) {
            match change {
                SourceChange::Applied(secret) => self.apply(&secret),
                SourceChange::Deleted(name) => self.gone(&name),
            }
        }
    }

    fn apply(&mut self, secret: &Secret) {
        let name = secret.name_any();
        let source = self.source(&name);
        if secret.metadata.deletion_timestamp.is_some() {
            self.gone(&name);
            return;
        }
        let bytes = kubeconfig::secret_bytes(secret, &self.options.key);
        let Some(bytes) = bytes else {
            // A version built from bytes it no longer holds is never
            // engaged, even if its build is under way.
            self.engagements.hold(&name);
            self.problems.report(
                source,
                format!(
                    "has no key {:?}, or it is empty: skipped, and a cluster it gave before is left as it was",
                    self.options.key
                ),
            );
            return;
        };
        let hash = self.hasher.hash_one(&*bytes);
        let policy = self.options.policy.clone();
        let origin = format!("{source}, key {:?}", self.options.key);
        // Labels, annotations or another key changed: the same version,
        // nothing to do.
        self.engagements.want(name, source, hash, move || {
            let (bytes, policy, origin) = (bytes.clone(), policy.clone(), origin.clone());
            async move { kubeconfig::bytes_client(&bytes, &origin, &policy).await }
        });
    }

    /// The Secret `name` is gone, or leaving.
    fn gone(&mut self, name: &str) {
        self.engagements.unwant(name);
        self.problems.clear(&self.source(name));
    }
}
