use kube_fleet::McRequest;

use crate::{load_object::ObjectRequest, resolve_cluster::ClusterRequest};

/// A request that names the object to reconcile: what layers that log,
/// count or limit by cluster read from whatever request type they sit on.
///
/// Implemented for [`McRequest`], [`ClusterRequest`] and [`ObjectRequest`],
/// so those layers work above or below cluster resolution and object loading.
pub trait AsMcRequest {
    /// The cluster, namespace and name the request is for.
    fn mc_request(&self) -> &McRequest;
}

impl AsMcRequest for McRequest {
    fn mc_request(&self) -> &McRequest {
        self
    }
}

impl AsMcRequest for ClusterRequest {
    fn mc_request(&self) -> &McRequest {
        &self.request
    }
}

impl<K> AsMcRequest for ObjectRequest<K> {
    fn mc_request(&self) -> &McRequest {
        &self.request
    }
}
