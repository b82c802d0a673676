use std::{fmt, marker::PhantomData};

use kube::runtime::watcher;
use tower_layer::Layer;

use super::LoadObject;

/// Wraps a service in [`LoadObject`] for `K` objects.
pub struct LoadObjectLayer<K> {
    config: watcher::Config,
    _object: PhantomData<fn() -> K>,
}

impl<K> LoadObjectLayer<K> {
    /// Loads `K` objects from the watch with the default configuration.
    pub fn new() -> Self {
        Self::with_config(watcher::Config::default())
    }

    /// Loads `K` objects from the watch with this configuration: the one the
    /// controller's `Controller::new` was given.
    pub fn with_config(config: watcher::Config) -> Self {
        Self {
            config,
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
        Self::with_config(self.config.clone())
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
        LoadObject::with_config(inner, self.config.clone())
    }
}
