use std::{fmt, marker::PhantomData, sync::Arc, time::Duration};

use kube::runtime::watcher;
use kube_fleet::Fleet;
use tower::{ServiceBuilder, retry::RetryLayer, timeout::TimeoutLayer};
use tower_layer::Layer;

use crate::{
    catch_panic::{CatchPanic, CatchPanicLayer},
    load_object::{LoadObject, LoadObjectLayer},
    metrics::{Metrics, MetricsLayer, ReconcileMetrics},
    resolve_cluster::{ResolveCluster, ResolveClusterLayer},
    retry::TransientErrors,
    trace::{Trace, TraceLayer},
};

/// The service [`RecommendedLayer`] builds around a reconciler `S` of `K`s.
pub type RecommendedService<S, K> = Trace<
    Metrics<
        CatchPanic<
            tower::timeout::Timeout<
                tower::retry::Retry<TransientErrors, ResolveCluster<LoadObject<S, K>>>,
            >,
        >,
    >,
>;

/// The recommended stack for a controller of `K`; see the [module docs](super).
pub struct RecommendedLayer<K> {
    fleet: Fleet,
    controller: Arc<str>,
    metrics: ReconcileMetrics,
    timeout: Duration,
    retries: u32,
    watch: watcher::Config,
    _object: PhantomData<fn() -> K>,
}

impl<K> Clone for RecommendedLayer<K> {
    fn clone(&self) -> Self {
        Self {
            fleet: self.fleet.clone(),
            controller: self.controller.clone(),
            metrics: self.metrics.clone(),
            timeout: self.timeout,
            retries: self.retries,
            watch: self.watch.clone(),
            _object: PhantomData,
        }
    }
}

impl<K> fmt::Debug for RecommendedLayer<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecommendedLayer")
            .field("controller", &self.controller)
            .field("timeout", &self.timeout)
            .field("retries", &self.retries)
            .finish_non_exhaustive()
    }
}

impl<K> RecommendedLayer<K> {
    /// The stack for the controller named `controller` (in spans and
    /// metrics), resolving clusters in `fleet`: 60 s timeout, 3 retries of
    /// transient errors, and no metrics recorded until
    /// [`metrics`](Self::metrics) gives the ones to export.
    pub fn new(fleet: Fleet, controller: impl Into<Arc<str>>) -> Self {
        Self {
            fleet,
            controller: controller.into(),
            metrics: ReconcileMetrics::unregistered(),
            timeout: Duration::from_secs(60),
            retries: 3,
            watch: watcher::Config::default(),
            _object: PhantomData,
        }
    }

    /// Records into these metrics (registered in the registry you export;
    /// give them the fleet with [`ReconcileMetrics::follow`] so that the
    /// series of departed clusters go).
    #[must_use]
    pub fn metrics(mut self, metrics: ReconcileMetrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// The longest a reconcile may take, retries included.
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// How many times a transient error is retried within one reconcile.
    #[must_use]
    pub fn retries(mut self, retries: u32) -> Self {
        self.retries = retries;
        self
    }

    /// The watch configuration the controller was given, so that objects
    /// are loaded from that watch's cache.
    #[must_use]
    pub fn watch_config(mut self, config: watcher::Config) -> Self {
        self.watch = config;
        self
    }
}

impl<S, K> Layer<S> for RecommendedLayer<K> {
    type Service = RecommendedService<S, K>;

    fn layer(&self, inner: S) -> Self::Service {
        ServiceBuilder::new()
            .layer(TraceLayer::new().controller(self.controller.clone()))
            .layer(MetricsLayer::new(
                self.metrics.clone(),
                self.controller.clone(),
            ))
            .layer(CatchPanicLayer::new())
            .layer(TimeoutLayer::new(self.timeout))
            .layer(RetryLayer::new(TransientErrors::new(self.retries)))
            .layer(ResolveClusterLayer::new(self.fleet.clone()))
            .layer(LoadObjectLayer::<K>::with_config(self.watch.clone()))
            .service(inner)
    }
}
