//! Keeping the registrations current as the fleet changes: written when a
//! cluster is engaged, written again when the CA changes and every few
//! minutes (so that one deleted by hand, or by a replica that let the
//! cluster go as this one took it, comes back), retried with a growing
//! pause while a cluster refuses them, removed when it leaves.

use std::{
    collections::HashMap,
    hash::{DefaultHasher, Hash, Hasher},
    sync::Arc,
    time::Duration,
};

use futures::StreamExt;
use kube_multicluster::{Cluster, ClusterName, Fleet, FleetEvent, FleetSubscription};
use tokio::{
    sync::{Semaphore, watch},
    task::{AbortHandle, JoinSet},
};

use super::{Plan, Whose};

/// First writes (a cluster engaged, a CA changed, the periodic one) made
/// at once.
const PARALLEL: usize = 8;
/// Writes to clusters that refused the last one, made at once: a pool of
/// their own, so that clusters that do not answer do not hold up the rest.
const PARALLEL_RETRIES: usize = 8;
/// How long a first write may take: a cluster that does not answer soon
/// leaves the first pool for the retries'.
const FIRST_WAIT: Duration = Duration::from_secs(5);
/// How long a retried registration, or a removal, may take.
const WAIT: Duration = Duration::from_secs(20);
/// The longest pause between two tries in a cluster that refuses.
const MAX_PAUSE: Duration = Duration::from_secs(60);
/// How often a cluster's registrations are written again, give or take a
/// minute spread by its name.
const REWRITE_EVERY: Duration = Duration::from_secs(300);

/// The source under which a cluster's registration problems are reported
/// in the fleet's [`problems`](Fleet::problems).
pub(crate) fn source_of(cluster: &ClusterName) -> String {
    format!("webhook registration in cluster {:?}", cluster.as_str())
}

/// The clusters being kept, whose problems are cleared when keeping stops.
struct Kept {
    fleet: Fleet,
    clusters: HashMap<ClusterName, (Cluster, AbortHandle)>,
    /// Removals under way, by name: a cluster engaged again waits for its
    /// own before writing, so that the removal cannot take the new write.
    removing: HashMap<ClusterName, watch::Receiver<bool>>,
}

impl Drop for Kept {
    fn drop(&mut self) {
        for name in self.clusters.keys() {
            self.fleet.problems().clear(&source_of(name));
        }
    }
}

/// The pools writes wait in.
#[derive(Clone)]
struct Permits {
    first: Arc<Semaphore>,
    retries: Arc<Semaphore>,
}

/// Registers in every engaged cluster the plan selects, and keeps doing
/// so as clusters come and go and the CA changes, for as long as it is
/// polled. Dropped, it stops writing (registrations stay) and clears the
/// problems it reported.
pub(crate) async fn follow(fleet: Fleet, plan: Arc<Plan>, ca: watch::Receiver<Arc<str>>) {
    let permits = Permits {
        first: Arc::new(Semaphore::new(PARALLEL)),
        retries: Arc::new(Semaphore::new(PARALLEL_RETRIES)),
    };
    let FleetSubscription {
        clusters,
        mut events,
    } = fleet.subscribe();
    let mut kept = Kept {
        fleet: fleet.clone(),
        clusters: HashMap::new(),
        removing: HashMap::new(),
    };
    let mut tasks = JoinSet::new();
    let start = |cluster: Cluster, tasks: &mut JoinSet<()>, kept: &mut Kept| {
        let after = kept.removing.remove(cluster.name());
        let keep = keep(
            fleet.clone(),
            cluster.clone(),
            plan.clone(),
            ca.clone(),
            permits.clone(),
            after,
        );
        let handle = tasks.spawn(keep);
        if let Some((_, old)) = kept
            .clusters
            .insert(cluster.name().clone(), (cluster, handle))
        {
            old.abort();
        }
    };
    for cluster in clusters {
        if plan.selects(cluster.name()) {
            start(cluster, &mut tasks, &mut kept);
        }
    }
    loop {
        tokio::select! {
            event = events.recv() => match event {
                None => break,
                Some(FleetEvent::Engaged(cluster)) => {
                    if plan.selects(cluster.name()) {
                        start(cluster, &mut tasks, &mut kept);
                    }
                }
                Some(FleetEvent::Disengaged(name)) => {
                    if let Some((cluster, handle)) = kept.clusters.remove(&name) {
                        handle.abort();
                        fleet.problems().clear(&source_of(&name));
                        let (done, removed) = watch::channel(false);
                        kept.removing.insert(name.clone(), removed);
                        tasks.spawn(remove(cluster, plan.clone(), done));
                    }
                }
            },
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {
                // Removals that are over need no waiting for.
                kept.removing.retain(|_, removed| !*removed.borrow() && removed.has_changed().is_ok());
            }
        }
    }
}

