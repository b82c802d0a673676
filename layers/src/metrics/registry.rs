use std::{
    collections::{HashMap, HashSet},
    sync::{
        Arc, Mutex, MutexGuard, OnceLock, Weak,
        atomic::{AtomicBool, Ordering},
    },
};

use kube_multicluster::{Fleet, FleetEvent};
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

/// The results of `controller_runtime_reconcile_total`, as controller-runtime
/// names them.
const RESULTS: [&str; 4] = ["success", "error", "requeue", "requeue_after"];

type Durations = Family<ClusterLabels, Histogram, fn() -> Histogram>;

/// How one reconcile ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Done, waiting for the next change.
    Success,
    /// Done, to run again at once.
    Requeue,
    /// Done, to run again after a delay.
    RequeueAfter,
    /// Failed.
    Error,
    /// Panicked (and counted as failed too).
    Panic,
}

impl Outcome {
    fn result(self) -> &'static str {
        match self {
            Self::Success => "success",
            Self::Requeue => "requeue",
            Self::RequeueAfter => "requeue_after",
            Self::Error | Self::Panic => "error",
        }
    }
}

/// The reconcile counters and histograms, registered once and shared by
/// every [`MetricsLayer`](super::MetricsLayer) (cheap to clone).
///
/// Given the fleet with [`follow`](Self::follow), series are kept only for
/// engaged clusters: a cluster's series go when it leaves, and reconciles
/// that end after it left are not recorded.
#[derive(Debug, Clone)]
pub struct ReconcileMetrics {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    reconciles: Family<ResultLabels, Counter>,
    errors: Family<ClusterLabels, Counter>,
    panics: Family<ClusterLabels, Counter>,
    durations: Durations,
    /// The controllers that have series for each cluster.
    series: Mutex<HashMap<String, HashSet<String>>>,
    fleet: OnceLock<Fleet>,
    /// The task that forgets departed clusters has been started.
    forgetting: AtomicBool,
    /// Records nothing: metrics that no registry exports.
    unregistered: bool,
}

impl Inner {
    fn series(&self) -> MutexGuard<'_, HashMap<String, HashSet<String>>> {
        self.series.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn forget(&self, cluster: &str, controllers: HashSet<String>) {
        for controller in controllers {
            let labels = ClusterLabels {
                controller,
                cluster: cluster.to_owned(),
            };
            self.durations.remove(&labels);
            self.errors.remove(&labels);
            self.panics.remove(&labels);
            for result in RESULTS {
                self.reconciles.remove(&ResultLabels {
                    controller: labels.controller.clone(),
                    cluster: labels.cluster.clone(),
                    result,
                });
            }
        }
    }

    /// Drops the series of every cluster that is not engaged now: the one
    /// that just left, and any recorded in a race with an earlier leave.
    /// Holds the series lock throughout, as [`record`](ReconcileMetrics::record)
    /// does, so that no series is created behind its back.
    fn forget_departed(&self, fleet: &Fleet) {
        let mut series = self.series();
        let departed: Vec<String> = series
            .keys()
            .filter(|cluster| fleet.get(cluster.as_str()).is_none())
            .cloned()
            .collect();
        for cluster in departed {
            if let Some(controllers) = series.remove(&cluster) {
                self.forget(&cluster, controllers);
            }
        }
    }
}

impl ReconcileMetrics {
    /// Creates the metrics and registers them in `registry`.
    pub fn new(registry: &mut Registry) -> Self {
        let metrics = Self::unregistered();
        let mut inner = Arc::into_inner(metrics.inner).expect("just made");
        inner.unregistered = false;
        registry.register(
            "controller_runtime_reconcile",
            "Reconciles by controller, cluster and result (success, error, requeue, requeue_after)",
            inner.reconciles.clone(),
        );
        registry.register(
            "controller_runtime_reconcile_errors",
            "Reconciles that failed, by controller and cluster",
            inner.errors.clone(),
        );
        registry.register(
            "controller_runtime_reconcile_panics",
            "Reconciles that panicked, by controller and cluster",
            inner.panics.clone(),
        );
        registry.register(
            "controller_runtime_reconcile_time_seconds",
            "How long reconciles took, by controller and cluster",
            inner.durations.clone(),
        );
        Self {
            inner: Arc::new(inner),
        }
    }

