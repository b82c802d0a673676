//! A cluster provider for kubeconfig files: every context of every file is a
//! cluster, and the files are watched, so that clusters come and go as the
//! files change.
//!
//! # What it reads
//!
//! Its sources are paths, each one of:
//! - a **file**, read as a kubeconfig (it may come into being later);
//! - a **directory**, whose files (not those below it) with a kubeconfig's
//!   name are read: by default `kubeconfig.yaml`, `kubeconfig.yml`,
//!   `*.kubeconfig`, `*.kubeconfig.yaml` and `*.kubeconfig.yml`
//!   ([`FileProvider::names`] changes them);
//! - a **glob** pattern (a path with `*`, `?` or `[`), whose files are read.
//!
//! [`FileProvider::from_env`] reads what kubectl reads: the files of
//! `$KUBECONFIG`, else `~/.kube/config`.
//!
//! # Naming
//!
//! The cluster of context `ctx` in the file `path` is named `path+ctx`, with
//! the path as the source gave it (a file) or as found (a directory's or a
//! glob's file): `/etc/fleet/east.kubeconfig+admin@east`.
//!
//! # Changes
//!
//! The directories that hold the sources are watched (inotify, FSEvents,
//! kqueue, ... through [`notify`]), and every source is read again shortly
//! after anything in them changes, and at least every
//! [`rescan`](FileProvider::rescan) interval in case a change notice was
//! lost:
//! - a new file or context engages its cluster;
//! - a context whose entries changed (its cluster, its user, or the context
//!   itself) is engaged again under the same name, with a new client;
//!   contexts of the same file that did not change are left alone;
//! - a deleted file or context disengages its clusters.
//!
//! # Security and bad input
//!
//! [`FileProvider::new`] applies [`KubeconfigPolicy::default`], which refuses
//! exec and auth-provider plugins, `insecure-skip-tls-verify`, servers that
//! are not `https`, and files named by a kubeconfig: a directory another party
//! writes to must not be a way to run commands here. Allow what your files
//! need with [`FileProvider::policy`]. [`FileProvider::from_env`] reads your
//! own kubeconfig and trusts it as kubectl does.
//!
//! A file is acted on once two readings a [`debounce`](FileProvider::debounce)
//! apart find the same bytes, so that one caught while it is written (in
//! place, as client-go writes) changes nothing until it is whole. A file that
//! cannot be read or parsed keeps the clusters it gave before; so does a
//! directory, glob or file that cannot be looked at (a permission or I/O
//! error is not the same as gone). A context that is refused, names a cluster
//! or user the file lacks, or cannot be loaded is not engaged (and is
//! disengaged if it was). Each such problem is logged once, with the file
//! (and context) it is about, and kept in [`FileProvider::problems`] until it
//! is fixed or gone. None stops the provider or touches other
//! clusters. Tokens and keys are never logged.
//!
//! ```no_run
//! use kube_multicluster::{Fleet, provider::kubeconfig::KubeconfigPolicy};
//! use kube_multicluster_provider_file::FileProvider;
//!
//! # async fn example() {
//! let provider = FileProvider::new(["/etc/fleet", "/home/me/clusters/*.yaml"])
//!     .policy(KubeconfigPolicy::default().allow_exec());
//! let problems = provider.problems();
//! let fleet = Fleet::new();
//! tokio::spawn(async move { fleet.run(provider).await });
//! // Later: what is wrong with which file or context.
//! for (source, problem) in problems.current() {
//!     eprintln!("{source}: {problem}");
//! }
//! # }
//! ```

#![cfg_attr(docsrs, feature(doc_cfg))]

mod sources;
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

/// What separates a file's path from a context's name in a cluster's name.
pub const SEPARATOR: char = '+';

/// The names a directory's kubeconfig files have, unless
/// [`FileProvider::names`] says otherwise.
pub const DEFAULT_NAMES: [&str; 5] = [
    "kubeconfig.yaml",
    "kubeconfig.yml",
    "*.kubeconfig",
    "*.kubeconfig.yaml",
    "*.kubeconfig.yml",
];

/// The most time between two readings of every source.
pub const DEFAULT_RESCAN: Duration = Duration::from_secs(60);

