//! The reconcile a request is made for: a task-local set while a
//! controller's reconcile runs, which the cluster clients it writes
//! through read to refuse owner references across clusters (`owners`) and
//! to record its writes (`writes`).

use std::{future::Future, sync::Arc};

use kube::{Resource, ResourceExt};

use super::{reachability::Reachability, writes::Writer};
use crate::cluster_name::ClusterName;

tokio::task_local! {
    static RECONCILING: Reconciling;
}

/// What an owner reference can name: an object read from its API server.
pub(crate) trait Owner: Send + Sync {
    /// Its UID, if it has one.
    fn uid(&self) -> Option<&str>;
    /// `namespace/name`, or `name`.
    fn describe(&self) -> String;
    /// Its namespace; `None` if it is cluster-scoped.
    fn namespace(&self) -> Option<&str>;
}

impl<K: Resource + Send + Sync> Owner for K {
    fn uid(&self) -> Option<&str> {
        self.meta().uid.as_deref()
    }

    fn describe(&self) -> String {
        match self.meta().namespace.as_deref() {
            Some(namespace) => format!("{namespace}/{}", self.name_any()),
            None => self.name_any(),
        }
    }

    fn namespace(&self) -> Option<&str> {
        self.meta().namespace.as_deref()
    }
}

/// The object a reconcile runs for, as the clients it writes through see
/// it.
#[derive(Clone)]
pub(crate) struct Reconciling {
    /// Its cluster.
    pub(crate) cluster: ClusterName,
    /// Its cluster's reachability, shared by the namespaces of one host.
    pub(crate) reachability: Arc<Reachability>,
    /// The object, shared with the cache; `None` if it is gone.
    pub(crate) object: Option<Arc<dyn Owner>>,
    /// The controller whose reconcile it is, if it reads its own writes:
    /// what the cluster's client records its writes under.
    pub(crate) writer: Option<Arc<Writer>>,
}

/// Runs `reconcile` as the reconcile of `object`.
pub(crate) async fn reconciling<F: Future>(object: Reconciling, reconcile: F) -> F::Output {
    RECONCILING.scope(object, reconcile).await
}

/// The reconcile that runs on this task, if any.
pub(crate) fn current() -> Option<Reconciling> {
    RECONCILING.try_with(Reconciling::clone).ok()
}

/// The controller whose reconcile runs on this task, if it reads its own
/// writes, and the cluster of the reconciled key.
pub(crate) fn writer() -> Option<(Arc<Writer>, ClusterName)> {
    RECONCILING
        .try_with(|reconciling| {
            let writer = reconciling.writer.clone()?;
            Some((writer, reconciling.cluster.clone()))
        })
        .ok()
        .flatten()
}
