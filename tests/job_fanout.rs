//! The job fan-out example's controller on real API servers: Jobs in the hub
//! and every member, status aggregated back, and cleanup across clusters,
//! also of clusters that were down when their parent went.

#[path = "../examples/job-fanout/fanout.rs"]
mod fanout;
mod support;

use support::eventually;

use std::time::Duration;

use fanout::{FanoutJob, FanoutJobSpec, FanoutJobStatus};
use k8s_openapi::api::batch::v1::Job;
use kube::{
    Api, Client, CustomResourceExt,
    api::{DeleteParams, PostParams},
};
use kube_multicluster::envtest::{Envtest, TestCluster};
use kube_multicluster::{
    ClusterName, Fleet,
    ownership::{PARENT_ANNOTATION, PARENT_UID_LABEL},
    provider::{ProgrammaticHandle, ProgrammaticProvider},
};
use serde_json::json;
use tower::BoxError;

struct Setup {
    env: Envtest,
    fleet: Fleet,
    members: ProgrammaticHandle,
    fanouts: Api<FanoutJob>,
    controller: tokio::task::JoinHandle<Result<(), BoxError>>,
}

impl Drop for Setup {
    fn drop(&mut self) {
        self.controller.abort();
    }
}

/// A hub (the local cluster) with the controller running, and `n` members
/// that are not engaged yet.
async fn setup(members: usize) -> Setup {
    let env = Envtest::start(members + 1).await.unwrap();
    let hub = &env.clusters()[0];
    hub.install_crds([FanoutJob::crd()]).await.unwrap();
    let fleet = Fleet::new();
    fleet.engage(ClusterName::local(), hub.client());
    let (provider, handle) = ProgrammaticProvider::new();
    tokio::spawn({
        let fleet = fleet.clone();
        async move { fleet.run(provider).await }
    });
    let controller = tokio::spawn(fanout::run(fleet.clone()));
    Setup {
        fanouts: Api::namespaced(hub.client(), "default"),
        env,
        fleet,
        members: handle,
        controller,
    }
}

fn member(setup: &Setup, i: usize) -> &TestCluster {
    &setup.env.clusters()[i]
}

async fn create(fanouts: &Api<FanoutJob>, name: &str) {
    let spec = FanoutJobSpec {
        image: "busybox".into(),
        command: vec!["true".into()],
    };
    fanouts
        .create(&PostParams::default(), &FanoutJob::new(name, spec))
        .await
        .unwrap();
}

async fn job(client: Client, name: &str) -> Option<Job> {
    Api::<Job>::namespaced(client, "default")
        .get_opt(name)
        .await
        .unwrap()
}

async fn status(fanouts: &Api<FanoutJob>, name: &str) -> FanoutJobStatus {
    fanouts.get(name).await.unwrap().status.unwrap_or_default()
}

async fn phase_is(fanouts: &Api<FanoutJob>, name: &str, phase: &str) -> FanoutJobStatus {
    eventually(&format!("phase {phase}"), || async {
        status(fanouts, name).await.phase == phase
    })
    .await;
    status(fanouts, name).await
}

#[tokio::test]
async fn a_fanout_job_runs_everywhere_and_reports_running_finished_and_the_failed_cluster() {
    let setup = setup(2).await;
    setup.members.engage("member-1", member(&setup, 1).client());
    setup.members.engage("member-2", member(&setup, 2).client());
    create(&setup.fanouts, "ok").await;
    for cluster in setup.env.clusters() {
        eventually("the Job everywhere", || async {
            job(cluster.client(), "ok").await.is_some()
        })
        .await;
    }
    // Each Job names its parent: cluster, kind, namespace, name and UID.
    let parent = setup.fanouts.get("ok").await.unwrap();
    let child = job(member(&setup, 2).client(), "ok").await.unwrap();
    let labels = child.metadata.labels.unwrap_or_default();
    assert_eq!(labels.get(PARENT_UID_LABEL), parent.metadata.uid.as_ref());
    let annotation: serde_json::Value =
        serde_json::from_str(&child.metadata.annotations.unwrap_or_default()[PARENT_ANNOTATION])
            .unwrap();
    assert_eq!(annotation["kind"], "FanoutJob");
    assert_eq!(annotation["namespace"], "default");
    assert_eq!(annotation["name"], "ok");
    assert_eq!(annotation["cluster"], "");

    // Every cluster's Job shows, once the status has caught up with them.
    eventually("Running in all 3 clusters", || async {
        let now = status(&setup.fanouts, "ok").await;
        now.phase == "Running" && now.clusters.len() == 3
    })
    .await;

    // Two of three complete: still running, waiting for the third.
    fanout::finish_job(member(&setup, 0).client(), "default", "ok", true)
        .await
        .unwrap();
    fanout::finish_job(member(&setup, 1).client(), "default", "ok", true)
        .await
        .unwrap();
    eventually("two complete", || async {
        let status = status(&setup.fanouts, "ok").await;
        status
            .clusters
            .iter()
            .filter(|entry| entry.value == Some(json!("Complete")))
            .count()
            == 2
    })
    .await;
    let waiting = status(&setup.fanouts, "ok").await;
    assert_eq!(waiting.phase, "Running");
    assert_eq!(waiting.message, "waiting for member-2");

    fanout::finish_job(member(&setup, 2).client(), "default", "ok", true)
        .await
        .unwrap();
    let finished = phase_is(&setup.fanouts, "ok", "Finished").await;
    assert_eq!(finished.message, "the Job completed in all 3 clusters");

    // Another fans out and fails in one member: an error naming it, at once.
    create(&setup.fanouts, "bad").await;
    eventually("the second Job in member-1", || async {
        job(member(&setup, 1).client(), "bad").await.is_some()
    })
    .await;
    fanout::finish_job(member(&setup, 1).client(), "default", "bad", false)
        .await
        .unwrap();
    let failed = phase_is(&setup.fanouts, "bad", "Error").await;
    assert_eq!(failed.message, "the Job failed in member-1");
    let member_1 = failed.clusters.iter().find(|e| e.cluster == "member-1");
    assert_eq!(
        member_1.and_then(|e| e.value.clone()),
        Some(json!("Failed"))
    );
}