    /// Metrics that record nothing, for a stack whose metrics nobody
    /// exports.
    pub(crate) fn unregistered() -> Self {
        let inner = Inner {
            reconciles: Family::default(),
            errors: Family::default(),
            panics: Family::default(),
            durations: Family::new_with_constructor(|| {
                Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
                    0.001, 2.0, 18,
                ))
            }),
            series: Mutex::default(),
            fleet: OnceLock::new(),
            forgetting: AtomicBool::new(false),
            unregistered: true,
        };
        Self {
            inner: Arc::new(inner),
        }
    }

    /// Keeps series only for clusters engaged in `fleet`: those of a
    /// cluster that leaves are removed, so a fleet whose clusters come and
    /// go does not grow its metrics without end, and reconciles that end
    /// after their cluster left are not recorded. The removal runs in a task
    /// on the current tokio runtime, which ends with the last clone of these
    /// metrics; called outside a runtime, only the recording is filtered
    /// until a call from inside one starts the task. Metrics follow the
    /// first fleet they are given.
    pub fn follow(self, fleet: &Fleet) -> Self {
        let _ = self.inner.fleet.set(fleet.clone());
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return self;
        };
        if self.inner.forgetting.swap(true, Ordering::SeqCst) {
            return self;
        }
        let followed = self.inner.fleet.get().expect("just set");
        let mut events = followed.subscribe().events;
        // Holds neither the metrics nor the fleet: it ends once either goes.
        let inner: Weak<Inner> = Arc::downgrade(&self.inner);
        runtime.spawn(async move {
            while let Some(event) = events.recv().await {
                let Some(inner) = inner.upgrade() else {
                    return;
                };
                if matches!(event, FleetEvent::Disengaged(_))
                    && let Some(fleet) = inner.fleet.get()
                {
                    inner.forget_departed(fleet);
                }
            }
        });
        self
    }

    /// Records one reconcile, unless its cluster is known to have left.
    pub(crate) fn record(&self, labels: &ClusterLabels, outcome: Outcome, seconds: f64) {
        if self.inner.unregistered {
            return;
        }
        let record = || {
            self.inner.durations.get_or_create(labels).observe(seconds);
            if matches!(outcome, Outcome::Error | Outcome::Panic) {
                self.inner.errors.get_or_create(labels).inc();
            }
            if outcome == Outcome::Panic {
                self.inner.panics.get_or_create(labels).inc();
            }
            self.inner
                .reconciles
                .get_or_create(&ResultLabels {
                    controller: labels.controller.clone(),
                    cluster: labels.cluster.clone(),
                    result: outcome.result(),
                })
                .inc();
        };
        let Some(fleet) = self.inner.fleet.get() else {
            return record();
        };
        // Under the lock that forgetting a cluster takes too: either the
        // cluster is still engaged and its series are forgotten after this,
        // or it has left and nothing is recorded.
        let mut series = self.inner.series();
        if fleet.get(labels.cluster.as_str()).is_none() {
            return;
        }
        let known = series.get(labels.cluster.as_str());
        if !known.is_some_and(|controllers| controllers.contains(&labels.controller)) {
            let controllers = series.entry(labels.cluster.clone()).or_default();
            controllers.insert(labels.controller.clone());
        }
        record();
    }

    /// How many reconciles of `controller` in `cluster` ended with `result`:
    /// `success`, `error` (panics included), `requeue` or `requeue_after`,
    /// as in `controller_runtime_reconcile_total`; or `panic`, as in
    /// `controller_runtime_reconcile_panics_total`. For tests and health
    /// checks.
    pub fn count(&self, controller: &str, cluster: &str, result: &str) -> u64 {
        let labels = ClusterLabels {
            controller: controller.to_owned(),
            cluster: cluster.to_owned(),
        };
        if result == "panic" {
            return self.inner.panics.get(&labels).map_or(0, |c| c.get());
        }
        let Some(result) = RESULTS.into_iter().find(|r| *r == result) else {
            return 0;
        };
        self.inner
            .reconciles
            .get(&ResultLabels {
                controller: labels.controller,
                cluster: labels.cluster,
                result,
            })
            .map_or(0, |counter| counter.get())
    }

    /// How many clusters have series now (counted only when following a
    /// fleet).
    pub fn clusters_recorded(&self) -> usize {
        self.inner.series().len()
    }
}
