//! Clients that reach each cluster over one HTTP/2 connection.
//!
//! kube's own [`Client::try_from`] speaks HTTP/1.1, where every watch holds a
//! TLS connection of its own and every request in flight another one. A
//! controller of one type with a few related types then keeps several
//! connections open per cluster, and a burst of reconciles opens one per
//! concurrent request. [`client`] builds a [`Client`] from the same
//! [`Config`] whose watches and requests share one HTTP/2 connection to the
//! cluster instead:
//!
//! - requests made together wait for that one connection rather than each
//!   dialing its own, also after it was replaced;
//! - HTTP/2 `PING`s find a connection that has silently died, so that its
//!   watches restart on a new one ([`ClientOptions::keep_alive`], on the
//!   terms of [`KeepAlive::DEFAULT`]);
//! - a request the server refused unprocessed as it closed the connection
//!   (`GOAWAY`, as API servers behind a load balancer do with
//!   `--goaway-chance`) is sent again;
//! - what HTTP/2 cannot carry goes over HTTP/1.1 connections: upgrades
//!   (exec, attach, port-forward), and any request or watch beyond
//!   [`DEFAULT_MAX_STREAMS`] open at once (an API server takes 100 streams
//!   per connection; a watch holds its stream as long as it runs);
//! - a server that does not agree to HTTP/2 in the TLS handshake (an API
//!   server with `--disable-http2-serving`, or something in between) is
//!   spoken to in HTTP/1.1.
//!
//! ```no_run
//! # async fn example() -> Result<(), kube::Error> {
//! let config = kube::Config::infer().await.map_err(kube::Error::InferConfig)?;
//! let client = kube_multicluster::client::client(config)?;
//! # Ok(())
//! # }
//! ```
//!
//! The client keeps what kube's builder sets up from the [`Config`]: the
//! cluster URL and its path, the TLS settings (root certificates, client
//! certificates, `insecure-skip-tls-verify`, `tls-server-name`), the
//! credentials (tokens, basic auth, exec and auth-provider plugins, refreshed
//! as kube refreshes them), impersonation and extra headers, the connect,
//! read and write timeouts, and kube's retry of `429`/`503`/`504` when
//! [`Config::default_retry`] is set (as it is by default): up to 15 times,
//! each after the server's `Retry-After` where it gives one, else after a
//! growing delay. It leaves out kube's `tracing` spans of
//! each HTTP request, gzip decompression (kube's `gzip` feature), and
//! [`Client::valid_until`] for client certificates issued by an exec plugin.
//!
//! HTTP/2 needs rustls (the default features `rustls-tls` and `ring`, or
//! `aws-lc-rs`). A plain `http://` URL is spoken to in HTTP/1.1, as is
//! every cluster with [`ClientOptions::http1_only`], by the same stack.
//! Where that stack is not available the client is kube's own, over
//! HTTP/1.1: built with only `openssl-tls`, or through a proxy
//! ([`Config::proxy_url`]); kube's own client also logs every failed
//! request as an `ERROR`, where this one leaves a cluster that does not
//! answer to be told once, as it stops and as it starts answering again.

use kube::{Client, Config};

mod asked;
mod budget;
mod cluster_client;
mod error;
mod exec;
mod inner;
mod keep_alive;
mod owners;
mod reachability;
mod reconciling;
mod requests;
#[cfg(feature = "rustls-tls")]
mod route;
mod stack;
mod stats;
mod writes;

pub(crate) use asked::telling;
pub(crate) use budget::Budget;
pub use budget::RequestBudget;
pub use cluster_client::{ClusterClient, InvalidPathPrefix};

