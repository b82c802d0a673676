//! What a watch changes in each object before caching it.

use std::{
    any::{Any, TypeId},
    fmt,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
};

use kube::{Resource, api::ObjectMeta};

/// A change made to every object a watch receives, before the cache stores
/// it or hands it to anyone: to drop what no reader needs (a large
/// annotation, a Secret's data, a status) and so hold less in memory.
///
/// Given to a controller's watch with
/// [`Watch::transform`](crate::controller::Watch::transform). It runs after
/// the cache has dropped `managedFields`, on listed, changed and deleted
/// objects alike, on the watch's task: keep it quick, and do not block.
/// What it removes is gone for every reader of that watch, the reconciler
/// included; it must leave the name, namespace, UID and resource version,
/// which the cache keys and compares on, and the owner references where the
/// watch serves [`Controller::owns`](crate::Controller::owns), which maps
/// by them. In a host split by annotation
/// ([`SplitBy::Annotation`](crate::cache::SplitBy::Annotation), kcp's
/// `kcp.io/cluster`), that annotation is put back if the transform takes
/// it away: it tells which cluster the object is in. A transform that panics does not stop the watch: the panic is
/// logged with the cluster, kind and object (the first one of a watch as an
/// error, later ones at debug level), and the object is cached as the
/// transform left it, so what it would have saved is not saved. A program
/// built with `panic = "abort"` ends at the panic instead.
///
/// Watches are shared by everyone who watches the same type the same way. A
/// watch with a transform is shared only by watches given the same
/// `Transform` value (or a clone of it): build it once, and hand clones to
/// every controller that should share the watch. Two `Transform`s built
/// apart, even from the same function, start two watches.
///
/// ```
/// use k8s_openapi::api::core::v1::Secret;
/// use kube::runtime::watcher;
/// use kube_multicluster::{Controller, Fleet, cache::Transform, controller::Watch};
///
/// # fn example(fleet: &Fleet) -> Controller<Secret> {
/// // The reconciler needs to know which Secrets exist, not what they hold.
/// let no_data = Transform::object(|secret: &mut Secret| {
///     secret.data = None;
///     secret.string_data = None;
/// });
/// // Nor the last-applied configuration that `kubectl apply` leaves behind.
/// let no_last_applied = Transform::metadata(|meta| {
///     if let Some(annotations) = meta.annotations.as_mut() {
///         annotations.remove("kubectl.kubernetes.io/last-applied-configuration");
///     }
/// });
/// Controller::<Secret>::new(fleet, Watch::default().transform(no_data))
///     .owns::<Secret>(Watch::default().transform(no_last_applied))
/// # }
/// ```
#[derive(Clone)]
pub struct Transform {
    hook: Hook,
    /// What tells this transform (and its clones) from any other.
    identity: u64,
}

/// A change to an object of one type, handed any object (it changes only
/// its own type).
type AnyChange = Arc<dyn Fn(&mut dyn Any) + Send + Sync>;

#[derive(Clone)]
enum Hook {
    Metadata(Arc<dyn Fn(&mut ObjectMeta) + Send + Sync>),
    Object {
        type_id: TypeId,
        type_name: &'static str,
        change: AnyChange,
    },
}

impl Transform {
    /// Changes the metadata of every object, of whatever type the watch
    /// watches (metadata-only watches too).
    pub fn metadata(change: impl Fn(&mut ObjectMeta) + Send + Sync + 'static) -> Self {
        Self::new(Hook::Metadata(Arc::new(change)))
    }

    fn new(hook: Hook) -> Self {
        static BUILT: AtomicU64 = AtomicU64::new(0);
        Self {
            hook,
            identity: BUILT.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// Changes every object of type `K`: only for a watch of `K` (a
    /// controller refuses it on a watch of another type, and says so when
    /// it runs). For a metadata-only watch, `K` is `PartialObjectMeta<_>`.
    pub fn object<K: Any>(change: impl Fn(&mut K) + Send + Sync + 'static) -> Self {
        let change = move |object: &mut dyn Any| {
            if let Some(object) = object.downcast_mut::<K>() {
                change(object);
            }
        };
        Self::new(Hook::Object {
            type_id: TypeId::of::<K>(),
            type_name: std::any::type_name::<K>(),
            change: Arc::new(change),
        })
    }

    /// Whether this transform can change objects of type `T`.
    pub fn applies_to<T: Any>(&self) -> bool {
        match &self.hook {
            Hook::Metadata(_) => true,
            Hook::Object { type_id, .. } => *type_id == TypeId::of::<T>(),
        }
    }

    /// Changes `object`, if this transform is for its type.
    pub fn apply<T: Resource + Any>(&self, object: &mut T) {
        match &self.hook {
            Hook::Metadata(change) => change(object.meta_mut()),
            Hook::Object { change, .. } => change(object),
        }
    }

    /// The type this transform is for; `None` for a metadata transform.
    pub(crate) fn type_name(&self) -> Option<&'static str> {
        match &self.hook {
            Hook::Metadata(_) => None,
            Hook::Object { type_name, .. } => Some(type_name),
        }
    }

    /// What tells this transform (and its clones) from any other.
    pub(crate) fn identity(&self) -> u64 {
        self.identity
    }
}

impl fmt::Debug for Transform {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.type_name() {
            None => f.write_str("Transform(metadata)"),
            Some(type_name) => write!(f, "Transform({type_name})"),
        }
    }
}

