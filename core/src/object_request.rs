use std::{
    fmt,
    sync::{Arc, Weak},
};

use crate::{
    cache::{Lookup, SharedWatch, Watchable},
    cluster::Cluster,
    reason::ReconcileReason,
    request::McRequest,
};

/// What a controller hands its reconciler for each run: the cluster, the
/// object, and why it runs.
///
/// [`Controller::run`](crate::Controller::run) reads `object` from the very
/// watch the controller started for its type in that cluster, at the moment
/// the reconcile starts: an `Arc` shared with that watch's store, never a
/// copy. `object` is `None` when that watch holds no such object: it was
/// deleted, or it no longer matches the watch's label or field selector (the
/// API server tells a watch such an object as deleted), or it lives outside
/// the namespace the watch is limited to. It is never `None` because the
/// watch has not synced: a controller starts no reconcile in a cluster
/// before its watches there have synced.
///
/// A reconciler that needs other objects reads them through
/// `cluster.client()` or the cluster's [cache](crate::cache::ClusterCache).
///
/// ```
/// use k8s_openapi::api::core::v1::ConfigMap;
/// use kube_multicluster::{Action, ObjectRequest};
/// use tower::BoxError;
///
/// async fn reconcile(request: ObjectRequest<ConfigMap>) -> Result<Action, BoxError> {
///     let Some(config_map) = &request.object else {
///         tracing::info!(%request, "gone");
///         return Ok(Action::await_change());
///     };
///     tracing::info!(
///         %request,
///         reason = %request.reason,
///         keys = config_map.data.as_ref().map_or(0, |d| d.len()),
///         "reconciling",
///     );
///     Ok(Action::await_change())
/// }
/// # drop(tower::service_fn(reconcile));
/// ```
#[non_exhaustive]
pub struct ObjectRequest<K> {
    /// The engaged cluster the object lives in.
    pub cluster: Cluster,
    /// The cluster's name and the object's namespace and name: the queue's
    /// key.
    pub request: McRequest,
    /// The object, shared with the controller's watch; `None` if the watch
    /// does not hold it (see above).
    pub object: Option<Arc<K>>,
    /// Why this run happens.
    pub reason: ReconcileReason,
    /// The name of the controller that runs the reconcile
    /// ([`Controller::named`](crate::Controller::named)), for layers that
    /// label by controller; `None` outside a controller.
    pub controller: Option<Arc<str>>,
    /// The watch the object came from (a `SharedWatch<K>`), to read it
    /// again; weak, so that a kept request keeps no watch running.
    pub(crate) watch: Option<Weak<dyn Lookup<K>>>,
}

impl<K> ObjectRequest<K> {
    /// The recorder of Kubernetes Events in the request's cluster, reported
    /// by the request's controller (`kube-multicluster.dev/controller` outside a controller); see
    /// [`Cluster::recorder`].
    pub fn recorder(&self) -> kube::runtime::events::Recorder {
        self.cluster.recorder(
            self.controller
                .as_deref()
                .unwrap_or(crate::prefixed!("controller")),
        )
    }

    /// A request for `request`'s object in `cluster`, for reason
    /// [`Unknown`](ReconcileReason::Unknown) and outside a controller: for
    /// layers that load objects themselves, and for tests of reconcilers.
    pub fn new(cluster: Cluster, request: McRequest, object: Option<Arc<K>>) -> Self {
        Self {
            cluster,
            request,
            object,
            reason: ReconcileReason::Unknown,
            controller: None,
            watch: None,
        }
    }

    /// Sets why the reconcile runs.
    #[must_use]
    pub fn with_reason(mut self, reason: ReconcileReason) -> Self {
        self.reason = reason;
        self
    }

    /// Sets the controller's name.
    #[must_use]
    pub fn with_controller(mut self, controller: impl Into<Arc<str>>) -> Self {
        self.controller = Some(controller.into());
        self
    }

    /// Reads `object` again from the controller's watch, as it holds the
    /// object now: after a write failed on a conflict, say, so that a retry
    /// works on the newer version (the recommended stack does this before
    /// each attempt). Does nothing for a request made outside a controller,
    /// or once the watch has stopped (its cluster left).
    pub fn refresh(&mut self) {
        let Some(watch) = self.watch.as_ref().and_then(Weak::upgrade) else {
            return;
        };
        self.object = watch.lookup(&self.request);
    }
}

impl<K: kube::Resource<DynamicType = ()>> ObjectRequest<K> {
    /// Records `event` on the request's object, in the object's own
    /// cluster, through [`recorder`](Self::recorder). The object need not
    /// exist any more: without it the Event names it by kind, namespace
    /// and name, with no UID.
    ///
    /// ```
    /// use k8s_openapi::api::core::v1::ConfigMap;
    /// use kube::runtime::events::{Event, EventType};
    /// use kube_multicluster::{Action, ObjectRequest};
    /// use tower::BoxError;
    ///
    /// async fn reconcile(request: ObjectRequest<ConfigMap>) -> Result<Action, BoxError> {
    ///     // ... the work ...
    ///     request
    ///         .publish(&Event {
    ///             type_: EventType::Normal,
    ///             reason: "Labelled".into(),
    ///             note: Some(format!("labelled in {}", request.cluster.name())),
    ///             action: "Reconcile".into(),
    ///             secondary: None,
    ///         })
    ///         .await?;
    ///     Ok(Action::await_change())
    /// }
    /// # drop(tower::service_fn(reconcile));
    /// ```
    pub async fn publish(&self, event: &kube::runtime::events::Event) -> Result<(), kube::Error> {
        self.recorder().publish(event, &self.object_ref()).await
    }

    /// A reference to the request's object: from the object if the watch
    /// holds it (with its UID), else from the key.
    pub fn object_ref(&self) -> k8s_openapi::api::core::v1::ObjectReference {
        match &self.object {
            Some(object) => object.object_ref(&()),
            None => k8s_openapi::api::core::v1::ObjectReference {
                api_version: Some(K::api_version(&()).into_owned()),
                kind: Some(K::kind(&()).into_owned()),
                namespace: self.request.namespace.clone(),
                name: Some(self.request.name.clone()),
                ..Default::default()
            },
        }
    }
}

impl<K> Clone for ObjectRequest<K> {
    fn clone(&self) -> Self {
        Self {
            cluster: self.cluster.clone(),
            request: self.request.clone(),
            object: self.object.clone(),
            reason: self.reason.clone(),
            controller: self.controller.clone(),
            watch: self.watch.clone(),
        }
    }
}

impl<K> fmt::Debug for ObjectRequest<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ObjectRequest")
            .field("request", &self.request)
            .field("exists", &self.object.is_some())
            .field("reason", &self.reason)
            .field("controller", &self.controller)
            .finish()
    }
}

impl<K: Watchable> ObjectRequest<K> {
    /// The request for `key` in `cluster`, with the object `watch` holds
    /// now: how a controller builds each reconcile's request from its own
    /// watch.
    pub(crate) fn read(
        cluster: Cluster,
        key: McRequest,
        watch: Option<&Arc<SharedWatch<K>>>,
    ) -> Self {
        let object = watch.and_then(|watch| watch.get(&key));
        Self {
            watch: watch.map(|watch| Arc::downgrade(watch) as Weak<dyn Lookup<K>>),
            ..Self::new(cluster, key, object)
        }
    }
}

/// Displays as the [`McRequest`] does: `cluster://<cluster>/<namespace>/<name>`.
impl<K> fmt::Display for ObjectRequest<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.request, f)
    }
}
