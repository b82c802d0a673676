//! Each cluster's client as a stack of tower layers, in one place.
//!
//! From the outside in, a request
//!
//! 1. is refused if it would write an owner reference to an object being
//!    reconciled in another cluster ([`owners`](super::owners)): nothing
//!    below it is asked, and nothing counted;
//! 2. waits for the cluster's request budget, and tells the budget how the
//!    server answered ([`budget`](super::budget));
//! 3. is recorded, if it is a write of a reconcile that reads its own
//!    writes, so that the change it makes is known as its echo
//!    ([`writes`](super::writes)); after the budget, so that a write that
//!    waits is not taken for sent;
//! 4. tells the cluster's reachability whether it was answered, and a watch
//!    keeps telling it as its data comes ([`reachability`](super::reachability));
//! 5. is counted and timed ([`requests`](super::requests)), from when it is
//!    sent, not from when it waited: innermost, so that its count is in
//!    before anything hears of its answer.
//!
//! A request that comes through a client stacked over this one (a
//! namespace's over its host's) has been through all of that in the outer
//! client: here it only tells the reachability ([`Outermost`]).
//!
//! Every service of the stack is always ready: each calls the one below
//! from the future it returns, which the task that made the request polls
//! (kube's `Client` queues requests in front, and hands each caller its
//! future), so that what it reads of the reconcile under way (a task-local)
//! is that caller's.

use std::{
    sync::Arc,
    task::{Context, Poll},
};

use futures::{FutureExt, future::BoxFuture};
use http::{Request, Response};
use kube::Client;
use kube::client::Body;
use tower::{BoxError, Layer, Service, ServiceBuilder, util::BoxCloneSyncService};

use super::{
    budget::{Budget, Budgeted},
    cluster_client::{AnyBody, ClusterClient, Repr, Stack},
    inner::AroundLayer,
    owners::RefuseOwnersAcross,
    reachability::{Reachability, Reached},
    reconciling,
    requests::{Counting, is_counted},
    stats::RequestStats,
    writes::{RecordWrites, Writes},
};
use crate::{cluster_name::ClusterName, panic::lock};

/// What one cluster's client is made of: the client it was engaged with,
/// and what the stack over it tells and is held back by.
pub(crate) struct Parts {
    pub(crate) cluster: ClusterName,
    pub(crate) client: ClusterClient,
    pub(crate) stats: Arc<RequestStats>,
    pub(crate) reachability: Arc<Reachability>,
    pub(crate) budget: Option<Arc<Budget>>,
    pub(crate) writes: Arc<Writes>,
}

/// The stack of one cluster's client, over what its client sends through,
/// and the namespace and expiry of that client.
fn stack(parts: Parts) -> (Stack, String, Option<k8s_openapi::jiff::Timestamp>) {
    let Parts {
        cluster,
        client,
        stats,
        reachability,
        budget,
        writes,
    } = parts;
    let below = client.into_repr();
    let (namespace, valid_until) = match &below {
        Repr::Client(client) => (client.default_namespace().to_owned(), *client.valid_until()),
        Repr::Stack { namespace, .. } => (namespace.clone(), None),
    };
    let below = Below(Arc::new(below));
    let bare = AroundLayer(Reached(reachability.clone())).layer(below.clone());
    let full = ServiceBuilder::new()
        .layer(AroundLayer(RefuseOwnersAcross {
            cluster: cluster.clone(),
            reachability: reachability.clone(),
        }))
        .layer(AroundLayer(Budgeted {
            budget: budget.clone(),
            stats: stats.clone(),
        }))
        .layer(AroundLayer(RecordWrites {
            cluster,
            writes,
            current: reconciling::writer,
        }))
        .layer(AroundLayer(Reached(reachability)))
        .layer(AroundLayer(Counting { stats, budget }))
        .service(below);
    let outer = BoxCloneSyncService::new(Outermost { full, bare });
    (outer, namespace, valid_until)
}

/// Sends a request the whole stack took through `full`, and one that a
/// client stacked over this one counted already through `bare`.
#[derive(Clone)]
struct Outermost<F, B> {
    full: F,
    bare: B,
}

