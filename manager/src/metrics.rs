//! The manager's own metrics.

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric},
    metrics::gauge::ConstGauge,
    registry::Registry,
};
use tokio::sync::watch;

use crate::election::Role;

/// `leader_election_master_status{name}`: 1 while this replica leads
/// through the Lease `name`, 0 otherwise, as client-go reports it.
#[derive(Debug)]
pub(crate) struct LeaderGauge {
    name: String,
    role: watch::Receiver<Role>,
}

impl LeaderGauge {
    pub(crate) fn register(registry: &mut Registry, name: String, role: watch::Receiver<Role>) {
        registry.register_collector(Box::new(Self { name, role }));
    }
}

impl Collector for LeaderGauge {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let leading = i64::from(*self.role.borrow() == Role::Leading);
        let gauge = ConstGauge::new(leading);
        let mut family = encoder.encode_descriptor(
            "leader_election_master_status",
            "Whether this replica leads through the Lease (1) or not (0)",
            None,
            gauge.metric_type(),
        )?;
        gauge.encode(family.encode_family(&[("name", self.name.as_str())])?)
    }
}
