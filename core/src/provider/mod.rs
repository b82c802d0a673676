//! Providers discover clusters and tell the [`Fleet`](crate::Fleet) about them.
//!
//! A provider is a stream of [`ClusterEvent`]s: engage a cluster under a name
//! with a client, or disengage a name. [`Fleet::run`](crate::Fleet::run)
//! applies them. Providers never touch controllers. Two are built in:
//! [`ProgrammaticProvider`], driven from code, and [`LocalProvider`], the
//! process's own cluster. Others live in crates of their own; those that read
//! kubeconfigs share [`kubeconfig`]'s checks, and those that
//! build clients from sources they watch share [`Engagements`]. Those that
//! watch with kube's watcher retry it with [`backoff`] and report how it fares
//! with [`Problems::watched`].

mod build_error;
mod engagements;
pub mod kubeconfig;
mod local;
mod programmatic;
mod request_budget;
mod seen;
mod watch_backoff;

pub use crate::fleet::ClusterEvent;
pub use crate::problems::Problems;
pub use build_error::BuildError;
pub use engagements::{Engagements, drive};
pub use local::LocalProvider;
pub use programmatic::{ProgrammaticHandle, ProgrammaticProvider};
pub use request_budget::with_request_budget;
pub use seen::{Seen, SourceChange};
pub use watch_backoff::{WatchBackoff, backoff};