pub use error::OwnerReferenceAcross;
pub use error::error_chain;
pub(crate) use error::is_unanswered;
pub(crate) use exec::{ExecToken, PLUGIN_TIMEOUT, resolve as resolve_exec};
pub use keep_alive::KeepAlive;
pub(crate) use keep_alive::LOOK_EVERY;
pub(crate) use reachability::Reachability;
pub(crate) use reconciling::{Reconciling, reconciling};
pub(crate) use stack::{LazyClient, Parts, counting, counting_lazily};
pub use stats::{LATENCY_BUCKETS, RequestCount, RequestLatency, RequestStats};
#[cfg(test)]
pub(crate) use writes::ObjectId;
pub use writes::WriteWaits;
pub(crate) use writes::{Shown, Writer, Writes, Written};

/// How many requests and watches the HTTP/2 connection carries at once
/// before the next one goes over HTTP/1.1 instead.
///
/// A Kubernetes API server takes 100 streams per HTTP/2 connection unless
/// configured otherwise; beyond that a request would wait for a stream, and
/// watches, which hold theirs for as long as they run, could keep it waiting
/// for ever.
pub const DEFAULT_MAX_STREAMS: usize = 90;

/// A client for one cluster from its `config`, with the default
/// [`ClientOptions`]: HTTP/2 where the server offers it.
///
/// # Errors
///
/// What kube's `Client::try_from(config)` fails with: TLS material that cannot
/// be read, or credentials that cannot be turned into a request header.
pub fn client(config: Config) -> Result<Client, kube::Error> {
    ClientOptions::default().client(config)
}

/// [`client`](fn@client), for the fleet to finish: what
/// [`Fleet::engage`](crate::Fleet::engage) and the providers take, at one
/// request queue and one task less per cluster than a [`Client`] (see
/// [`ClusterClient`]). Over this crate's stack it starts no task until the
/// cluster is engaged; where the client is kube's own (built with only
/// `openssl-tls`, or through a proxy) it is a finished [`Client`], which
/// needs a tokio runtime as [`client`](fn@client) does.
///
/// # Errors
///
/// As [`client`](fn@client).
pub fn cluster_client(config: Config) -> Result<ClusterClient, kube::Error> {
    ClientOptions::default().cluster_client(config)
}

/// How [`client`](ClientOptions::client) connects to a cluster.
///
/// ```
/// use std::time::Duration;
/// use kube_multicluster::client::{ClientOptions, KeepAlive};
///
/// let options = ClientOptions::default()
///     .keep_alive(KeepAlive::new(Duration::from_secs(5), Duration::from_secs(3)));
/// ```
#[derive(Debug, Clone)]
pub struct ClientOptions {
    http2: bool,
    max_streams: usize,
    /// Given: also what the fleet asks its clusters on.
    keep_alive: Option<KeepAlive>,
}

impl Default for ClientOptions {
    fn default() -> Self {
        Self {
            http2: true,
            max_streams: DEFAULT_MAX_STREAMS,
            keep_alive: None,
        }
    }
}

impl ClientOptions {
    /// Pings an HTTP/2 connection from which nothing has been read for
    /// `keep_alive`'s interval, and closes it when the answer takes longer
    /// than its timeout (default [`KeepAlive::DEFAULT`]). A closed
    /// connection fails the watches and requests on it, which tells the
    /// cluster's health at once, and they go on over a new one. The client
    /// it builds also carries `keep_alive` for the fleet's own asking of a
    /// silent cluster ([`ClusterClient::with_keep_alive`]).
    pub fn keep_alive(mut self, keep_alive: KeepAlive) -> Self {
        self.keep_alive = Some(keep_alive);
        self
    }

    /// How many requests and watches may share the HTTP/2 connection at once
    /// (default [`DEFAULT_MAX_STREAMS`]); the next go over HTTP/1.1
    /// connections until some of them end. Keep it below the server's
    /// `--http2-max-streams-per-connection`.
    ///
    /// # Panics
    ///
    /// If `max` is zero.
    pub fn max_streams(mut self, max: usize) -> Self {
        assert!(max > 0, "at most zero streams");
        self.max_streams = max;
        self
    }

