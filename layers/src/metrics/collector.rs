use kube_fleet::Fleet;
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric},
    metrics::gauge::ConstGauge,
    registry::Registry,
};

/// Reports `kube_fleet_engaged_clusters`, the number of clusters the fleet
/// has engaged, at each scrape.
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
        let engaged = ConstGauge::new(self.fleet.clusters().len() as i64);
        let metric = encoder.encode_descriptor(
            "kube_fleet_engaged_clusters",
            "Clusters engaged in the fleet",
            None,
            engaged.metric_type(),
        )?;
        engaged.encode(metric)
    }
}
