//! A running fleet: one etcd and any number of API servers.

use std::{path::Path, time::Duration};

use futures::future::try_join_all;
use tempfile::TempDir;

use crate::{Binaries, Error, Result, TestCluster, cluster::Placement, etcd::Etcd};

/// How long a process may take to become ready before the fleet gives up.
pub const DEFAULT_START_TIMEOUT: Duration = Duration::from_secs(120);

/// A fleet of real Kubernetes API servers sharing one etcd, on 127.0.0.1.
///
/// Each cluster has its own etcd prefix, port, CA, serving certificate,
/// service-account keys and admin credentials, so clusters see nothing of each
/// other's objects and no credentials carry over. Ports and directories are
/// fresh for every fleet, so tests may run several fleets at once.
///
/// Dropping the fleet kills every process it started and removes its files,
/// also when a test panics.
///
/// ```no_run
/// # async fn example() -> kube_multicluster_envtest::Result<()> {
/// use kube_multicluster_envtest::Envtest;
///
/// let mut fleet = Envtest::start(3).await?;
/// assert_eq!(fleet.cluster("cluster-1").map(|c| c.name()), Some("cluster-1"));
///
/// // Clusters can join and leave while the fleet runs.
/// fleet.add_cluster("late").await?;
/// fleet.remove_cluster("cluster-0");
/// let names: Vec<_> = fleet.clusters().iter().map(|c| c.name()).collect();
/// assert_eq!(names, ["cluster-1", "cluster-2", "late"]);
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct Envtest {
    // Fields drop in order: API servers, then etcd, then the files.
    clusters: Vec<TestCluster>,
    etcd: Etcd,
    binaries: Binaries,
    started: usize,
    start_timeout: Duration,
    apiserver_args: Vec<String>,
    dir: TempDir,
}

/// Configures an [`Envtest`] before it starts.
///
/// ```no_run
/// # async fn example() -> kube_multicluster_envtest::Result<()> {
/// use std::time::Duration;
///
/// let fleet = kube_multicluster_envtest::Envtest::builder()
///     .clusters(["hub", "member-a", "member-b"])
///     .start_timeout(Duration::from_secs(60))
///     .start()
///     .await?;
/// assert_eq!(fleet.clusters().len(), 3);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
#[must_use]
pub struct EnvtestBuilder {
    names: Vec<String>,
    start_timeout: Duration,
    binaries: Option<Binaries>,
    apiserver_args: Vec<String>,
}

impl Envtest {
    /// Starts `n` clusters named `cluster-0` to `cluster-<n-1>` and waits until
    /// all of them are ready.
    pub async fn start(n: usize) -> Result<Self> {
        Self::builder()
            .clusters((0..n).map(|i| format!("cluster-{i}")))
            .start()
            .await
    }

    /// A builder for a fleet with chosen names, timeout or binaries.
    pub fn builder() -> EnvtestBuilder {
        EnvtestBuilder {
            names: Vec::new(),
            start_timeout: DEFAULT_START_TIMEOUT,
            binaries: None,
            apiserver_args: Vec::new(),
        }
    }

    /// The running clusters, in the order they were started.
    pub fn clusters(&self) -> &[TestCluster] {
        &self.clusters
    }

    /// The cluster with this name, if the fleet has it.
    pub fn cluster(&self, name: &str) -> Option<&TestCluster> {
        self.clusters.iter().find(|c| c.name() == name)
    }

    /// Starts one more API server on the same etcd and waits until it is ready.
    pub async fn add_cluster(&mut self, name: impl Into<String>) -> Result<&TestCluster> {
        let name = name.into();
        if name.is_empty() || self.cluster(&name).is_some() {
            return Err(Error::ClusterName(name));
        }
        let cluster = TestCluster::start(&name, self.placement(self.started, &name)).await?;
        self.started += 1;
        self.clusters.push(cluster);
        Ok(self.clusters.last().expect("just pushed"))
    }

    /// Stops a cluster's API server for good and forgets the cluster.
    ///
    /// Returns whether the fleet had a cluster of that name. Its data stays
    /// in etcd but is not reused: a cluster added later under the same name
    /// starts empty.
    pub fn remove_cluster(&mut self, name: &str) -> bool {
        let before = self.clusters.len();
        self.clusters.retain(|c| c.name() != name);
        self.clusters.len() != before
    }