    /// Speaks HTTP/1.1 only, as kube's own client does: a connection per
    /// watch and per request in flight.
    pub fn http1_only(mut self) -> Self {
        self.http2 = false;
        self
    }

    /// A client for one cluster from its `config`.
    ///
    /// # Errors
    ///
    /// As [`client`](fn@client).
    pub fn client(&self, config: Config) -> Result<Client, kube::Error> {
        Ok(self.client_with(config, None)?.into_client())
    }

    /// [`client`](Self::client), for the fleet to finish (see
    /// [`ClusterClient`]).
    ///
    /// # Errors
    ///
    /// As [`client`](fn@client).
    pub fn cluster_client(&self, config: Config) -> Result<ClusterClient, kube::Error> {
        self.client_with(config, None)
    }

    /// A client for one cluster from its `config`, whose requests carry
    /// `token` (renewed as it expires), if given.
    pub(crate) fn client_with(
        &self,
        config: Config,
        token: Option<ExecToken>,
    ) -> Result<ClusterClient, kube::Error> {
        let client = self.built(config, token)?;
        Ok(match self.keep_alive {
            Some(keep_alive) => client.with_keep_alive(keep_alive),
            None => client,
        })
    }

    fn built(
        &self,
        config: Config,
        token: Option<ExecToken>,
    ) -> Result<ClusterClient, kube::Error> {
        if config.proxy_url.is_some() || cfg!(not(feature = "rustls-tls")) {
            let namespace = config.default_namespace.clone();
            let client = Client::try_from(config)?;
            let Some(token) = token else {
                return Ok(client.into());
            };
            // kube's own client, with the token put on each request above it.
            let send = tower::service_fn(move |request: http::Request<kube::client::Body>| {
                let client = client.clone();
                async move { client.send(request).await.map_err(tower::BoxError::from) }
            });
            let service = tower::filter::AsyncFilter::new(send, token);
            return Ok(ClusterClient::stack(service, namespace));
        }
        self.own(config, token)
    }

    #[cfg(not(feature = "rustls-tls"))]
    fn own(&self, config: Config, _: Option<ExecToken>) -> Result<ClusterClient, kube::Error> {
        Client::try_from(config).map(ClusterClient::from)
    }

