use std::sync::Arc;

use kube::{
    core::{ApiResource, discovery::Scope},
    runtime::watcher,
};

use super::ClusterSelector;
use crate::{
    cache::{Sealed, Shape, SharedWatch, Transform, TypeInfo, Watchable, is_namespaced, stand_in},
    cluster::Cluster,
};

/// How a controller watches one type: the watch configuration (selectors,
/// list semantics), and optionally the clusters and the namespace the watch
/// is limited to.
///
/// Every place that takes a `Watch` also takes a plain `watcher::Config`,
/// which watches the type in all namespaces of the clusters the controller
/// selects ([`Controller::clusters`](super::Controller::clusters)). A
/// `DynamicObject` watch also needs its [`resource`](Self::resource).
///
/// ```
/// use k8s_openapi::api::{apps::v1::Deployment, core::v1::ConfigMap};
/// use kube::runtime::watcher;
/// use kube_multicluster::{Controller, Fleet, McRequest, controller::{ClusterSelector, Watch}};
///
/// # fn example(fleet: &Fleet) -> Controller<ConfigMap> {
/// // Hub and spoke: the ConfigMaps that describe the work live in the local
/// // cluster, in one namespace; the Deployments that do it, in every other.
/// Controller::<ConfigMap>::new(
///     fleet,
///     Watch::new(watcher::Config::default())
///         .in_clusters(ClusterSelector::Local)
///         .in_namespace("fleet-jobs"),
/// )
/// .watches::<Deployment, _>(
///     Watch::default().in_clusters(ClusterSelector::Provided),
///     |_member, deployment| {
///         let parent = deployment.metadata.labels.as_ref()?.get("fleet-job")?.clone();
///         Some(McRequest::new(kube_multicluster::ClusterName::local(), Some("fleet-jobs"), parent))
///     },
/// )
/// # }
/// ```
#[derive(Debug, Clone, Default)]
pub struct Watch {
    pub(crate) config: watcher::Config,
    pub(crate) clusters: Option<ClusterSelector>,
    pub(crate) namespace: Option<String>,
    pub(crate) resource: Option<(ApiResource, Scope)>,
    pub(crate) keep_managed_fields: bool,
    pub(crate) transform: Option<Transform>,
}

impl Watch {
    /// Watches with `config`, in all namespaces of the controller's clusters.
    pub fn new(config: watcher::Config) -> Self {
        Self {
            config,
            clusters: None,
            namespace: None,
            resource: None,
            keep_managed_fields: false,
            transform: None,
        }
    }

    /// Watches only in these clusters. For the controller's own type this
    /// selects the clusters the controller reconciles in, as
    /// [`Controller::clusters`](super::Controller::clusters) does; for an
    /// owned or watched type, where that type is watched. Its mapper's
    /// requests may name any cluster where the controller watches its own
    /// type; the controller drops requests for other clusters (with a
    /// warning), since it has no object to hand over there.
    #[must_use]
    pub fn in_clusters(mut self, clusters: ClusterSelector) -> Self {
        self.clusters = Some(clusters);
        self
    }

