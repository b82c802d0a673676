//! A cluster provider for a [Cluster Inventory API] hub: each
//! `ClusterProfile` (`multicluster.x-k8s.io/v1alpha1`) whose control plane
//! is healthy is a cluster, named `namespace/name`.
//!
//! [Cluster Inventory API]: https://github.com/kubernetes-sigs/cluster-inventory-api
//!
//! # What it reads
//!
//! - `ClusterProfile` objects ([`v1alpha1::ClusterProfile`]), in every
//!   namespace or in one ([`ClusterProfileProvider::namespace`]).
//! - Whether a profile is ready: by default, whether its condition
//!   `ControlPlaneHealthy` ([`v1alpha1::CONTROL_PLANE_HEALTHY`]) is `True`;
//!   [`ClusterProfileProvider::healthy`] replaces the test.
//! - Its credentials, one of two ways:
//!   - **access providers** ([`ClusterProfileProvider::new`], the default
//!     way): the profile's `status.accessProviders` (and the older
//!     `status.credentialProviders`) give the cluster's endpoint and CA
//!     for each named access provider; your [`AccessConfig`] maps those
//!     names to exec credential plugins. The provider builds a kubeconfig
//!     of the endpoint and the first configured plugin the profile lists,
//!     and kube runs the plugin under the Kubernetes `ExecCredential`
//!     protocol: with `provideClusterInfo`, the plugin is given the
//!     cluster's endpoint and its `client.authentication.k8s.io/exec`
//!     extension in `KUBERNETES_EXEC_INFO`, and a token that says when it
//!     expires is fetched again before then (from a minute before), in the
//!     same client, without engaging the cluster again.
//!   - **Secrets** ([`ClusterProfileProvider::from_secrets`], off unless
//!     chosen): the one Secret in the profile's namespace labelled
//!     [`CONSUMER_LABEL`]`=<consumer>` and [`PROFILE_LABEL`]`=<profile
//!     name>`, holding a kubeconfig under the key `Config`
//!     ([`SECRET_KEY`]).
//!
//! # Changes
//!
//! - A profile that is healthy and gives a kubeconfig is engaged; one that
//!   is not healthy (yet) is not, and is engaged when its status says it
//!   is: the provider waits for the change on its watch, it does not poll.
//! - A profile whose kubeconfig changes (another endpoint, CA or access
//!   provider; another Secret's content) is engaged again with a new
//!   client; the old one stays in use until the new one is built (a new
//!   version that gives no client disengages it). Other changes
//!   (conditions, properties) do nothing.
//! - A profile deleted, given a deletion timestamp, or no longer healthy
//!   is disengaged; with Secrets, so is one whose Secret is deleted.
//!
//! # Security and bad input
//!
//! The plugins that run are those of your [`AccessConfig`]; a profile
//! chooses among them by name, and adds arguments and environment only
//! where a provider's policy allows. Whoever writes a profile's status
//! also chooses where the plugin's credentials are sent (its `server`, CA
//! and proxy): use plugins whose credentials are good for that cluster
//! alone (a token whose audience is the cluster), not ones that would open
//! other doors, and give the right to write `ClusterProfile` status only
//! to your cluster managers. The endpoint comes from the profile, so
//! [`KubeconfigPolicy::default`] with exec allowed applies to it: a server
//! that is not `https`, `insecure-skip-tls-verify` and CA files on this
//! machine are refused. Kubeconfigs in Secrets get
//! [`KubeconfigPolicy::default`]. [`ClusterProfileProvider::policy`]
//! changes either.
//!
//! Each profile that gives no cluster (it lists no configured access
//! provider; its plugin fails, hangs or prints something that is not an
//! `ExecCredential`; its kubeconfig is refused; it has no Secret, or
//! several) is reported in [`ClusterProfileProvider::problems`] under
//! `ClusterProfile namespace/name`, and logged once, until fixed or gone;
//! a plugin that failed is tried again every
//! [`ClusterProfileProvider::retry`]. A plugin's output and command line
//! are never logged. Clients are built concurrently, so a profile whose
//! plugin hangs holds up no other.
//!
//! ```no_run
//! use kube_multicluster::Fleet;
//! use kube_multicluster_provider_cluster_inventory::{AccessConfig, ClusterProfileProvider};
//!
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let hub = kube::Client::try_default().await?;
//! let access = AccessConfig::from_file("clusterprofile-provider-file.json")?;
//! let provider = ClusterProfileProvider::new(hub, access);
//! let problems = provider.problems();
//! let fleet = Fleet::new();
//! tokio::spawn(async move { fleet.run(provider).await });
//! # Ok(())
//! # }
//! ```

#![cfg_attr(docsrs, feature(doc_cfg))]

mod access;
mod schema;
mod state;
pub mod v1alpha1;