    #[cfg(feature = "rustls-tls")]
    fn own(&self, config: Config, token: Option<ExecToken>) -> Result<ClusterClient, kube::Error> {
        use hyper_util::{
            client::legacy::{self, connect::HttpConnector},
            rt::{TokioExecutor, TokioTimer},
        };
        use kube::client::{Body, ConfigExt};
        use tower::{BoxError, ServiceExt};

        // As kube's own builder: with aws-lc-rs chosen, it is the process's
        // provider unless one is installed already (with both backends
        // compiled in, rustls cannot pick one by itself).
        #[cfg(feature = "aws-lc-rs")]
        if rustls::crypto::CryptoProvider::get_default().is_none() {
            let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        }

        let mut tcp = HttpConnector::new();
        tcp.enforce_http(false);
        tcp.set_nodelay(true);
        if config.cluster_url.scheme() != Some(&http::uri::Scheme::HTTPS) {
            // A plain `http://` URL: HTTP/1.1 without TLS.
            let http = legacy::Client::builder(TokioExecutor::new())
                .pool_timer(TokioTimer::new())
                .build::<_, Body>(timeouts(&config, tcp));
            return stack(config, http.map_err(BoxError::from), token);
        }
        let mut tls = config.rustls_client_config()?;
        // A client talks to one server: room for its sessions, not rustls's
        // default of 256 servers' (5 KiB per client, measured).
        tls.resumption = rustls::client::Resumption::in_memory_sessions(4);
        let server_name = match &config.tls_server_name {
            Some(name) => Some(
                rustls_pki_types::ServerName::try_from(name.clone())
                    .map_err(kube::client::RustlsTlsError::InvalidServerName)
                    .map_err(kube::Error::RustlsTls)?,
            ),
            None => None,
        };
        let https = || {
            let https = hyper_rustls::HttpsConnectorBuilder::new()
                .with_tls_config(tls.clone())
                .https_only();
            match &server_name {
                Some(name) => https.with_server_name_resolver(
                    hyper_rustls::FixedServerNameResolver::new(name.clone()),
                ),
                None => https,
            }
        };
        let http1 = https().enable_http1().wrap_connector(tcp.clone());
        let http1 = legacy::Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .build::<_, Body>(timeouts(&config, http1));
        if !self.http2 {
            return stack(config, http1.map_err(BoxError::from), token);
        }
        // Two pools: HTTP/2 only, so that requests made together wait for
        // one connection instead of each dialing its own; and HTTP/1.1 for
        // what HTTP/2 cannot carry.
        // Offering HTTP/1.1 too lets a server without HTTP/2 complete the
        // handshake, which `RequireHttp2` then turns into an error that
        // sends the request over HTTP/1.1.
        let http2 = https().enable_all_versions().wrap_connector(tcp);
        let keep_alive = self.keep_alive.unwrap_or_default();
        let http2 = legacy::Client::builder(TokioExecutor::new())
            .timer(TokioTimer::new())
            .pool_timer(TokioTimer::new())
            .http2_only(true)
            .http2_keep_alive_interval(keep_alive.interval())
            .http2_keep_alive_timeout(keep_alive.timeout())
            .http2_keep_alive_while_idle(true)
            .build::<_, Body>(route::RequireHttp2(timeouts(&config, http2)));
        stack(
            config,
            route::Route::new(http2, http1, self.max_streams),
            token,
        )
    }
}

/// `connector` with the connect, read and write timeouts of `config`.
#[cfg(feature = "rustls-tls")]
fn timeouts<C>(config: &Config, connector: C) -> hyper_timeout::TimeoutConnector<C>
where
    C: tower::Service<http::Uri> + Send,
    C::Response: hyper::rt::Read + hyper::rt::Write + Send + Unpin,
    C::Future: Send + 'static,
    C::Error: Into<tower::BoxError>,
{
    let mut connector = hyper_timeout::TimeoutConnector::new(connector);
    connector.set_connect_timeout(config.connect_timeout);
    connector.set_read_timeout(config.read_timeout);
    connector.set_write_timeout(config.write_timeout);
    connector.set_reset_reader_on_write(config.reset_reader_on_write);
    connector
}

/// The client over `http`, with what kube's builder puts around it from
/// `config` but its `tracing` of each request, which logs every failed
/// request to a cluster that is down as an `ERROR` (the cluster's
/// reachability is told once instead: `reachability`).
#[cfg(feature = "rustls-tls")]
fn stack<S, B>(
    config: Config,
    http: S,
    token: Option<ExecToken>,
) -> Result<ClusterClient, kube::Error>
where
    S: tower::Service<
            http::Request<kube::client::Body>,
            Response = http::Response<B>,
            Error = tower::BoxError,
        > + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
    B: http_body::Body<Data = hyper::body::Bytes> + Send + 'static,
    B::Error: Into<tower::BoxError>,
{
    use kube::client::{ConfigExt, retry::RetryPolicy};
    use tower::{ServiceBuilder, retry::RetryLayer};

    let retry = config
        .default_retry
        .then(|| RetryLayer::new(RetryPolicy::server_retry()));
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(retry)
        // Below the retries, so that each attempt is counted.
        .layer(requests::CountAttemptsLayer)
        .option_layer(config.auth_layer()?)
        .option_layer(token.map(tower::filter::AsyncFilterLayer::new))
        .layer(config.extra_headers_layer()?)
        .service(http);
    Ok(ClusterClient::stack(service, config.default_namespace))
}
