//! What a cluster is engaged with: a `kube::Client`, or this crate's client
//! stack that the fleet finishes itself.

use std::fmt;

use futures::future::BoxFuture;

use http::{Request, Response};
use http_body_util::BodyExt;
use hyper::body::Bytes;
use kube::{Client, client::Body};
use tower::{BoxError, ServiceExt, util::BoxCloneSyncService};

pub(crate) use super::inner::AnyBody;
use super::{budget::RequestBudget, keep_alive::KeepAlive};

/// This crate's client stack for one cluster: everything of a
/// [`Client`] but the request queue in front of it.
pub(crate) type Stack = BoxCloneSyncService<Request<Body>, Response<AnyBody>, BoxError>;

/// What a cluster is engaged with ([`Fleet::engage`](crate::Fleet::engage),
/// [`ClusterEvent::Engage`](crate::provider::ClusterEvent::Engage), the providers): a
/// [`kube::Client`], or a client built by [`cluster_client`](super::cluster_client)
/// that the fleet finishes itself.
///
/// Each engaged cluster counts its requests and tells whether its server
/// answers ([`Cluster::requests`](crate::Cluster::requests)), which takes a
/// client of its own in front of the one it was given. A `kube::Client`
/// always has a request queue and a task of its own in front of its
/// service, so a cluster engaged with one has two of each. One engaged
/// with a `ClusterClient` from [`cluster_client`](super::cluster_client) has
/// one: the fleet puts its counting into this crate's client stack instead
/// (about 10 KiB and one task less per cluster, measured in
/// `docs/benchmarks.md`). Both behave the same otherwise. Where
/// [`cluster_client`](super::cluster_client) gives kube's own client (built
/// with only `openssl-tls`, or through a proxy: see [`client`](super)), it
/// gives it finished, and a cluster engaged with it has two queues.
///
/// Every `kube::Client` converts into one, so anything that takes
/// `impl Into<ClusterClient>` takes a `kube::Client` as before.
///
/// ```
/// # async fn example() -> Result<(), kube::Error> {
/// use kube_multicluster::{Fleet, client};
///
/// let config = kube::Config::infer().await.map_err(kube::Error::InferConfig)?;
/// let fleet = Fleet::new();
/// // The fleet finishes it: one request queue for the cluster.
/// fleet.engage("east", client::cluster_client(config.clone())?);
/// // Any kube::Client is taken too.
/// fleet.engage("west", kube::Client::try_from(config)?);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct ClusterClient {
    repr: Repr,
    /// Its own budget, if it was given one.
    budget: Option<RequestBudget>,
    /// Its own terms for finding it silent, if it was given some.
    keep_alive: Option<KeepAlive>,
}

#[derive(Clone)]
pub(crate) enum Repr {
    /// A finished client, queue and all.
    Client(Client),
    /// This crate's stack, without its queue.
    Stack { service: Stack, namespace: String },
}

