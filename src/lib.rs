//! Kubernetes controllers that reconcile across a dynamic fleet of clusters.
//!
//! A reconciler is written once, as a [`tower::Service`], and run against every
//! cluster that a provider engages: kind clusters, kubeconfig files or Secrets,
//! Cluster API workload clusters, a `ClusterProfile` inventory. Clusters join
//! and leave while the process runs.
//!
//! Tests and examples run against real API servers started by the
//! `kube-fleet-envtest` crate.

#![forbid(unsafe_code)]
