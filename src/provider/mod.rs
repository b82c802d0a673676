//! Providers discover clusters and tell the [`Fleet`](crate::Fleet) about them.
//!
//! A provider is a stream of [`ClusterEvent`]s: engage a cluster under a name
//! with a client, or disengage a name. [`Fleet::run`](crate::Fleet::run)
//! applies them. Providers never touch controllers. Two are built in:
//! [`ProgrammaticProvider`], driven from code, and [`LocalProvider`], the
//! process's own cluster. Others live in crates of their own; those that read
//! kubeconfigs share [`kubeconfig`]'s checks, and those that
//! build clients from sources they watch share [`Engagements`].

mod engagements;
pub mod kubeconfig;
mod local;
mod problems;
mod programmatic;
mod seen;

pub use engagements::{BuildError, Engagements};
pub use local::LocalProvider;
pub use problems::Problems;
pub use programmatic::{ProgrammaticHandle, ProgrammaticProvider};
pub use seen::{Change, Seen};

use kube::Client;

use crate::{ClusterName, cache::NamespaceView};

/// An error and every error beneath it, as one line (`a: b: c`), for
/// problems and logs. A failure to obtain credentials is told as that
/// alone: kube's text of it quotes a credential plugin's command line,
/// environment and output, which may hold secrets.
pub fn describe(error: &(dyn std::error::Error + 'static)) -> String {
    crate::client::error_chain(error)
}

/// A change in the set of clusters a provider knows.
#[derive(Clone)]
pub enum ClusterEvent {
    /// Engage the cluster `name` through `client`. Engaging a name that is
    /// already engaged replaces that cluster: its watches stop and new ones start.
    Engage {
        /// The cluster's name in the fleet.
        name: ClusterName,
        /// A client for it, built inside the tokio runtime.
        client: Client,
    },
    /// Engage the cluster `name` that is one namespace of a host, read
    /// through the host's shared watches (see
    /// [`HostCache`](crate::cache::HostCache)). Replaces as `Engage` does.
    EngageView {
        /// The cluster's name in the fleet.
        name: ClusterName,
        /// The namespace and its host.
        view: NamespaceView,
    },
    /// The cluster `name` has left: stop its watches and forget its work.
    Disengage {
        /// The cluster's name in the fleet.
        name: ClusterName,
    },
}

impl std::fmt::Debug for ClusterEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Engage { name, .. } => f
                .debug_struct("Engage")
                .field("name", name)
                .finish_non_exhaustive(),
            Self::EngageView { name, view } => f
                .debug_struct("EngageView")
                .field("name", name)
                .field("view", view)
                .finish(),
            Self::Disengage { name } => f.debug_struct("Disengage").field("name", name).finish(),
        }
    }
}
