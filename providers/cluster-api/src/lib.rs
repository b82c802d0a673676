//! A cluster provider for the workload clusters of a [Cluster API] management
//! cluster: each `Cluster` (`cluster.x-k8s.io`) whose control plane is
//! initialized is a cluster, named `namespace/name`, reached through the
//! kubeconfig Cluster API writes for it.
//!
//! [Cluster API]: https://cluster-api.sigs.k8s.io/
//!
//! # What it reads
//!
//! - `Cluster` objects, by default of version `v1beta2` ([`v1beta2::Cluster`]);
//!   [`ClusterApiProvider::v1beta1`] reads `v1beta1` ([`v1beta1::Cluster`])
//!   instead, and [`ClusterApiProvider::of`] any type of yours that
//!   implements [`ClusterObject`].
//! - Whether a `Cluster` is ready: by default, whether its control plane is
//!   initialized, read from the field its version defines:
//!   `status.initialization.controlPlaneInitialized` in `v1beta2`,
//!   `status.controlPlaneReady` in `v1beta1`.
//!   [`ClusterApiProvider::ready`] replaces the test.
//! - The kubeconfig in the Secret `<cluster name>-kubeconfig` in the
//!   `Cluster`'s namespace, under the key `value` ([`KUBECONFIG_KEY`]),
//!   its current context. The Secrets watched are those that carry the label
//!   [`CLUSTER_NAME_LABEL`], which Cluster API puts on every Secret it
//!   writes for a cluster; a Secret you write yourself needs the label too.
//!
//! Both are watched in every namespace, or in one
//! ([`ClusterApiProvider::namespace`]).
//!
//! # Changes
//!
//! - A `Cluster` that is ready and has its kubeconfig Secret is engaged;
//!   one that is not ready yet is not, and is engaged when its status says
//!   it is: the provider waits for the change on its watch, it does not
//!   poll.
//! - A changed kubeconfig (compared by a hash of the key's bytes) engages
//!   the cluster again, with a new client; the old one stays in use until
//!   the new one is built (a new kubeconfig that gives no client
//!   disengages it).
//! - A `Cluster` deleted, or given a deletion timestamp, or no longer ready
//!   by the test, is disengaged; so is one whose Secret is deleted.
//!
//! # Security and bad input
//!
//! Whoever can write Secrets in the watched namespaces chooses what the
//! kubeconfig asks for, so the provider applies [`KubeconfigPolicy::default`]
//! (Cluster API's own kubeconfigs need nothing more); allow more with
//! [`ClusterApiProvider::policy`].
//!
//! A ready `Cluster` without its Secret, a Secret without the key, a
//! kubeconfig that does not parse or is refused, and one whose allowed
//! credential plugin fails (tried again every [`ClusterApiProvider::retry`])
//! are each reported in [`ClusterApiProvider::problems`] under `Cluster
//! namespace/name`, and logged once, until fixed or gone. A Secret without
//! the key leaves a cluster engaged from it as it was. Clients are built
//! concurrently, so one cluster whose plugin hangs holds up no other. A
//! failing watch is reported and retried, and the clusters stay meanwhile.
//!
//! ```no_run
//! use kube_multicluster::Fleet;
//! use kube_multicluster_provider_cluster_api::ClusterApiProvider;
//!
//! # async fn example() -> Result<(), kube::Error> {
//! let management = kube::Client::try_default().await?;
//! let provider = ClusterApiProvider::new(management);
//! let problems = provider.problems();
//! let fleet = Fleet::new();
//! tokio::spawn(async move { fleet.run(provider).await });
//! # Ok(())
//! # }
//! ```

#![cfg_attr(docsrs, feature(doc_cfg))]

mod schema;
mod state;
pub mod v1beta1;
pub mod v1beta2;

use std::{
    fmt,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use futures::{Stream, StreamExt, stream::BoxStream};
use k8s_openapi::{NamespaceResourceScope, api::core::v1::Secret};
use kube::{Api, Client, Resource, runtime::watcher};
use kube_multicluster::provider::{self, ClusterEvent, Problems, kubeconfig::KubeconfigPolicy};
use serde::de::DeserializeOwned;

/// The label Cluster API puts on the Secrets it writes for a cluster, whose
/// value is the cluster's name. The provider watches the Secrets that carry
/// it.
pub const CLUSTER_NAME_LABEL: &str = "cluster.x-k8s.io/cluster-name";

/// The key of the kubeconfig Secret's data that holds the kubeconfig.
pub const KUBECONFIG_KEY: &str = "value";

/// What a `Cluster`'s kubeconfig Secret is named after the cluster:
/// `<cluster name>-kubeconfig`.
pub const KUBECONFIG_SUFFIX: &str = "-kubeconfig";

/// How long until a cluster whose kubeconfig is fine but gave no client (an
/// allowed credential plugin failed, say) is tried again, by default.
pub const DEFAULT_RETRY: Duration = Duration::from_secs(30);

/// A version of the Cluster API `Cluster` type the provider can watch.
///
/// Implemented for [`v1beta2::Cluster`] and [`v1beta1::Cluster`]; implement
/// it for a type of your own to watch another version.
pub trait ClusterObject:
    Resource<DynamicType = (), Scope = NamespaceResourceScope>
    + Clone
    + DeserializeOwned
    + fmt::Debug
    + Send
    + Sync
    + 'static
{
    /// Whether the cluster's control plane is initialized, as this version
    /// of the type says: the default readiness test.
    fn control_plane_initialized(&self) -> bool;
}

type Ready<K> = Arc<dyn Fn(&K) -> bool + Send + Sync>;

/// Workload clusters of a Cluster API management cluster: a stream of
/// [`ClusterEvent`]s for [`Fleet::run`](kube_multicluster::Fleet::run). See the
/// [crate docs](crate).
///
/// The stream never ends; failing watches are retried with backoff, and the
/// clusters stay as they are meanwhile. Nothing runs before it is polled.
pub struct ClusterApiProvider<K: ClusterObject = v1beta2::Cluster> {
    client: Option<Client>,
    options: state::Options<K>,
    problems: Problems,
    stream: Option<BoxStream<'static, ClusterEvent>>,
}

impl<K: ClusterObject> fmt::Debug for ClusterApiProvider<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClusterApiProvider")
            .field("kind", &K::api_version(&()))
            .field("namespace", &self.options.namespace)
            .field("policy", &self.options.policy)
            .field("problems", &self.problems)
            .finish_non_exhaustive()
    }
}

