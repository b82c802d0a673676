use std::{fmt, sync::Arc};

use kube::{Client, runtime::reflector::Store};

use crate::{ClusterName, cache::ClusterCache, cache::Watchable};

/// One engaged cluster: its name, a client, and its shared cache.
///
/// Cheap to clone: clones share the client's connection pool and the cache.
///
/// ```
/// # async fn example(client: kube::Client) {
/// use kube_fleet::Cluster;
///
/// let cluster = Cluster::new("east", client);
/// assert_eq!(cluster.name(), "east");
/// assert_eq!(cluster.cache().watch_count(), 0);
/// # }
/// ```
#[derive(Clone)]
pub struct Cluster {
    inner: Arc<Inner>,
}

struct Inner {
    name: ClusterName,
    client: Client,
    cache: ClusterCache,
}

impl fmt::Debug for Cluster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cluster")
            .field("name", &self.inner.name)
            .field("cache", &self.inner.cache)
            .finish_non_exhaustive()
    }
}

impl Cluster {
    /// A cluster reached through `client`, with an empty cache.
    pub fn new(name: impl Into<ClusterName>, client: Client) -> Self {
        let name = name.into();
        Self {
            inner: Arc::new(Inner {
                cache: ClusterCache::new(name.clone(), client.clone()),
                name,
                client,
            }),
        }
    }

    /// The cluster's name in the fleet.
    pub fn name(&self) -> &ClusterName {
        &self.inner.name
    }

    /// A client for this cluster.
    pub fn client(&self) -> Client {
        self.inner.client.clone()
    }

    /// The cluster's shared watches and stores.
    pub fn cache(&self) -> &ClusterCache {
        &self.inner.cache
    }

    /// The store of `K` objects, if a controller watches `K` here with the
    /// default watch configuration.
    pub fn store<K: Watchable>(&self) -> Option<Store<K>> {
        self.inner.cache.store::<K>()
    }
}
