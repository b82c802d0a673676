use std::{path::PathBuf, time::Duration};

/// Everything that can go wrong while finding binaries or running a fleet.
///
/// Each variant names what it was doing and, for a process that failed, the log
/// file it wrote and the last lines of that log.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Neither `KUBEBUILDER_ASSETS` nor a `go` toolchain was available.
    #[error("{0}")]
    MissingBinaries(String),

    /// `KUBEBUILDER_ASSETS` is set but lacks a binary.
    #[error(
        "KUBEBUILDER_ASSETS={dir} has no executable `{binary}`; point it at a directory holding kube-apiserver and etcd, or unset it to build them with go"
    )]
    MissingAsset {
        /// The directory `KUBEBUILDER_ASSETS` names.
        dir: PathBuf,
        /// The binary that is missing.
        binary: &'static str,
    },

    /// Building the binaries with `go` failed.
    #[error("building {what} with go failed ({status}); its output is in {}:\n{tail}", log.display())]
    Build {
        /// What was being built.
        what: String,
        /// How `go` exited.
        status: std::process::ExitStatus,
        /// The full build log.
        log: PathBuf,
        /// The last lines of that log.
        tail: String,
    },

    /// A file-system or process operation failed.
    #[error("{context}")]
    Io {
        /// What was being done, naming the path or program.
        context: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },

    /// A process of the fleet exited before it became ready.
    #[error("{process} exited before it was ready ({status}); its log is {}:\n{tail}", log.display())]
    Exited {
        /// Which process: `etcd` or `kube-apiserver for cluster <name>`.
        process: String,
        /// How it exited.
        status: std::process::ExitStatus,
        /// The process's log file.
        log: PathBuf,
        /// The last lines of that log.
        tail: String,
    },

    /// A process or resource did not become ready in time.
    #[error("{what} was not ready after {after:?}{}", last_error.as_deref().map(|e| format!("; last error: {e}")).unwrap_or_default())]
    Timeout {
        /// What was awaited.
        what: String,
        /// How long the harness waited.
        after: Duration,
        /// The last error seen while waiting, if any.
        last_error: Option<String>,
    },

    /// Generating certificates or keys failed.
    #[error("generating {what} failed")]
    Certificate {
        /// Which certificate or key.
        what: &'static str,
        /// The underlying error.
        #[source]
        source: rcgen::Error,
    },

    /// Turning the generated kubeconfig into a client configuration failed.
    #[error("kubeconfig for cluster {cluster} is invalid")]
    Kubeconfig {
        /// The cluster whose kubeconfig it is.
        cluster: String,
        /// The underlying error.
        #[source]
        source: kube::config::KubeconfigError,
    },

    /// A request to an API server failed.
    #[error("{context}")]
    Kube {
        /// What was being done, naming the cluster.
        context: String,
        /// The underlying error.
        #[source]
        source: Box<kube::Error>,
    },

    /// CRD YAML could not be parsed at all.
    #[error("CRD YAML is not valid YAML")]
    CrdParse {
        /// The underlying error.
        #[source]
        source: serde_saphyr::Error,
    },

    /// A document in CRD YAML is of another kind.
    #[error("document {index} of the CRD YAML is a {kind:?}, not a CustomResourceDefinition")]
    NotACrd {
        /// The zero-based position of the document among the non-empty ones.
        index: usize,
        /// The `kind` it declares (empty if none).
        kind: String,
    },

    /// A CRD document does not fit the CustomResourceDefinition schema.
    #[error("document {index} of the CRD YAML is not a valid CustomResourceDefinition")]
    CrdDecode {
        /// The zero-based position of the document among the non-empty ones.
        index: usize,
        /// The underlying error.
        #[source]
        source: serde_json::Error,
    },

    /// A cluster name was given twice, or is not usable as a kubeconfig name.
    #[error("cluster name {0:?} is already in use in this fleet or is empty")]
    ClusterName(String),
}

/// A `Result` whose error is this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Self::Io {
            context: context.into() + &crate::open_files::explain(&source),
            source,
        }
    }

    pub(crate) fn kube(context: impl Into<String>, source: kube::Error) -> Self {
        Self::Kube {
            context: context.into(),
            source: Box::new(source),
        }
    }
}
