//! Why a gather could not be read or written.

use tower::BoxError;

use crate::request::McRequest;

/// Why a [`Read`](super::Read) could not be made, or a parent's status not
/// written by [`Gather`](super::Gather).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The selector of [`Read::field`](super::Read::field) is not a JSONPath
    /// expression.
    #[error("the selector {selector:?} is not a JSONPath expression")]
    InvalidSelector {
        /// The selector as given.
        selector: String,
        /// What the parser found.
        #[source]
        source: BoxError,
    },
    /// The fields given beside the entries are not a JSON object.
    #[error("the status fields given beside the entries of {parent} are not an object")]
    NotAnObject {
        /// The parent whose status it was.
        parent: McRequest,
    },
    /// The entries, or the fields given beside them, could not be made
    /// JSON (a map with keys that are not strings, a `Serialize` that
    /// fails).
    #[error("the status of {parent} could not be serialized")]
    Serialize {
        /// The parent whose status it was.
        parent: McRequest,
        /// What serde_json found.
        #[source]
        source: serde_json::Error,
    },
    /// The apply of the parent's status failed: a `404` when the parent's
    /// CRD has no status subresource.
    #[error("applying the status of {parent}")]
    Apply {
        /// The parent whose status it was.
        parent: McRequest,
        /// The API's error.
        #[source]
        source: Box<kube::Error>,
    },
}