/// Clusters from the contexts of kubeconfig files: a stream of
/// [`ClusterEvent`]s for [`Fleet::run`](kube_multicluster::Fleet::run). See the
/// [crate docs](crate) for what it reads and how it names clusters.
///
/// The stream never ends. It does its work as it is polled: nothing runs
/// before [`Fleet::run`](kube_multicluster::Fleet::run) (or another consumer) polls
/// it, and nothing after it is dropped.
pub struct FileProvider {
    options: Option<state::Options>,
    problems: Problems,
    stream: Option<BoxStream<'static, ClusterEvent>>,
}

impl fmt::Debug for FileProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut debug = f.debug_struct("FileProvider");
        if let Some(options) = &self.options {
            debug.field("sources", &options.sources);
        }
        debug
            .field("problems", &self.problems)
            .finish_non_exhaustive()
    }
}

impl FileProvider {
    /// A provider for the files, directories and globs in `sources`, with
    /// the strict [`KubeconfigPolicy::default`].
    pub fn new<P: Into<PathBuf>>(sources: impl IntoIterator<Item = P>) -> Self {
        let options = state::Options {
            sources: sources.into_iter().map(Into::into).collect(),
            names: DEFAULT_NAMES
                .iter()
                .map(|name| glob::Pattern::new(name).expect("valid patterns"))
                .collect(),
            policy: KubeconfigPolicy::default(),
            rescan: DEFAULT_RESCAN,
            debounce: Duration::from_millis(100),
        };
        Self {
            options: Some(options),
            problems: Problems::new(),
            stream: None,
        }
    }

    /// A provider for the kubeconfig kubectl reads: each file of
    /// `$KUBECONFIG`, else `~/.kube/config`, trusted as kubectl trusts it
    /// ([`KubeconfigPolicy::trusted`]).
    pub fn from_env() -> Self {
        let files: Vec<PathBuf> = match std::env::var_os("KUBECONFIG") {
            Some(paths) if !paths.is_empty() => std::env::split_paths(&paths)
                .filter(|p| !p.as_os_str().is_empty())
                .collect(),
            _ => std::env::var_os("HOME")
                .map(|home| PathBuf::from(home).join(".kube").join("config"))
                .into_iter()
                .collect(),
        };
        Self::new(files).policy(KubeconfigPolicy::trusted())
    }

    /// What the kubeconfigs may ask for; [`KubeconfigPolicy::default`]
    /// unless set.
    pub fn policy(mut self, policy: KubeconfigPolicy) -> Self {
        self.options_mut().policy = policy;
        self
    }

    /// The names (glob patterns, such as `*.yaml`) of the files read in a
    /// directory source, in place of [`DEFAULT_NAMES`].
    ///
    /// # Panics
    ///
    /// If a pattern is not a valid glob pattern.
    pub fn names<S: AsRef<str>>(mut self, names: impl IntoIterator<Item = S>) -> Self {
        self.options_mut().names = names
            .into_iter()
            .map(|name| {
                let name = name.as_ref();
                glob::Pattern::new(name)
                    .unwrap_or_else(|e| panic!("{name:?} is not a glob pattern: {e}"))
            })
            .collect();
        self
    }

    /// The most time between two readings of every source, whether or not a
    /// change was noticed; [`DEFAULT_RESCAN`] unless set.
    pub fn rescan(mut self, every: Duration) -> Self {
        self.options_mut().rescan = every;
        self
    }

    /// How long to wait after a change is noticed before reading, so that a
    /// burst of changes is read once; 100 ms unless set.
    pub fn debounce(mut self, wait: Duration) -> Self {
        self.options_mut().debounce = wait;
        self
    }

    /// What keeps files and contexts from giving clusters now, by file or by
    /// cluster name. Shared with the provider: it stays current while the
    /// provider runs.
    pub fn problems(&self) -> Problems {
        self.problems.clone()
    }

    fn options_mut(&mut self) -> &mut state::Options {
        self.options
            .as_mut()
            .expect("a FileProvider is configured before it is polled")
    }
}

impl Stream for FileProvider {
    type Item = ClusterEvent;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<ClusterEvent>> {
        let this = &mut *self;
        let stream = this.stream.get_or_insert_with(|| {
            let options = this.options.take().expect("options until first polled");
            state::State::new(options, this.problems.clone()).events()
        });
        stream.poll_next_unpin(cx)
    }
}