use std::{
    fmt,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

pub use access::{
    ADDITIONAL_ARGS_EXTENSION, ADDITIONAL_ENVS_EXTENSION, AccessConfig, AccessConfigError,
    AccessProviderConfig, ArgsPolicy, EXEC_EXTENSION, EnvPolicy,
};
use futures::{Stream, StreamExt, stream::BoxStream};
use k8s_openapi::api::core::v1::Secret;
use kube::{Api, Client, runtime::watcher};
use kube_multicluster::provider::{self, ClusterEvent, Problems, kubeconfig::KubeconfigPolicy};
use v1alpha1::ClusterProfile;

/// The label of a Secret that holds credentials, whose value names the
/// consumer they are for.
pub const CONSUMER_LABEL: &str = "x-k8s.io/cluster-inventory-consumer";

/// The label of a Secret that holds credentials, whose value names the
/// `ClusterProfile` (in the Secret's namespace) they are for.
pub const PROFILE_LABEL: &str = "x-k8s.io/cluster-profile";

/// The key of such a Secret's data that holds the kubeconfig.
pub const SECRET_KEY: &str = "Config";

/// How long until a profile whose kubeconfig is fine but gave no client (its
/// plugin failed, say) is tried again, by default.
pub const DEFAULT_RETRY: Duration = Duration::from_secs(30);

type Healthy = Arc<dyn Fn(&ClusterProfile) -> bool + Send + Sync>;

/// Where a profile's credentials come from.
#[derive(Clone, Debug)]
pub(crate) enum Credentials {
    Access(Arc<AccessConfig>),
    Secrets { consumer: String },
}

/// The clusters of a Cluster Inventory API hub's `ClusterProfile`s: a
/// stream of [`ClusterEvent`]s for [`Fleet::run`](kube_multicluster::Fleet::run).
/// See the [crate docs](crate).
///
/// The stream never ends; failing watches are retried with backoff, and the
/// clusters stay as they are meanwhile. Nothing runs before it is polled.
pub struct ClusterProfileProvider {
    client: Option<Client>,
    options: state::Options,
    problems: Problems,
    stream: Option<BoxStream<'static, ClusterEvent>>,
}

impl fmt::Debug for ClusterProfileProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClusterProfileProvider")
            .field("credentials", &self.options.credentials)
            .field("namespace", &self.options.namespace)
            .field("policy", &self.options.policy)
            .field("problems", &self.problems)
            .finish_non_exhaustive()
    }
}

impl ClusterProfileProvider {
    /// A provider for the `ClusterProfile`s in every namespace of the hub
    /// `client` reaches, with credentials from their access providers
    /// and the plugins `access` names for them.
    pub fn new(client: Client, access: AccessConfig) -> Self {
        Self::with(
            client,
            Credentials::Access(Arc::new(access)),
            KubeconfigPolicy::default().allow_exec(),
        )
    }

    /// A provider for the `ClusterProfile`s in every namespace of the hub
    /// `client` reaches, with credentials from the Secrets labelled for
    /// `consumer` and each profile (the older way).
    pub fn from_secrets(client: Client, consumer: impl Into<String>) -> Self {
        Self::with(
            client,
            Credentials::Secrets {
                consumer: consumer.into(),
            },
            KubeconfigPolicy::default(),
        )
    }

    fn with(client: Client, credentials: Credentials, policy: KubeconfigPolicy) -> Self {
        Self {
            client: Some(client),
            options: state::Options {
                credentials,
                namespace: None,
                policy,
                retry: DEFAULT_RETRY,
                healthy: Arc::new(ClusterProfile::control_plane_healthy),
            },
            problems: Problems::new(),
            stream: None,
        }
    }

    /// Watches the profiles (and Secrets) of `namespace` alone.
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.options.namespace = Some(namespace.into());
        self
    }

    /// Whether a profile is ready to be engaged, in place of
    /// [`ClusterProfile::control_plane_healthy`]. It is asked on each
    /// change of the profile; a cluster engaged is disengaged when it says
    /// no.
    ///
    /// ```
    /// use kube_multicluster_provider_cluster_inventory::{AccessConfig, ClusterProfileProvider};
    ///
    /// # fn example(client: kube::Client, access: AccessConfig) {
    /// // Engage every profile of the cluster manager `ocm`, healthy or not.
    /// let provider = ClusterProfileProvider::new(client, access)
    ///     .healthy(|profile| profile.spec.cluster_manager.name == "ocm");
    /// # }
    /// ```
    pub fn healthy(
        mut self,
        healthy: impl Fn(&ClusterProfile) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.options.healthy = Arc::new(healthy);
        self
    }

    /// What the kubeconfigs may ask for: [`KubeconfigPolicy::default`] with
    /// exec plugins allowed for access providers (the plugins are yours),
    /// [`KubeconfigPolicy::default`] for Secrets, unless set.
    pub fn policy(mut self, policy: KubeconfigPolicy) -> Self {
        self.options.policy = policy;
        self
    }

    /// How long until a profile whose kubeconfig is fine but gave no client
    /// (its plugin failed or hung) is tried again; [`DEFAULT_RETRY`] unless
    /// set. A kubeconfig that is refused is not tried again until it
    /// changes.
    pub fn retry(mut self, every: Duration) -> Self {
        self.options.retry = every;
        self
    }

    /// What keeps profiles from being engaged now, by `ClusterProfile
    /// namespace/name`, and failing watches. Shared with the provider: it
    /// stays current while the provider runs.
    pub fn problems(&self) -> Problems {
        self.problems.clone()
    }
}

impl Stream for ClusterProfileProvider {
    type Item = ClusterEvent;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<ClusterEvent>> {
        let this = &mut *self;
        let stream = this.stream.get_or_insert_with(|| {
            let client = this.client.take().expect("a client until first polled");
            let (profiles, secrets) = match &this.options.namespace {
                Some(ns) => (
                    Api::<ClusterProfile>::namespaced(client.clone(), ns),
                    Api::<Secret>::namespaced(client, ns),
                ),
                None => (
                    Api::<ClusterProfile>::all(client.clone()),
                    Api::<Secret>::all(client),
                ),
            };
            let profiles = provider::backoff(watcher(profiles, watcher::Config::default())).boxed();
            let secrets = match &this.options.credentials {
                Credentials::Access(_) => futures::stream::pending().boxed(),
                Credentials::Secrets { consumer } => {
                    let labels = format!("{CONSUMER_LABEL}={consumer},{PROFILE_LABEL}");
                    provider::backoff(watcher(secrets, watcher::Config::default().labels(&labels)))
                        .boxed()
                }
            };
            state::State::new(this.options.clone(), this.problems.clone()).events(profiles, secrets)
        });
        stream.poll_next_unpin(cx)
    }
}
