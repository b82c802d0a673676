use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, histogram::Histogram},
    registry::Registry,
};

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(crate) struct ResultLabels {
    pub(crate) controller: String,
    pub(crate) cluster: String,
    pub(crate) result: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(crate) struct ClusterLabels {
    pub(crate) controller: String,
    pub(crate) cluster: String,
}

type Durations = Family<ClusterLabels, Histogram, fn() -> Histogram>;

/// The reconcile counters and histograms, registered once and shared by
/// every [`MetricsLayer`](super::MetricsLayer) (cheap to clone).
#[derive(Debug, Clone)]
pub struct ReconcileMetrics {
    pub(crate) reconciles: Family<ResultLabels, Counter>,
    pub(crate) durations: Durations,
}

impl ReconcileMetrics {
    /// Creates the metrics and registers them in `registry`.
    pub fn new(registry: &mut Registry) -> Self {
        let metrics = Self {
            reconciles: Family::default(),
            durations: Family::new_with_constructor(|| {
                Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
                    0.001, 2.0, 18,
                ))
            }),
        };
        registry.register(
            "kube_fleet_reconciles",
            "Reconciles by controller, cluster and result (success, error, panic)",
            metrics.reconciles.clone(),
        );
        registry.register(
            "kube_fleet_reconcile_duration_seconds",
            "How long reconciles took, by controller and cluster",
            metrics.durations.clone(),
        );
        metrics
    }

    /// How many reconciles of `controller` in `cluster` ended with `result`
    /// (`success`, `error` or `panic`); for tests and health checks.
    pub fn count(&self, controller: &str, cluster: &str, result: &'static str) -> u64 {
        self.reconciles
            .get(&ResultLabels {
                controller: controller.to_owned(),
                cluster: cluster.to_owned(),
                result,
            })
            .map_or(0, |counter| counter.get())
    }
}
