//! A link of its own to one cluster, for faults that only some clients see.

use std::net::SocketAddr;

use kube::{Client, config::Kubeconfig};

use crate::{
    Error, Result,
    fault::{FaultProxy, Traffic},
    kubeconfig,
};

/// A link of its own to one [`TestCluster`](crate::TestCluster), made by
/// [`TestCluster::link`](crate::TestCluster::link), which can fail while the
/// cluster's other clients carry on.
///
/// It is a TCP proxy on 127.0.0.1 in front of the cluster's address. Its
/// [`client`](Self::client) and [`kubeconfig`](Self::kubeconfig) (admin
/// credentials, certificates inline) go through it, so
/// [`hang`](Self::hang), [`cut_off`](Self::cut_off) and
/// [`restore`](Self::restore) act on them alone; faults of the cluster
/// itself reach them too, since the link forwards to the cluster's address.
///
/// Dropping the link closes its port and every connection through it.
///
/// ```no_run
/// # async fn example() -> kube_multicluster_envtest::Result<()> {
/// use k8s_openapi::api::core::v1::Namespace;
/// use kube::Api;
///
/// let fleet = kube_multicluster_envtest::Envtest::start(1).await?;
/// let cluster = &fleet.clusters()[0];
/// let link = cluster.link()?;
/// // Give the code under test `link.client()` (or `link.kubeconfig()`).
///
/// link.cut_off();
/// assert!(Api::<Namespace>::all(link.client()).get("default").await.is_err());
/// assert!(Api::<Namespace>::all(cluster.client()).get("default").await.is_ok());
/// link.restore();
/// # Ok(())
/// # }
/// ```
pub struct FaultyLink {
    cluster: String,
    proxy: FaultProxy,
    kubeconfig: Kubeconfig,
    client: Client,
}

impl std::fmt::Debug for FaultyLink {
    // The kubeconfig holds the admin key.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultyLink")
            .field("cluster", &self.cluster)
            .field("server", &self.server())
            .finish_non_exhaustive()
    }
}

impl FaultyLink {
    /// A link to the cluster `cluster` at `target`, whose admin kubeconfig is
    /// `kubeconfig`.
    pub(crate) fn new(cluster: &str, target: SocketAddr, kubeconfig: &Kubeconfig) -> Result<Self> {
        let proxy = FaultProxy::bind(target)
            .map_err(|e| Error::io(format!("starting a link to cluster {cluster}"), e))?;
        let kubeconfig = kubeconfig::with_server(kubeconfig, &format!("https://{}", proxy.addr()));
        let client = kubeconfig::client(kubeconfig.clone(), cluster)?;
        Ok(Self {
            cluster: cluster.to_owned(),
            proxy,
            kubeconfig,
            client,
        })
    }

    /// An admin client whose every request goes through this link.
    ///
    /// Cloning a [`Client`] is cheap; every clone shares one connection pool.
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// The cluster's admin kubeconfig, pointed at this link; certificates
    /// inline. It is not written to a file.
    pub fn kubeconfig(&self) -> &Kubeconfig {
        &self.kubeconfig
    }

    /// The link's URL, `https://127.0.0.1:<port>`, as in its kubeconfig.
    pub fn server(&self) -> &str {
        kubeconfig::server(&self.kubeconfig)
    }

    /// How many connections the link's clients hold open to the cluster now.
    ///
    /// A connection counts from when the link accepts it until either side
    /// closes it (or the link cuts it off).
    pub fn open_connections(&self) -> usize {
        self.proxy.open_connections()
    }

    /// How many connections the link's clients have made since it was
    /// created, open or closed.
    pub fn connections_made(&self) -> usize {
        self.proxy.accepted_connections()
    }

    /// Makes the cluster hang for the clients of this link, as
    /// [`TestCluster::hang`](crate::TestCluster::hang) does for all of its
    /// clients.
    pub fn hang(&self) {
        self.proxy.set(Traffic::Hung);
    }

    /// Cuts the clients of this link off from the cluster, as
    /// [`TestCluster::cut_off`](crate::TestCluster::cut_off) does for all of
    /// its clients.
    pub fn cut_off(&self) {
        self.proxy.set(Traffic::CutOff);
    }

    /// Ends a [`hang`](Self::hang) or [`cut_off`](Self::cut_off) of this
    /// link, as [`TestCluster::restore`](crate::TestCluster::restore) does.
    pub fn restore(&self) {
        self.proxy.set(Traffic::Flowing);
    }
}
