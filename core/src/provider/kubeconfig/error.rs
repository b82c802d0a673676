//! Why a kubeconfig, or one of its contexts, gives no cluster.

use crate::provider::build_error::BuildError;

/// Why a kubeconfig, or one of its contexts, gives no cluster. Each names
/// the kubeconfig's source (a file, a Secret) as the provider gave it.
#[derive(Debug, thiserror::Error)]
pub enum KubeconfigError {
    /// The text is not a kubeconfig.
    #[error("{origin}: not a kubeconfig: {reason}")]
    Malformed {
        /// Where the kubeconfig came from.
        origin: String,
        /// What the parser said.
        reason: String,
    },
    /// A context names a cluster or user the kubeconfig does not define.
    #[error("{origin}: context {context:?} names {entry}, which the kubeconfig does not define")]
    Missing {
        /// Where the kubeconfig came from.
        origin: String,
        /// The context.
        context: String,
        /// What it names: `cluster "x"`, `user "y"`.
        entry: String,
    },
    /// The policy refuses what a context asks for.
    #[error(
        "{origin}: context {context:?} refused: it asks for {what}, which this provider does not allow \
         (KubeconfigPolicy::{allow})"
    )]
    Refused {
        /// Where the kubeconfig came from.
        origin: String,
        /// The context.
        context: String,
        /// What it asks for.
        what: String,
        /// The policy method that would allow it.
        allow: &'static str,
    },
    /// The kubeconfig could not be read.
    #[error("{origin}: cannot be read: {reason}")]
    Unreadable {
        /// Where the kubeconfig came from.
        origin: String,
        /// What the system said.
        reason: String,
    },
    /// kube could not build a configuration from the context.
    #[error("{origin}: context {context:?}: {reason}")]
    Invalid {
        /// Where the kubeconfig came from.
        origin: String,
        /// The context.
        context: String,
        /// What kube said.
        reason: String,
    },
}

impl KubeconfigError {
    /// [`Invalid`](Self::Invalid): the context `context` of the kubeconfig
    /// from `origin` gives no cluster, for `reason`.
    pub(super) fn invalid(origin: &str, context: &str, reason: impl Into<String>) -> Self {
        Self::Invalid {
            origin: origin.to_owned(),
            context: context.to_owned(),
            reason: reason.into(),
        }
    }

    /// Where the kubeconfig came from, as the provider named it.
    pub fn origin(&self) -> &str {
        match self {
            Self::Malformed { origin, .. }
            | Self::Missing { origin, .. }
            | Self::Refused { origin, .. }
            | Self::Unreadable { origin, .. }
            | Self::Invalid { origin, .. } => origin,
        }
    }

    /// What is wrong, without where the kubeconfig came from: the message
    /// for a problem reported under a name of its own (a context's
    /// cluster, say).
    ///
    /// ```
    /// use kube_multicluster::provider::kubeconfig;
    ///
    /// let error = kubeconfig::parse("[", "/etc/fleet/east.yaml").unwrap_err();
    /// assert_eq!(error.origin(), "/etc/fleet/east.yaml");
    /// assert!(error.reason().starts_with("not a kubeconfig"));
    /// ```
    pub fn reason(&self) -> String {
        let text = self.to_string();
        match text
            .strip_prefix(self.origin())
            .and_then(|rest| rest.strip_prefix(": "))
        {
            Some(reason) => reason.to_owned(),
            None => text,
        }
    }
}

impl From<KubeconfigError> for BuildError {
    /// A kubeconfig that does not parse, or that the policy refuses, is not
    /// tried again until it changes.
    fn from(error: KubeconfigError) -> Self {
        Self::Refused(error.to_string())
    }
}
