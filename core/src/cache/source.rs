//! Where a watch's events come from: listed as the cluster lists, found by
//! discovery for a kind of any version, each object shaped.

use std::sync::{Arc, atomic::AtomicBool};

use futures::{Stream, StreamExt, stream::BoxStream};
use kube::{Api, Resource, runtime::watcher};

use super::ClusterCache;
use super::{Shape, TypeInfo, Watchable, discovery, initial_list, scoped};
use crate::{cluster_name::ClusterName, panic::contain};

impl ClusterCache {
    /// The events of a watch of `K` in `namespace` (all for `None`) with
    /// `config`, listed as this cluster lists, each list under one of the
    /// fleet's permits (`queued` while it waits for one), each object
    /// shaped.
    pub(super) fn events<K: Watchable>(
        &self,
        dyntype: &K::DynamicType,
        namespace: Option<&str>,
        shape: &Shape,
        config: &watcher::Config,
        queued: Arc<AtomicBool>,
    ) -> impl Stream<Item = watcher::Result<watcher::Event<K>>> + Send + 'static {
        let (client, config) = (self.client.get(), config.clone());
        let (lists, cluster) = (self.lists.clone(), self.cluster.clone());
        let permits = self.permits.clone();
        let namespace = namespace.map(str::to_owned);
        let events = move |dyntype: &K::DynamicType| {
            let (client, dyntype) = (client.clone(), dyntype.clone());
            let namespace = namespace.clone();
            let kind = K::kind(&dyntype).into_owned();
            let events = initial_list::streamed_or_paged(
                lists.clone(),
                cluster.clone(),
                kind,
                config.clone(),
                move |config| match &namespace {
                    Some(namespace) => {
                        scoped::objects::<K>(client.clone(), &dyntype, namespace, config).boxed()
                    }
                    None => {
                        let api = Api::<K>::all_with(client.clone(), &dyntype);
                        watcher::watcher(api, config).boxed()
                    }
                },
            );
            permits.bound(events, queued.clone())
        };
        shaped(
            self.discovering(dyntype, events),
            shape.clone(),
            self.cluster.clone(),
            K::kind(dyntype).into_owned(),
        )
    }

    /// The events `events` makes for `dyntype`, or, for a stand-in
    /// resource of any version, for the version this cluster's discovery
    /// finds.
    fn discovering<T>(
        &self,
        dyntype: &T::DynamicType,
        events: impl Fn(&T::DynamicType) -> BoxStream<'static, watcher::Result<watcher::Event<T>>>
        + Send
        + 'static,
    ) -> BoxStream<'static, watcher::Result<watcher::Event<T>>>
    where
        T: Resource<DynamicType: TypeInfo> + Send + 'static,
    {
        use super::Sealed;
        match dyntype.to_discover() {
            Some((group, kind, namespaced)) => discovery::discovered(
                self.client.get(),
                (group.to_owned(), kind.to_owned(), namespaced),
                events,
            ),
            None => events(dyntype),
        }
    }
}

/// `events` with each object shaped as `shape` says: its `managedFields`
/// dropped unless kept (few controllers read them, and they are often the
/// larger part of a small object's metadata), then the user's transform. A
/// transform that panics is contained: the object is cached as it left it.
/// The first panic of a watch is logged as an error, later ones at debug
/// level (a transform may fail on every object).
pub(super) fn shaped<T: Resource + 'static, S>(
    events: S,
    shape: Shape,
    cluster: ClusterName,
    kind: String,
) -> impl Stream<Item = S::Item> + Send + 'static
where
    S: Stream<Item = watcher::Result<watcher::Event<T>>> + Send + 'static,
{
    let mut panics = 0_u64;
    events.map(move |event| {
        event.map(|event| {
            event.modify(|object| {
                let Err(message) = contain(|| shape.apply(object)) else {
                    return;
                };
                panics += 1;
                let meta = object.meta();
                let namespace = meta.namespace.as_deref().unwrap_or_default();
                let name = meta.name.as_deref().unwrap_or_default();
                if panics == 1 {
                    tracing::error!(
                        %cluster, %kind, namespace, name, %message,
                        "a watch's transform panicked; the object is cached as the transform left it \
                         (later panics of this watch are logged at debug level)"
                    );
                } else {
                    tracing::debug!(
                        %cluster, %kind, namespace, name, %message, panics,
                        "a watch's transform panicked again"
                    );
                }
            })
        })
    })
}
