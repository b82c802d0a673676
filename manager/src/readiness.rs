//! What `/readyz` and `/healthz` answer.

use std::{
    fmt::Write,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
};

use kube_multicluster::{Fleet, controller::ControllerStatus};
use tokio::sync::watch;

use crate::election::Role;

/// How many clusters that are not healthy `/readyz` names; the rest it
/// counts.
const UNWELL_TOLD: usize = 20;

/// A controller as the endpoints see it.
#[derive(Debug)]
pub(crate) struct Watched {
    pub(crate) name: String,
    pub(crate) status: ControllerStatus,
    pub(crate) started: Arc<AtomicBool>,
}

/// The state behind the readiness answer.
#[derive(Debug)]
pub(crate) struct Readiness {
    /// Whose clusters' health is told.
    pub(crate) fleet: Fleet,
    pub(crate) controllers: Vec<Watched>,
    /// The Lease and this replica's role in its election, if any.
    pub(crate) election: Option<(String, watch::Receiver<Role>)>,
    /// Whether a cluster that cannot sync makes the process unready.
    pub(crate) strict: bool,
    /// The webhook server, which every replica serves.
    #[cfg(feature = "webhooks")]
    pub(crate) webhooks: Option<kube_multicluster_webhook::WebhookStatus>,
}

impl Readiness {
    /// Whether the process is ready, and a text that says why or why not,
    /// one line per controller and per cluster that is not served.
    pub(crate) fn check(&self) -> (bool, String) {
        let mut ready = true;
        let mut lines = String::new();
        // Served by every replica, leading or not: told first.
        #[cfg(feature = "webhooks")]
        if let Some(webhooks) = &self.webhooks {
            if webhooks.is_serving() {
                let _ = writeln!(
                    lines,
                    "webhooks: serving {} on {}",
                    webhooks.webhooks(),
                    webhooks.address()
                );
            } else {
                let _ = writeln!(lines, "webhooks: not serving on {}", webhooks.address());
                return (false, format!("not ready\n{lines}"));
            }
        }
        if let Some((lease, role)) = &self.election {
            match *role.borrow() {
                Role::Standby => {
                    // A standby replica is ready: it serves its endpoints
                    // and waits, and a rollout must be able to go on.
                    let _ = writeln!(lines, "standby: waiting to lead through Lease {lease}");
                    return (true, format!("ready\n{lines}"));
                }
                Role::Leading => {
                    let _ = writeln!(lines, "leading through Lease {lease}");
                }
                Role::Stopped => {
                    let _ = writeln!(lines, "stopped leading through Lease {lease}");
                    return (false, format!("not ready\n{lines}"));
                }
            }
        }
        for controller in &self.controllers {
            let name = &controller.name;
            if !controller.started.load(Ordering::SeqCst) {
                ready = false;
                let _ = writeln!(lines, "controller {name}: not running");
                continue;
            }
            let not_started = controller.status.not_started();
            if !not_started.is_empty() {
                ready = false;
                let names: Vec<&str> = not_started.iter().map(|n| n.as_str()).collect();
                let _ = writeln!(lines, "controller {name}: starting in {names:?}");
            }
            let clusters = controller.status.clusters();
            let mut serving = 0;
            for cluster in &clusters {
                let failing = cluster.failing().next().is_some();
                if cluster.serving && !failing {
                    serving += 1;
                } else if cluster.serving {
                    // Served, but a watch there does not run (its cluster
                    // is down, or back and its watches not yet resumed, or
                    // a right was taken away): told, and not counted as
                    // serving until it runs; never unready for, as a
                    // cluster's health is not.
                    let _ = writeln!(lines, "controller {name}: behind in {cluster}");
                } else if failing {
                    // Reported by name; unready only if asked.
                    ready &= !self.strict;
                    let _ = writeln!(lines, "controller {name}: cannot sync: {cluster}");
                } else {
                    ready = false;
                    let _ = writeln!(lines, "controller {name}: syncing: {cluster}");
                }
            }
            let _ = writeln!(
                lines,
                "controller {name}: serving {serving} of {} clusters",
                clusters.len() + not_started.len()
            );
        }
        // Told, never unready for: one broken member must not take the
        // operator out of its Service. A few by name, the rest counted.
        let unwell: Vec<_> = self
            .fleet
            .status()
            .health
            .into_iter()
            .filter(|(_, health)| !health.is_healthy())
            .collect();
        for (cluster, health) in unwell.iter().take(UNWELL_TOLD) {
            let _ = writeln!(lines, "cluster {:?}: {health}", cluster.as_str());
        }
        if unwell.len() > UNWELL_TOLD {
            let _ = writeln!(
                lines,
                "and {} more clusters not healthy ({})",
                unwell.len() - UNWELL_TOLD,
                kube_multicluster::metric_name!("cluster_health")
            );
        }
        // Names offered for a cluster engaged under another, and clusters
        // whose identity could not be read: told too.
        let problems = self.fleet.problems().current();
        for (source, problem) in problems.iter().take(UNWELL_TOLD) {
            let _ = writeln!(lines, "{source}: {problem}");
        }
        if problems.len() > UNWELL_TOLD {
            let _ = writeln!(
                lines,
                "and {} more problems of the fleet (Fleet::problems)",
                problems.len() - UNWELL_TOLD
            );
        }
        let head = if ready { "ready" } else { "not ready" };
        (ready, format!("{head}\n{lines}"))
    }
}
