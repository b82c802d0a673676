//! The job fan-out controller: a `FanoutJob` in the hub describes a Job; the
//! controller runs that Job in the hub and in every member cluster, and
//! reports on the `FanoutJob` how they fare: each cluster's Job gathered into
//! `status.clusters` (`kube_multicluster::gather`), and a phase made from them.

#![allow(dead_code, unreachable_pub)]

use std::{sync::Arc, time::Duration};

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
    cache::WatchState,
    controller::{ClusterSelector, Watch},
    finalizer::Event,
    fleetwide::for_each_cluster,
    gather::{ClusterEntry, Gather, Read, entries_schema},
    ownership::{Children, PARENT_UID_LABEL, ParentRef},
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
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
    /// Each cluster's Job: its `value` is `Complete` or `Failed` once it
    /// ends, with the cluster's health and whether it is `stale`.
    #[serde(default)]
    #[schemars(schema_with = "cluster_entries")]
    pub clusters: Vec<ClusterEntry>,
}

fn cluster_entries(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::Schema::try_from(entries_schema()).expect("an object schema")
}

/// The finalizer that deletes a `FanoutJob`'s Jobs before it goes.
pub const FINALIZER: &str = "fleet.example.com/jobs";
/// The field manager of the status.
const MANAGER: &str = "job-fanout";
/// How a Job ended, gathered from each cluster: the type of its `Complete`
/// or `Failed` condition that holds, nothing while it runs.
const ENDED: &str =
    r#".status.conditions[?@.status=="True" && (@.type=="Complete" || @.type=="Failed")].type"#;

/// Runs the controller on `fleet`, whose local cluster is the hub: until
/// the fleet's controller stops.
pub async fn run(fleet: Fleet) -> Result<(), BoxError> {
    // The Jobs this controller made, in the hub and the members.
    let jobs = Watch::new(watcher::Config::default().labels(PARENT_UID_LABEL))
        .in_clusters(ClusterSelector::All);
    let children = Children::<Job>::new(&fleet, jobs.clone());
    let gather = Gather::new(&fleet, children.clone(), Read::field(ENDED)?)
        .manager(MANAGER)
        .local_name("hub");
    let controller = Controller::<FanoutJob>::new(&fleet, watcher::Config::default())
        .named("job-fanout")
        .clusters(ClusterSelector::Local)
        .owns_across::<Job>(jobs)
        // A member that joins gets every FanoutJob's Job.
        .reconcile_all_on(fleet.engagements().map(|_| ()))
        // Clusters that were down when a FanoutJob went are swept.
        .reconcile_on(children.sweeps(Duration::from_secs(5)))
        // A cluster that stops answering, or answers again, shows in the status.
        .reconcile_all_on(gather.changes(Duration::from_secs(1)));
    let reconcile = move |request: ObjectRequest<FanoutJob>| {
        let (fleet, children, gather) = (fleet.clone(), children.clone(), gather.clone());
        async move { reconcile(request, fleet, children, gather).await }
    };
    controller.run(service_fn(reconcile)).await?;
    Ok(())
}

async fn reconcile(
    request: ObjectRequest<FanoutJob>,
    fleet: Fleet,
    children: Children<Job>,
    gather: Gather<Job>,
) -> Result<Action, BoxError> {
    if request.object.is_none() {
        // Gone: Jobs left in clusters that were down when it went go now.
        gather.forget(&request.request);
        children.sweep(&request).await?;
        return Ok(Action::await_change());
    }
    request
        .finalize(FINALIZER, |event| async {
            match event {
                Event::Apply(fanout) => apply(&request, &fanout, &fleet, &children, &gather).await,
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
    gather: &Gather<Job>,
) -> Result<Action, BoxError> {
    let parent = ParentRef::of(request.cluster.name(), fanout.as_ref())?;
    let namespace = fanout.namespace().unwrap_or_default();
    // Jobs of an earlier FanoutJob of this name go; a cluster where that
    // fails holds up no other (its next sweep comes with the next run).
    if let Err(error) = children.sweep(request).await {
        tracing::warn!(%request, %error, "Jobs of an earlier FanoutJob of this name remain");
    }
    // Clusters whose Jobs are not all known yet (just joined, say) get
    // their Job once they are (their entries keep their last value).
    let known: Vec<ClusterName> = children
        .store()
        .clusters()
        .into_iter()
        .filter(|(_, state)| *state == WatchState::Synced)
        .map(|(name, _)| name)
        .collect();
    let existing = children.owned(request);
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
    for (cluster, error) in created.errors() {
        tracing::warn!(%request, cluster = %cluster, %error, "the Job was not created");
    }

    // Each cluster's Job gathered, and the phase made from them, in one apply.
    let gathered = gather.write_with(request, phase).await?;
    let action = if unknown.is_empty() && created.all_ok() {
        Action::await_change()
    } else {
        Action::requeue(Duration::from_secs(5))
    };
    Ok(gathered.merged(action))
}

/// `phase` and `message` from each cluster's entry: `Error` as soon as a
/// Job failed, `Finished` once every Job completed, `Running` otherwise.
/// A stale entry counts with its last value (a Job that ended stays ended);
/// after a restart, the entries of clusters not engaged yet are kept, so
/// the phase is never made from only the clusters engaged so far.
fn phase(entries: &[ClusterEntry]) -> Value {
    let clusters = |keep: fn(Option<&str>) -> bool| -> Vec<&str> {
        let kept = entries
            .iter()
            .filter(|entry| keep(entry.value.as_ref().and_then(Value::as_str)));
        kept.map(|entry| entry.cluster.as_str()).collect()
    };
    let failed = clusters(|ended| ended == Some("Failed"));
    let running = clusters(|ended| !matches!(ended, Some("Failed" | "Complete")));
    let (phase, message) = if entries.is_empty() {
        ("Running", "no cluster read yet".to_owned())
    } else if !failed.is_empty() {
        ("Error", format!("the Job failed in {}", failed.join(", ")))
    } else if running.is_empty() {
        (
            "Finished",
            format!("the Job completed in all {} clusters", entries.len()),
        )
    } else {
        ("Running", format!("waiting for {}", running.join(", ")))
    };
    json!({ "phase": phase, "message": message })
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