    /// Watches only objects in `namespace`: the watch lists and watches
    /// that namespace alone, so it needs only namespaced read rights there
    /// (a Role, not a ClusterRole). A cluster-scoped type is watched
    /// cluster-wide whatever this says (a warning is logged).
    #[must_use]
    pub fn in_namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = Some(namespace.into());
        self
    }

    /// Watches the type `resource` describes, with objects in namespaces
    /// or not as `scope` says: what a `DynamicObject` watch needs (a static
    /// type knows both, and ignores this). Both come from discovery
    /// (`kube::discovery`), or from what you know of the type.
    ///
    /// ```
    /// use kube::{api::{ApiResource, GroupVersionKind}, discovery::Scope};
    /// use kube_multicluster::controller::Watch;
    ///
    /// let widgets = ApiResource::from_gvk(&GroupVersionKind::gvk("example.com", "v1", "Widget"));
    /// let watch = Watch::default().resource(widgets, Scope::Namespaced);
    /// ```
    #[must_use]
    pub fn resource(mut self, resource: ApiResource, scope: Scope) -> Self {
        self.resource = Some((resource, scope));
        self
    }

    /// Watches `kind` of API `group` (`""` for the core group) at whatever
    /// version each cluster serves it: the group's preferred version if it
    /// has the kind, else the most stable version that does, found by
    /// discovery when the watch starts there. For `DynamicObject` watches of
    /// a kind that is served at different versions in different clusters,
    /// or not at all in some:
    ///
    /// - where the kind is not served, or `scope` is not how the cluster
    ///   serves it, the watch reports it (`Failing`, with "Missing Kind" and
    ///   why) and asks again after a backoff, so the controller starts there
    ///   once the kind appears;
    /// - when the version found stops being served (its CRD deleted or
    ///   changed), the watch runs discovery again and lists anew;
    /// - the objects are handed over as the cluster sends them: a custom
    ///   resource carries its `apiVersion` in `types`, while list items of
    ///   built-in kinds may carry none;
    /// - a controller of a discovered kind matches owner references by group
    ///   and kind, whatever their version.
    ///
    /// In every cluster the watch's store keys objects under a stand-in
    /// resource of version `*` ([`SharedWatch::dyntype`](crate::cache::SharedWatch::dyntype)),
    /// not usable for requests of your own.
    ///
    /// ```
    /// use kube::discovery::Scope;
    /// use kube_multicluster::controller::Watch;
    ///
    /// let watch = Watch::default().discover("example.com", "Widget", Scope::Namespaced);
    /// ```
    #[must_use]
    pub fn discover(self, group: &str, kind: &str, scope: Scope) -> Self {
        let resource = stand_in::any_version(group, kind, &scope);
        self.resource(resource, scope)
    }

    /// Keeps each cached object's `metadata.managedFields`, which the
    /// cache drops by default: few controllers read them, and for small
    /// objects they are much of what the cache holds. A watch that keeps
    /// them is a separate watch from one that does not.
    #[must_use]
    pub fn keep_managed_fields(mut self) -> Self {
        self.keep_managed_fields = true;
        self
    }

    /// Changes every object the watch receives before it is cached: to
    /// drop what the controller does not read, and so hold less. One
    /// transform per watch (a second replaces the first); see [`Transform`]
    /// for what it may change, and how watches with transforms are shared.
    /// A transform of one type on a watch of another is refused when the
    /// controller runs, with an error naming both.
    ///
    /// ```
    /// use k8s_openapi::api::core::v1::ConfigMap;
    /// use kube_multicluster::{cache::Transform, controller::Watch};
    ///
    /// // Only the keys matter to this controller, not the values.
    /// let keys_only = Transform::object(|cm: &mut ConfigMap| {
    ///     for value in cm.data.iter_mut().flat_map(|data| data.values_mut()) {
    ///         drop(std::mem::take(value));
    ///     }
    ///     cm.binary_data = None;
    /// });
    /// let watch = Watch::default().transform(keys_only);
    /// ```
    #[must_use]
    pub fn transform(mut self, transform: Transform) -> Self {
        self.transform = Some(transform);
        self
    }

    /// The watch configuration.
    pub fn config(&self) -> &watcher::Config {
        &self.config
    }

    /// The namespace the watch is limited to, if any.
    pub fn namespace(&self) -> Option<&str> {
        self.namespace.as_deref()
    }
}

impl From<watcher::Config> for Watch {
    fn from(config: watcher::Config) -> Self {
        Self::new(config)
    }
}

/// What a [`Watch`] says of a type `T`, checked: its type information, its
/// namespace (none for a cluster-scoped type), and whether its objects live
/// in namespaces.
pub(crate) struct Resolved<T: Watchable> {
    pub(crate) dyntype: T::DynamicType,
    pub(crate) config: watcher::Config,
    pub(crate) clusters: Option<ClusterSelector>,
    pub(crate) namespace: Option<String>,
    /// Whether `T` objects live in namespaces: a cluster-scoped kind is
    /// watched whole, also in a cluster that is a namespace of a host.
    pub(crate) namespaced: bool,
    pub(crate) shape: Shape,
}