impl ClusterClient {
    /// This crate's `stack`, whose requests default to `namespace`.
    pub(crate) fn stack<S, B>(service: S, namespace: String) -> Self
    where
        S: tower::Service<Request<Body>, Response = Response<B>, Error = BoxError>
            + Clone
            + Send
            + Sync
            + 'static,
        S::Future: Send + 'static,
        B: http_body::Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        let service = service.map_response(|response: Response<B>| {
            response.map(|body| body.map_err(Into::into).boxed_unsync())
        });
        Self::over(BoxCloneSyncService::new(service), namespace, None)
    }

    /// This crate's stack `service`, whose default namespace is `namespace`.
    fn over(service: Stack, namespace: String, keep_alive: Option<KeepAlive>) -> Self {
        Self {
            repr: Repr::Stack { service, namespace },
            budget: None,
            keep_alive,
        }
    }

    pub(crate) fn into_repr(self) -> Repr {
        self.repr
    }

    /// The cluster engaged with it sends its requests within `budget`,
    /// whatever its fleet's or provider's budget is.
    ///
    /// ```
    /// # async fn example(config: kube::Config) -> Result<(), kube::Error> {
    /// use kube_multicluster::client::{RequestBudget, cluster_client};
    ///
    /// let client = cluster_client(config)?.with_budget(RequestBudget::DEFAULT.writes(50.0, 100));
    /// assert_eq!(client.budget().and_then(|b| b.write_rate()), Some((50.0, 100)));
    /// # Ok(())
    /// # }
    /// ```
    pub fn with_budget(mut self, budget: RequestBudget) -> Self {
        self.budget = Some(budget);
        self
    }

    /// The cluster engaged with it is asked whether it is there after
    /// `keep_alive`'s interval of silence, and called unreachable without
    /// an answer within its timeout, whatever its fleet's
    /// [`keep_alive`](crate::FleetConfig::keep_alive) is. (Its connection's
    /// HTTP/2 `PING`s are set where it is built:
    /// [`ClientOptions::keep_alive`](super::ClientOptions::keep_alive),
    /// which sets this too.)
    ///
    /// ```
    /// # async fn example(config: kube::Config) -> Result<(), kube::Error> {
    /// use std::time::Duration;
    /// use kube_multicluster::client::{KeepAlive, cluster_client};
    ///
    /// let far = KeepAlive::new(Duration::from_secs(30), Duration::from_secs(15));
    /// let client = cluster_client(config)?.with_keep_alive(far);
    /// assert_eq!(client.keep_alive(), Some(far));
    /// # Ok(())
    /// # }
    /// ```
    pub fn with_keep_alive(mut self, keep_alive: KeepAlive) -> Self {
        self.keep_alive = Some(keep_alive);
        self
    }

    /// Its own terms for finding it silent, if it was given some.
    pub fn keep_alive(&self) -> Option<KeepAlive> {
        self.keep_alive
    }

    /// A client of the same server and connection whose requests' paths
    /// are put under `prefix`: a path of its own for each of many clusters
    /// one server serves (kcp's `/clusters/<logical cluster>`), or a
    /// proxy's route. `prefix` is a path (`/clusters/root`): it starts with
    /// `/`, and has no query, fragment or trailing `/`. Clients of one
    /// stack made this way share its connection, and add no request queue
    /// or task of their own. The client has no [budget](Self::with_budget)
    /// of its own, whatever this one had: each cluster engaged with one
    /// gets its fleet's, unless given one.
    ///
    /// ```
    /// # async fn example(config: kube::Config) -> Result<(), Box<dyn std::error::Error>> {
    /// use kube_multicluster::client::cluster_client;
    ///
    /// let server = cluster_client(config)?;
    /// let tenant = server.clone().under_path("/clusters/2x5qrt7c")?;
    /// assert!(server.under_path("clusters").is_err());
    /// # let _ = tenant;
    /// # Ok(())
    /// # }
    /// ```
    pub fn under_path(self, prefix: &str) -> Result<Self, InvalidPathPrefix> {
        let valid = prefix.starts_with('/')
            && !prefix.ends_with('/')
            && prefix
                .parse::<http::uri::PathAndQuery>()
                .is_ok_and(|p| p.query().is_none())
            && !prefix.contains('#');
        if !valid {
            return Err(InvalidPathPrefix(prefix.to_owned()));
        }
        let prefix: std::sync::Arc<str> = prefix.into();
        let namespace = self.default_namespace().to_owned();
        let keep_alive = self.keep_alive;
        let below = self.into_stack();
        let service = tower::service_fn(move |mut request: Request<Body>| {
            let below = below.clone();
            let path = request
                .uri()
                .path_and_query()
                .map_or("/", |path| path.as_str());
            let under = format!("{prefix}{path}")
                .parse::<http::uri::PathAndQuery>()
                .map_err(BoxError::from)
                .and_then(|path| {
                    let mut parts = request.uri().clone().into_parts();
                    parts.path_and_query = Some(path);
                    http::Uri::from_parts(parts).map_err(BoxError::from)
                });
            async move {
                // Never sent where it was not meant to go.
                *request.uri_mut() = under?;
                below.oneshot(request).await
            }
        });
        Ok(Self::over(
            BoxCloneSyncService::new(service),
            namespace,
            keep_alive,
        ))
    }

    /// The same client, its requests defaulting to `namespace`
    /// (`Api::default_namespaced`). It shares the connection, and adds no
    /// request queue or task of its own. Like
    /// [`under_path`](Self::under_path), it has no budget of its own: each
    /// cluster engaged with one gets its fleet's.
    pub fn with_default_namespace(self, namespace: impl Into<String>) -> Self {
        let keep_alive = self.keep_alive;
        Self::over(self.into_stack(), namespace.into(), keep_alive)
    }

    /// Its stack: this crate's, or one that sends through the finished
    /// client.
    fn into_stack(self) -> Stack {
        match self.repr {
            Repr::Stack { service, .. } => service,
            Repr::Client(client) => {
                BoxCloneSyncService::new(tower::service_fn(move |request: Request<Body>| {
                    let client = client.clone();
                    async move {
                        let response = client.send(request).await.map_err(BoxError::from)?;
                        Ok::<_, BoxError>(
                            response.map(|body| body.map_err(BoxError::from).boxed_unsync()),
                        )
                    }
                }))
            }
        }
    }

    /// Its own budget, if it was given one.
    pub fn budget(&self) -> Option<RequestBudget> {
        self.budget
    }

    pub(crate) fn repr(&self) -> &Repr {
        &self.repr
    }

    /// The namespace its requests default to.
    pub fn default_namespace(&self) -> &str {
        match &self.repr {
            Repr::Client(client) => client.default_namespace(),
            Repr::Stack { namespace, .. } => namespace,
        }
    }

    /// A [`kube::Client`] of its own: the one it was made from, or one
    /// finished from this crate's stack (sharing its connections). Call it
    /// inside a tokio runtime.
    pub fn into_client(self) -> Client {
        match self.repr {
            Repr::Client(client) => client,
            Repr::Stack { service, namespace } => Client::new(service, namespace),
        }
    }
}

