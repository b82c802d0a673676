//! The job fan-out controller: a `FanoutJob` in the hub describes a Job; the
//! controller runs that Job in the hub and in every member cluster, and
//! reports on the `FanoutJob` how they fare.

#![allow(dead_code, unreachable_pub)]

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use futures::StreamExt;
use k8s_openapi::api::{
    batch::v1::{Job, JobSpec},
    core::v1::{Container, PodSpec, PodTemplateSpec},
};
use kube::{
    Api, CustomResource, ResourceExt,
    api::{ObjectMeta, PostParams},
    runtime::watcher,
};
use kube_multicluster::{
    Action, Cluster, ClusterName, Controller, Fleet, ObjectRequest,
    apply::apply_status,
    cache::WatchState,
    controller::{ClusterSelector, Watch},
    finalizer::Event,
    fleetwide::for_each_cluster,
    ownership::{Children, PARENT_UID_LABEL, ParentRef},
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tower::{BoxError, service_fn};

/// A Job to run in every cluster of the fleet.
#[derive(CustomResource, Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
#[kube(
    group = "fleet.example.com",
    version = "v1alpha1",
    kind = "FanoutJob",
    namespaced,
    status = "FanoutJobStatus",
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#
)]
pub struct FanoutJobSpec {
    /// The container image the Job runs.
    pub image: String,
    /// The command it runs.
    #[serde(default)]
    pub command: Vec<String>,
}

/// How the Jobs fare: `Running`, `Finished` once every cluster's Job
/// completed, or `Error` as soon as one failed.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
pub struct FanoutJobStatus {
    /// `Running`, `Finished` or `Error`.
    pub phase: String,
    /// What the phase means, naming the clusters concerned.
    pub message: String,
    /// Each cluster's Job: `Running`, `Complete`, `Failed`, or why it is
    /// not there.
    pub clusters: BTreeMap<String, String>,
}

/// The finalizer that deletes a `FanoutJob`'s Jobs before it goes.
pub const FINALIZER: &str = "fleet.example.com/jobs";
/// The field manager of the status.
const MANAGER: &str = "job-fanout";

/// The local cluster's name in messages.
fn shown(cluster: &Cluster) -> String {
    if cluster.name().is_local() {
        "hub".to_owned()
    } else {
        cluster.name().to_string()
    }
}

/// Runs the controller on `fleet`, whose local cluster is the hub: until
/// the fleet's controller stops.
pub async fn run(fleet: Fleet) -> Result<(), BoxError> {
    // The Jobs this controller made, in the hub and the members.
    let jobs = Watch::new(watcher::Config::default().labels(PARENT_UID_LABEL))
        .in_clusters(ClusterSelector::All);
    let children = Children::<Job>::new(&fleet, jobs.clone());
    let controller = Controller::<FanoutJob>::new(&fleet, watcher::Config::default())
        .named("job-fanout")
        .clusters(ClusterSelector::Local)
        .owns_across::<Job>(jobs)
        // A member that joins gets every FanoutJob's Job.
        .reconcile_all_on(fleet.engagements().map(|_| ()))
        // Clusters that were down when a FanoutJob went are swept.
        .reconcile_on(children.sweeps(Duration::from_secs(5)));
    let reconcile = move |request: ObjectRequest<FanoutJob>| {
        let (fleet, children) = (fleet.clone(), children.clone());
        async move { reconcile(request, fleet, children).await }
    };
    controller.run(service_fn(reconcile)).await?;
    Ok(())
}

async fn reconcile(
    request: ObjectRequest<FanoutJob>,
    fleet: Fleet,
    children: Children<Job>,
) -> Result<Action, BoxError> {
    if request.object.is_none() {
        // Gone: Jobs left in clusters that were down when it went go now.
        children.sweep(&request).await?;
        return Ok(Action::await_change());
    }
    request
        .finalize(FINALIZER, |event| async {
            match event {
                Event::Apply(fanout) => apply(&request, &fanout, &fleet, &children).await,
                Event::Cleanup(_) => {
                    let deleted = children.delete(&request, Duration::from_secs(10)).await?;
                    tracing::info!(request = %request, deleted = deleted.deleted.len(), skipped = ?deleted.skipped, "Jobs deleted");
                    Ok(Action::await_change())
                }
            }
        })
        .await
}

