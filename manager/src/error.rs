//! What ends a [`Manager`](crate::Manager).

use std::net::SocketAddr;

/// Why a [`Manager`](crate::Manager) stopped or could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A setting that cannot work, named with the reason.
    #[error("{what}: {reason}")]
    Invalid {
        /// What was set.
        what: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The endpoints' address could not be bound or served.
    #[error("serving the endpoints on {address}: {source}")]
    Serve {
        /// The address.
        address: SocketAddr,
        /// The error.
        source: std::io::Error,
    },
    /// No client could be built for the cluster that holds the Leases.
    #[error("a client for the {what}: {source}")]
    Client {
        /// What the client was for.
        what: String,
        /// The error.
        source: kube::Error,
    },
    /// A controller ended with an error; the others were stopped.
    #[error("controller {controller:?}: {source}")]
    Controller {
        /// The controller's name.
        controller: String,
        /// Its error.
        source: kube_multicluster::controller::Error,
    },
    /// A controller's task panicked; the others were stopped.
    #[error("controller {controller:?} panicked: {message}")]
    Panicked {
        /// The controller's name.
        controller: String,
        /// The panic.
        message: String,
    },
    /// This replica stopped leading before it was told to stop: the
    /// controllers were stopped at the renew deadline.
    #[error("leadership of Lease {lease} lost: {reason}")]
    LeadershipLost {
        /// `namespace/name` of the Lease.
        lease: String,
        /// Why.
        reason: String,
    },
    /// The webhook server could not start: a certificate or key file, a
    /// URL or a webhook it refuses, named in the error.
    #[cfg(feature = "webhooks")]
    #[cfg_attr(docsrs, doc(cfg(feature = "webhooks")))]
    #[error(transparent)]
    Webhooks(#[from] kube_multicluster_webhook::Error),
}
