//! The runtime core of kube-multicluster: the fleet of engaged clusters, their
//! clients and shared caches, controllers, their queues and runners, and the
//! patterns built on them.
//!
//! Depend on `kube-multicluster`, which re-exports all of this crate at its root
//! beside the layers, the manager and the providers (each behind a
//! feature); the examples here are written against it.

#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]

mod action;
pub mod apply;
pub mod cache;
pub mod client;
mod cluster;
mod cluster_name;
pub mod controller;
mod error;
pub mod finalizer;
mod fleet;
pub mod fleetwide;
pub mod gather;
pub mod health;
pub mod identity;
mod names;
mod object_request;
pub mod ownership;
mod panic;
mod problems;
pub mod provider;
pub mod queue;
pub mod rbac;
mod reason;
mod request;
mod serve;

pub use action::Action;
pub use cluster::Cluster;
pub use cluster_name::ClusterName;
pub use controller::{Controller, Error};
pub use error::TerminalError;
pub use fleet::{
    Duplicate, Duplicates, Fleet, FleetConfig, FleetEvent, FleetStatus, FleetSubscription,
};
pub use names::{METRIC_PREFIX, PREFIX};
pub use object_request::ObjectRequest;
pub use panic::panic_message;
pub use reason::ReconcileReason;
pub use request::{McRequest, ObjectKey};
pub use serve::serve;
