use std::{fmt, marker::PhantomData};

use tower_layer::Layer;

use super::LoadObject;

/// Wraps a service in [`LoadObject`] for `K` objects.
pub struct LoadObjectLayer<K> {
    _object: PhantomData<fn() -> K>,
}

impl<K> LoadObjectLayer<K> {
    /// Loads `K` objects.
    pub const fn new() -> Self {
        Self {
            _object: PhantomData,
        }
    }
}

impl<K> Default for LoadObjectLayer<K> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K> Clone for LoadObjectLayer<K> {
    fn clone(&self) -> Self {
        Self::new()
    }
}

impl<K> fmt::Debug for LoadObjectLayer<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoadObjectLayer")
            .field("kind", &std::any::type_name::<K>())
            .finish()
    }
}

impl<S, K> Layer<S> for LoadObjectLayer<K> {
    type Service = LoadObject<S, K>;

    fn layer(&self, inner: S) -> Self::Service {
        LoadObject::new(inner)
    }
}
