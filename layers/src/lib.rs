//! Tower layers for reconcilers run by [`kube_fleet`].
//!
//! Each layer is an ordinary [`tower_layer::Layer`], so it stacks with
//! `tower::ServiceBuilder` and with tower's own middleware:
//!
//! - [`resolve_cluster`]: an `McRequest` becomes a [`ClusterRequest`]
//!   carrying the engaged cluster; requests for departed clusters end quietly.
//! - [`load_object`]: a `ClusterRequest` becomes an [`ObjectRequest`]
//!   carrying the object from the cluster's cache, or `None` if it is gone.
//!
//! [`ClusterRequest`]: resolve_cluster::ClusterRequest
//! [`ObjectRequest`]: load_object::ObjectRequest

#![forbid(unsafe_code)]

pub mod load_object;
pub mod resolve_cluster;
