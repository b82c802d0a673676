use kube_multicluster::{McRequest, ObjectRequest, ReconcileReason};

/// A request that names the object to reconcile: what layers that log,
/// count or limit by cluster read from whatever request type they sit on.
///
/// Implemented for [`ObjectRequest`], which `Controller::run` hands out and
/// which also names its controller and why it runs (the trace and metrics
/// layers then need not be told), and for a plain [`McRequest`], for a stack
/// below a `map_request` that keeps only the key.
pub trait AsMcRequest {
    /// The cluster, namespace and name the request is for.
    fn mc_request(&self) -> &McRequest;

    /// The controller that runs the reconcile, if the request says.
    fn controller(&self) -> Option<&str> {
        None
    }

    /// Why the reconcile runs, if the request says.
    fn reason(&self) -> Option<&ReconcileReason> {
        None
    }

    /// Reads again what the request carries of the cluster's state: an
    /// `ObjectRequest` from `Controller::run` reads its object from the
    /// controller's watch. Nothing for the others. The recommended stack's
    /// [`Refresh`](crate::recommended::Refresh) calls it before each attempt.
    fn refresh(&mut self) {}
}

impl AsMcRequest for McRequest {
    fn mc_request(&self) -> &McRequest {
        self
    }
}

impl<K> AsMcRequest for ObjectRequest<K> {
    fn mc_request(&self) -> &McRequest {
        &self.request
    }

    fn controller(&self) -> Option<&str> {
        self.controller.as_deref()
    }

    fn reason(&self) -> Option<&ReconcileReason> {
        Some(&self.reason)
    }

    fn refresh(&mut self) {
        ObjectRequest::refresh(self);
    }
}