    /// The process ids of every process the fleet runs now: etcd first, then
    /// each running API server.
    pub fn pids(&self) -> Vec<u32> {
        std::iter::once(self.etcd.pid())
            .chain(self.clusters.iter().filter_map(TestCluster::pid))
            .collect()
    }

    /// The URL of the etcd that stores every cluster's data.
    pub fn etcd_url(&self) -> String {
        self.etcd.url()
    }

    /// The directory holding the fleet's kubeconfigs, certificates, logs and
    /// etcd data; removed when the fleet is dropped.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    fn placement(&self, index: usize, name: &str) -> Placement<'_> {
        Placement {
            binary: &self.binaries.kube_apiserver,
            etcd_url: self.etcd.url(),
            etcd_prefix: format!("/envtest/{index}-{name}"),
            dir: self.dir.path().join(format!("{index}-{name}")),
            timeout: self.start_timeout,
            extra_args: &self.apiserver_args,
        }
    }
}

impl EnvtestBuilder {
    /// Names the clusters to start, in order. Names must be unique and not empty.
    pub fn clusters<I>(mut self, names: I) -> Self
    where
        I: IntoIterator,
        I::Item: Into<String>,
    {
        self.names = names.into_iter().map(Into::into).collect();
        self
    }

    /// How long etcd and each API server may take to become ready
    /// (default [`DEFAULT_START_TIMEOUT`]).
    pub fn start_timeout(mut self, timeout: Duration) -> Self {
        self.start_timeout = timeout;
        self
    }

    /// Passes `arg` (`--flag=value`) to every API server of the fleet, those
    /// added later included, after the flags envtest sets. Given twice, most
    /// flags take the later value; list and map flags (`--feature-gates`,
    /// `--disable-admission-plugins`, which envtest sets) add up.
    ///
    /// ```no_run
    /// # async fn example() -> kube_multicluster_envtest::Result<()> {
    /// let fleet = kube_multicluster_envtest::Envtest::builder()
    ///     .clusters(["plain"])
    ///     .apiserver_arg("--feature-gates=WatchList=false")
    ///     .start()
    ///     .await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn apiserver_arg(mut self, arg: impl Into<String>) -> Self {
        self.apiserver_args.push(arg.into());
        self
    }

    /// Runs these binaries instead of the ones [`Binaries::find`] finds.
    pub fn binaries(mut self, binaries: Binaries) -> Self {
        self.binaries = Some(binaries);
        self
    }

    /// Starts etcd, then every API server at once, and waits until all are ready.
    ///
    /// On Unix the process's soft limit on open files is first raised to its
    /// hard limit: the fault proxy in front of each API server runs in this
    /// process, and a parallel test binary can need more descriptors than a
    /// shell's default soft limit allows.
    pub async fn start(self) -> Result<Envtest> {
        crate::open_files::raise_limit();
        for (i, name) in self.names.iter().enumerate() {
            if name.is_empty() || self.names[..i].contains(name) {
                return Err(Error::ClusterName(name.clone()));
            }
        }
        let binaries = match self.binaries {
            Some(binaries) => binaries,
            None => Binaries::find().await?,
        };
        let dir = tempfile::Builder::new()
            .prefix("kube-multicluster-envtest-")
            .tempdir()
            .map_err(|e| Error::io("creating the fleet's temporary directory", e))?;
        let etcd = Etcd::start(&binaries.etcd, dir.path(), self.start_timeout).await?;
        let mut fleet = Envtest {
            clusters: Vec::new(),
            etcd,
            binaries,
            started: 0,
            start_timeout: self.start_timeout,
            apiserver_args: self.apiserver_args,
            dir,
        };
        let starting = self
            .names
            .iter()
            .enumerate()
            .map(|(i, name)| TestCluster::start(name, fleet.placement(i, name)));
        fleet.clusters = try_join_all(starting).await?;
        fleet.started = fleet.clusters.len();
        Ok(fleet)
    }
}
