//! A cluster provider for the [kind](https://kind.sigs.k8s.io) clusters on
//! this machine: every cluster `kind get clusters` lists is engaged, and
//! clusters come and go as they are created and deleted.
//!
//! # What it discovers
//!
//! [`KindProvider`] runs `kind get clusters` at once when first polled, then
//! again each [`interval`](KindProvider::interval) (2 s unless set) after
//! the last listing ended. For the clusters listed it runs
//! `kind get kubeconfig --name <cluster>`: on every listing for a cluster
//! that is not engaged, or whose last fetch failed, and for an engaged one
//! once its kubeconfig has not been fetched for
//! [`refresh`](KindProvider::refresh) (30 s unless set). It only shells out
//! to the `kind` program ([`executable`](KindProvider::executable), `kind` on
//! `PATH` unless set), which asks the container runtime; it reads no files
//! of its own.
//!
//! - A cluster listed for the first time is engaged through its kubeconfig's
//!   current context.
//! - A cluster whose kubeconfig changed (deleted and created again under the
//!   same name, with new certificates and port) is engaged again, with a new
//!   client, when its kubeconfig is next fetched; one whose kubeconfig is the
//!   same is left alone.
//! - A cluster no longer listed is disengaged as soon as a listing says so.
//!
//! Each fetch is acted on as soon as it ends, and a slow one holds up no
//! other cluster: a cluster whose `kind get kubeconfig` hangs (its node
//! container is paused, say) is not asked again until that fetch ends, while
//! the listings and the other clusters' fetches go on. Up to eight fetches
//! run at once, the others waiting for a place.
//!
//! Each command is killed if it takes more than 30 s, or when it is no
//! longer wanted: its cluster is no longer listed, or the provider is
//! dropped. On unix each runs in a process group of its own, and the whole
//! group is killed (`SIGKILL`, sent by running `kill`), so that what `kind`
//! started, a `docker exec` that hangs, goes too; elsewhere, or if `kill`
//! cannot be run, only `kind` itself is killed.
//!
//! [`prefix`](KindProvider::prefix) limits it to the clusters whose names
//! start with a prefix, so that a fleet leaves out the clusters made for
//! other work.
//!
//! # Naming
//!
//! A cluster is engaged under its kind name, as `kind create cluster --name`
//! gave it (`fleet-east`, not its context's `kind-fleet-east`), prefix
//! included.
//!
//! # Security
//!
//! The kubeconfigs are checked against a
//! [`KubeconfigPolicy`], [`KubeconfigPolicy::default`] unless
//! [`policy`](KindProvider::policy) says otherwise. kind's kubeconfigs point
//! at an `https` server with the CA and client certificate inline, so the
//! strict default, which refuses exec and auth-provider plugins,
//! `insecure-skip-tls-verify`, plain `http` and files named by the
//! kubeconfig, lets them all through; a `kind` that prints anything else is
//! refused. A policy that allows exec plugins lets a kubeconfig run one
//! when its cluster's client is made, off the runtime's threads; a client
//! not made within 30 s is given up on, and the cluster reported. Tokens and keys are never logged nor put in problems: of what
//! `kind` prints, only the first line of its stderr is quoted, and of a
//! credential plugin that fails, neither its command line nor its output.
//!
//! # Errors
//!
//! Nothing stops the provider, and no cluster's trouble touches another's.
//! Each problem is logged once and kept in [`KindProvider::problems`] until
//! it is fixed or gone:
//!
//! - If `kind get clusters` fails (no `kind`, no container runtime, a
//!   timeout), it is reported under the source `kind get clusters`, with the
//!   command, its exit status and its stderr's first line. The clusters
//!   engaged stay engaged until it works again: a failure for a moment does
//!   not empty the fleet.
//! - A cluster whose kubeconfig cannot be fetched or parsed is reported under
//!   the source `kind cluster "<name>"` and not engaged; if it was engaged,
//!   it stays, with the kubeconfig it had, and its kubeconfig is fetched on
//!   every listing until that works. A kubeconfig that is refused by the
//!   policy or cannot be loaded, or whose client cannot be made (a credential
//!   plugin fails), is reported the same way, and disengages the cluster if
//!   it was engaged.
//! - A cluster that is gone takes its problem with it.
//!
//! # Example
//!
//! ```no_run
//! use std::time::Duration;
//!
//! use kube_multicluster::Fleet;
//! use kube_multicluster_provider_kind::KindProvider;
//!
//! # async fn example() {
//! let provider = KindProvider::new()
//!     .prefix("fleet-")
//!     .interval(Duration::from_secs(5));
//! let problems = provider.problems();
//! let fleet = Fleet::new();
//! tokio::spawn({
//!     let fleet = fleet.clone();
//!     async move { fleet.run(provider).await }
//! });
//! // `kind create cluster --name fleet-east` engages "fleet-east";
//! // `kind delete cluster --name fleet-east` disengages it.
//! for (source, problem) in problems.current() {
//!     eprintln!("{source}: {problem}");
//! }
//! # }
//! ```

#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]

mod command;
mod state;

