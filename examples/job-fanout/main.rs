//! A `FanoutJob` in the hub runs its Job in the hub and in every member
//! cluster, and reports their progress back: `Running`, `Finished` once every
//! Job completed, `Error` as soon as one failed, naming the cluster.
//!
//! `cargo run --example job-fanout` starts a local fleet (a hub and two
//! members, real API servers), creates a `FanoutJob`, plays the Job
//! controller that bare API servers lack, and shows the status follow; then
//! deletes the `FanoutJob`, and its Jobs go from every cluster.

mod fanout;
#[path = "../support/mod.rs"]
mod support;

use fanout::{FanoutJob, FanoutJobSpec};
use k8s_openapi::api::batch::v1::Job;
use kube::{
    Api, CustomResourceExt,
    api::{DeleteParams, PostParams},
};
use kube_multicluster::envtest::Envtest;
use kube_multicluster::{ClusterName, Fleet, provider::ProgrammaticProvider};
use tower::BoxError;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    support::logging();
    let env = Envtest::start(3).await?;
    let hub = &env.clusters()[0];
    hub.install_crds([FanoutJob::crd()]).await?;

    // The hub is the local cluster; the members come from a provider.
    let fleet = Fleet::new();
    fleet.engage(ClusterName::local(), hub.client());
    let (provider, members) = ProgrammaticProvider::new();
    tokio::spawn({
        let fleet = fleet.clone();
        async move { fleet.run(provider).await }
    });
    members.engage("member-1", env.clusters()[1].client());
    members.engage("member-2", env.clusters()[2].client());
    let controller = tokio::spawn(fanout::run(fleet.clone()));

    let fanouts = Api::<FanoutJob>::namespaced(hub.client(), "default");
    let hello = FanoutJob::new(
        "hello",
        FanoutJobSpec {
            image: "busybox".into(),
            command: vec!["echo".into(), "hello".into()],
        },
    );
    fanouts.create(&PostParams::default(), &hello).await?;
    for cluster in env.clusters() {
        support::wait_for(&format!("the Job in {}", cluster.name()), || async {
            Ok(Api::<Job>::namespaced(cluster.client(), "default")
                .get_opt("hello")
                .await?
                .is_some())
        })
        .await?;
    }
    print_status(&fanouts, "Running").await?;

    tracing::info!("the Jobs complete, one cluster at a time");
    for cluster in env.clusters() {
        fanout::finish_job(cluster.client(), "default", "hello", true).await?;
    }
    print_status(&fanouts, "Finished").await?;

    tracing::info!("the FanoutJob is deleted: its Jobs go from every cluster");
    fanouts.delete("hello", &DeleteParams::default()).await?;
    for cluster in env.clusters() {
        support::wait_for(&format!("the Job in {} to go", cluster.name()), || async {
            Ok(Api::<Job>::namespaced(cluster.client(), "default")
                .get_opt("hello")
                .await?
                .is_none())
        })
        .await?;
    }
    support::wait_for("the FanoutJob to go", || async {
        Ok(fanouts.get_opt("hello").await?.is_none())
    })
    .await?;
    tracing::info!("done");
    // Stop the controller and the watches before the fleet's servers stop.
    controller.abort();
    for cluster in fleet.clusters() {
        fleet.disengage(cluster.name());
    }
    Ok(())
}

async fn print_status(fanouts: &Api<FanoutJob>, phase: &str) -> Result<(), BoxError> {
    support::wait_for(&format!("phase {phase}"), || async {
        let status = fanouts.get("hello").await?.status.unwrap_or_default();
        Ok(status.phase == phase)
    })
    .await?;
    let status = fanouts.get("hello").await?.status.unwrap_or_default();
    tracing::info!(phase = %status.phase, message = %status.message, clusters = ?status.clusters, "FanoutJob hello");
    Ok(())
}
