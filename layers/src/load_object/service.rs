use std::{
    fmt,
    marker::PhantomData,
    sync::Arc,
    task::{Context, Poll},
};

use kube::{
    Client,
    api::GetParams,
    runtime::{reflector::ObjectRef, watcher},
};
use kube_fleet::{
    Action, McRequest, ObjectRequest,
    cache::{Watchable, is_namespaced},
};
use tower::{BoxError, Service};

use super::{LoadError, ResponseFuture};
use crate::resolve_cluster::ClusterRequest;

/// Loads each request's object; see the [module docs](super).
pub struct LoadObject<S, K> {
    inner: S,
    config: watcher::Config,
    _object: PhantomData<fn() -> K>,
}

impl<S: Clone, K> Clone for LoadObject<S, K> {
    fn clone(&self) -> Self {
        Self::with_config(self.inner.clone(), self.config.clone())
    }
}

impl<S: fmt::Debug, K> fmt::Debug for LoadObject<S, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoadObject")
            .field("inner", &self.inner)
            .field("kind", &std::any::type_name::<K>())
            .finish()
    }
}

impl<S, K> LoadObject<S, K> {
    /// Wraps `inner`, loading from the watch with the default configuration.
    pub fn new(inner: S) -> Self {
        Self::with_config(inner, watcher::Config::default())
    }

    /// Wraps `inner`, loading from the watch with this configuration.
    pub fn with_config(inner: S, config: watcher::Config) -> Self {
        Self {
            inner,
            config,
            _object: PhantomData,
        }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, K> Service<ClusterRequest> for LoadObject<S, K>
where
    K: Watchable<DynamicType = ()>,
    S: Service<ObjectRequest<K>, Response = Action> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
{
    type Response = Action;
    type Error = BoxError;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, ClusterRequest { cluster, request }: ClusterRequest) -> Self::Future {
        if request.namespace.is_none() && is_namespaced::<K>() {
            // Not "deleted": a reconciler might clean up after an object that exists.
            let error = format!(
                "{request} names no namespace, but {} objects live in namespaces",
                K::kind(&())
            );
            return ResponseFuture::loading(async move { Err(error.into()) });
        }
        let watch = cluster.cache().find::<K>(&self.config);
        let key = ObjectRef::<K>::new(&request.name)
            .within(request.namespace.as_deref().unwrap_or_default());
        if let Some(watch) = watch.as_ref().filter(|w| w.has_synced()) {
            let object = watch.store().get(&key);
            return ResponseFuture::called(
                self.inner
                    .call(ObjectRequest::new(cluster, request, object)),
            );
        }
        // The slow path: the service that said it was ready goes into the
        // future, and a fresh clone takes its place for the next poll_ready.
        let clone = self.inner.clone();
        let mut ready = std::mem::replace(&mut self.inner, clone);
        ResponseFuture::loading(async move {
            let object = match watch {
                Some(watch) => {
                    watch.synced().await;
                    watch.store().get(&key)
                }
                None => get::<K>(cluster.client(), &request).await?,
            };
            ready
                .call(ObjectRequest::new(cluster, request, object))
                .await
                .map_err(Into::into)
        })
    }
}

/// Reads the object from the API server; `None` if it does not exist.
async fn get<K: Watchable<DynamicType = ()>>(
    client: Client,
    request: &McRequest,
) -> Result<Option<Arc<K>>, BoxError> {
    let get = kube::core::Request::new(K::url_path(&(), request.namespace.as_deref()))
        .get(&request.name, &GetParams::default())?;
    match client.request::<K>(get).await {
        Ok(object) => Ok(Some(Arc::new(object))),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(None),
        Err(source) => Err(Box::new(LoadError {
            request: request.clone(),
            source,
        })),
    }
}
