use std::task::{Context, Poll};

use kube_fleet::{Action, Cluster, Fleet, McRequest};
use tower::{BoxError, Service};

use super::ResponseFuture;

/// A request whose cluster is engaged: the request and the cluster it names.
#[derive(Debug, Clone)]
pub struct ClusterRequest {
    /// The engaged cluster the request names.
    pub cluster: Cluster,
    /// The original request.
    pub request: McRequest,
}

/// Resolves each request's cluster; see the [module docs](super).
#[derive(Debug, Clone)]
pub struct ResolveCluster<S> {
    inner: S,
    fleet: Fleet,
}

impl<S> ResolveCluster<S> {
    /// Wraps `inner`, looking clusters up in `fleet`.
    pub const fn new(inner: S, fleet: Fleet) -> Self {
        Self { inner, fleet }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S> Service<McRequest> for ResolveCluster<S>
where
    S: Service<ClusterRequest, Response = Action>,
    S::Error: Into<BoxError>,
{
    type Response = Action;
    type Error = BoxError;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: McRequest) -> Self::Future {
        if let Some(cluster) = self.fleet.get(&request.cluster) {
            return ResponseFuture::called(self.inner.call(ClusterRequest { cluster, request }));
        }
        tracing::debug!(request = %request, "cluster is not in the fleet; dropping the request");
        ResponseFuture::gone()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    };

    use kube::Client;
    use tower::{BoxError, ServiceExt, service_fn};

    use super::*;

    /// A client whose requests go nowhere; resolving a cluster makes none.
    fn idle_client() -> Client {
        let (service, _handle) = tower_test::mock::pair::<
            http::Request<kube::client::Body>,
            http::Response<kube::client::Body>,
        >();
        Client::new(service, "default")
    }

    fn counting_inner(
        calls: Arc<AtomicUsize>,
    ) -> impl Service<ClusterRequest, Response = Action, Error = BoxError, Future: Send> + Clone
    {
        service_fn(move |request: ClusterRequest| {
            calls.fetch_add(1, Ordering::SeqCst);
            async move {
                assert_eq!(request.cluster.name(), &request.request.cluster);
                Ok::<_, BoxError>(Action::requeue(std::time::Duration::from_secs(1)))
            }
        })
    }

    #[tokio::test]
    async fn a_request_for_an_engaged_cluster_reaches_the_service_with_that_cluster() {
        let fleet = Fleet::new();
        fleet.engage("east", idle_client());
        let calls = Arc::new(AtomicUsize::new(0));
        let service = ResolveCluster::new(counting_inner(calls.clone()), fleet);
        let action = service
            .oneshot(McRequest::new("east", Some("ns"), "obj"))
            .await
            .unwrap();
        assert_eq!(action, Action::requeue(std::time::Duration::from_secs(1)));
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_request_for_a_cluster_that_left_ends_quietly_without_a_call() {
        let fleet = Fleet::new();
        fleet.engage("east", idle_client());
        assert!(fleet.disengage("east"));
        let calls = Arc::new(AtomicUsize::new(0));
        let service = ResolveCluster::new(counting_inner(calls.clone()), fleet);
        let action = service
            .oneshot(McRequest::new("east", Some("ns"), "obj"))
            .await
            .expect("not an error, so not retried");
        assert_eq!(action, Action::await_change());
        assert_eq!(calls.load(Ordering::SeqCst), 0);
    }
}
