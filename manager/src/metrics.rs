//! The manager's own metrics.

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric},
    metrics::{MetricType, gauge::ConstGauge},
    registry::Registry,
};
use tokio::sync::watch;

use crate::{
    election::Role,
    gate::{HubShards, lock},
    shard::{ShardStatus, shard_of},
};

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

/// `kube_multicluster_shard_owned{name, cluster, shard}`: 1 per cluster this
/// replica runs now under the sharding `name` (its shard's Lease held),
/// `kube_multicluster_shard_replicas{name}`: the live replicas it saw last,
/// itself included, the set's coverage as it saw it last
/// (`kube_multicluster_shards_unowned`, `_misplaced`, `_unowned_clusters`,
/// `_unowned_seconds`, each `{name}`; see [`Coverage`](crate::Coverage)),
/// and with hubs `kube_multicluster_shard_hub_shards{name}`: the
/// shards whose hub keys it runs now.
#[derive(Debug)]
pub(crate) struct ShardGauge {
    name: String,
    shards: u32,
    status: ShardStatus,
    hubs: Option<HubShards>,
}

impl ShardGauge {
    pub(crate) fn register(
        registry: &mut Registry,
        name: String,
        shards: u32,
        status: ShardStatus,
        hubs: Option<HubShards>,
    ) {
        registry.register_collector(Box::new(Self {
            name,
            shards,
            status,
            hubs,
        }));
    }
}

impl Collector for ShardGauge {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let mut family = encoder.encode_descriptor(
            kube_multicluster::metric_name!("shard_owned"),
            "Each cluster this replica runs now: 1 under its shard",
            None,
            MetricType::Gauge,
        )?;
        for cluster in self.status.owned() {
            let shard = shard_of(cluster.as_str(), self.shards).to_string();
            let labels = [
                ("name", self.name.as_str()),
                ("cluster", cluster.as_str()),
                ("shard", shard.as_str()),
            ];
            ConstGauge::new(1).encode(family.encode_family(&labels)?)?;
        }
        let replicas = ConstGauge::new(self.status.replicas().len() as i64);
        let mut family = encoder.encode_descriptor(
            kube_multicluster::metric_name!("shard_replicas"),
            "The live replicas of the sharding this replica saw last, itself included",
            None,
            replicas.metric_type(),
        )?;
        replicas.encode(family.encode_family(&[("name", self.name.as_str())])?)?;
        let coverage = self.status.coverage();
        let unowned_for = coverage.unowned_for();
        let counts: [(&str, &str, usize); 3] = [
            (
                kube_multicluster::metric_name!("shards_unowned"),
                "Shards holding an offered cluster whose Lease no live replica holds, as this replica saw the Leases last",
                coverage.unowned.len(),
            ),
            (
                kube_multicluster::metric_name!("shards_misplaced"),
                "Shards whose Lease is held by a replica that does not rank first for them, as this replica saw the Leases last",
                coverage.misplaced.len(),
            ),
            (
                kube_multicluster::metric_name!("shards_unowned_clusters"),
                "Offered clusters in shards whose Lease no live replica holds, as this replica saw the Leases last",
                coverage.clusters_unowned,
            ),
        ];
        for (name, help, value) in counts {
            let gauge = ConstGauge::new(value as i64);
            let mut family = encoder.encode_descriptor(name, help, None, gauge.metric_type())?;
            gauge.encode(family.encode_family(&[("name", self.name.as_str())])?)?;
        }
        let age = ConstGauge::new(unowned_for.as_secs_f64());
        let mut family = encoder.encode_descriptor(
            kube_multicluster::metric_name!("shards_unowned_seconds"),
            "How long the shard unowned the longest had been without a live owner when this replica last listed the Leases; 0 when every shard was owned",
            None,
            age.metric_type(),
        )?;
        age.encode(family.encode_family(&[("name", self.name.as_str())])?)?;
        if let Some(hubs) = &self.hubs {
            let held = lock(hubs).len();
            let held = ConstGauge::new(held as i64);
            let mut family = encoder.encode_descriptor(
                kube_multicluster::metric_name!("shard_hub_shards"),
                "The shards whose hub keys this replica runs now",
                None,
                held.metric_type(),
            )?;
            held.encode(family.encode_family(&[("name", self.name.as_str())])?)?;
        }
        Ok(())
    }
}