impl<T: Watchable> Clone for Resolved<T> {
    fn clone(&self) -> Self {
        Self {
            dyntype: self.dyntype.clone(),
            config: self.config.clone(),
            clusters: self.clusters.clone(),
            namespace: self.namespace.clone(),
            namespaced: self.namespaced,
            shape: self.shape.clone(),
        }
    }
}

impl<T: Watchable> Resolved<T> {
    /// The shared watch this describes in `cluster`, started if none runs:
    /// the same one a controller's trigger with this watch reads.
    pub(crate) fn watch_in(&self, cluster: &Cluster) -> Arc<SharedWatch<T>> {
        let cache = if self.namespaced {
            cluster.cache()
        } else {
            cluster.cache().whole()
        };
        cache.watch_shaped::<T>(
            &self.dyntype,
            self.namespace.as_deref(),
            &self.shape,
            &self.config,
        )
    }

    /// The clusters the watch is limited to, if any.
    pub(crate) fn clusters(&self) -> Option<&ClusterSelector> {
        self.clusters.as_ref()
    }

    /// The watched type's information.
    pub(crate) fn dyntype(&self) -> &T::DynamicType {
        &self.dyntype
    }

    pub(crate) fn from(watch: Watch) -> Result<Self, String> {
        let Watch {
            config,
            clusters,
            namespace,
            resource,
            keep_managed_fields,
            transform,
        } = watch;
        let dyntype =
            T::DynamicType::from_watch(resource.as_ref().map(|(r, _)| r)).ok_or_else(|| {
                format!(
                    "a watch of {} needs the type it watches: give it Watch::resource(..)",
                    std::any::type_name::<T>()
                )
            })?;
        if let Some(transform) = &transform
            && !transform.applies_to::<T>()
        {
            return Err(format!(
                "a watch of {} was given a transform of {}",
                std::any::type_name::<T>(),
                transform.type_name().unwrap_or("metadata"),
            ));
        }
        if namespace.as_deref() == Some("") {
            return Err(format!(
                "a watch of {} names an empty namespace",
                T::kind(&dyntype)
            ));
        }
        // A static type knows its scope; a dynamic one is told.
        let namespaced = is_namespaced::<T>()
            && !(<T::DynamicType as Sealed>::DYNAMIC
                && matches!(resource, Some((_, kube::core::discovery::Scope::Cluster))));
        if namespace.is_some() && !namespaced {
            tracing::warn!(
                kind = %T::kind(&dyntype),
                ?namespace,
                "a cluster-scoped type cannot be watched in one namespace; watching it cluster-wide"
            );
        }
        Ok(Self {
            namespace: namespace.filter(|_| namespaced),
            dyntype,
            config,
            clusters,
            namespaced,
            shape: Shape {
                keep_managed_fields,
                transform,
                keep_annotation: None,
            },
        })
    }

    /// The kind, as reconcile reasons name it.
    pub(crate) fn kind(&self) -> Arc<str> {
        T::kind(&self.dyntype).into()
    }
}

#[cfg(test)]
mod tests {
    use super::{Resolved, Watch};

    #[test]
    fn a_watch_scope_counts_for_dynamic_types_only() {
        use k8s_openapi::api::core::v1::ConfigMap;
        use kube::{
            api::{ApiResource, DynamicObject},
            core::discovery::Scope,
        };

        let config_maps = ApiResource::erase::<ConfigMap>(&());
        let told = |scope: Scope| Watch::default().resource(config_maps.clone(), scope);
        // A static type knows it lives in namespaces, whatever it is told.
        assert!(
            Resolved::<ConfigMap>::from(told(Scope::Cluster))
                .unwrap()
                .namespaced
        );
        assert!(
            !Resolved::<DynamicObject>::from(told(Scope::Cluster))
                .unwrap()
                .namespaced
        );
        assert!(
            Resolved::<DynamicObject>::from(told(Scope::Namespaced))
                .unwrap()
                .namespaced
        );
        assert!(Resolved::<DynamicObject>::from(Watch::default()).is_err());
        assert!(Resolved::<ConfigMap>::from(Watch::default().in_namespace("")).is_err());
    }
}