impl Repr {
    /// Sends `request`, and tells its errors as a [`Client`] does, whether
    /// through a finished client or this crate's stack.
    pub(crate) fn send(
        &self,
        request: Request<Body>,
    ) -> BoxFuture<'static, Result<Response<AnyBody>, kube::Error>> {
        match self {
            Self::Client(client) => {
                let client = client.clone();
                Box::pin(async move {
                    let response = client.send(request).await?;
                    Ok(response.map(|body| body.map_err(BoxError::from).boxed_unsync()))
                })
            }
            Self::Stack { service, .. } => {
                let sent = service.clone().oneshot(request);
                Box::pin(async move { sent.await.map_err(as_kube_error) })
            }
        }
    }
}

/// `error` of the stack as a [`Client`] reports it: the error a layer
/// raised, hyper's own, or the service's.
fn as_kube_error(error: BoxError) -> kube::Error {
    error
        .downcast::<kube::Error>()
        .map(|error| *error)
        .or_else(|error| {
            error
                .downcast::<hyper::Error>()
                .map(|error| kube::Error::HyperError(*error))
        })
        .unwrap_or_else(kube::Error::Service)
}

/// A path prefix that [`ClusterClient::under_path`] cannot put requests
/// under: not a path starting with `/`, or with a query, fragment or
/// trailing `/`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{0:?} is not a path prefix: give a path such as /clusters/root (a leading /, no query, fragment or trailing /)"
)]
pub struct InvalidPathPrefix(pub String);

impl From<Client> for ClusterClient {
    fn from(client: Client) -> Self {
        Self {
            repr: Repr::Client(client),
            budget: None,
            keep_alive: None,
        }
    }
}

