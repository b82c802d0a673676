//! How many requests each cluster's client made, and how long they took:
//! the figures, kept per engagement.

use std::{sync::Mutex, time::Duration};

use http::{Method, StatusCode};

use crate::panic::lock;

/// The upper bounds, in seconds, of the latency histogram's buckets:
/// client-go's for `rest_client_request_duration_seconds`.
pub const LATENCY_BUCKETS: [f64; 12] = [
    0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0,
];

/// How many requests with one method ended one way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestCount {
    /// The HTTP method (`GET` for gets, lists and watches alike).
    pub method: Method,
    /// The response's status, or `None` where no response came: the
    /// connection failed, or the request was given up before its answer (a
    /// timeout, a reconcile cancelled).
    pub code: Option<StatusCode>,
    /// How many.
    pub count: u64,
}

/// How long requests with one method took until their response's head
/// arrived (for a watch: until it started, not how long it ran).
#[derive(Debug, Clone, PartialEq)]
pub struct RequestLatency {
    /// The HTTP method.
    pub method: Method,
    /// How many requests took at most each of [`LATENCY_BUCKETS`]'s bounds
    /// (cumulative, as Prometheus histograms count).
    pub buckets: [u64; LATENCY_BUCKETS.len()],
    /// How many requests in all.
    pub count: u64,
    /// Their durations added up, in seconds.
    pub sum: f64,
}

/// The API requests made through one engaged cluster's client: by method
/// and status code, and how long they took.
///
/// Every engaged [`Cluster`](crate::Cluster) counts the requests made
/// through its client, its cache's watches included (but not the host's
/// watches that a namespace view's cache reads), in its own
/// [`RequestStats`] ([`Cluster::requests`](crate::Cluster::requests)). The
/// counts go when the engagement goes, so nothing accumulates for clusters
/// that left. Requests are counted per attempt where the client is this
/// crate's own ([`client`](super::client)): a request the server throttled
/// with `429 Too Many Requests` and that was sent again after its
/// `Retry-After` counts once as a `429` and once as what came after.
/// Through any other client (kube's own over plain HTTP or a proxy, or one
/// built by hand) each request counts once, with its final status, and
/// without the server's host.
///
/// `kube_multicluster_layers::metrics::ClientMetrics` reports them as client-go's
/// `rest_client_requests_total` and `rest_client_request_duration_seconds`,
/// labelled with the cluster.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// # let (idle, _) = tower_test::mock::pair::<http::Request<kube::client::Body>, http::Response<kube::client::Body>>();
/// # let client = kube::Client::new(idle, "default");
/// let fleet = kube_multicluster::Fleet::new();
/// let east = fleet.engage("east", client);
/// assert_eq!(east.requests().total(), 0);
/// assert_eq!(east.requests().throttled(), 0);
/// # }
/// ```
#[derive(Debug, Default)]
pub struct RequestStats {
    tallies: Mutex<Tallies>,
}

#[derive(Debug, Default)]
struct Tallies {
    host: Option<String>,
    counts: Vec<RequestCount>,
    latencies: Vec<RequestLatency>,
    waits: Vec<RequestLatency>,
}

/// Adds `took` to the histogram of `method` in `histograms`.
fn observe(histograms: &mut Vec<RequestLatency>, method: &Method, took: Duration) {
    let seconds = took.as_secs_f64();
    let histogram = match histograms.iter().position(|l| l.method == method) {
        Some(at) => &mut histograms[at],
        None => {
            histograms.push(RequestLatency {
                method: method.clone(),
                buckets: [0; LATENCY_BUCKETS.len()],
                count: 0,
                sum: 0.0,
            });
            histograms.last_mut().expect("just pushed")
        }
    };
    for (bucket, bound) in histogram.buckets.iter_mut().zip(LATENCY_BUCKETS) {
        if seconds <= bound {
            *bucket += 1;
        }
    }
    histogram.count += 1;
    histogram.sum += seconds;
}