impl ClusterApiProvider<v1beta2::Cluster> {
    /// A provider for the `v1beta2` `Cluster`s in every namespace of the
    /// management cluster `client` reaches.
    pub fn new(client: Client) -> Self {
        Self::of(client)
    }

    /// A provider for the `v1beta1` `Cluster`s, for Cluster API releases
    /// that serve no `v1beta2`.
    pub fn v1beta1(client: Client) -> ClusterApiProvider<v1beta1::Cluster> {
        ClusterApiProvider::of(client)
    }
}

impl<K: ClusterObject> ClusterApiProvider<K> {
    /// A provider for the `Cluster`s of type `K` in every namespace of the
    /// management cluster `client` reaches.
    pub fn of(client: Client) -> Self {
        Self {
            client: Some(client),
            options: state::Options {
                namespace: None,
                policy: KubeconfigPolicy::default(),
                retry: DEFAULT_RETRY,
                ready: Arc::new(K::control_plane_initialized),
            },
            problems: Problems::new(),
            stream: None,
        }
    }

    /// Watches the `Cluster`s and Secrets of `namespace` alone.
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.options.namespace = Some(namespace.into());
        self
    }

    /// Whether a `Cluster` is ready to be engaged, in place of
    /// [`ClusterObject::control_plane_initialized`]. It is asked on each
    /// change of the `Cluster`; a cluster engaged is disengaged when it
    /// says no.
    ///
    /// ```
    /// use kube_multicluster_provider_cluster_api::ClusterApiProvider;
    ///
    /// # fn example(client: kube::Client) {
    /// // Engage once the Cluster's `Available` condition is true.
    /// let provider = ClusterApiProvider::new(client).ready(|cluster| {
    ///     let conditions = cluster.status.as_ref().and_then(|s| s.conditions.as_ref());
    ///     conditions.into_iter().flatten().any(|c| c.type_ == "Available" && c.status == "True")
    /// });
    /// # }
    /// ```
    pub fn ready(mut self, ready: impl Fn(&K) -> bool + Send + Sync + 'static) -> Self {
        self.options.ready = Arc::new(ready);
        self
    }

    /// What the kubeconfigs may ask for; [`KubeconfigPolicy::default`]
    /// unless set.
    pub fn policy(mut self, policy: KubeconfigPolicy) -> Self {
        self.options.policy = policy;
        self
    }

    /// How long until a cluster whose kubeconfig is fine but gave no client
    /// (an allowed credential plugin failed or timed out) is tried again;
    /// [`DEFAULT_RETRY`] unless set. A kubeconfig that does not parse or is
    /// refused is not tried again until it changes.
    pub fn retry(mut self, every: Duration) -> Self {
        self.options.retry = every;
        self
    }

    /// What keeps `Cluster`s from being engaged now, by `Cluster
    /// namespace/name`, and failing watches, by `Clusters (<api version>)`
    /// and `Secrets labelled cluster.x-k8s.io/cluster-name`.
    /// Shared with the provider: it stays current while the provider runs.
    pub fn problems(&self) -> Problems {
        self.problems.clone()
    }
}

impl<K: ClusterObject> Stream for ClusterApiProvider<K> {
    type Item = ClusterEvent;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<ClusterEvent>> {
        let this = &mut *self;
        let stream = this.stream.get_or_insert_with(|| {
            let client = this.client.take().expect("a client until first polled");
            let (clusters, secrets) = match &this.options.namespace {
                Some(ns) => (
                    Api::<K>::namespaced(client.clone(), ns),
                    Api::<Secret>::namespaced(client, ns),
                ),
                None => (Api::<K>::all(client.clone()), Api::<Secret>::all(client)),
            };
            let clusters = provider::backoff(watcher(clusters, watcher::Config::default())).boxed();
            let secrets = provider::backoff(watcher(
                secrets,
                watcher::Config::default().labels(CLUSTER_NAME_LABEL),
            ))
            .boxed();
            state::State::new(this.options.clone(), this.problems.clone()).events(clusters, secrets)
        });
        stream.poll_next_unpin(cx)
    }
}
