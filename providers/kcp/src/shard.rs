//! One shard of an export's virtual workspace: one connection, one host
//! cache over the wildcard endpoint, and a client per logical cluster.

use std::{
    collections::{BTreeSet, HashMap},
    sync::Arc,
};

use http::{Request, Uri};
use kube::{Client, Config, client::Body};
use kube_fleet::cache::{HostCache, HostView, SplitBy};
use tower::BoxError;

use crate::binding::CLUSTER_ANNOTATION;

/// A shard of the export's virtual workspace, and the logical clusters its
/// APIBindings name.
pub(crate) struct Shard {
    /// A client of the virtual workspace's URL, which every request of the
    /// shard goes through: one connection.
    through: Client,
    /// The wildcard endpoint's cache, split by logical cluster.
    pub(crate) host: HostCache,
    /// The bindings seen, by the logical cluster they are in.
    pub(crate) bindings: HashMap<String, BTreeSet<String>>,
    /// The bindings seen since a relist began.
    pub(crate) relisted: Option<HashMap<String, BTreeSet<String>>>,
}

impl Shard {
    /// The shard at `url`, reached with `config`'s credentials and TLS.
    pub(crate) fn new(url: &str, config: &Config) -> Result<Self, String> {
        let mut config = config.clone();
        config.cluster_url = url
            .parse::<Uri>()
            .map_err(|e| format!("the endpoint URL {url:?} is not a URL: {e}"))?;
        let through =
            kube_fleet::client::client(config).map_err(|e| format!("no client of {url}: {e}"))?;
        let all = prefixed(&through, "/clusters/*");
        Ok(Self {
            host: HostCache::split_by(url, all, SplitBy::annotation(CLUSTER_ANNOTATION)),
            through,
            bindings: HashMap::new(),
            relisted: None,
        })
    }

    /// The logical cluster `name` of this shard, to be engaged.
    pub(crate) fn view(&self, name: &str) -> HostView {
        self.host
            .view_with(name, prefixed(&self.through, &format!("/clusters/{name}")))
    }
}

/// A client that sends its requests through `through`, their paths under
/// `prefix` (kcp's `/clusters/<name>`).
fn prefixed(through: &Client, prefix: &str) -> Client {
    let through = through.clone();
    let prefix: Arc<str> = prefix.into();
    let send = tower::service_fn(move |mut request: Request<Body>| {
        let through = through.clone();
        let prefix = prefix.clone();
        async move {
            let path = request
                .uri()
                .path_and_query()
                .map_or("/", |path| path.as_str());
            *request.uri_mut() = format!("{prefix}{path}").parse::<Uri>()?;
            through.send(request).await.map_err(BoxError::from)
        }
    });
    Client::new(send, "default")
}