impl fmt::Debug for ClusterClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match &self.repr {
            Repr::Client(_) => "kube::Client",
            Repr::Stack { .. } => "stack",
        };
        f.debug_struct("ClusterClient")
            .field("kind", &kind)
            .field("default_namespace", &self.default_namespace())
            .field("budget", &self.budget)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use http::StatusCode;
    use tower_test::mock::{self, Handle};

    use super::*;
    use crate::Cluster;

    type Requests = Handle<Request<Body>, Response<Body>>;

    fn engaged() -> (Cluster, Requests) {
        engaged_within(RequestBudget::DEFAULT)
    }

    fn engaged_within(budget: RequestBudget) -> (Cluster, Requests) {
        let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
        let client = ClusterClient::stack(service, "default".into()).with_budget(budget);
        (Cluster::new("east", client), handle)
    }

    fn get(path: &str) -> Request<Body> {
        Request::get(path).body(Body::empty()).unwrap()
    }

    fn answer(status: StatusCode) -> Response<Body> {
        Response::builder()
            .status(status)
            .body(Body::empty())
            .unwrap()
    }

    #[tokio::test]
    async fn a_cluster_on_the_stack_counts_its_requests_and_lets_go_of_the_stack() {
        let (cluster, mut requests) = engaged();
        let client = cluster.client();
        assert_eq!(client.default_namespace(), "default");
        let asked = tokio::spawn(async move {
            client
                .send(get("/api/v1/namespaces"))
                .await
                .map(|r| r.status())
        });
        let (request, reply) = requests.next_request().await.expect("a request");
        assert_eq!(request.uri().path(), "/api/v1/namespaces");
        reply.send_response(answer(StatusCode::OK));
        assert_eq!(asked.await.unwrap().unwrap(), StatusCode::OK);
        assert_eq!(cluster.requests().total(), 1);

        // Nothing else holds the stack: with the cluster gone, so is every
        // clone of it, and its connections with them.
        drop(cluster);
        let end = tokio::time::timeout(Duration::from_secs(10), requests.next_request()).await;
        assert!(matches!(end, Ok(None)), "the stack outlived its cluster");
    }

    #[tokio::test]
    async fn a_cluster_on_the_stack_that_stops_answering_is_probed_through_it() {
        let (cluster, mut requests) = engaged();
        let client = cluster.client();
        let asked = tokio::spawn(async move { client.send(get("/api/v1/pods")).await });
        let (_, reply) = requests.next_request().await.expect("a request");
        reply.send_error(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "connection refused",
        ));
        let error = asked.await.unwrap().expect_err("no answer");
        assert!(
            crate::client::is_unanswered(&error),
            "{}",
            crate::client::error_chain(&error)
        );
        assert!(!cluster.reachability().is_answering());
        // The probe asks through the stack, and its answer brings the
        // cluster back.
        let (probe, reply) = requests.next_request().await.expect("a probe");
        assert_eq!(probe.uri().path(), "/readyz");
        let mut recoveries = cluster.reachability().recoveries();
        reply.send_response(answer(StatusCode::OK));
        tokio::time::timeout(Duration::from_secs(10), recoveries.changed())
            .await
            .expect("told it answers again")
            .unwrap();
        assert!(cluster.reachability().is_answering());
    }

    #[tokio::test]
    async fn one_stack_engaged_twice_serves_each_engagement_until_it_alone_ends() {
        let (service, mut requests) = mock::pair::<Request<Body>, Response<Body>>();
        let stack = ClusterClient::stack(service, "default".into());
        let (east, west) = (
            Cluster::new("east", stack.clone()),
            Cluster::new("west", stack),
        );
        east.leave();
        drop(east);
        let client = west.client();
        let asked =
            tokio::spawn(async move { client.send(get("/version")).await.map(|r| r.status()) });
        let (_, reply) = requests.next_request().await.expect("a request");
        reply.send_response(answer(StatusCode::OK));
        assert_eq!(asked.await.unwrap().unwrap(), StatusCode::OK);
        assert_eq!(west.requests().total(), 1);
    }

    #[tokio::test]
    async fn through_a_proxy_the_client_is_kubes_own_and_finished() {
        let mut config = kube::Config::new("https://east.example.com:6443".parse().unwrap());
        config.proxy_url = Some("http://proxy.example.com:3128".parse().unwrap());
        // kube's own client, or, without kube's proxy feature, its error.
        match crate::client::cluster_client(config) {
            Ok(client) => assert!(matches!(client.repr(), Repr::Client(_)), "{client:?}"),
            Err(error) => assert!(
                matches!(error, kube::Error::ProxyProtocolDisabled { .. }),
                "{error}"
            ),
        }
        let config = kube::Config::new("https://east.example.com:6443".parse().unwrap());
        let client = crate::client::cluster_client(config).unwrap();
        assert!(matches!(client.repr(), Repr::Stack { .. }), "{client:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_429_with_retry_after_holds_back_its_cluster_and_no_other() {
        let reads = RequestBudget::DEFAULT.reads(1_000.0, 1_000);
        let (east, mut east_requests) = engaged_within(reads);
        let (west, mut west_requests) = engaged_within(reads);
        let send = |cluster: &Cluster, path: &'static str| {
            let client = cluster.client();
            tokio::spawn(async move { client.send(get(path)).await.map(|r| r.status()) })
        };
        let asked = send(&east, "/first");
        let (_, reply) = east_requests.next_request().await.expect("a request");
        let throttled = Response::builder()
            .status(StatusCode::TOO_MANY_REQUESTS)
            .header(http::header::RETRY_AFTER, "3")
            .body(Body::empty())
            .unwrap();
        reply.send_response(throttled);
        assert_eq!(asked.await.unwrap().unwrap(), StatusCode::TOO_MANY_REQUESTS);

        let started = tokio::time::Instant::now();
        let (east_asked, west_asked) = (send(&east, "/second"), send(&west, "/other"));
        let (_, reply) = west_requests.next_request().await.expect("west's request");
        assert_eq!(started.elapsed(), Duration::ZERO, "west is not held back");
        reply.send_response(answer(StatusCode::OK));
        let (_, reply) = east_requests.next_request().await.expect("east's request");
        assert!(
            started.elapsed() >= Duration::from_secs(3),
            "{:?}",
            started.elapsed()
        );
        reply.send_response(answer(StatusCode::OK));
        assert_eq!(east_asked.await.unwrap().unwrap(), StatusCode::OK);
        assert_eq!(west_asked.await.unwrap().unwrap(), StatusCode::OK);
        let waits = east.requests().budget_waits();
        assert!(waits.iter().any(|w| w.sum >= 3.0), "{waits:?}");
    }
}
