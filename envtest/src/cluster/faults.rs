//! What can go wrong with a test cluster, on purpose: its API server
//! stopped and restarted, its address hung or cut off, a link of its own.

use crate::{FaultyLink, Result, fault::Traffic};

use super::TestCluster;

impl TestCluster {
    /// Stops this API server alone (it is killed, as in a crash).
    ///
    /// Requests to it then fail with a connection error, while the other
    /// clusters of the fleet keep answering. Its data stays in etcd.
    pub fn stop(&self) {
        // Dropping the process kills and reaps it.
        drop(self.process().take());
    }

    /// Starts this API server again with the same address and credentials,
    /// and waits until it is ready. Stops it first if it runs.
    ///
    /// Existing clients and kubeconfigs keep working, and the cluster's data
    /// is as it was before [`stop`](Self::stop). A fault set with
    /// [`hang`](Self::hang) or [`cut_off`](Self::cut_off) stays in place: it
    /// is the network's, not the server's.
    pub async fn restart(&self) -> Result<()> {
        self.stop();
        self.run().await
    }

    /// Makes the cluster hang for every client: connections to it are
    /// accepted and kept open, but nothing is answered, and bytes stop
    /// flowing on the connections already open, so requests and watches
    /// stall without an error until [`restore`](Self::restore).
    ///
    /// This is a cluster whose network or API server has stalled; clients
    /// notice only through their own timeouts.
    ///
    /// ```no_run
    /// # async fn example() -> kube_fleet_envtest::Result<()> {
    /// use std::time::Duration;
    /// use k8s_openapi::api::core::v1::ConfigMap;
    /// use kube::{Api, api::ListParams};
    ///
    /// let fleet = kube_fleet_envtest::Envtest::start(1).await?;
    /// let cluster = &fleet.clusters()[0];
    /// let config_maps: Api<ConfigMap> = Api::default_namespaced(cluster.client());
    /// let all = ListParams::default();
    ///
    /// cluster.hang();
    /// let list = tokio::time::timeout(Duration::from_secs(1), config_maps.list(&all));
    /// assert!(list.await.is_err(), "no answer");
    ///
    /// cluster.restore();
    /// config_maps.list(&all).await.expect("answers again");
    /// # Ok(())
    /// # }
    /// ```
    pub fn hang(&self) {
        self.proxy.set(Traffic::Hung);
    }

    /// Cuts the cluster off from every client: open connections are closed
    /// at once and new ones as soon as they are made, so requests fail
    /// quickly with a connection error until [`restore`](Self::restore).
    ///
    /// ```no_run
    /// # async fn example() -> kube_fleet_envtest::Result<()> {
    /// use k8s_openapi::api::core::v1::Namespace;
    /// use kube::Api;
    ///
    /// let fleet = kube_fleet_envtest::Envtest::start(1).await?;
    /// let cluster = &fleet.clusters()[0];
    /// let namespaces: Api<Namespace> = Api::all(cluster.client());
    ///
    /// cluster.cut_off();
    /// assert!(namespaces.get("default").await.is_err());
    /// cluster.restore();
    /// assert!(namespaces.get("default").await.is_ok());
    /// # Ok(())
    /// # }
    /// ```
    pub fn cut_off(&self) {
        self.proxy.set(Traffic::CutOff);
    }

    /// Ends a [`hang`](Self::hang) or [`cut_off`](Self::cut_off).
    ///
    /// Connections held during a hang carry on where they stopped, with no
    /// byte lost; clients whose connections were cut off make new ones.
    pub fn restore(&self) {
        self.proxy.set(Traffic::Flowing);
    }

    /// A link of its own to this cluster, which can fail while the cluster's
    /// other clients carry on. See [`FaultyLink`].
    ///
    /// Must be called within a Tokio runtime, like `Client::try_from`.
    pub fn link(&self) -> Result<FaultyLink> {
        FaultyLink::new(&self.name, self.proxy.addr(), &self.kubeconfig)
    }
}
