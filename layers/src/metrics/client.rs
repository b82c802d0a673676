use kube_multicluster::{
    Fleet,
    client::{LATENCY_BUCKETS, RequestLatency, RequestStats, WriteWaits},
};
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric, NoLabelSet},
    metrics::{MetricType, counter::ConstCounter},
    registry::Registry,
};

/// Reports the API requests of every engaged cluster at each scrape, read
/// from each cluster's [`RequestStats`], under client-go's names with a
/// `cluster` label added:
///
/// - `rest_client_requests_total{cluster, code, method, host}`: requests by
///   status code (`<error>` where no response came) and HTTP method; a
///   throttled request shows as `code="429"`;
/// - `rest_client_request_duration_seconds{cluster, verb, host}`: how long
///   each took until its response's head, by HTTP method, in client-go's
///   buckets ([`LATENCY_BUCKETS`]);
/// - `rest_client_rate_limiter_duration_seconds{cluster, verb, host}`: how
///   long each waited for its cluster's
///   [`RequestBudget`](kube_multicluster::client::RequestBudget) before it was
///   sent ([`RequestStats::budget_waits`]), in the same buckets; none for a
///   cluster without a budget;
/// - `kube_multicluster_read_your_writes_writes_total{cluster}`,
///   `kube_multicluster_read_your_writes_waits_total{cluster}`,
///   `kube_multicluster_read_your_writes_wait_seconds_total{cluster}` and
///   `kube_multicluster_read_your_writes_timeouts_total{cluster}`: the writes of
///   reconciles that read their own writes, the times their controllers
///   held the cluster's reconciles for its watches to show them, how long,
///   and the waits that ran out
///   ([`Cluster::read_your_writes`](kube_multicluster::Cluster::read_your_writes);
///   namespaces of one host each report their host's), for each cluster
///   where a controller wrote or waited.
///
/// `kube-multicluster-manager`'s `Manager` registers it already: register it
/// yourself only in a registry of your own, and once (a second collector
/// would repeat every series).
///
/// `host` is the API server's `host:port`, empty where the cluster's client
/// is not kube-multicluster's own (see [`RequestStats`]). A cluster's series go
/// when it leaves the fleet, and start from zero when it is engaged again.
///
/// ```
/// use kube_multicluster::Fleet;
/// use kube_multicluster_layers::metrics::ClientMetrics;
/// use prometheus_client::registry::Registry;
///
/// let mut registry = Registry::default();
/// ClientMetrics::register(&mut registry, Fleet::new());
/// ```
#[derive(Debug)]
pub struct ClientMetrics {
    fleet: Fleet,
}

impl ClientMetrics {
    /// Registers a collector for `fleet`'s clusters in `registry`.
    pub fn register(registry: &mut Registry, fleet: Fleet) {
        registry.register_collector(Box::new(Self { fleet }));
    }
}

impl Collector for ClientMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let mut clusters = self.fleet.clusters();
        clusters.sort_by(|a, b| a.name().cmp(b.name()));
        let stats: Vec<(&str, &RequestStats)> = clusters
            .iter()
            .map(|c| (c.name().as_str(), c.requests()))
            .collect();

        let mut family = encoder.encode_descriptor(
            "rest_client_requests",
            "API requests by cluster, status code, method and host",
            None,
            MetricType::Counter,
        )?;
        for (cluster, stats) in &stats {
            let host = stats.host().unwrap_or_default();
            for count in stats.counts() {
                let code = count
                    .code
                    .map_or_else(|| "<error>".to_owned(), |c| c.as_u16().to_string());
                let labels = [
                    ("cluster", *cluster),
                    ("code", code.as_str()),
                    ("method", count.method.as_str()),
                    ("host", host.as_str()),
                ];
                ConstCounter::new(count.count).encode(family.encode_family(&labels)?)?;
            }
        }

        let read_your_writes: [(&str, &str, ReadWrites); 4] = [
            (
                kube_multicluster::metric_name!("read_your_writes_writes"),
                "Writes of reconciles whose controllers read their own writes, by cluster",
                |w| ConstCounter::new(w.writes as f64),
            ),
            (
                kube_multicluster::metric_name!("read_your_writes_waits"),
                "Times a controller held a cluster's reconciles until its watches showed the controller's writes",
                |w| ConstCounter::new(w.waits as f64),
            ),
            (
                kube_multicluster::metric_name!("read_your_writes_wait_seconds"),
                "How long controllers held a cluster's reconciles for its watches to show their writes",
                |w| ConstCounter::new(w.waited_seconds),
            ),
            (
                kube_multicluster::metric_name!("read_your_writes_timeouts"),
                "Waits for a cluster's watches to show a controller's writes that ran out",
                |w| ConstCounter::new(w.timeouts as f64),
            ),
        ];
        // Only clusters where a controller wrote or waited have them.
        let waits: Vec<(&str, WriteWaits)> = clusters
            .iter()
            .map(|c| (c.name().as_str(), c.read_your_writes()))
            .filter(|(_, waits)| *waits != WriteWaits::default())
            .collect();
        for (name, help, read) in read_your_writes {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            for (cluster, waits) in &waits {
                read(waits).encode(family.encode_family(&[("cluster", *cluster)])?)?;
            }
        }

        let histograms: [(&str, &str, Read); 2] = [
            (
                "rest_client_request_duration_seconds",
                "How long API requests took until their response's head, by cluster, verb and host",
                RequestStats::latencies,
            ),
            (
                "rest_client_rate_limiter_duration_seconds",
                "How long API requests waited for their cluster's request budget, by cluster, verb and host",
                RequestStats::budget_waits,
            ),
        ];
        for (name, help, read) in histograms {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Histogram)?;
            for (cluster, stats) in &stats {
                let host = stats.host().unwrap_or_default();
                for latency in read(stats) {
                    let labels = [
                        ("cluster", *cluster),
                        ("verb", latency.method.as_str()),
                        ("host", host.as_str()),
                    ];
                    encode_histogram(family.encode_family(&labels)?, &latency)?;
                }
            }
        }
        Ok(())
    }
}

/// Reads one figure of a cluster's waits for its watches.
type ReadWrites = fn(&WriteWaits) -> ConstCounter<f64>;

/// Reads one histogram of a cluster's requests, by method.
type Read = fn(&RequestStats) -> Vec<RequestLatency>;

/// `histogram` in client-go's buckets ([`LATENCY_BUCKETS`]).
fn encode_histogram(
    mut encoder: prometheus_client::encoding::MetricEncoder<'_>,
    histogram: &RequestLatency,
) -> Result<(), std::fmt::Error> {
    // The encoder adds the buckets up itself.
    let mut buckets = Vec::with_capacity(LATENCY_BUCKETS.len() + 1);
    let mut below = 0;
    for (bound, cumulative) in LATENCY_BUCKETS.iter().zip(histogram.buckets) {
        buckets.push((*bound, cumulative - below));
        below = cumulative;
    }
    buckets.push((f64::INFINITY, histogram.count - below));
    encoder.encode_histogram::<NoLabelSet>(histogram.sum, histogram.count, &buckets, None)
}