use std::{
    fmt,
    path::PathBuf,
    pin::Pin,
    task::{Context, Poll},
    time::Duration,
};

use futures::{Stream, StreamExt, stream::BoxStream};
use kube_multicluster::provider::{ClusterEvent, Problems, kubeconfig::KubeconfigPolicy};

/// How often `kind` is asked for its clusters unless
/// [`KindProvider::interval`] says otherwise.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(2);

/// How often an engaged cluster's kubeconfig is fetched again unless
/// [`KindProvider::refresh`] says otherwise.
pub const DEFAULT_REFRESH: Duration = Duration::from_secs(30);

/// The kind clusters on this machine: a stream of [`ClusterEvent`]s for
/// [`Fleet::run`](kube_multicluster::Fleet::run). See the [crate docs](crate) for
/// what it discovers and how it names clusters.
///
/// The stream never ends. It does its work as it is polled, inside the
/// tokio runtime that polls it (which needs its IO and time drivers, as
/// `#[tokio::main]` gives): nothing runs before it is first polled, and
/// nothing after it is dropped. Set its options before then; later changes
/// do not reach a stream that has started.
///
/// ```
/// use kube_multicluster_provider_kind::KindProvider;
///
/// // No runtime is needed to make one.
/// let provider = KindProvider::new()
///     .executable("/usr/local/bin/kind")
///     .prefix("fleet-");
/// assert!(provider.problems().current().is_empty());
/// ```
#[must_use = "a provider does nothing unless its stream is polled, as by Fleet::run"]
pub struct KindProvider {
    options: state::Options,
    problems: Problems,
    stream: Option<BoxStream<'static, ClusterEvent>>,
}

impl fmt::Debug for KindProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KindProvider")
            .field("executable", &self.options.executable)
            .field("interval", &self.options.interval)
            .field("refresh", &self.options.refresh)
            .field("prefix", &self.options.prefix)
            .field("policy", &self.options.policy)
            .field("problems", &self.problems)
            .finish_non_exhaustive()
    }
}

impl Default for KindProvider {
    fn default() -> Self {
        Self::new()
    }
}

impl KindProvider {
    /// A provider that runs `kind` from `PATH` every [`DEFAULT_INTERVAL`],
    /// for every kind cluster, fetching the engaged clusters' kubeconfigs
    /// again every [`DEFAULT_REFRESH`], with the strict
    /// [`KubeconfigPolicy::default`].
    pub fn new() -> Self {
        Self {
            options: state::Options {
                executable: PathBuf::from("kind"),
                interval: DEFAULT_INTERVAL,
                refresh: DEFAULT_REFRESH,
                prefix: String::new(),
                policy: KubeconfigPolicy::default(),
            },
            problems: Problems::new(),
            stream: None,
        }
    }

    /// The `kind` program to run: a path, or a name looked up on `PATH`.
    pub fn executable(mut self, executable: impl Into<PathBuf>) -> Self {
        self.options.executable = executable.into();
        self
    }

    /// How long to wait between the end of one listing of kind's clusters
    /// and the start of the next; [`DEFAULT_INTERVAL`] unless set. Listings
    /// never overlap.
    ///
    /// # Panics
    ///
    /// If `every` is zero.
    pub fn interval(mut self, every: Duration) -> Self {
        assert!(
            !every.is_zero(),
            "a KindProvider's interval must not be zero"
        );
        self.options.interval = every;
        self
    }

    /// How often an engaged cluster's kubeconfig is fetched again, to see
    /// whether the cluster was deleted and created again under its name;
    /// [`DEFAULT_REFRESH`] unless set. It is checked at each listing, so it
    /// is at least the [`interval`](Self::interval); zero fetches it on every
    /// listing. A cluster that is not engaged, or whose last fetch failed, is
    /// fetched on every listing whatever this says.
    pub fn refresh(mut self, every: Duration) -> Self {
        self.options.refresh = every;
        self
    }

    /// Engages only the kind clusters whose names start with `prefix`; the
    /// others are neither engaged nor asked for their kubeconfigs. The
    /// clusters keep their whole names.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.options.prefix = prefix.into();
        self
    }

    /// What the clusters' kubeconfigs may ask for;
    /// [`KubeconfigPolicy::default`], which kind's own kubeconfigs pass,
    /// unless set.
    pub fn policy(mut self, policy: KubeconfigPolicy) -> Self {
        self.options.policy = policy;
        self
    }

    /// What keeps the provider from engaging clusters now: a failing
    /// `kind get clusters` under the source `kind get clusters`, and a
    /// cluster's kubeconfig that cannot be fetched or is refused under
    /// `kind cluster "<name>"`. The set is shared: the clone returned stays
    /// current while the provider runs.
    pub fn problems(&self) -> Problems {
        self.problems.clone()
    }
}

impl Stream for KindProvider {
    type Item = ClusterEvent;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<ClusterEvent>> {
        let this = &mut *self;
        this.stream
            .get_or_insert_with(|| state::events(this.options.clone(), this.problems.clone()))
            .poll_next_unpin(cx)
    }
}
