//! A cluster provider for the namespaces of one cluster: each namespace is
//! a cluster of its own, named after it.
//!
//! A namespace's cluster sees that namespace only: its caches hold the
//! namespace's objects and no other's, and its client's default namespace
//! is it (`Api::default_namespaced(cluster.client())`). Cluster-scoped types
//! (`Node`, `Namespace`, ...) are the host's, seen whole by every namespace's
//! cluster.
//!
//! All the namespaces' clusters read one [`HostCache`]: each type is watched
//! once at the API server for all of them, and each object is cached once, in
//! its namespace's part of that watch. A thousand namespaces cost one watch
//! per type, not a thousand, and their objects once. Requests go through the
//! host's one client. The host's watches hold the objects of every
//! namespace, also of those the selector leaves out (as one watch of all
//! namespaces does), and need rights to list and watch in all namespaces.
//!
//! The split is of the cache, not of rights: a namespace's client carries the
//! host's credentials, and `Api::namespaced(client, "other")` reaches another
//! namespace. It keeps controllers that mean well apart; it is no security
//! boundary.
//!
//! # Changes
//!
//! Namespaces are watched (those matching [`NamespaceProvider::selector`],
//! if given): a namespace created engages its cluster; one deleted, or given a
//! deletion timestamp (a namespace stays `Terminating` while its contents are
//! removed), disengages it. A failing watch of the namespaces is retried with
//! backoff, the clusters staying as they are; it is reported in
//! [`NamespaceProvider::problems`] while it lasts.
//!
//! ```no_run
//! use kube_multicluster::Fleet;
//! use kube_multicluster_provider_namespace::NamespaceProvider;
//!
//! # async fn example() -> Result<(), kube::Error> {
//! let host = kube::Client::try_default().await?;
//! let provider = NamespaceProvider::new("host", host).selector("tenant=true");
//! let fleet = Fleet::new();
//! tokio::spawn(async move { fleet.run(provider).await });
//! # Ok(())
//! # }
//! ```

#![cfg_attr(docsrs, feature(doc_cfg))]

use std::{
    collections::{HashSet, VecDeque},
    fmt,
    pin::Pin,
    task::{Context, Poll},
};

use futures::{
    Stream, StreamExt,
    stream::{self, BoxStream},
};
use k8s_openapi::api::core::v1::Namespace;
use kube::{Api, ResourceExt, runtime::watcher};
use kube_multicluster::{
    ClusterName,
    cache::HostCache,
    provider::{self, ClusterEvent, Problems, Seen, SourceChange},
};

/// The namespaces of one cluster as clusters: a stream of
/// [`ClusterEvent::EngageView`]s and [`ClusterEvent::Disengage`]s for
/// [`Fleet::run`](kube_multicluster::Fleet::run). See the [crate docs](crate).
///
/// The stream never ends. Nothing runs before it is polled.
pub struct NamespaceProvider {
    host: HostCache,
    selector: Option<String>,
    problems: Problems,
    stream: Option<BoxStream<'static, ClusterEvent>>,
}

impl fmt::Debug for NamespaceProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NamespaceProvider")
            .field("host", &self.host)
            .field("selector", &self.selector)
            .field("problems", &self.problems)
            .finish_non_exhaustive()
    }
}

impl NamespaceProvider {
    /// A provider for every namespace of the cluster `client` reaches,
    /// which is named `host` in logs.
    pub fn new(
        host: impl Into<ClusterName>,
        client: impl Into<kube_multicluster::client::ClusterClient>,
    ) -> Self {
        Self {
            host: HostCache::new(host, client),
            selector: None,
            problems: Problems::new(),
            stream: None,
        }
    }

    /// Only the namespaces that match this label selector (`tenant=true`,
    /// `team in (a,b)`).
    pub fn selector(mut self, selector: impl Into<String>) -> Self {
        self.selector = Some(selector.into());
        self
    }

    /// The cache the namespaces' clusters share: how many watches it holds
    /// at the API server, say.
    pub fn host(&self) -> HostCache {
        self.host.clone()
    }

    /// A failing watch of the namespaces, while it lasts, under the source
    /// `Namespaces of <host>`.
    pub fn problems(&self) -> Problems {
        self.problems.clone()
    }
}

impl Stream for NamespaceProvider {
    type Item = ClusterEvent;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<ClusterEvent>> {
        let this = &mut *self;
        let stream = this.stream.get_or_insert_with(|| {
            let api = Api::<Namespace>::all(this.host.client());
            let mut config = watcher::Config::default();
            if let Some(selector) = &this.selector {
                config = config.labels(selector);
            }
            let namespaces = provider::backoff(watcher(api, config)).boxed();
            let state = State {
                host: this.host.clone(),
                problems: this.problems.clone(),
                engaged: HashSet::new(),
                watch: Seen::new(),
                ready: VecDeque::new(),
            };
            state.events(namespaces)
        });
        stream.poll_next_unpin(cx)
    }
}

type Namespaces = BoxStream<'static, Result<watcher::Event<Namespace>, watcher::Error>>;

struct State {
    host: HostCache,
    problems: Problems,
    engaged: HashSet<String>,
    watch: Seen,
    ready: VecDeque<ClusterEvent>,
}

impl State {
    fn events(self, namespaces: Namespaces) -> BoxStream<'static, ClusterEvent> {
        stream::unfold(
            (self, namespaces),
            |(mut state, mut namespaces)| async move {
                loop {
                    if let Some(event) = state.ready.pop_front() {
                        return Some((event, (state, namespaces)));
                    }
                    let event = namespaces.next().await?;
                    state.handle(event);
                }
            },
        )
        .boxed()
    }

    fn source(&self) -> String {
        format!("Namespaces of {}", self.host.name())
    }

    fn handle(&mut self, event: Result<watcher::Event<Namespace>, watcher::Error>) {
        match &event {
            Err(error) => {
                let reason = kube_multicluster::client::error_chain(error);
                let problem = format!("the watch of namespaces fails, and is retried: {reason}");
                self.problems.report(self.source(), problem);
            }
            Ok(_) => self.problems.watched(&self.source(), &event),
        }
        let Ok(event) = event else { return };
        for change in self.watch.changes(event, ResourceExt::name_any) {
            match change {
                SourceChange::Applied(namespace) => self.apply(&namespace),
                SourceChange::Deleted(name) => self.disengage(&name),
            }
        }
    }

    fn apply(&mut self, namespace: &Namespace) {
        let name = namespace.name_any();
        let terminating = namespace.metadata.deletion_timestamp.is_some()
            || namespace
                .status
                .as_ref()
                .and_then(|status| status.phase.as_deref())
                == Some("Terminating");
        if terminating {
            self.disengage(&name);
        } else if self.engaged.insert(name.clone()) {
            tracing::info!(namespace = %name, host = %self.host.name(), "engaging a namespace as a cluster");
            self.ready.push_back(ClusterEvent::EngageView {
                view: self.host.view(name.clone()),
                name: ClusterName::new(name),
            });
        }
    }

    fn disengage(&mut self, name: &str) {
        if self.engaged.remove(name) {
            tracing::info!(namespace = %name, host = %self.host.name(), "disengaging a namespace");
            self.ready.push_back(ClusterEvent::Disengage {
                name: ClusterName::new(name),
            });
        }
    }
}
