use std::sync::{Arc, Mutex};

use kube_multicluster::{
    ClusterName,
    queue::{ClusterQueueMetrics, DurationHistogram, QueueMetrics, WORKQUEUE_BUCKETS},
};
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric},
    metrics::{MetricType, counter::ConstCounter, gauge::ConstGauge},
    registry::Registry,
};

/// The names this collector reports, each with the labels `name` and
/// `controller` (both the controller's name, as controller-runtime labels
/// them) and `cluster`.
pub const WORKQUEUE_METRICS: [&str; 7] = [
    "workqueue_depth",
    "workqueue_adds_total",
    "workqueue_queue_duration_seconds",
    "workqueue_work_duration_seconds",
    "workqueue_unfinished_work_seconds",
    "workqueue_longest_running_processor_seconds",
    "workqueue_retries_total",
];

/// Reports, at each scrape, each added controller's queue cluster by
/// cluster, under controller-runtime's workqueue names with a `cluster`
/// label ([`WORKQUEUE_METRICS`]), from its
/// [`QueueMetrics`](kube_multicluster::queue::QueueMetrics):
///
/// - `workqueue_depth`: keys ready to run, waiting for their turn (not
///   those delayed until a requeue or retry, nor those running), as
///   controller-runtime counts it;
/// - `workqueue_adds_total`: keys that became ready to run;
/// - `workqueue_queue_duration_seconds`: how long keys were ready before
///   they ran, a histogram from 10 ns to 1,000 s by factors of ten
///   (controller-runtime's buckets);
/// - `workqueue_work_duration_seconds`: how long runs took, in the same
///   buckets;
/// - `workqueue_unfinished_work_seconds`: the time the runs under way have
///   taken so far, summed (a value growing while nothing finishes means a
///   stuck reconcile);
/// - `workqueue_longest_running_processor_seconds`: the longest of them;
/// - `workqueue_retries_total`: runs that failed and were scheduled again.
///
/// A cluster's series go when the controller stops serving it (it left the
/// fleet, or this replica no longer runs it) and holds no key of it. A
/// controller that has not started running yet is not reported. This
/// reports `workqueue_depth` per cluster: register it instead of
/// [`QueueDepths`](super::QueueDepths), not beside it (the manager does).
/// Cheap to clone; clones add to the same collector.
///
/// ```
/// # use k8s_openapi::api::core::v1::ConfigMap;
/// # use kube::runtime::watcher;
/// # use kube_multicluster::{Controller, Fleet};
/// use kube_multicluster_layers::metrics::WorkqueueMetrics;
/// use prometheus_client::registry::Registry;
///
/// let mut registry = Registry::default();
/// let workqueues = WorkqueueMetrics::register(&mut registry);
/// let controller = Controller::<ConfigMap>::new(&Fleet::new(), watcher::Config::default());
/// workqueues.add(controller.queue_metrics());
/// ```
#[derive(Debug, Clone)]
pub struct WorkqueueMetrics {
    controllers: Arc<Mutex<Vec<QueueMetrics>>>,
}

impl WorkqueueMetrics {
    /// Registers an empty collector in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self {
            controllers: Arc::default(),
        };
        registry.register_collector(Box::new(metrics.clone()));
        metrics
    }

    /// Reports `queue` (from
    /// [`Controller::queue_metrics`](kube_multicluster::Controller::queue_metrics))
    /// under its controller's name.
    pub fn add(&self, queue: QueueMetrics) {
        self.controllers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(queue);
    }
}

impl Collector for WorkqueueMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let controllers = self.controllers.lock().unwrap_or_else(|e| e.into_inner());
        let mut read = Vec::new();
        for queue in controllers.iter() {
            let Some(controller) = queue.controller() else {
                continue;
            };
            let mut clusters = queue.clusters();
            clusters.sort_by(|(a, _), (b, _)| a.cmp(b));
            for (cluster, figures) in clusters {
                read.push((controller, cluster, figures));
            }
        }
        let [depth, adds, queued, worked, unfinished, longest, retries] = WORKQUEUE_METRICS;

        let mut family = encoder.encode_descriptor(
            depth,
            "Keys ready to run in each controller's queue, per cluster",
            None,
            MetricType::Gauge,
        )?;
        for (controller, cluster, figures) in &read {
            ConstGauge::new(figures.depth as i64)
                .encode(family.encode_family(&labels(controller, cluster))?)?;
        }
        for (name, help, count) in [
            (
                adds,
                "Keys that became ready to run, per controller and cluster",
                (|f| f.adds) as fn(&ClusterQueueMetrics) -> u64,
            ),
            (
                retries,
                "Runs that failed and were scheduled again, per controller and cluster",
                |f| f.retries,
            ),
        ] {
            // The encoder adds `_total` to a counter's name.
            let name = name.trim_end_matches("_total");
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            for (controller, cluster, figures) in &read {
                ConstCounter::new(count(figures))
                    .encode(family.encode_family(&labels(controller, cluster))?)?;
            }
        }
        for (name, help, histogram) in [
            (
                queued,
                "How long keys were ready before they ran, per controller and cluster",
                (|f| &f.queue_duration) as fn(&ClusterQueueMetrics) -> &DurationHistogram,
            ),
            (
                worked,
                "How long runs took, per controller and cluster",
                |f| &f.work_duration,
            ),
        ] {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Histogram)?;
            for (controller, cluster, figures) in &read {
                let histogram = histogram(figures);
                let mut buckets = Vec::with_capacity(WORKQUEUE_BUCKETS.len() + 1);
                let mut below = 0;
                for (bound, cumulative) in WORKQUEUE_BUCKETS.iter().zip(histogram.buckets) {
                    buckets.push((*bound, cumulative - below));
                    below = cumulative;
                }
                buckets.push((f64::INFINITY, histogram.count.saturating_sub(below)));
                family
                    .encode_family(&labels(controller, cluster))?
                    .encode_histogram::<prometheus_client::encoding::NoLabelSet>(
                    histogram.sum.as_secs_f64(),
                    histogram.count,
                    &buckets,
                    None,
                )?;
            }
        }
        for (name, help, seconds) in [
            (
                unfinished,
                "The time the runs under way have taken so far, summed, per controller and cluster",
                (|f| f.unfinished_work.as_secs_f64()) as fn(&ClusterQueueMetrics) -> f64,
            ),
            (
                longest,
                "The time the longest run under way has taken so far, per controller and cluster",
                |f| f.longest_running.as_secs_f64(),
            ),
        ] {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for (controller, cluster, figures) in &read {
                ConstGauge::new(seconds(figures))
                    .encode(family.encode_family(&labels(controller, cluster))?)?;
            }
        }
        Ok(())
    }
}

/// A series' labels, as controller-runtime gives them, with its cluster.
fn labels<'a>(controller: &'a str, cluster: &'a ClusterName) -> [(&'static str, &'a str); 3] {
    [
        ("name", controller),
        ("controller", controller),
        ("cluster", cluster.as_str()),
    ]
}
