use kube_fleet::McRequest;

/// Reading an object from the API server failed (where the cluster had no
/// cache of its kind). The `kube::Error` is the source, so a retry policy
/// sees whether it is transient.
#[derive(Debug, thiserror::Error)]
#[error("reading {request} from its API server")]
pub struct LoadError {
    /// The request whose object could not be read.
    pub request: McRequest,
    /// What the API server or the connection said.
    #[source]
    pub source: kube::Error,
}