impl RequestStats {
    pub(super) fn record(
        &self,
        method: &Method,
        code: Option<StatusCode>,
        took: Duration,
        host: Option<&str>,
    ) {
        let mut tallies = lock(&self.tallies);
        if let Some(host) = host
            && tallies.host.as_deref() != Some(host)
        {
            tallies.host = Some(host.to_owned());
        }
        match tallies
            .counts
            .iter_mut()
            .find(|c| c.method == method && c.code == code)
        {
            Some(count) => count.count += 1,
            None => tallies.counts.push(RequestCount {
                method: method.clone(),
                code,
                count: 1,
            }),
        }
        observe(&mut tallies.latencies, method, took);
    }

    /// A request with `method` waited `took` for the cluster's budget.
    pub(super) fn waited(&self, method: &Method, took: Duration) {
        observe(&mut lock(&self.tallies).waits, method, took);
    }

    /// The requests so far, by method and status.
    pub fn counts(&self) -> Vec<RequestCount> {
        lock(&self.tallies).counts.clone()
    }

    /// How long the requests so far took, by method.
    pub fn latencies(&self) -> Vec<RequestLatency> {
        lock(&self.tallies).latencies.clone()
    }

    /// How long the requests so far waited for the cluster's
    /// [`RequestBudget`](super::RequestBudget) before they were sent, by
    /// method (client-go's `rest_client_rate_limiter_duration_seconds`);
    /// empty for a cluster whose budget is
    /// [`UNLIMITED`](super::RequestBudget::UNLIMITED).
    pub fn budget_waits(&self) -> Vec<RequestLatency> {
        lock(&self.tallies).waits.clone()
    }

    /// The API server's `host:port` as the last counted request addressed
    /// it; `None` where the client is not this crate's own.
    pub fn host(&self) -> Option<String> {
        lock(&self.tallies).host.clone()
    }

    /// How many requests so far, whatever their outcome.
    pub fn total(&self) -> u64 {
        lock(&self.tallies).counts.iter().map(|c| c.count).sum()
    }

    /// How many requests the server answered with `429 Too Many Requests`.
    pub fn throttled(&self) -> u64 {
        lock(&self.tallies)
            .counts
            .iter()
            .filter(|c| c.code == Some(StatusCode::TOO_MANY_REQUESTS))
            .map(|c| c.count)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_by_method_and_status_with_cumulative_buckets() {
        let stats = RequestStats::default();
        let get = Method::GET;
        stats.record(&get, Some(StatusCode::OK), Duration::from_millis(3), None);
        stats.record(
            &get,
            Some(StatusCode::OK),
            Duration::from_millis(200),
            Some("h:1"),
        );
        stats.record(
            &get,
            Some(StatusCode::TOO_MANY_REQUESTS),
            Duration::from_millis(1),
            None,
        );
        stats.record(&Method::PATCH, None, Duration::from_secs(90), None);

        assert_eq!(stats.total(), 4);
        assert_eq!(stats.throttled(), 1);
        assert_eq!(stats.host().as_deref(), Some("h:1"));
        let counts = stats.counts();
        let ok = counts
            .iter()
            .find(|c| c.method == get && c.code == Some(StatusCode::OK))
            .unwrap();
        assert_eq!(ok.count, 2);
        assert!(
            counts
                .iter()
                .any(|c| c.method == Method::PATCH && c.code.is_none())
        );

        let latencies = stats.latencies();
        let gets = latencies.iter().find(|l| l.method == get).unwrap();
        assert_eq!(gets.count, 3);
        // 1 ms and 3 ms are within 5 ms; 200 ms first within 250 ms.
        assert_eq!(gets.buckets[0], 2);
        assert_eq!(gets.buckets[2], 2);
        assert_eq!(gets.buckets[3], 3);
        assert_eq!(gets.buckets[11], 3);
        let patches = latencies
            .iter()
            .find(|l| l.method == Method::PATCH)
            .unwrap();
        // Longer than the last bound: in no bucket, only in the count.
        assert_eq!(patches.buckets[11], 0);
        assert_eq!(patches.count, 1);
    }
}
