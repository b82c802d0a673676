//! What the runner hands the service for an admitted key: the key itself
//! (the raw path), or the key with its cluster and object (the typed path).

use std::{any::Any, marker::PhantomData, sync::Arc};

use kube::runtime::reflector::ObjectRef;

use crate::{
    Cluster, McRequest, ObjectRequest, ReconcileReason,
    cache::{SharedWatch, Watchable},
};

/// Builds the service's request for an admitted key.
pub(crate) trait Deliver: Send + Sync + 'static {
    type Request: Send + 'static;

    /// Whether a request needs the controller's own watch in its cluster:
    /// requests for clusters where the controlled type is not watched are
    /// then dropped.
    const NEEDS_WATCH: bool;

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
    pub(crate) _object: PhantomData<fn() -> K>,
}

impl<K: Watchable> Deliver for Objects<K> {
    type Request = ObjectRequest<K>;
    const NEEDS_WATCH: bool = true;

    fn request(
        &self,
        key: McRequest,
        reason: ReconcileReason,
        cluster: &Cluster,
        controlled: Option<&Arc<dyn Any + Send + Sync>>,
    ) -> ObjectRequest<K> {
        let object = controlled
            .and_then(|watch| watch.downcast_ref::<SharedWatch<K>>())
            .and_then(|watch| {
                let mut reference = ObjectRef::<K>::new(&key.name);
                reference.namespace.clone_from(&key.namespace);
                watch.store().get(&reference)
            });
        ObjectRequest {
            cluster: cluster.clone(),
            request: key,
            object,
            reason,
            controller: Some(self.controller.clone()),
        }
    }
}
