//! How many requests each cluster's client made, and how long they took.

use std::{
    sync::{
        Arc, Mutex, MutexGuard,
        atomic::{AtomicBool, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use futures::future::BoxFuture;
use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use kube::{Client, client::Body};
use tokio::time::Instant;
use tower::{BoxError, Service};

use super::{
    asked,
    budget::Budget,
    cluster_client::{AnyBody, ClusterClient, Repr},
    error::is_unanswered,
    owners::{Destination, checked as owners_checked},
    reachability::{Reachability, Watched},
    writes::{self, Writes},
};
use crate::cluster_name::ClusterName;

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
/// `kube_fleet_layers::metrics::ClientMetrics` reports them as client-go's
/// `rest_client_requests_total` and `rest_client_request_duration_seconds`,
/// labelled with the cluster.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// # let (idle, _) = tower_test::mock::pair::<http::Request<kube::client::Body>, http::Response<kube::client::Body>>();
/// # let client = kube::Client::new(idle, "default");
/// let fleet = kube_fleet::Fleet::new();
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
    fn tallies(&self) -> MutexGuard<'_, Tallies> {
        self.tallies.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn record(
        &self,
        method: &Method,
        code: Option<StatusCode>,
        took: Duration,
        host: Option<&str>,
    ) {
        let mut tallies = self.tallies();
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
    fn waited(&self, method: &Method, took: Duration) {
        observe(&mut self.tallies().waits, method, took);
    }

    /// The requests so far, by method and status.
    pub fn counts(&self) -> Vec<RequestCount> {
        self.tallies().counts.clone()
    }

    /// How long the requests so far took, by method.
    pub fn latencies(&self) -> Vec<RequestLatency> {
        self.tallies().latencies.clone()
    }

    /// How long the requests so far waited for the cluster's
    /// [`RequestBudget`](super::RequestBudget) before they were sent, by
    /// method (client-go's `rest_client_rate_limiter_duration_seconds`);
    /// empty for a cluster whose budget is
    /// [`UNLIMITED`](super::RequestBudget::UNLIMITED).
    pub fn budget_waits(&self) -> Vec<RequestLatency> {
        self.tallies().waits.clone()
    }

    /// The API server's `host:port` as the last counted request addressed
    /// it; `None` where the client is not this crate's own.
    pub fn host(&self) -> Option<String> {
        self.tallies().host.clone()
    }

    /// How many requests so far, whatever their outcome.
    pub fn total(&self) -> u64 {
        self.tallies().counts.iter().map(|c| c.count).sum()
    }

    /// How many requests the server answered with `429 Too Many Requests`.
    pub fn throttled(&self) -> u64 {
        self.tallies()
            .counts
            .iter()
            .filter(|c| c.code == Some(StatusCode::TOO_MANY_REQUESTS))
            .map(|c| c.count)
            .sum()
    }
}

/// Carried in a request's extensions from the cluster's client down to
/// this crate's client stack, which counts each attempt itself.
#[derive(Debug, Clone)]
struct Counted {
    stats: Arc<RequestStats>,
    /// Some attempt was counted inside the stack.
    inside: Arc<AtomicBool>,
    /// The cluster's request budget, which a `429` holds back.
    #[cfg_attr(not(feature = "rustls-tls"), allow(dead_code))]
    budget: Option<Arc<Budget>>,
}

/// One request or attempt on its way: counted once it ends, and counted
/// as answerless (`code` `None`) if it is given up before, as a request cut
/// short by a timeout or a cancelled reconcile is.
struct Pending {
    counted: Counted,
    method: Method,
    host: Option<String>,
    started: Instant,
    /// Counted below the cluster's client, inside kube-fleet's stack.
    inside: bool,
    ended: bool,
}

impl Pending {
    fn new(counted: Counted, method: Method, host: Option<String>, inside: bool) -> Self {
        Self {
            counted,
            method,
            host,
            started: Instant::now(),
            inside,
            ended: false,
        }
    }

    fn done(&mut self, code: Option<StatusCode>) {
        self.ended = true;
        // The cluster's side counts only what the stack below did not.
        if self.inside || !self.counted.inside.load(Ordering::Acquire) {
            let took = self.started.elapsed();
            self.counted
                .stats
                .record(&self.method, code, took, self.host.as_deref());
        }
        if self.inside {
            self.counted.inside.store(true, Ordering::Release);
        }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if !self.ended {
            self.done(None);
        }
    }
}

/// `client`, counting its requests in `stats` and telling `reachability`
/// whether they were answered. Given this crate's stack, the counting goes
/// in front of it, under the one request queue of the client it makes;
/// given a `kube::Client`, in front of that client, under a queue of its
/// own.
pub(crate) fn counting(
    cluster: ClusterName,
    client: ClusterClient,
    stats: Arc<RequestStats>,
    reachability: Arc<Reachability>,
    budget: Option<Arc<Budget>>,
    writes: Arc<Writes>,
) -> Client {
    counting_lazily(cluster, client, stats, reachability, budget, writes).get()
}

/// [`counting`], its client made when first asked for: until then it
/// holds no request queue and no task.
pub(crate) fn counting_lazily(
    cluster: ClusterName,
    client: ClusterClient,
    stats: Arc<RequestStats>,
    reachability: Arc<Reachability>,
    budget: Option<Arc<Budget>>,
    writes: Arc<Writes>,
) -> LazyClient {
    let below = client.into_repr();
    let (namespace, valid_until) = match &below {
        Repr::Client(client) => (client.default_namespace().to_owned(), *client.valid_until()),
        Repr::Stack { namespace, .. } => (namespace.clone(), None),
    };
    let outer = Outer {
        cluster,
        budget,
        below,
        stats,
        reachability,
        writes,
    };
    LazyClient(Arc::new(Lazy {
        made: std::sync::OnceLock::new(),
        parts: std::sync::Mutex::new(Some((outer, namespace, valid_until))),
        runtime: tokio::runtime::Handle::try_current().ok(),
    }))
}

/// A cluster's counted client, made on first use: a `kube::Client` always
/// has a request queue (about 10 KiB) and a task, which a cluster that
/// sends nothing need not hold. Cheap to clone; clones share the client.
#[derive(Clone)]
pub(crate) struct LazyClient(Arc<Lazy>);

struct Lazy {
    made: std::sync::OnceLock<Client>,
    /// What it is made of, until it is made.
    parts: std::sync::Mutex<Option<(Outer, String, Option<k8s_openapi::jiff::Timestamp>)>>,
    /// The runtime it was set up in, where its queue's task runs whoever
    /// first asks for it.
    runtime: Option<tokio::runtime::Handle>,
}

impl LazyClient {
    /// The client, made now if it was not yet, its queue's task in the
    /// runtime the cluster was engaged in (else the caller's, which a
    /// cluster engaged outside any runtime needs the first time).
    pub(crate) fn get(&self) -> Client {
        self.0
            .made
            .get_or_init(|| {
                let mut parts = self.0.parts.lock().unwrap_or_else(|e| e.into_inner());
                let (outer, namespace, valid_until) = parts.clone().expect("kept until made");
                let _entered = self.0.runtime.as_ref().map(tokio::runtime::Handle::enter);
                let client = Client::new(outer, namespace).with_valid_until(valid_until);
                // Kept until here: a first call that panics (no runtime)
                // leaves them for the next.
                *parts = None;
                client
            })
            .clone()
    }
}

impl From<Client> for LazyClient {
    /// A client made already.
    fn from(client: Client) -> Self {
        Self(Arc::new(Lazy {
            made: std::sync::OnceLock::from(client),
            parts: std::sync::Mutex::new(None),
            runtime: None,
        }))
    }
}

impl std::fmt::Debug for LazyClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LazyClient")
            .field("made", &self.0.made.get().is_some())
            .finish()
    }
}

/// The cluster's side: marks each request for counting, and counts it
/// itself when the stack below did not.
#[derive(Clone)]
struct Outer {
    /// The cluster's name: a write it refuses names it.
    cluster: ClusterName,
    /// Its request budget, if it has one.
    budget: Option<Arc<Budget>>,
    /// What it sends its requests through.
    below: Repr,
    stats: Arc<RequestStats>,
    reachability: Arc<Reachability>,
    /// What reconciles wrote, for their controllers to read.
    writes: Arc<Writes>,
}

impl Service<Request<Body>> for Outer {
    type Response = Response<AnyBody>;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<Response<AnyBody>, BoxError>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut request: Request<Body>) -> Self::Future {
        // A request of a client stacked on this one (a namespace's, over its
        // host's) is counted, and checked, by that client alone.
        let outermost = request.extensions().get::<Counted>().is_none();
        let counted = outermost.then(|| {
            let counted = Counted {
                stats: self.stats.clone(),
                inside: Arc::default(),
                budget: self.budget.clone(),
            };
            request.extensions_mut().insert(counted.clone());
            counted
        });
        let budget = self.budget.clone().filter(|_| outermost);
        let below = self.below.clone();
        let reachability = self.reachability.clone();
        let cluster = self.cluster.clone();
        let writes = self.writes.clone();
        // Polled by the task that sends the request (the queue in front
        // hands it this future), where the reconcile it belongs to is known.
        Box::pin(async move {
            let to = Destination {
                cluster: &cluster,
                reachability: &reachability,
            };
            if outermost && let Some(check) = owners_checked(&to, &request) {
                check.await?;
            }
            let writer = outermost.then(super::owners::writer).flatten();
            let write = writer
                .as_ref()
                .and_then(|(writer, _)| writes::pending(&request, writer.name.clone(), &cluster));
            if let (Some(budget), Some(counted)) = (&budget, &counted) {
                let waited = budget.wait(request.method()).await;
                counted.stats.waited(request.method(), waited);
            }
            // On its way from now: a change to its object is taken for its
            // echo until it is answered.
            let write = match write {
                Some(write) => Some(write.sending(&writes).await),
                None => None,
            };
            let method = request.method().clone();
            let watch = asked::is_watch(&request);
            let mut pending =
                counted.map(|counted| Pending::new(counted, method.clone(), None, false));
            let result = below.send(request).await.map_err(BoxError::from);
            if let Some(pending) = &mut pending {
                pending.done(result.as_ref().ok().map(Response::status));
            }
            if let (Some(budget), Ok(response)) = (&budget, &result) {
                budget.answered(&method, response.status(), response.headers());
            }
            match &result {
                Ok(response) => reachability.answered_with(response.status()),
                Err(error) if is_unanswered(&**error) => reachability.unanswered(&**error),
                // Answered, with an error of the server's or the client's own.
                Err(_) => {}
            }
            // A watch under way: its data is heard from the cluster, and its
            // failure is the cluster's; the task that asked knows it runs.
            let result = match result {
                Ok(response) if watch && response.status().is_success() => {
                    asked::watch_started();
                    let reachability = reachability.clone();
                    Ok(response.map(|body| Watched::new(body, reachability).boxed_unsync()))
                }
                result => result,
            };
            match (write, result) {
                (Some(write), Ok(response)) => {
                    let answered = write.answered(response, &writes).await;
                    if let Some((writer, origin)) = &writer
                        && *origin != cluster
                    {
                        // Recorded: its origin's next reconcile waits for
                        // this cluster too.
                        writer.wrote_away(origin, &cluster);
                    }
                    answered
                }
                (_, result) => result,
            }
        })
    }
}

