//! A client of an API server that holds no ConfigMaps, for unit tests of
//! controllers that need a cluster to be in the fleet and its watch to sync,
//! but no objects: shared by the core's and the layers' tests.

use std::{
    pin::Pin,
    task::{Context, Poll},
};

use tower::service_fn;

/// A response body: sent at once, or a watch's that stays open with
/// nothing to say.
enum FakeBody {
    Once(Option<bytes::Bytes>),
    Open,
}

impl http_body::Body for FakeBody {
    type Data = bytes::Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        match &mut *self {
            Self::Once(bytes) => Poll::Ready(bytes.take().map(|b| Ok(http_body::Frame::data(b)))),
            Self::Open => Poll::Pending,
        }
    }
}

/// A client of an API server that holds no ConfigMaps: a list comes back
/// empty and a watch stays open, so the controller's watch in the cluster
/// syncs at once and holds nothing; every reconcile reads no object.
pub(crate) fn empty_api_client() -> kube::Client {
    let service = service_fn(|request: http::Request<kube::client::Body>| async move {
        let watch = request.uri().query().is_some_and(|query| {
            query
                .split('&')
                .any(|p| p == "watch=true" || p == "watch=1")
        });
        let body = if watch {
            FakeBody::Open
        } else {
            FakeBody::Once(Some(bytes::Bytes::from_static(
                br#"{"kind":"ConfigMapList","apiVersion":"v1","metadata":{"resourceVersion":"1"},"items":[]}"#,
            )))
        };
        Ok::<_, std::convert::Infallible>(http::Response::new(body))
    });
    kube::Client::new(service, "default")
}
