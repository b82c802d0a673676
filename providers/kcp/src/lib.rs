//! A cluster provider for kcp: every logical cluster (workspace) that binds
//! an APIExport is a cluster, named after its logical cluster (or its workspace path), all of them
//! served through the export's virtual workspace.
//!
//! The provider follows the export's `APIExportEndpointSlice`: each URL it
//! lists is the export's virtual workspace on one shard. Through each, one
//! wildcard watch of `APIBinding`s (`…/clusters/*`) tells which logical
//! clusters bind the export: a logical cluster is engaged when its first
//! binding of the export is seen, and disengaged when its last one goes (the
//! binding deleted, or its workspace deleted) or is being deleted.
//!
//! All the logical clusters of a shard read one [`HostCache`] split by the
//! `kcp.io/cluster` annotation ([`SplitBy::Annotation`](kube_multicluster::cache::SplitBy::Annotation)): each type a
//! controller watches is watched once per shard at `…/clusters/*`, across
//! every logical cluster, and each object is cached once, in its logical
//! cluster's part. A thousand workspaces cost one watch per type and shard,
//! and one connection per shard. Each logical cluster's client sends its
//! requests to `…/clusters/<name>` over that connection, so its writes land
//! in its own workspace. A watch of one namespace inside a logical cluster
//! is a watch of its own, through that cluster's client.
//!
//! What a logical cluster's cluster can read is what the export serves
//! there: the exported resources, the resources of the permission claims
//! its binding accepted, and the bindings. The virtual workspace serves
//! nothing else (no `Namespace` unless claimed, no `kube-system`): give
//! engaged clusters no [`Duplicates`](kube_multicluster::Duplicates) check that
//! needs them, which views are not given anyway.
//!
//! # Problems
//!
//! Reported in [`KcpProvider::problems`] by source, each cleared when it
//! ends; none of them disengages a logical cluster of another shard:
//!
//! - `APIExportEndpointSlice <name>`: the slice is not found, lists no
//!   endpoint (no workspace binds the export yet, or no shard serves it), or
//!   its watch fails (retried with backoff; the shards followed stay).
//! - `kcp shard <url>`: the shard's watch of bindings (or, named by path,
//!   of LogicalClusters) fails (the shard is unreachable, say; retried with
//!   backoff), or no client can be built for its URL. Its logical clusters
//!   stay engaged meanwhile; their health shows the shard unreachable.
//! - `logical cluster <name>`: named by path
//!   ([`KcpProvider::named_by_path`]), it binds the export but its path is
//!   not known (the export's claim on `logicalclusters` not accepted), or
//!   its path is the name another logical cluster is engaged under (a
//!   workspace made again before the old one is gone); it is not engaged
//!   until that changes.
//!
//! A watch told something again clears its problem; what failed is also
//! looked at again every ten seconds, beside the watches (a failing shard is
//! asked whether it answers, a slice whose watch failed is read, a shard no
//! client could be made for is tried again), since a watch that resumes
//! may tell nothing.
//! - `APIBinding <name> in <logical cluster>`: the binding does not accept
//!   a permission claim of the export (the claimed resources are then not
//!   served there). The logical cluster is engaged all the same, for the
//!   exported resources.
//!
//! ```no_run
//! use kube_multicluster::Fleet;
//! use kube_multicluster_provider_kcp::KcpProvider;
//!
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! // A kubeconfig of the workspace that holds the APIExport (its endpoint
//! // slice), with rights to the export's content.
//! let config = kube::Config::infer().await?;
//! let provider = KcpProvider::new(config, "widgets.example.io")?;
//! let problems = provider.problems();
//! let fleet = Fleet::new();
//! tokio::spawn(async move { fleet.run(provider).await });
//! # let _ = problems;
//! # Ok(())
//! # }
//! ```

#![cfg_attr(docsrs, feature(doc_cfg))]

mod binding;
mod shard;
mod state;

pub use binding::{CLUSTER_ANNOTATION, PATH_ANNOTATION};

use std::{
    fmt,
    pin::Pin,
    sync::{Arc, Mutex},
    task::{Context, Poll},
};

use futures::{Stream, StreamExt, stream::BoxStream};
use kube::{Client, Config};
use kube_multicluster::{
    cache::HostCache,
    provider::{ClusterEvent, Problems},
};

use state::State;