#[cfg(feature = "rustls-tls")]
/// Counts each attempt of a request marked by its cluster's client: placed
/// below the retries of this crate's client stack.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct CountLayer;

#[cfg(feature = "rustls-tls")]
impl<S> tower::Layer<S> for CountLayer {
    type Service = Count<S>;

    fn layer(&self, inner: S) -> Count<S> {
        Count { inner }
    }
}

#[cfg(feature = "rustls-tls")]
#[derive(Debug, Clone)]
pub(crate) struct Count<S> {
    inner: S,
}

#[cfg(feature = "rustls-tls")]
impl<S, B, R> Service<Request<B>> for Count<S>
where
    S: Service<Request<B>, Response = Response<R>>,
    S::Future: Send + 'static,
{
    type Response = Response<R>;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Response<R>, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let mut pending = request
            .extensions()
            .get::<Counted>()
            .cloned()
            .map(|counted| {
                let host = request.uri().authority().map(|a| a.as_str().to_owned());
                Pending::new(counted, request.method().clone(), host, true)
            });
        let response = self.inner.call(request);
        Box::pin(async move {
            let result = response.await;
            if let Some(pending) = &mut pending {
                pending.done(result.as_ref().ok().map(Response::status));
                // Each attempt's 429, before the retries send it again.
                if let (Some(budget), Ok(response)) = (&pending.counted.budget, &result) {
                    budget.answered(&pending.method, response.status(), response.headers());
                }
            }
            result
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_request_given_up_before_its_answer_is_counted_without_a_code() {
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let stats = Arc::<RequestStats>::default();
        let reachability = Arc::new(Reachability::new(
            "test".into(),
            Client::new(service.clone(), "default").into(),
        ));
        let client = counting(
            "test".into(),
            Client::new(service, "default").into(),
            stats.clone(),
            reachability,
            None,
            Arc::default(),
        );
        let asked = tokio::spawn(async move {
            client
                .send(
                    Request::get("/api/v1/namespaces")
                        .body(Body::empty())
                        .unwrap(),
                )
                .await
        });
        let (request, _answer) = handle.next_request().await.expect("a request");
        assert!(request.extensions().get::<Counted>().is_some());
        asked.abort();
        assert!(asked.await.unwrap_err().is_cancelled());
        let counts = stats.counts();
        assert_eq!(counts.len(), 1, "{counts:?}");
        assert_eq!((counts[0].code, counts[0].count), (None, 1));
        assert_eq!(stats.latencies()[0].count, 1);
    }

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
