//! The webhook server's metrics, under controller-runtime's names with a
//! `cluster` label, and the requests refused before any handler saw them.

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex},
    time::Duration,
};

use kube_multicluster::{Cluster, ClusterName};
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

use crate::handler::Outcome;

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RequestLabels {
    webhook: String,
    cluster: String,
    code: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ClusterLabels {
    webhook: String,
    cluster: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct OutcomeLabels {
    webhook: String,
    cluster: String,
    outcome: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct WebhookLabels {
    webhook: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RefusedLabels {
    webhook: String,
    reason: &'static str,
}

/// Why a request was refused before its handler saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// No token, or one that is not the named cluster's.
    Token,
    /// A good token for a cluster that is not engaged here (any more).
    NotEngaged,
    /// A path that names no webhook of this server.
    Unknown,
    /// Not a POST, or a body too large or cut off.
    BadRequest,
}

impl Refusal {
    fn as_str(self) -> &'static str {
        match self {
            Self::Token => "token",
            Self::NotEngaged => "not_engaged",
            Self::Unknown => "unknown_webhook",
            Self::BadRequest => "bad_request",
        }
    }
}

type Latencies = Family<ClusterLabels, Histogram, fn() -> Histogram>;

#[derive(Debug)]
struct Inner {
    requests: Family<RequestLabels, Counter>,
    latency: Latencies,
    in_flight: Family<WebhookLabels, Gauge>,
    outcomes: Family<OutcomeLabels, Counter>,
    refused: Family<RefusedLabels, Counter>,
    /// Each cluster's series, to remove when it leaves.
    series: Mutex<HashMap<ClusterName, HashSet<Series>>>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Series {
    Request(RequestLabels),
    Latency(ClusterLabels),
    Outcome(OutcomeLabels),
}

/// The webhook server's metrics; cheap to clone.
#[derive(Clone, Debug)]
pub(crate) struct Metrics {
    inner: Arc<Inner>,
}

fn latencies() -> Histogram {
    // controller-runtime's buckets (Prometheus' defaults).
    Histogram::new([
        0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    ])
}

impl Metrics {
    /// Metrics kept but exported nowhere.
    pub(crate) fn unregistered() -> Self {
        Self {
            inner: Arc::new(Inner {
                requests: Family::default(),
                latency: Family::new_with_constructor(latencies),
                in_flight: Family::default(),
                outcomes: Family::default(),
                refused: Family::default(),
                series: Mutex::default(),
            }),
        }
    }

    /// Metrics registered in `registry`.
    pub(crate) fn register(registry: &mut Registry) -> Self {
        let metrics = Self::unregistered();
        let inner = &metrics.inner;
        registry.register(
            "controller_runtime_webhook_requests",
            "Admission and conversion requests answered, by webhook, cluster and HTTP code",
            inner.requests.clone(),
        );
        registry.register(
            "controller_runtime_webhook_latency_seconds",
            "How long requests took to answer, by webhook and cluster",
            inner.latency.clone(),
        );
        registry.register(
            "controller_runtime_webhook_requests_in_flight",
            "Requests being answered now, by webhook",
            inner.in_flight.clone(),
        );
        registry.register(
            kube_multicluster::metric_name!("webhook_answers"),
            "How requests were answered, by webhook, cluster and outcome (allowed, mutated, denied, converted, error, panic, timeout, malformed)",
            inner.outcomes.clone(),
        );
        registry.register(
            kube_multicluster::metric_name!("webhook_refused"),
            "Requests refused before a handler saw them, by webhook and reason (token, not_engaged, unknown_webhook, bad_request)",
            inner.refused.clone(),
        );
        metrics
    }

    /// Counts a request in flight until the guard drops.
    pub(crate) fn in_flight(&self, webhook: &str) -> InFlight {
        let gauge = self
            .inner
            .in_flight
            .get_or_create(&WebhookLabels {
                webhook: webhook.to_owned(),
            })
            .clone();
        gauge.inc();
        InFlight(gauge)
    }

    /// Records one answered request, unless its cluster has left since
    /// (its series are removed, or about to be).
    pub(crate) fn answered(
        &self,
        webhook: &str,
        asking: &Cluster,
        code: u16,
        outcome: Outcome,
        took: Duration,
    ) {
        let cluster = asking.name();
        // Under the lock `forget` takes, so that a cluster's series are
        // not made again after they are removed.
        let mut series = self.inner.series.lock().unwrap_or_else(|e| e.into_inner());
        if !asking.is_engaged() {
            return;
        }
        let request = RequestLabels {
            webhook: webhook.to_owned(),
            cluster: cluster.as_str().to_owned(),
            code: code.to_string(),
        };
        let latency = ClusterLabels {
            webhook: webhook.to_owned(),
            cluster: cluster.as_str().to_owned(),
        };
        let answer = OutcomeLabels {
            webhook: webhook.to_owned(),
            cluster: cluster.as_str().to_owned(),
            outcome: outcome.as_str(),
        };
        self.inner.requests.get_or_create(&request).inc();
        self.inner
            .latency
            .get_or_create(&latency)
            .observe(took.as_secs_f64());
        self.inner.outcomes.get_or_create(&answer).inc();
        let mine = series.entry(cluster.clone()).or_default();
        mine.insert(Series::Request(request));
        mine.insert(Series::Latency(latency));
        mine.insert(Series::Outcome(answer));
    }

    /// Records one request refused before a handler saw it. The webhook
    /// label is one of the server's, or empty: a caller cannot add series.
    pub(crate) fn refused(&self, webhook: Option<&str>, why: Refusal) {
        self.inner
            .refused
            .get_or_create(&RefusedLabels {
                webhook: webhook.unwrap_or_default().to_owned(),
                reason: why.as_str(),
            })
            .inc();
    }

    /// Removes the series of a cluster that left.
    pub(crate) fn forget(&self, cluster: &ClusterName) {
        let series = self
            .inner
            .series
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(cluster);
        for series in series.into_iter().flatten() {
            match series {
                Series::Request(labels) => {
                    self.inner.requests.remove(&labels);
                }
                Series::Latency(labels) => {
                    self.inner.latency.remove(&labels);
                }
                Series::Outcome(labels) => {
                    self.inner.outcomes.remove(&labels);
                }
            }
        }
    }
}

/// A request in flight; counted down when dropped.
#[derive(Debug)]
pub(crate) struct InFlight(Gauge);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.dec();
    }
}
