//! What can keep the webhook server from starting.

use std::path::PathBuf;

/// Why the webhook server could not start, or a configuration it refuses.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A certificate, key or CA file that cannot be read or served.
    #[error("webhook certificate file {}: {reason}", path.display())]
    Certificate {
        /// The file at fault.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A certificate could not be generated.
    #[error("generating the webhook certificate: {0}")]
    Generate(String),
    /// The token key file cannot be read, or is too short.
    #[error("webhook token key file {}: {reason}", path.display())]
    TokenKey {
        /// The file at fault.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A webhook's settings that the API server would refuse, or two
    /// webhooks of one name.
    #[error("webhook {name:?}: {reason}")]
    Invalid {
        /// The webhook's name.
        name: String,
        /// What is wrong.
        reason: String,
    },
    /// The members' URL is not an `https://` URL with a host.
    #[error("webhook URL {url:?}: {reason}")]
    Url {
        /// The URL given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The server's address cannot be bound or read.
    #[error("webhook server on {address}: {source}")]
    Bind {
        /// The address asked for.
        address: String,
        /// The socket error.
        #[source]
        source: std::io::Error,
    },
}
