//! How many keys wait in a controller's queue, for metrics.

use std::sync::{
    Arc, OnceLock,
    atomic::{AtomicUsize, Ordering},
};

/// How many keys wait in a controller's queue (ready or delayed, not
/// running): a handle to read while the controller runs, for metrics.
///
/// ```
/// # use k8s_openapi::api::core::v1::ConfigMap;
/// # use kube::runtime::watcher;
/// # use kube_multicluster::{Controller, Fleet};
/// let controller = Controller::<ConfigMap>::new(&Fleet::new(), watcher::Config::default());
/// let depth = controller.queue_depth();
/// assert_eq!(depth.get(), 0);
/// ```
#[derive(Debug, Clone, Default)]
pub struct QueueDepth {
    depth: Arc<AtomicUsize>,
    controller: Arc<OnceLock<Arc<str>>>,
}

impl QueueDepth {
    /// The number of waiting keys at the controller's last step.
    pub fn get(&self) -> usize {
        self.depth.load(Ordering::Relaxed)
    }

    /// The controller's name
    /// ([`Controller::named`](crate::Controller::named)), once it runs: for
    /// metrics that label the depth by controller.
    pub fn controller(&self) -> Option<&str> {
        self.controller.get().map(|name| &**name)
    }

    pub(crate) fn set(&self, depth: usize) {
        self.depth.store(depth, Ordering::Relaxed);
    }

    pub(crate) fn name(&self, controller: Arc<str>) {
        let _ = self.controller.set(controller);
    }
}
