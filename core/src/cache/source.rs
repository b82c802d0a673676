//! Where a watch's events come from: listed as the cluster lists, found by
//! discovery for a kind of any version, each object shaped.

use std::sync::{Arc, atomic::AtomicBool};

use futures::{Stream, StreamExt};
use kube::{Api, Resource, runtime::watcher};

use super::ClusterCache;
use super::{Shape, Watchable, discovery, initial_list, scoped};
use crate::{cluster_name::ClusterName, panic::contain};

impl ClusterCache {
    /// The events of a watch of `K` in `namespace` (all for `None`) with
    /// `config`, listed as this cluster lists, each list under one of the
    /// fleet's permits (`queued` while it waits for one), each object
    /// shaped, and, for a stand-in resource of any version, of the version
    /// this cluster's discovery finds. Under a cache budget, its objects
    /// are counted as shaped, across versions.
    pub(super) fn events<K: Watchable>(
        &self,
        dyntype: &K::DynamicType,
        namespace: Option<&str>,
        shape: &Shape,
        config: &watcher::Config,
        queued: Arc<AtomicBool>,
    ) -> impl Stream<Item = watcher::Result<watcher::Event<K>>> + Send + 'static {
        use super::Sealed;
        let (client, cluster) = (self.client.get(), self.cluster.clone());
        let source = format!(
            "cluster {:?}: {}",
            cluster.as_str(),
            watched::<K>(dyntype, namespace, config)
        );
        let kind = K::kind(dyntype).into_owned();
        let version = {
            let (client, config, lists) = (client.clone(), config.clone(), self.lists.clone());
            let (permits, queued, shape) = (self.permits.clone(), queued.clone(), shape.clone());
            let namespace = namespace.map(str::to_owned);
            Arc::new(move |dyntype: &K::DynamicType| {
                let (client, dyntype) = (client.clone(), dyntype.clone());
                let namespace = namespace.clone();
                let events = initial_list::streamed_or_paged(
                    lists.clone(),
                    cluster.clone(),
                    K::kind(&dyntype).into_owned(),
                    config.clone(),
                    move |config| match &namespace {
                        Some(namespace) => {
                            scoped::objects::<K>(client.clone(), &dyntype, namespace, config)
                                .boxed()
                        }
                        None => {
                            let api = Api::<K>::all_with(client.clone(), &dyntype);
                            watcher::watcher(api, config).boxed()
                        }
                    },
                );
                let events = shaped(events, shape.clone(), cluster.clone(), kind.clone());
                permits.bound(events.boxed(), queued.clone())
            })
        };
        let discover = dyntype
            .to_discover()
            .map(|(group, kind, namespaced)| (group.to_owned(), kind.to_owned(), namespaced));
        let dyntype = dyntype.clone();
        self.permits.counted(source, queued, move || {
            let version = version.clone();
            match &discover {
                Some(wanted) => {
                    discovery::discovered(client.clone(), wanted.clone(), move |d| version(d))
                }
                None => version(&dyntype),
            }
        })
    }
}

/// What a watch of `K` reads, for messages: its API version and kind, its
/// namespace if one, and its selectors if any.
fn watched<K: Resource>(
    dyntype: &K::DynamicType,
    namespace: Option<&str>,
    config: &watcher::Config,
) -> String {
    let mut what = format!("{} {}", K::api_version(dyntype), K::kind(dyntype));
    if let Some(namespace) = namespace {
        what.push_str(&format!(" in {namespace}"));
    }
    if let Some(labels) = &config.label_selector {
        what.push_str(&format!(" labelled {labels}"));
    }
    if let Some(fields) = &config.field_selector {
        what.push_str(&format!(" with fields {fields}"));
    }
    what
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
