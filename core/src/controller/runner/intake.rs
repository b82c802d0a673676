//! What a running controller takes in from outside its watches (requests
//! and signals to reconcile everything), and the requests it drops: each
//! problem warned about once per cluster.

use std::{
    collections::HashSet,
    sync::Arc,
    task::{Context, Poll},
};

use futures::{
    StreamExt,
    stream::{BoxStream, Fuse},
};

use crate::{cluster_name::ClusterName, request::McRequest};

/// How many names of unknown clusters (and misaddressed requests) the
/// runner remembers having warned about; past that it forgets them all and
/// may warn again.
const REMEMBERED: usize = 1024;

/// Requests from outside, and the problems already warned about.
pub(super) struct Intake {
    controller: Arc<str>,
    external: Fuse<BoxStream<'static, McRequest>>,
    reconcile_all: Fuse<BoxStream<'static, ()>>,
    /// Problems with requests already warned about, per cluster.
    misaddressed: HashSet<(ClusterName, &'static str)>,
    /// Clusters not in the fleet that requests named, warned about once.
    unknown: HashSet<ClusterName>,
}

impl Intake {
    pub(super) fn new(
        controller: Arc<str>,
        external: BoxStream<'static, McRequest>,
        reconcile_all: BoxStream<'static, ()>,
    ) -> Self {
        Self {
            controller,
            external: external.fuse(),
            reconcile_all: reconcile_all.fuse(),
            misaddressed: HashSet::new(),
            unknown: HashSet::new(),
        }
    }

    pub(super) fn poll_external(&mut self, cx: &mut Context<'_>) -> Poll<Option<McRequest>> {
        self.external.poll_next_unpin(cx)
    }

    /// Whether everything is to be reconciled (signals that came together
    /// count once).
    pub(super) fn poll_reconcile_all(&mut self, cx: &mut Context<'_>) -> bool {
        let mut asked = false;
        while let Poll::Ready(Some(())) = self.reconcile_all.poll_next_unpin(cx) {
            asked = true;
        }
        asked
    }

    /// Forgets the warnings about `name`, a cluster just taken in.
    pub(super) fn forget(&mut self, name: &ClusterName) {
        self.unknown.remove(name);
        self.misaddressed.retain(|(cluster, _)| cluster != name);
    }

    /// Drops a request that names its object in a way the controller's
    /// watch cannot hold.
    pub(super) fn misaddressed(&mut self, request: &McRequest, problem: &'static str) {
        if self.misaddressed.insert((request.cluster.clone(), problem)) {
            tracing::warn!(controller = %self.controller, %request, "request {problem}; dropped, and further such requests for this cluster too");
            if self.misaddressed.len() > REMEMBERED {
                self.misaddressed.clear();
            }
        }
    }

    /// Drops a request for a cluster the controller does not work in.
    pub(super) fn unknown_cluster(&mut self, request: &McRequest, why: &str) {
        if self.unknown.insert(request.cluster.clone()) {
            tracing::warn!(controller = %self.controller, %request, "request names a cluster that {why}; dropped, and further requests for it too");
            if self.unknown.len() > REMEMBERED {
                self.unknown.clear();
                self.unknown.insert(request.cluster.clone());
            }
        }
    }
}