/// Removes what this process wrote in a cluster that left, where it still
/// answers (a cluster gone for good cannot be cleaned, nor needs to), and
/// then says so through `done`.
async fn remove(cluster: Cluster, plan: Arc<Plan>, done: watch::Sender<bool>) {
    let name = cluster.name().as_str();
    let removed = tokio::time::timeout(WAIT, plan.unregister(&cluster.client(), Whose::Mine)).await;
    match removed {
        Ok(Ok(())) => {
            tracing::debug!(
                cluster = name,
                "webhook registrations removed from a cluster that left"
            );
        }
        Ok(Err(error)) => {
            tracing::info!(cluster = name, %error, "the webhook registrations of a cluster that left could not be removed");
        }
        Err(_) => {
            tracing::info!(
                cluster = name,
                "the webhook registrations of a cluster that left could not be removed in time"
            );
        }
    }
    done.send_replace(true);
}

/// Registers in one cluster (once `after`, a removal of an earlier
/// engagement, is over), and again whenever the CA changes and every few
/// minutes; while it fails, reports why and tries again after a growing
/// pause.
async fn keep(
    fleet: Fleet,
    cluster: Cluster,
    plan: Arc<Plan>,
    mut ca: watch::Receiver<Arc<str>>,
    permits: Permits,
    after: Option<watch::Receiver<bool>>,
) {
    if let Some(mut removed) = after {
        // An error is the removal's task gone: over all the same.
        let _ = removed.wait_for(|done| *done).await;
    }
    let source = source_of(cluster.name());
    let rewrite = REWRITE_EVERY + spread(cluster.name());
    let mut pause = Duration::from_secs(1);
    let mut failing = false;
    loop {
        let bundle = ca.borrow_and_update().clone();
        let result = {
            let (pool, wait) = if failing {
                (&permits.retries, WAIT)
            } else {
                (&permits.first, FIRST_WAIT)
            };
            let _permit = pool.acquire().await;
            tokio::time::timeout(
                wait,
                plan.register(&cluster.client(), cluster.name(), &bundle),
            )
            .await
            .unwrap_or_else(|_| Err(format!("no answer within {wait:?}")))
        };
        match result {
            Ok(()) => {
                fleet.problems().clear(&source);
                pause = Duration::from_secs(1);
                failing = false;
                tracing::debug!(cluster = cluster.name().as_str(), "webhooks registered");
                tokio::select! {
                    changed = ca.changed() => {
                        if changed.is_err() {
                            // The server is gone: nothing changes any more.
                            std::future::pending::<()>().await;
                        }
                    }
                    () = tokio::time::sleep(rewrite) => {}
                }
            }
            Err(error) => {
                tracing::warn!(cluster = cluster.name().as_str(), %error, "registering the webhooks");
                fleet.problems().report(&source, &error);
                failing = true;
                tokio::select! {
                    () = tokio::time::sleep(pause) => {}
                    Ok(()) = ca.changed() => {}
                }
                pause = (pause * 2).min(MAX_PAUSE);
            }
        }
    }
}

/// Up to a minute, the same for a name every time: clusters registered at
/// once are written again spread out.
fn spread(name: &ClusterName) -> Duration {
    let mut hasher = DefaultHasher::new();
    name.as_str().hash(&mut hasher);
    Duration::from_millis(hasher.finish() % 60_000)
}

/// Removes the registrations from every engaged cluster the plan selects,
/// whoever wrote them, a few at a time, each for at most [`WAIT`]; returns
/// the clusters where that failed, with why.
pub(crate) async fn unregister_all(fleet: &Fleet, plan: &Plan) -> Vec<(ClusterName, String)> {
    let clusters: Vec<Cluster> = fleet
        .clusters()
        .into_iter()
        .filter(|cluster| plan.selects(cluster.name()))
        .collect();
    futures::stream::iter(clusters)
        .map(|cluster| async move {
            let removed =
                tokio::time::timeout(WAIT, plan.unregister(&cluster.client(), Whose::Any))
                    .await
                    .unwrap_or_else(|_| Err(format!("no answer within {WAIT:?}")));
            removed.err().map(|error| (cluster.name().clone(), error))
        })
        .buffer_unordered(PARALLEL)
        .filter_map(std::future::ready)
        .collect()
        .await
}