#[tokio::test]
async fn a_member_that_joins_later_gets_the_job() {
    let setup = setup(1).await;
    create(&setup.fanouts, "late").await;
    eventually("the Job in the hub", || async {
        job(member(&setup, 0).client(), "late").await.is_some()
    })
    .await;
    assert!(job(member(&setup, 1).client(), "late").await.is_none());
    setup.members.engage("member-1", member(&setup, 1).client());
    eventually("the Job in the member that joined", || async {
        job(member(&setup, 1).client(), "late").await.is_some()
    })
    .await;
    eventually("the member in the status", || async {
        status(&setup.fanouts, "late")
            .await
            .clusters
            .iter()
            .any(|entry| entry.cluster == "member-1")
    })
    .await;
}

#[tokio::test]
async fn deleting_the_parent_deletes_its_jobs_everywhere_also_in_clusters_that_were_down() {
    let setup = setup(2).await;
    // member-1 is reached through a link of its own, to cut off the
    // controller alone while the test still reads the cluster.
    let link = member(&setup, 1).link().unwrap();
    setup.members.engage("member-1", link.client());
    setup.members.engage("member-2", member(&setup, 2).client());
    create(&setup.fanouts, "gone").await;
    for cluster in setup.env.clusters() {
        eventually("the Job everywhere", || async {
            job(cluster.client(), "gone").await.is_some()
        })
        .await;
    }
    phase_is(&setup.fanouts, "gone", "Running").await;

    // member-1 does not answer; member-2 has left the fleet.
    link.cut_off();
    setup.members.disengage("member-2");
    eventually("member-2 to leave", || async {
        setup.fleet.get("member-2").is_none()
    })
    .await;
    setup
        .fanouts
        .delete("gone", &DeleteParams::default())
        .await
        .unwrap();
    // The parent does not wait for them: it goes, and so does the hub's Job.
    eventually("the parent to go", || async {
        setup.fanouts.get_opt("gone").await.unwrap().is_none()
    })
    .await;
    eventually("the hub's Job to go", || async {
        job(member(&setup, 0).client(), "gone").await.is_none()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        job(member(&setup, 1).client(), "gone").await.is_some(),
        "member-1 was cut off"
    );
    assert!(
        job(member(&setup, 2).client(), "gone").await.is_some(),
        "member-2 had left"
    );

    // member-1 answers again, without leaving the fleet: swept.
    link.restore();
    eventually("member-1's orphan to go", || async {
        job(member(&setup, 1).client(), "gone").await.is_none()
    })
    .await;
    // member-2 is engaged again: its children are listed, and swept.
    setup.members.engage("member-2", member(&setup, 2).client());
    eventually("member-2's orphan to go", || async {
        job(member(&setup, 2).client(), "gone").await.is_none()
    })
    .await;
}

#[tokio::test]
async fn a_parent_made_again_under_its_name_gets_its_own_job_in_a_member_that_was_down() {
    let setup = setup(1).await;
    let link = member(&setup, 1).link().unwrap();
    setup.members.engage("member-1", link.client());
    create(&setup.fanouts, "p").await;
    eventually("Job in member", || async {
        job(member(&setup, 1).client(), "p").await.is_some()
    })
    .await;
    link.cut_off();
    setup
        .fanouts
        .delete("p", &DeleteParams::default())
        .await
        .unwrap();
    eventually("parent gone", || async {
        setup.fanouts.get_opt("p").await.unwrap().is_none()
    })
    .await;
    create(&setup.fanouts, "p").await;
    let uid = setup.fanouts.get("p").await.unwrap().metadata.uid.unwrap();
    link.restore();
    eventually("the member's Job to belong to the new parent", || async {
        job(member(&setup, 1).client(), "p")
            .await
            .and_then(|j| j.metadata.labels)
            .is_some_and(|l| l.get(PARENT_UID_LABEL) == Some(&uid))
    })
    .await;
}

/// A Finished FanoutJob stays Finished when a member is engaged again (new
/// credentials, say) and its new watch has not synced yet.
#[tokio::test]
async fn a_finished_fanout_stays_finished_when_a_member_is_engaged_again() {
    let setup = setup(1).await;
    setup.members.engage("member-1", member(&setup, 1).client());
    create(&setup.fanouts, "f").await;
    for cluster in setup.env.clusters() {
        eventually("Job", || async {
            job(cluster.client(), "f").await.is_some()
        })
        .await;
        fanout::finish_job(cluster.client(), "default", "f", true)
            .await
            .unwrap();
    }
    phase_is(&setup.fanouts, "f", "Finished").await;
    // The same member, engaged again through a slow link.
    let link = member(&setup, 1).link().unwrap();
    link.hang();
    setup.members.engage("member-1", link.client());
    tokio::time::sleep(Duration::from_secs(12)).await;
    let status = status(&setup.fanouts, "f").await;
    assert_eq!(status.phase, "Finished", "{status:?}");
}