/// The logical clusters that bind one APIExport, as clusters: a stream of
/// [`ClusterEvent::EngageView`]s and [`ClusterEvent::Disengage`]s for
/// [`Fleet::run`](kube_multicluster::Fleet::run). See the [crate docs](crate).
///
/// The stream never ends. Nothing runs before it is polled.
pub struct KcpProvider {
    config: Config,
    slice: String,
    workspace: Client,
    problems: Problems,
    shards: Arc<Mutex<Vec<HostCache>>>,
    by_path: bool,
    stream: Option<BoxStream<'static, ClusterEvent>>,
}

impl fmt::Debug for KcpProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KcpProvider")
            .field("slice", &self.slice)
            .field("cluster_url", &self.config.cluster_url)
            .field("problems", &self.problems)
            .finish_non_exhaustive()
    }
}

impl KcpProvider {
    /// A provider of the logical clusters that bind the export whose
    /// `APIExportEndpointSlice` is `slice` (kcp makes one named after the
    /// export), in the workspace `config` reaches (its URL ends in
    /// `/clusters/<workspace path>`). The virtual workspaces are reached
    /// with `config`'s credentials and TLS settings at the URLs the slice
    /// lists; they need the `content` subresource of the export
    /// (`apiexports/content` in `apis.kcp.io`, for the export's name).
    ///
    /// Fails only if no client can be built from `config`.
    pub fn new(config: Config, slice: impl Into<String>) -> Result<Self, kube::Error> {
        let workspace = kube_multicluster::client::client(config.clone())?;
        Ok(Self {
            config,
            slice: slice.into(),
            workspace,
            problems: Problems::new(),
            shards: Arc::default(),
            by_path: false,
            stream: None,
        })
    }

    /// Names each cluster by its workspace's path (`root:org:team`)
    /// rather than its logical cluster's name, as the shard's
    /// `LogicalCluster` object says it ([`PATH_ANNOTATION`]). The export
    /// must claim `logicalclusters` of `core.kcp.io` (verbs `get`, `list`,
    /// `watch`) and each binding accept that claim: a logical cluster whose
    /// path is not known is not engaged, and is reported under the source
    /// `logical cluster <name>`. The cluster's part of the shard's watches
    /// and its requests are still its logical cluster's.
    ///
    /// ```no_run
    /// # fn example(config: kube::Config) -> Result<(), kube::Error> {
    /// use kube_multicluster_provider_kcp::KcpProvider;
    ///
    /// let provider = KcpProvider::new(config, "widgets.example.io")?.named_by_path();
    /// # let _ = provider;
    /// # Ok(())
    /// # }
    /// ```
    pub fn named_by_path(mut self) -> Self {
        self.by_path = true;
        self
    }

    /// What goes wrong, by source: see the [crate docs](crate#problems).
    pub fn problems(&self) -> Problems {
        self.problems.clone()
    }

    /// The shards it follows, as they change: a handle that outlives the
    /// provider's move into [`Fleet::run`](kube_multicluster::Fleet::run).
    pub fn shards(&self) -> Shards {
        Shards {
            caches: self.shards.clone(),
        }
    }
}

/// The shards a [`KcpProvider`] follows now, one per URL of its endpoint
/// slice. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Shards {
    caches: Arc<Mutex<Vec<HostCache>>>,
}

impl Shards {
    /// Each shard's cache, split by logical cluster: how many watches it
    /// holds at its shard, say ([`HostCache::watch_count`]).
    pub fn caches(&self) -> Vec<HostCache> {
        self.caches
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The watches the shards serve for the provider's clusters' caches
    /// now: one per type and watch configuration per shard, however many
    /// logical clusters read them. Not counted: the provider's own watch
    /// of APIBindings (one per shard), and a logical cluster's own watch of
    /// one namespace.
    pub fn watch_count(&self) -> usize {
        self.caches().iter().map(HostCache::watch_count).sum()
    }
}

impl Stream for KcpProvider {
    type Item = ClusterEvent;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<ClusterEvent>> {
        let this = &mut *self;
        let stream = this.stream.get_or_insert_with(|| {
            let state = State::new(
                this.config.clone(),
                this.slice.clone(),
                this.workspace.clone(),
                this.problems.clone(),
                this.shards.clone(),
            );
            if this.by_path { state.by_path() } else { state }.events()
        });
        stream.poll_next_unpin(cx)
    }
}