/// How a watch shapes the objects it caches: whether it keeps their
/// `managedFields`, and a transform of the user's.
#[derive(Clone, Debug, Default)]
pub(crate) struct Shape {
    pub(crate) keep_managed_fields: bool,
    pub(crate) transform: Option<Transform>,
    /// An annotation the transform may not take away: what tells the parts
    /// of a host split by annotation apart.
    pub(crate) keep_annotation: Option<std::sync::Arc<str>>,
}

impl Shape {
    pub(crate) fn apply<T: Resource + Any>(&self, object: &mut T) {
        if !self.keep_managed_fields {
            object.meta_mut().managed_fields = None;
        }
        if let Some(transform) = &self.transform {
            let kept = self.keep_annotation.as_deref().and_then(|key| {
                let value = object.meta().annotations.as_ref()?.get(key)?.clone();
                Some((key, value))
            });
            transform.apply(object);
            if let Some((key, value)) = kept {
                // As it was, whatever the transform made of it.
                object
                    .meta_mut()
                    .annotations
                    .get_or_insert_default()
                    .insert(key.to_owned(), value);
            }
        }
    }

    /// What tells watches shaped differently apart.
    pub(crate) fn key(&self) -> (bool, Option<u64>) {
        (
            self.keep_managed_fields,
            self.transform.as_ref().map(Transform::identity),
        )
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{ConfigMap, Secret};

    use super::*;

    #[test]
    fn an_object_transform_changes_its_type_only() {
        let transform = Transform::object(|cm: &mut ConfigMap| cm.data = None);
        assert!(transform.applies_to::<ConfigMap>());
        assert!(!transform.applies_to::<Secret>());
        let mut cm = ConfigMap {
            data: Some([("a".to_owned(), "b".to_owned())].into()),
            ..ConfigMap::default()
        };
        transform.apply(&mut cm);
        assert_eq!(cm.data, None);
        let mut secret = Secret {
            type_: Some("Opaque".into()),
            ..Secret::default()
        };
        transform.apply(&mut secret);
        assert_eq!(secret.type_.as_deref(), Some("Opaque"));
    }

    #[test]
    fn clones_share_an_identity_and_separate_builds_do_not() {
        let strip = |meta: &mut ObjectMeta| meta.annotations = None;
        let a = Transform::metadata(strip);
        assert_eq!(a.identity(), a.clone().identity());
        assert_ne!(a.identity(), Transform::metadata(strip).identity());
    }

    #[test]
    fn a_shape_drops_managed_fields_before_the_transform_runs() {
        let saw_managed_fields = Arc::new(std::sync::Mutex::new(None));
        let shape = Shape {
            keep_managed_fields: false,
            transform: Some(Transform::metadata({
                let saw = saw_managed_fields.clone();
                move |meta| *saw.lock().unwrap() = Some(meta.managed_fields.is_some())
            })),
            keep_annotation: None,
        };
        let mut cm = ConfigMap::default();
        cm.metadata.managed_fields = Some(Vec::new());
        shape.apply(&mut cm);
        assert_eq!(*saw_managed_fields.lock().unwrap(), Some(false));
    }

    #[test]
    fn the_annotation_a_host_splits_by_outlives_a_transform() {
        let shape = Shape {
            transform: Some(Transform::metadata(|meta| meta.annotations = None)),
            keep_annotation: Some("kcp.io/cluster".into()),
            ..Shape::default()
        };
        let rewriting = Shape {
            transform: Some(Transform::metadata(|meta| {
                for value in meta.annotations.get_or_insert_default().values_mut() {
                    value.clear();
                }
            })),
            ..shape.clone()
        };
        let mut cm = ConfigMap::default();
        cm.metadata.annotations = Some(
            [
                ("kcp.io/cluster".to_owned(), "a".to_owned()),
                ("other".to_owned(), "x".to_owned()),
            ]
            .into(),
        );
        let mut rewritten = cm.clone();
        shape.apply(&mut cm);
        assert_eq!(
            cm.metadata.annotations,
            Some([("kcp.io/cluster".to_owned(), "a".to_owned())].into())
        );
        rewriting.apply(&mut rewritten);
        assert_eq!(
            rewritten.metadata.annotations,
            Some(
                [
                    ("kcp.io/cluster".to_owned(), "a".to_owned()),
                    ("other".to_owned(), String::new()),
                ]
                .into()
            ),
            "its value as it was"
        );
    }
}
