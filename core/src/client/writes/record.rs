//! The layer of a cluster's client that records the writes of a reconcile
//! that reads its own writes: from when it is sent until its answer, a
//! change to its object is taken for its echo.

use std::sync::Arc;

use http::{Request, Response};
use kube::client::Body;
use tower::BoxError;

use super::{Writer, Writes, answer::pending};
use crate::{
    client::{
        cluster_client::AnyBody,
        inner::{Around, Below},
    },
    cluster_name::ClusterName,
};

/// The controller whose reconcile runs on the calling task, if it reads its
/// own writes, and the cluster of the reconciled key.
pub(crate) type CurrentWriter = fn() -> Option<(Arc<Writer>, ClusterName)>;

/// Records each write of a reconcile that reads its own writes in the
/// cluster's [`Writes`], as the reconcile under way says (`current`).
#[derive(Clone)]
pub(crate) struct RecordWrites {
    pub(crate) cluster: ClusterName,
    pub(crate) writes: Arc<Writes>,
    pub(crate) current: CurrentWriter,
}

impl Around for RecordWrites {
    async fn around<S: Below>(
        self,
        request: Request<Body>,
        mut inner: S,
    ) -> Result<Response<AnyBody>, BoxError> {
        let Self {
            cluster,
            writes,
            current,
        } = self;
        let writer = current();
        let write = writer
            .as_ref()
            .and_then(|(writer, _)| pending(&request, writer.name.clone(), &cluster));
        // On its way from now: a change to its object is taken for its
        // echo until it is answered.
        let write = match write {
            Some(write) => Some(write.sending(&writes).await),
            None => None,
        };
        match (write, inner.call(request).await) {
            (Some(write), Ok(response)) => {
                let answered = write.answered(response, &writes).await;
                if let Some((writer, origin)) = &writer {
                    // Recorded: the next reconcile in its origin (and in
                    // this cluster) looks for it before it starts.
                    writer.wrote(origin, &cluster);
                }
                answered
            }
            (_, result) => result,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::OnceLock;

    use bytes::Bytes;
    use http_body_util::{BodyExt, Full};
    use tower::{Layer, ServiceExt};

    use super::*;
    use crate::client::inner::AroundLayer;

    fn parents() -> Option<(Arc<Writer>, ClusterName)> {
        static PARENTS: OnceLock<Arc<Writer>> = OnceLock::new();
        let writer = PARENTS.get_or_init(|| {
            let writer = Writer::new("parents".into());
            writer.serve(&"hub".into(), || false);
            writer.serve(&"east".into(), || false);
            Arc::new(writer)
        });
        Some((writer.clone(), "hub".into()))
    }

    fn nobody() -> Option<(Arc<Writer>, ClusterName)> {
        None
    }

    /// Patches a ConfigMap through the layer over a mock that answers with
    /// the object at version 12; what the cluster's writes recorded.
    async fn patch(current: CurrentWriter) -> Arc<Writes> {
        let writes = Arc::new(Writes::default());
        let (below, mut handle) = tower_test::mock::pair::<Request<Body>, Response<AnyBody>>();
        let service = AroundLayer(RecordWrites {
            cluster: "east".into(),
            writes: writes.clone(),
            current,
        })
        .layer(below);
        let request = Request::patch("/api/v1/namespaces/default/configmaps/child")
            .body(Body::from(b"{\"data\":{\"k\":\"v\"}}".to_vec()))
            .unwrap();
        let call = tokio::spawn(service.oneshot(request));
        let (_, send) = handle.next_request().await.unwrap();
        let object = r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"child","namespace":"default","uid":"u1","resourceVersion":"12"}}"#;
        let body = Full::new(Bytes::from(object))
            .map_err(|never| match never {})
            .boxed_unsync();
        send.send_response(Response::new(body));
        let answered = call.await.unwrap().unwrap();
        let read = answered.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(
            read,
            object.as_bytes(),
            "the answer reaches the caller whole"
        );
        writes
    }

    #[tokio::test]
    async fn a_write_of_a_reconcile_that_reads_its_writes_is_recorded_with_its_version() {
        let writes = patch(parents).await;
        let unshown = writes.unshown("parents", &"east".into());
        assert_eq!(unshown.len(), 1, "{unshown:?}");
        assert_eq!(unshown[0].version, 12);
        let (writer, origin) = parents().unwrap();
        let (_, away) = writer.holds(&origin).expect("the origin is marked");
        assert_eq!(
            away,
            [ClusterName::from("east")],
            "the origin's next reconcile waits for this cluster too"
        );
        assert!(writer.holds(&"east".into()).is_some(), "east's too");
    }

    #[tokio::test]
    async fn a_write_outside_such_a_reconcile_is_not_recorded() {
        let writes = patch(nobody).await;
        assert!(writes.unshown("parents", &"east".into()).is_empty());
    }
}
