//! A cluster provider for kubeconfigs held in Secrets: each labelled Secret
//! in one namespace of a cluster (the local one, usually) is a cluster, named
//! after the Secret.
//!
//! # What it reads
//!
//! The Secrets in one namespace that match a label selector, by default
//! [`DEFAULT_LABEL`]`=true` (the label multicluster-runtime's kubeconfig
//! provider uses), holding a kubeconfig under a key, by default
//! [`DEFAULT_KEY`]. The kubeconfig's `current-context` (or its only context)
//! is the cluster.
//!
//! # Changes
//!
//! The Secrets are watched:
//! - a new Secret engages its cluster, named after the Secret;
//! - a Secret whose kubeconfig changed (compared by a hash of the key's
//!   bytes) engages its cluster again under the same name, with a new
//!   client: the old client is dropped, and no request uses the old
//!   credentials after it;
//! - a change of the Secret's labels, annotations or other keys does
//!   nothing;
//! - a Secret deleted, given a deletion timestamp (it has finalizers), or
//!   no longer matching the selector disengages its cluster.
//!
//! # Security and bad input
//!
//! Whoever can write a labelled Secret in the namespace chooses what the
//! kubeconfig asks for, so the provider applies [`KubeconfigPolicy::default`]:
//! exec and auth-provider plugins, `insecure-skip-tls-verify`, servers that
//! are not `https` and files on this machine are refused. Allow what your
//! Secrets need with [`SecretProvider::policy`].
//!
//! A Secret whose key is missing or empty is skipped with a warning (a
//! cluster it engaged before is left as it was). A Secret whose kubeconfig
//! is not UTF-8, not a kubeconfig, has no usable context, or is refused, is
//! not engaged (and is disengaged if it was); one that is fine but gives no
//! client now (an allowed credential plugin fails) is tried again every
//! [`SecretProvider::retry`]. Each such problem is logged
//! once with the Secret's namespace and name, and kept in
//! [`SecretProvider::problems`] until it is fixed or the Secret is gone;
//! failures of the watch itself are there too, while they last. None stops
//! the provider or touches other clusters: clients are built concurrently,
//! so a Secret whose plugin hangs holds up no other. Tokens and keys are
//! never logged.
//!
//! ```no_run
//! use kube_multicluster::{Fleet, provider::kubeconfig::KubeconfigPolicy};
//! use kube_multicluster_provider_secret::SecretProvider;
//!
//! # async fn example() -> Result<(), kube::Error> {
//! let local = kube::Client::try_default().await?;
//! let provider = SecretProvider::new(local, "fleet-system")
//!     .policy(KubeconfigPolicy::default().allow_exec());
//! let problems = provider.problems();
//! let fleet = Fleet::new();
//! tokio::spawn(async move { fleet.run(provider).await });
//! # Ok(())
//! # }
//! ```

#![cfg_attr(docsrs, feature(doc_cfg))]

mod state;

use std::{
    fmt,
    pin::Pin,
    task::{Context, Poll},
};

use futures::{Stream, StreamExt, stream::BoxStream};
use k8s_openapi::api::core::v1::Secret;
use kube::{Api, Client, runtime::watcher};
use kube_multicluster::provider::{self, ClusterEvent, Problems, kubeconfig::KubeconfigPolicy};

/// The label a Secret carries, with the value `true`, to be read by default.
pub const DEFAULT_LABEL: &str = "sigs.k8s.io/multicluster-runtime-kubeconfig";

/// The key of a Secret's data that holds the kubeconfig by default.
pub const DEFAULT_KEY: &str = "kubeconfig";

/// How long until a Secret whose kubeconfig is fine but gave no client (a
/// credential plugin failed, say) is tried again, by default.
pub const DEFAULT_RETRY: std::time::Duration = std::time::Duration::from_secs(30);

/// Clusters from kubeconfigs in Secrets: a stream of [`ClusterEvent`]s for
/// [`Fleet::run`](kube_multicluster::Fleet::run). See the [crate docs](crate).
///
/// The stream never ends; a failing watch of the Secrets is retried with
/// backoff, and the clusters stay as they are meanwhile. Nothing runs before
/// it is polled.
pub struct SecretProvider {
    client: Option<Client>,
    options: state::Options,
    problems: Problems,
    stream: Option<BoxStream<'static, ClusterEvent>>,
}

impl fmt::Debug for SecretProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SecretProvider")
            .field("namespace", &self.options.namespace)
            .field("selector", &self.options.selector)
            .field("key", &self.options.key)
            .field("policy", &self.options.policy)
            .field("problems", &self.problems)
            .finish_non_exhaustive()
    }
}

impl SecretProvider {
    /// A provider for the Secrets in `namespace` of the cluster `client`
    /// reaches, labelled [`DEFAULT_LABEL`]`=true`, with their kubeconfig
    /// under [`DEFAULT_KEY`], and the strict [`KubeconfigPolicy::default`].
    pub fn new(client: Client, namespace: impl Into<String>) -> Self {
        Self {
            client: Some(client),
            options: state::Options {
                namespace: namespace.into(),
                selector: format!("{DEFAULT_LABEL}=true"),
                key: DEFAULT_KEY.to_owned(),
                policy: KubeconfigPolicy::default(),
                retry: DEFAULT_RETRY,
            },
            problems: Problems::new(),
            stream: None,
        }
    }

    /// The label selector Secrets must match (`team=edge,tier!=test`), in
    /// place of [`DEFAULT_LABEL`]`=true`.
    pub fn selector(mut self, selector: impl Into<String>) -> Self {
        self.options.selector = selector.into();
        self
    }

    /// The key of the Secrets' data that holds the kubeconfig, in place of
    /// [`DEFAULT_KEY`].
    pub fn key(mut self, key: impl Into<String>) -> Self {
        self.options.key = key.into();
        self
    }

    /// What the kubeconfigs may ask for; [`KubeconfigPolicy::default`]
    /// unless set.
    pub fn policy(mut self, policy: KubeconfigPolicy) -> Self {
        self.options.policy = policy;
        self
    }

    /// How long until a Secret whose kubeconfig is fine but gave no client
    /// (an allowed credential plugin failed, or timed out) is tried again;
    /// [`DEFAULT_RETRY`] unless set. A kubeconfig that is not usable or is
    /// refused is not tried again until it changes.
    pub fn retry(mut self, every: std::time::Duration) -> Self {
        self.options.retry = every;
        self
    }

    /// What keeps Secrets from giving clusters now, by `Secret
    /// namespace/name`, and a failing watch of the Secrets, by `Secrets in
    /// namespace`. Shared with the provider: it stays current while the
    /// provider runs.
    pub fn problems(&self) -> Problems {
        self.problems.clone()
    }
}

impl Stream for SecretProvider {
    type Item = ClusterEvent;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<ClusterEvent>> {
        let this = &mut *self;
        let stream = this.stream.get_or_insert_with(|| {
            let client = this.client.take().expect("a client until first polled");
            let api = Api::<Secret>::namespaced(client, &this.options.namespace);
            let config = watcher::Config::default().labels(&this.options.selector);
            let secrets = provider::backoff(watcher(api, config)).boxed();
            state::State::new(this.options.clone(), this.problems.clone()).events(secrets)
        });
        stream.poll_next_unpin(cx)
    }
}
