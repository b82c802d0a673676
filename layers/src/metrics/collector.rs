use std::sync::{Arc, Mutex};

use kube_multicluster::{Fleet, queue::QueueDepth};
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric},
    metrics::{MetricType, gauge::ConstGauge},
    registry::Registry,
};

/// Reports, at each scrape, `kube_multicluster_engaged_clusters`, the number of
/// clusters the fleet has engaged, `kube_multicluster_set_aside_clusters`, the
/// number it has [set aside](kube_multicluster::FleetConfig::set_aside_after) for
/// want of an answer, `kube_multicluster_duplicate_clusters`, the names offered
/// for a cluster engaged under another
/// ([`FleetStatus::duplicates`](kube_multicluster::FleetStatus::duplicates)), and
/// `kube_multicluster_cluster_health{cluster, state}`: one
/// series per engaged or set-aside cluster, of value 1, whose `state` is
/// its [`ClusterHealth::state`](kube_multicluster::health::ClusterHealth::state)
/// (`healthy`, `degraded`, `unreachable` or `settling`); a cluster's series
/// goes when it leaves. With a
/// [cache budget](kube_multicluster::FleetConfig::cache_budget), also
/// `kube_multicluster_cache_budget_bytes`, `kube_multicluster_cache_bytes`
/// (what the caches hold, as the budget counts it) and
/// `kube_multicluster_cache_waiting_watches` (first lists waiting for room).
#[derive(Debug)]
pub struct FleetCollector {
    fleet: Fleet,
}

impl FleetCollector {
    /// Registers a collector for `fleet` in `registry`.
    pub fn register(registry: &mut Registry, fleet: Fleet) {
        registry.register_collector(Box::new(Self { fleet }));
    }
}

impl Collector for FleetCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let status = self.fleet.status();
        for (name, help, count) in [
            (
                kube_multicluster::metric_name!("engaged_clusters"),
                "Clusters engaged in the fleet",
                self.fleet.clusters().len(),
            ),
            (
                kube_multicluster::metric_name!("set_aside_clusters"),
                "Clusters set aside for want of an answer, engaged again when they answer",
                status.set_aside.len(),
            ),
            (
                kube_multicluster::metric_name!("duplicate_clusters"),
                "Names offered for a cluster engaged under another name (FleetStatus::duplicates)",
                status.duplicates.len(),
            ),
        ] {
            let gauge = ConstGauge::new(count as i64);
            gauge.encode(encoder.encode_descriptor(name, help, None, gauge.metric_type())?)?;
        }
        let lists = &status.initial_lists;
        if let Some(budget) = lists.cache_budget() {
            for (name, help, value) in [
                (
                    kube_multicluster::metric_name!("cache_budget_bytes"),
                    "The budget for the bytes the fleet's caches hold (FleetConfig::cache_budget)",
                    budget,
                ),
                (
                    kube_multicluster::metric_name!("cache_bytes"),
                    "The bytes the fleet's caches hold, with the first lists under way, as the cache budget counts them",
                    lists.cached_bytes(),
                ),
                (
                    kube_multicluster::metric_name!("cache_waiting_watches"),
                    "Watches whose first list waits for room in the cache budget",
                    lists.waiting_for_room().len(),
                ),
            ] {
                let gauge = ConstGauge::new(i64::try_from(value).unwrap_or(i64::MAX));
                gauge.encode(encoder.encode_descriptor(
                    name,
                    help,
                    None,
                    gauge.metric_type(),
                )?)?;
            }
        }
        let mut family = encoder.encode_descriptor(
            kube_multicluster::metric_name!("cluster_health"),
            "Each engaged or set-aside cluster's health: 1 under its state (healthy, degraded, unreachable, settling)",
            None,
            MetricType::Gauge,
        )?;
        for (cluster, health) in &status.health {
            let labels = [("cluster", cluster.as_str()), ("state", health.state())];
            ConstGauge::new(1).encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

/// Reports `workqueue_depth{name, controller}`, the keys waiting in each
/// added controller's queue, at each scrape, labelled (as controller-runtime
/// labels it) with the controller's own name ([`QueueDepth::controller`])
/// twice, as the queue's and as the controller's; a controller that has not started
/// running yet is not reported. Cheap to clone; clones add to the same
/// collector.
///
/// ```
/// # use k8s_openapi::api::core::v1::ConfigMap;
/// # use kube::runtime::watcher;
/// # use kube_multicluster::{Controller, Fleet};
/// use kube_multicluster_layers::metrics::QueueDepths;
/// use prometheus_client::registry::Registry;
///
/// let mut registry = Registry::default();
/// let depths = QueueDepths::register(&mut registry);
/// let controller = Controller::<ConfigMap>::new(&Fleet::new(), watcher::Config::default());
/// depths.add(controller.queue_depth());
/// ```
#[derive(Debug, Clone)]
pub struct QueueDepths {
    controllers: Arc<Mutex<Vec<QueueDepth>>>,
}

impl QueueDepths {
    /// Registers an empty collector in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let depths = Self {
            controllers: Arc::default(),
        };
        registry.register_collector(Box::new(depths.clone()));
        depths
    }

    /// Reports `depth` under its controller's name.
    pub fn add(&self, depth: QueueDepth) {
        self.controllers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(depth);
    }
}

impl Collector for QueueDepths {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let controllers = self.controllers.lock().unwrap_or_else(|e| e.into_inner());
        let mut family = encoder.encode_descriptor(
            "workqueue_depth",
            "Keys waiting in each controller's queue",
            None,
            MetricType::Gauge,
        )?;
        for depth in controllers.iter() {
            let Some(controller) = depth.controller() else {
                continue;
            };
            let labels = [("name", controller), ("controller", controller)];
            ConstGauge::new(depth.get() as i64).encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }
}
