//! Keeping the registrations current as the fleet changes: written when a
//! cluster is engaged, written again when the CA changes, retried with a
//! growing pause while a cluster refuses them, removed when it leaves.

use std::{collections::HashMap, sync::Arc, time::Duration};

use futures::StreamExt;
use kube_fleet::{Cluster, ClusterName, Fleet, FleetEvent, FleetSubscription};
use tokio::{
    sync::{Semaphore, watch},
    task::{AbortHandle, JoinSet},
};

use super::{Plan, Whose};

/// Clusters written to at once.
const PARALLEL: usize = 8;
/// How long one cluster's registration (or removal) may take.
const WAIT: Duration = Duration::from_secs(20);
/// The longest pause between two tries in a cluster that refuses.
const MAX_PAUSE: Duration = Duration::from_secs(60);

/// The source under which a cluster's registration problems are reported
/// in the fleet's [`problems`](Fleet::problems).
pub(crate) fn source_of(cluster: &ClusterName) -> String {
    format!("webhook registration in cluster {:?}", cluster.as_str())
}

/// Registers in every engaged cluster the plan selects, and keeps doing
/// so as clusters come and go and the CA changes, for as long as it is
/// polled. Dropped, it stops writing (registrations stay).
pub(crate) async fn follow(fleet: Fleet, plan: Arc<Plan>, ca: watch::Receiver<Arc<str>>) {
    let permits = Arc::new(Semaphore::new(PARALLEL));
    let FleetSubscription {
        clusters,
        mut events,
    } = fleet.subscribe();
    let mut kept: HashMap<ClusterName, (Cluster, AbortHandle)> = HashMap::new();
    let mut tasks = JoinSet::new();
    let start = |cluster: Cluster,
                 tasks: &mut JoinSet<()>,
                 kept: &mut HashMap<ClusterName, (Cluster, AbortHandle)>| {
        let keep = keep(
            fleet.clone(),
            cluster.clone(),
            plan.clone(),
            ca.clone(),
            permits.clone(),
        );
        let handle = tasks.spawn(keep);
        if let Some((_, old)) = kept.insert(cluster.name().clone(), (cluster, handle)) {
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
                    if let Some((cluster, handle)) = kept.remove(&name) {
                        handle.abort();
                        fleet.problems().clear(&source_of(&name));
                        let plan = plan.clone();
                        tasks.spawn(async move {
                            // Where the cluster still answers; a cluster
                            // gone for good cannot be cleaned, nor needs to.
                            let removed = tokio::time::timeout(WAIT, plan.unregister(&cluster.client(), Whose::Mine)).await;
                            match removed {
                                Ok(Ok(())) => tracing::debug!(cluster = name.as_str(), "webhook registrations removed from a cluster that left"),
                                Ok(Err(error)) => tracing::info!(cluster = name.as_str(), %error, "the webhook registrations of a cluster that left could not be removed"),
                                Err(_) => tracing::info!(cluster = name.as_str(), "the webhook registrations of a cluster that left could not be removed in time"),
                            }
                        });
                    }
                }
            },
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
        }
    }
}

/// Registers in one cluster, and again whenever the CA changes; while it
/// fails, reports why and tries again after a growing pause.
async fn keep(
    fleet: Fleet,
    cluster: Cluster,
    plan: Arc<Plan>,
    mut ca: watch::Receiver<Arc<str>>,
    permits: Arc<Semaphore>,
) {
    let source = source_of(cluster.name());
    let mut pause = Duration::from_secs(1);
    loop {
        let bundle = ca.borrow_and_update().clone();
        let result = {
            let _permit = permits.acquire().await;
            tokio::time::timeout(
                WAIT,
                plan.register(&cluster.client(), cluster.name(), &bundle),
            )
            .await
            .unwrap_or_else(|_| Err(format!("no answer within {WAIT:?}")))
        };
        match result {
            Ok(()) => {
                fleet.problems().clear(&source);
                pause = Duration::from_secs(1);
                tracing::debug!(cluster = cluster.name().as_str(), "webhooks registered");
                if ca.changed().await.is_err() {
                    // The server is gone: nothing changes any more.
                    std::future::pending::<()>().await;
                }
            }
            Err(error) => {
                tracing::warn!(cluster = cluster.name().as_str(), %error, "registering the webhooks");
                fleet.problems().report(&source, &error);
                tokio::select! {
                    () = tokio::time::sleep(pause) => {}
                    Ok(()) = ca.changed() => {}
                }
                pause = (pause * 2).min(MAX_PAUSE);
            }
        }
    }
}

/// Removes the registrations from every engaged cluster the plan selects,
/// a few at a time, each for at most [`WAIT`]; returns the clusters where
/// that failed, with why.
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
