//! What a running controller takes in: requests from its watches and from
//! outside, checked against the fleet and the controller's watch, then
//! queued.

use std::task::{Context, Poll};

use futures::StreamExt;

use super::{INTAKE_PER_POLL, Runner, UNKNOWN_REMEMBERED};
use crate::{
    cache::Watchable,
    cluster::Cluster,
    cluster_name::ClusterName,
    controller::{ClusterSelector, trigger::Trigger},
    queue::Lane,
    reason::ReconcileReason,
    request::{McRequest, ObjectKey},
};

impl<K: Watchable> Runner<K> {
    /// Takes what the clusters' streams and the outside have sent, half the
    /// budget each, so that neither a flood of watch events nor of external
    /// requests starves the other.
    pub(super) fn poll_intake(&mut self, cx: &mut Context<'_>) {
        let clusters_left_more =
            (0..INTAKE_PER_POLL / 2).all(|_| match self.incoming.poll_next_unpin(cx) {
                Poll::Ready(Some((name, item))) => {
                    self.cluster_item(name, item);
                    true
                }
                _ => false,
            });
        let outside_left_more =
            (0..INTAKE_PER_POLL / 2).all(|_| match self.external.poll_next_unpin(cx) {
                Poll::Ready(Some(request)) => {
                    self.accept(request, Lane::Changed, ReconcileReason::External);
                    true
                }
                _ => false,
            });
        while let Poll::Ready(Some(())) = self.reconcile_all.poll_next_unpin(cx) {
            self.queue_everything();
        }
        if clusters_left_more || outside_left_more {
            // The budget ran out: come back for the rest soon.
            cx.waker().wake_by_ref();
        }
    }

    /// Queues every object of the controlled type in every cluster it works in.
    fn queue_everything(&mut self) {
        let controlled = self.own.clone();
        let clusters: Vec<Cluster> = self
            .engaged
            .values()
            .filter(|cluster| self.selection.selects(cluster.name()))
            .cloned()
            .collect();
        let mut queued = 0;
        for cluster in clusters {
            for request in controlled.known(&cluster) {
                queued += 1;
                self.accept(request, Lane::Listed, ReconcileReason::BulkReconcile);
            }
        }
        tracing::info!(controller = %self.name, queued, "reconciling everything");
    }

    /// Queues a request, if its cluster is in the fleet. A cluster the
    /// runner has not heard of yet but the fleet has is engaged first, so
    /// its keys wait for its watches like any other.
    pub(super) fn accept(&mut self, request: McRequest, lane: Lane, reason: ReconcileReason) {
        // The cluster the fleet has may be replaced while it is engaged here;
        // then `engage` skips it and the fleet has its successor.
        while !self.engaged.contains_key(&request.cluster) {
            match self.fleet.get(&request.cluster) {
                Some(cluster) => self.engage(cluster),
                None => {
                    return self
                        .unknown_cluster(&request, "is not in the fleet (never engaged, or left)");
                }
            }
        }
        if !self.selection.selects(&request.cluster) {
            return self
                .unknown_cluster(&request, "is not one where the controller watches its type");
        }
        match self.address(request) {
            Ok(request) => self.queue.push(request, lane, reason),
            Err((request, problem)) => self.misaddressed(&request, problem),
        }
    }

    /// Queues the request for `key` in every engaged cluster that `to`
    /// selects and where the controller watches its type.
    pub(super) fn accept_across(
        &mut self,
        to: &ClusterSelector,
        key: &ObjectKey,
        lane: Lane,
        reason: &ReconcileReason,
    ) {
        let clusters: Vec<ClusterName> = self
            .engaged
            .keys()
            .filter(|name| to.selects(name) && self.selection.selects(name))
            .cloned()
            .collect();
        for cluster in clusters {
            self.accept(key.clone().in_cluster(cluster), lane, reason.clone());
        }
    }

    /// `key` as it may be queued, or why it may not: it must name the
    /// object the way the controller's watch keys it.
    fn address(&self, mut key: McRequest) -> Result<McRequest, (McRequest, &'static str)> {
        let watch = &self.own.watch;
        if !watch.namespaced {
            // Cluster-scoped objects are keyed without one.
            key.namespace = None;
            return Ok(key);
        }
        let problem = match (&key.namespace, &watch.namespace) {
            (None, _) => {
                "names no namespace, but the controlled objects live in namespaces (it would read as deleted)"
            }
            (Some(asked), Some(watched)) if asked != watched => {
                "names a namespace outside the one the controller watches (it would read as deleted)"
            }
            _ => return Ok(key),
        };
        Err((key, problem))
    }

    fn misaddressed(&mut self, request: &McRequest, problem: &'static str) {
        if self.misaddressed.insert((request.cluster.clone(), problem)) {
            tracing::warn!(controller = %self.name, %request, "request {problem}; dropped, and further such requests for this cluster too");
            if self.misaddressed.len() > UNKNOWN_REMEMBERED {
                self.misaddressed.clear();
            }
        }
    }

    fn unknown_cluster(&mut self, request: &McRequest, why: &str) {
        if self.unknown.insert(request.cluster.clone()) {
            tracing::warn!(controller = %self.name, %request, "request names a cluster that {why}; dropped, and further requests for it too");
            if self.unknown.len() > UNKNOWN_REMEMBERED {
                self.unknown.clear();
                self.unknown.insert(request.cluster.clone());
            }
        }
    }
}