/// Makes sure every cluster has the Job, and reports how they fare.
async fn apply(
    request: &ObjectRequest<FanoutJob>,
    fanout: &Arc<FanoutJob>,
    fleet: &Fleet,
    children: &Children<Job>,
) -> Result<Action, BoxError> {
    let parent = ParentRef::of(request.cluster.name(), fanout.as_ref())?;
    let namespace = fanout.namespace().unwrap_or_default();
    // Jobs of an earlier FanoutJob of this name go; a cluster where that
    // fails holds up no other (its next sweep comes with the next run).
    if let Err(error) = children.sweep(request).await {
        tracing::warn!(%request, %error, "Jobs of an earlier FanoutJob of this name remain");
    }
    // Clusters whose Jobs are not all known yet (just joined, say) keep
    // their last state, and get their Job once they are.
    let known: Vec<ClusterName> = children
        .store()
        .clusters()
        .into_iter()
        .filter(|(_, state)| *state == WatchState::Synced)
        .map(|(name, _)| name)
        .collect();
    let existing = children.owned(request);
    let previous = fanout.status.clone().unwrap_or_default();
    let job = job(fanout, &parent);
    // Create the Job where it is missing; a Job's template cannot change.
    let (mut clusters, unknown): (Vec<Cluster>, Vec<Cluster>) = fleet
        .clusters()
        .into_iter()
        .partition(|cluster| known.contains(cluster.name()));
    clusters.sort_by(|a, b| a.name().cmp(b.name()));
    let created = for_each_cluster(clusters, 8, Duration::from_secs(10), |cluster| {
        let has = existing
            .iter()
            .any(|child| child.cluster == *cluster.name());
        let (job, namespace) = (job.clone(), namespace.clone());
        async move {
            if !has {
                let api = Api::<Job>::namespaced(cluster.client(), &namespace);
                match api.create(&PostParams::default(), &job).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(status)) if status.code == 409 => {}
                    Err(error) => return Err(error.into()),
                }
            }
            Ok(cluster)
        }
    })
    .await;

    // Each cluster's Job, as its cluster's cache has it.
    let mut status = FanoutJobStatus::default();
    let (mut failed, mut running) = (Vec::new(), Vec::new());
    for (name, outcome) in &created.outcomes {
        let label = if name.is_local() {
            "hub".to_owned()
        } else {
            name.to_string()
        };
        let state = match outcome {
            Err(error) => {
                running.push(label.clone());
                format!("not created: {error}")
            }
            Ok(cluster) => {
                let found = existing
                    .iter()
                    .find(|child| child.cluster == *cluster.name());
                match found.map(|child| job_state(&child.object)) {
                    Some("Failed") => {
                        failed.push(shown(cluster));
                        "Failed".to_owned()
                    }
                    Some("Complete") => "Complete".to_owned(),
                    _ => {
                        running.push(shown(cluster));
                        "Running".to_owned()
                    }
                }
            }
        };
        status.clusters.insert(label, state);
    }
    for cluster in &unknown {
        let label = shown(cluster);
        let last = previous.clusters.get(&label).cloned();
        let state = last.unwrap_or_else(|| "Unknown".to_owned());
        match state.as_str() {
            "Failed" => failed.push(label.clone()),
            "Complete" => {}
            _ => running.push(label.clone()),
        }
        status.clusters.insert(label, state);
    }
    failed.sort();
    running.sort();
    (status.phase, status.message) = if !failed.is_empty() {
        (
            "Error".into(),
            format!("the Job failed in {}", failed.join(", ")),
        )
    } else if running.is_empty() {
        (
            "Finished".into(),
            format!(
                "the Job completed in all {} clusters",
                status.clusters.len()
            ),
        )
    } else {
        (
            "Running".into(),
            format!("waiting for {}", running.join(", ")),
        )
    };
    if fanout.status.as_ref() != Some(&status) {
        let api = Api::<FanoutJob>::namespaced(request.cluster.client(), &namespace);
        apply_status(&api, MANAGER, &fanout.name_any(), &status).await?;
    }
    if unknown.is_empty() {
        Ok(Action::await_change())
    } else {
        Ok(Action::requeue(Duration::from_secs(5)))
    }
}

/// The Job a `FanoutJob` asks for, marked as its child.
fn job(fanout: &FanoutJob, parent: &ParentRef) -> Job {
    let mut job = Job {
        metadata: ObjectMeta {
            name: Some(fanout.name_any()),
            ..ObjectMeta::default()
        },
        spec: Some(JobSpec {
            backoff_limit: Some(0),
            template: PodTemplateSpec {
                metadata: None,
                spec: Some(PodSpec {
                    restart_policy: Some("Never".into()),
                    containers: vec![Container {
                        name: "job".into(),
                        image: Some(fanout.spec.image.clone()),
                        command: Some(fanout.spec.command.clone()).filter(|c| !c.is_empty()),
                        ..Container::default()
                    }],
                    ..PodSpec::default()
                }),
            },
            ..JobSpec::default()
        }),
        status: None,
    };
    parent.adopt(&mut job);
    job
}

/// `Complete`, `Failed`, or `Running`, by the Job's conditions.
pub fn job_state(job: &Job) -> &'static str {
    let conditions = job.status.as_ref().and_then(|s| s.conditions.as_ref());
    let holds = |kind: &str| {
        conditions.is_some_and(|c| c.iter().any(|c| c.type_ == kind && c.status == "True"))
    };
    if holds("Failed") {
        "Failed"
    } else if holds("Complete") {
        "Complete"
    } else {
        "Running"
    }
}

/// Plays the Job controller, which a bare API server lacks: marks the Job
/// `name` in `namespace` as completed, or as failed, through its status.
pub async fn finish_job(
    client: kube::Client,
    namespace: &str,
    name: &str,
    succeeded: bool,
) -> Result<(), kube::Error> {
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let condition = |type_: &str| {
        serde_json::json!({
            "type": type_, "status": "True", "reason": "Played", "message": "set through the API",
            "lastProbeTime": now, "lastTransitionTime": now,
        })
    };
    let status = if succeeded {
        serde_json::json!({
            "startTime": now, "completionTime": now, "succeeded": 1, "active": 0,
            "conditions": [condition("SuccessCriteriaMet"), condition("Complete")],
        })
    } else {
        serde_json::json!({
            "startTime": now, "failed": 1, "active": 0,
            "conditions": [condition("FailureTarget"), condition("Failed")],
        })
    };
    Api::<Job>::namespaced(client, namespace)
        .patch_status(
            name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({ "status": status })),
        )
        .await?;
    Ok(())
}
