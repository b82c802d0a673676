//! What the runner hands the service for an admitted key: the key itself
//! (the raw path), or the key with its cluster and object (the typed path).

use std::{any::Any, marker::PhantomData, sync::Arc};

use crate::{
    cache::{SharedWatch, Watchable},
    cluster::Cluster,
    object_request::ObjectRequest,
    reason::ReconcileReason,
    request::McRequest,
};

/// A request that cannot be queued, and why.
pub(crate) type Misaddressed = (McRequest, &'static str);

/// Builds the service's request for an admitted key.
pub(crate) trait Deliver: Send + Sync + 'static {
    type Request: Send + 'static;

    /// Whether a request needs the controller's own watch in its cluster:
    /// requests for clusters where the controlled type is not watched are
    /// then dropped.
    const NEEDS_WATCH: bool;

    /// `key` as it may be queued, or why it may not: a typed request must
    /// name the object the way the controller's watch keys it.
    fn admit(&self, key: McRequest) -> Result<McRequest, Misaddressed> {
        Ok(key)
    }

    /// The request for `key`, whose cluster is `cluster`; `controlled` is
    /// the controller's watch of its own type there, if it runs one.
    fn request(
        &self,
        key: McRequest,
        reason: ReconcileReason,
        cluster: &Cluster,
        controlled: Option<&Arc<dyn Any + Send + Sync>>,
    ) -> Self::Request;
}

/// The raw path: the service gets the key.
pub(crate) struct Keys;

impl Deliver for Keys {
    type Request = McRequest;
    const NEEDS_WATCH: bool = false;

    fn request(
        &self,
        key: McRequest,
        _: ReconcileReason,
        _: &Cluster,
        _: Option<&Arc<dyn Any + Send + Sync>>,
    ) -> McRequest {
        key
    }
}

/// The typed path: the service gets an [`ObjectRequest`] with the object
/// read from the controller's own watch.
pub(crate) struct Objects<K> {
    pub(crate) controller: Arc<str>,
    /// Whether `K` objects live in namespaces.
    pub(crate) namespaced: bool,
    /// The one namespace the controller's watch is limited to, if any.
    pub(crate) namespace: Option<String>,
    pub(crate) _object: PhantomData<fn() -> K>,
}

impl<K: Watchable> Deliver for Objects<K> {
    type Request = ObjectRequest<K>;
    const NEEDS_WATCH: bool = true;

    fn admit(&self, mut key: McRequest) -> Result<McRequest, Misaddressed> {
        if !self.namespaced {
            // Cluster-scoped objects are keyed without one.
            key.namespace = None;
            return Ok(key);
        }
        let problem = match (&key.namespace, &self.namespace) {
            (None, _) => {
                "names no namespace, but the controlled objects live in namespaces (it would read as deleted)"
            }
            (Some(asked), Some(watched)) if asked != watched => {
                "names a namespace outside the one the controller watches (it would read as deleted)"
            }
            _ => return Ok(key),
        };
        Err((key, problem))
    }

    fn request(
        &self,
        key: McRequest,
        reason: ReconcileReason,
        cluster: &Cluster,
        controlled: Option<&Arc<dyn Any + Send + Sync>>,
    ) -> ObjectRequest<K> {
        let object = controlled
            .and_then(|watch| watch.downcast_ref::<SharedWatch<K>>())
            .and_then(|watch| watch.get(&key));
        ObjectRequest {
            cluster: cluster.clone(),
            request: key,
            object,
            reason,
            controller: Some(self.controller.clone()),
            watch: controlled.map(Arc::downgrade),
        }
    }
}
