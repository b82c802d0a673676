//! Tower layers for reconcilers run by [`kube_fleet`].
//!
//! Each layer here is an ordinary [`tower_layer::Layer`], so it stacks with
//! `tower::ServiceBuilder` and with tower's own middleware. The layers arrive
//! one module at a time; this crate is their home.

#![forbid(unsafe_code)]
