//! What a type needs to be watched: a static or a dynamic resource, its
//! type information, and where its objects live.

use std::fmt;

use kube::{Resource, core::ApiResource};
use serde::de::DeserializeOwned;

/// What a shared watch needs of a type: a Kubernetes resource, either
/// static (`k8s-openapi` and `kube-derive` types, whose type information is
/// `()`) or dynamic (`DynamicObject` and other types described at run time
/// by an [`ApiResource`]).
pub trait Watchable:
    Resource<DynamicType: TypeInfo> + Clone + DeserializeOwned + fmt::Debug + Send + Sync + 'static
{
}

impl<K> Watchable for K where
    K: Resource<DynamicType: TypeInfo>
        + Clone
        + DeserializeOwned
        + fmt::Debug
        + Send
        + Sync
        + 'static
{
}

/// The type information a watched type carries: `()` for static types,
/// [`ApiResource`] for dynamic ones. Sealed: these two are all kube has.
pub trait TypeInfo:
    Clone + Eq + std::hash::Hash + fmt::Debug + Send + Sync + Unpin + 'static + sealed::Sealed
{
    /// The type information a [`Watch`](crate::controller::Watch) gives, if
    /// it gives what this type needs: nothing for static types, an
    /// `ApiResource` for dynamic ones.
    fn from_watch(resource: Option<&ApiResource>) -> Option<Self>;
}

impl TypeInfo for () {
    fn from_watch(_: Option<&ApiResource>) -> Option<Self> {
        Some(())
    }
}

impl TypeInfo for ApiResource {
    fn from_watch(resource: Option<&ApiResource>) -> Option<Self> {
        resource.cloned()
    }
}

pub(crate) use sealed::Sealed;

mod sealed {
    use kube::core::ApiResource;

    pub trait Sealed: Sized {
        /// Whether the type is described at run time (so a watch's scope
        /// counts for it).
        const DYNAMIC: bool = false;

        /// The group, kind and namespacedness to find by discovery in each
        /// cluster, for a stand-in resource of any version.
        fn to_discover(&self) -> Option<(&str, &str, bool)> {
            None
        }

        /// This type's information for a resource discovery found.
        fn resolved(_: ApiResource) -> Option<Self> {
            None
        }
    }

    impl Sealed for () {}

    impl Sealed for ApiResource {
        const DYNAMIC: bool = true;

        fn to_discover(&self) -> Option<(&str, &str, bool)> {
            crate::cache::stand_in::to_discover(self)
        }

        fn resolved(resource: ApiResource) -> Option<Self> {
            Some(resource)
        }
    }
}

/// Whether objects of kind `K` live in namespaces.
///
/// ```
/// use k8s_openapi::api::core::v1::{ConfigMap, Node};
///
/// assert!(kube_multicluster::cache::is_namespaced::<ConfigMap>());
/// assert!(!kube_multicluster::cache::is_namespaced::<Node>());
/// ```
pub fn is_namespaced<K: Resource>() -> bool {
    // `Resource::Scope` need not be 'static, so no TypeId: its name tells.
    std::any::type_name::<K::Scope>() != std::any::type_name::<kube::core::ClusterResourceScope>()
}

/// The namespace a watch of `K` is limited to: none for a cluster-scoped
/// type, whatever was asked.
pub(crate) fn scope<K: Resource>(namespace: Option<&str>) -> Option<&str> {
    namespace.filter(|_| is_namespaced::<K>())
}
