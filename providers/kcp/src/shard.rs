//! One shard of an export's virtual workspace: one connection, one host
//! cache over the wildcard endpoint, and a client per logical cluster.

use std::collections::{BTreeSet, HashMap};

use http::Uri;
use kube::{
    Api, Config,
    api::{ApiResource, DynamicObject},
};
use kube_multicluster::{
    cache::{HostCache, HostView, SplitBy},
    client::ClusterClient,
    provider::Seen,
};

use crate::binding::CLUSTER_ANNOTATION;

/// A shard of the export's virtual workspace, and the logical clusters its
/// APIBindings name.
pub(crate) struct Shard {
    /// The virtual workspace's URL, which every request of the shard goes
    /// through: one connection.
    through: ClusterClient,
    /// The wildcard endpoint's cache, split by logical cluster.
    pub(crate) host: HostCache,
    /// The bindings seen, by the logical cluster they are in.
    pub(crate) bindings: HashMap<String, BTreeSet<String>>,
    /// The watch of bindings, each known by `<logical cluster>/<name>`.
    pub(crate) binding_watch: Seen,
    /// The workspace path of each logical cluster, when clusters are named
    /// by path.
    pub(crate) paths: HashMap<String, String>,
    /// The watch of LogicalClusters, each known by its logical cluster.
    pub(crate) path_watch: Seen,
}

impl Shard {
    /// The shard at `url`, reached with `config`'s credentials and TLS.
    pub(crate) fn new(url: &str, config: &Config) -> Result<Self, String> {
        let mut config = config.clone();
        config.cluster_url = url
            .parse::<Uri>()
            .map_err(|e| format!("the endpoint URL {url:?} is not a URL: {e}"))?;
        let through = kube_multicluster::client::cluster_client(config)
            .map_err(|e| format!("no client of {url}: {e}"))?;
        let all = through
            .clone()
            .under_path("/clusters/*")
            .map_err(|e| e.to_string())?;
        Ok(Self {
            host: HostCache::split_by(url, all, SplitBy::annotation(CLUSTER_ANNOTATION)),
            through,
            bindings: HashMap::new(),
            binding_watch: Seen::new(),
            paths: HashMap::new(),
            path_watch: Seen::new(),
        })
    }

    /// `resource` in every logical cluster of the shard, through its
    /// wildcard endpoint.
    pub(crate) fn all(&self, resource: &ApiResource) -> Api<DynamicObject> {
        Api::all_with(self.host.client(), resource)
    }

    /// The logical cluster `name` of this shard, to be engaged: its
    /// requests go to `…/clusters/<name>` over the shard's connection.
    pub(crate) fn view(&self, name: &str) -> Result<HostView, String> {
        let valid = !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | ':' | '_'));
        if !valid {
            return Err(format!("{name:?} is not a logical cluster's name"));
        }
        let client = self
            .through
            .clone()
            .under_path(&format!("/clusters/{name}"))
            .map_err(|e| e.to_string())?;
        Ok(self.host.view_with(name, client))
    }
}