impl<F, B> Service<Request<Body>> for Outermost<F, B>
where
    F: Service<Request<Body>, Response = Response<AnyBody>, Error = BoxError>,
    B: Service<Request<Body>, Response = Response<AnyBody>, Error = BoxError, Future = F::Future>,
{
    type Response = Response<AnyBody>;
    type Error = BoxError;
    type Future = F::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        // Either may take the next request: both are made ready.
        let full = self.full.poll_ready(cx)?;
        let bare = self.bare.poll_ready(cx)?;
        if full.is_ready() && bare.is_ready() {
            Poll::Ready(Ok(()))
        } else {
            Poll::Pending
        }
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        if is_counted(&request) {
            self.bare.call(request)
        } else {
            self.full.call(request)
        }
    }
}

/// What the stack sends its requests through: a finished client, or this
/// crate's connection stack (shared, so that each layer's clone of what is
/// below it is cheap).
#[derive(Clone)]
struct Below(Arc<Repr>);

impl Service<Request<Body>> for Below {
    type Response = Response<AnyBody>;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<Response<AnyBody>, BoxError>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        self.0
            .send(request)
            .map(|r| r.map_err(BoxError::from))
            .boxed()
    }
}

/// `client`, counting its requests in `stats` and telling `reachability`
/// whether they were answered. Given this crate's stack, the counting goes
/// in front of it, under the one request queue of the client it makes;
/// given a `kube::Client`, in front of that client, under a queue of its
/// own.
pub(crate) fn counting(parts: Parts) -> Client {
    counting_lazily(parts).get()
}

/// [`counting`], its client made when first asked for: until then it
/// holds no request queue and no task.
pub(crate) fn counting_lazily(parts: Parts) -> LazyClient {
    LazyClient(Arc::new(Lazy {
        made: std::sync::OnceLock::new(),
        parts: std::sync::Mutex::new(Some(stack(parts))),
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
    parts: std::sync::Mutex<Option<(Stack, String, Option<k8s_openapi::jiff::Timestamp>)>>,
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
                let mut parts = lock(&self.0.parts);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::requests::Counted;

    #[tokio::test]
    async fn a_request_given_up_before_its_answer_is_counted_without_a_code() {
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let stats = Arc::<RequestStats>::default();
        let reachability = Arc::new(Reachability::new(
            "test".into(),
            Client::new(service.clone(), "default").into(),
        ));
        let client = counting(Parts {
            cluster: "test".into(),
            client: Client::new(service, "default").into(),
            stats: stats.clone(),
            reachability,
            budget: None,
            writes: Arc::default(),
        });
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

    #[tokio::test(start_paused = true)]
    async fn a_request_counted_by_a_client_stacked_over_this_one_only_tells_reachability() {
        use crate::client::{budget::RequestBudget, requests::counted_elsewhere};

        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let stats = Arc::<RequestStats>::default();
        let reachability = Arc::new(Reachability::new(
            "test".into(),
            Client::new(service.clone(), "default").into(),
        ));
        // One read at once, then one an hour.
        let budget = Budget::new(RequestBudget::UNLIMITED.reads(1.0 / 3600.0, 1)).map(Arc::new);
        let client = counting(Parts {
            cluster: "test".into(),
            client: Client::new(service, "default").into(),
            stats: stats.clone(),
            reachability: reachability.clone(),
            budget,
            writes: Arc::default(),
        });
        let get = || {
            Request::get("/api/v1/namespaces")
                .body(Body::empty())
                .unwrap()
        };
        let first = tokio::spawn({
            let client = client.clone();
            async move { client.send(get()).await }
        });
        let (_, send) = handle.next_request().await.expect("the budget's one read");
        send.send_response(Response::new(Body::empty()));
        first.await.unwrap().unwrap();
        assert_eq!(stats.total(), 1);

        // Marked by an outer client: no budget, no count, straight below.
        let mut marked = get();
        marked.extensions_mut().insert(counted_elsewhere());
        let second = tokio::spawn(async move { client.send(marked).await });
        let (_, send) =
            tokio::time::timeout(std::time::Duration::from_secs(1), handle.next_request())
                .await
                .expect("not held by the budget")
                .expect("a request");
        let cause = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        send.send_error(kube::Error::Service(Box::new(cause)));
        assert!(second.await.unwrap().is_err());
        assert_eq!(stats.total(), 1, "counted by the outer client alone");
        assert!(
            !reachability.is_answering(),
            "but its answer, or none, is this cluster's"
        );
    }
}
