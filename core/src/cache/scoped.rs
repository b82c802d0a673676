//! Watches limited to one namespace, for any watchable type.
//!
//! kube's `Api::namespaced` asks for a type known at compile time to live in
//! namespaces; the cache serves any `Watchable`. `InNamespace<K>` is `K`
//! under a scope that kube lets name a namespace at run time; its objects are
//! unwrapped as they arrive, so the watch's store holds plain `K`s.

use std::borrow::Cow;

use futures::{Stream, StreamExt};
use kube::{Api, Client, Resource, api::ObjectMeta, core::DynamicResourceScope, runtime::watcher};
use serde::{Deserialize, Deserializer};

use super::Watchable;

/// `K`, decoded as `K`, under the dynamic scope.
#[derive(Clone, Debug)]
struct InNamespace<K>(K);

impl<'de, K: Deserialize<'de>> Deserialize<'de> for InNamespace<K> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        K::deserialize(deserializer).map(Self)
    }
}

impl<K: Resource> Resource for InNamespace<K> {
    type DynamicType = K::DynamicType;
    type Scope = DynamicResourceScope;

    fn kind(dt: &K::DynamicType) -> Cow<'_, str> {
        K::kind(dt)
    }

    fn group(dt: &K::DynamicType) -> Cow<'_, str> {
        K::group(dt)
    }

    fn version(dt: &K::DynamicType) -> Cow<'_, str> {
        K::version(dt)
    }

    fn api_version(dt: &K::DynamicType) -> Cow<'_, str> {
        K::api_version(dt)
    }

    fn plural(dt: &K::DynamicType) -> Cow<'_, str> {
        K::plural(dt)
    }

    fn url_path(dt: &K::DynamicType, namespace: Option<&str>) -> String {
        K::url_path(dt, namespace)
    }

    fn metadata_api() -> bool {
        K::metadata_api()
    }

    fn meta(&self) -> &ObjectMeta {
        self.0.meta()
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        self.0.meta_mut()
    }
}

fn unwrap_event<T, U>(event: watcher::Event<T>, f: impl Fn(T) -> U) -> watcher::Event<U> {
    match event {
        watcher::Event::Apply(o) => watcher::Event::Apply(f(o)),
        watcher::Event::Delete(o) => watcher::Event::Delete(f(o)),
        watcher::Event::Init => watcher::Event::Init,
        watcher::Event::InitApply(o) => watcher::Event::InitApply(f(o)),
        watcher::Event::InitDone => watcher::Event::InitDone,
    }
}

/// A watch of `K` objects in `namespace` only (of their metadata only, for
/// `K = PartialObjectMeta<_>`).
pub(super) fn objects<K: Watchable>(
    client: Client,
    dyntype: &K::DynamicType,
    namespace: &str,
    config: watcher::Config,
) -> impl Stream<Item = watcher::Result<watcher::Event<K>>> + Send + 'static {
    let api = Api::<InNamespace<K>>::namespaced_with(client, namespace, dyntype);
    watcher::watcher(api, config).map(|event| event.map(|e| unwrap_event(e, |o| o.0)))
}

/// The `K` object `name` in `namespace` (`None` for a cluster-scoped one),
/// read through the API; `None` if it does not exist.
pub(crate) async fn get<K: Watchable>(
    client: Client,
    dyntype: &K::DynamicType,
    namespace: Option<&str>,
    name: &str,
) -> Result<Option<K>, kube::Error> {
    match namespace {
        Some(namespace) => {
            let api = Api::<InNamespace<K>>::namespaced_with(client, namespace, dyntype);
            Ok(api.get_opt(name).await?.map(|o| o.0))
        }
        None => Api::<K>::all_with(client, dyntype).get_opt(name).await,
    }
}
