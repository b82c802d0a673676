//! One shard of an export's virtual workspace: one connection, one host
//! cache over the wildcard endpoint, and a client per logical cluster.

use std::collections::{BTreeSet, HashMap};

use http::Uri;
use kube::Config;
use kube_fleet::{
    cache::{HostCache, HostView, SplitBy},
    client::ClusterClient,
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
    /// The bindings seen since a relist began.
    pub(crate) relisted: Option<HashMap<String, BTreeSet<String>>>,
    /// The workspace path of each logical cluster, when clusters are named
    /// by path.
    pub(crate) paths: HashMap<String, String>,
    /// The paths seen since a relist began.
    pub(crate) paths_relisted: Option<HashMap<String, String>>,
    /// Whether the paths have been listed once.
    pub(crate) paths_listed: bool,
}

impl Shard {
    /// The shard at `url`, reached with `config`'s credentials and TLS.
    pub(crate) fn new(url: &str, config: &Config) -> Result<Self, String> {
        let mut config = config.clone();
        config.cluster_url = url
            .parse::<Uri>()
            .map_err(|e| format!("the endpoint URL {url:?} is not a URL: {e}"))?;
        let through = kube_fleet::client::cluster_client(config)
            .map_err(|e| format!("no client of {url}: {e}"))?;
        let all = through
            .clone()
            .under_path("/clusters/*")
            .map_err(|e| e.to_string())?;
        Ok(Self {
            host: HostCache::split_by(url, all, SplitBy::annotation(CLUSTER_ANNOTATION)),
            through,
            bindings: HashMap::new(),
            relisted: None,
            paths: HashMap::new(),
            paths_relisted: None,
            paths_listed: false,
        })
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
