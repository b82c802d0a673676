//! Kubernetes Events recorded by a reconciler land in the reconciled
//! object's own cluster, reported by the controller.

mod support;

use std::time::Duration;

use k8s_openapi::api::{core::v1::ConfigMap, events::v1::Event as K8sEvent};
use kube::{
    Api,
    api::ListParams,
    runtime::{
        events::{Event, EventType},
        watcher,
    },
};
use kube_multicluster::envtest::Envtest;
use kube_multicluster::{Action, Controller, Fleet, ObjectRequest};
use support::{PATIENCE, create_config_map};
use tower::{BoxError, service_fn};

async fn events(api: &Api<K8sEvent>) -> Vec<K8sEvent> {
    api.list(&ListParams::default())
        .await
        .expect("a list of Events")
        .items
}

#[tokio::test]
async fn a_reconciler_records_events_on_its_object_in_that_objects_cluster() {
    let env = Envtest::start(2).await.expect("envtest");
    for (i, cluster) in env.clusters().iter().enumerate() {
        create_config_map(cluster.client(), &format!("only-in-{i}")).await;
    }
    let fleet = Fleet::new();
    for cluster in env.clusters() {
        fleet.engage(cluster.name(), cluster.client());
    }
    let controller =
        Controller::<ConfigMap>::new(&fleet, watcher::Config::default()).named("eventful");
    let run = tokio::spawn(controller.run(service_fn(
        |request: ObjectRequest<ConfigMap>| async move {
            if request.request.name.starts_with("only-in-") {
                let note = format!("seen in {}", request.cluster.name());
                // Twice: the second is counted on the first, not written anew.
                for _ in 0..2 {
                    request
                        .publish(&Event {
                            type_: EventType::Normal,
                            reason: "Seen".into(),
                            note: Some(note.clone()),
                            action: "Reconcile".into(),
                            secondary: None,
                        })
                        .await?;
                }
            }
            Ok::<_, BoxError>(Action::await_change())
        },
    )));

    for (i, cluster) in env.clusters().iter().enumerate() {
        let api = Api::<K8sEvent>::namespaced(cluster.client(), "default");
        let deadline = tokio::time::Instant::now() + PATIENCE;
        let recorded = loop {
            let recorded: Vec<K8sEvent> = events(&api)
                .await
                .into_iter()
                .filter(|e| e.reason.as_deref() == Some("Seen"))
                .collect();
            if recorded.first().is_some_and(|e| e.series.is_some()) {
                break recorded;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no Event in {}",
                cluster.name()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert_eq!(recorded.len(), 1, "one Event, counted twice: {recorded:?}");
        let event = &recorded[0];
        let regarding = event.regarding.as_ref().expect("regarding");
        assert_eq!(
            regarding.name.as_deref(),
            Some(format!("only-in-{i}").as_str())
        );
        assert_eq!(regarding.kind.as_deref(), Some("ConfigMap"));
        assert!(regarding.uid.is_some(), "the object's UID");
        assert_eq!(event.reporting_controller.as_deref(), Some("eventful"));
        assert_eq!(
            event.note.as_deref(),
            Some(format!("seen in {}", cluster.name()).as_str())
        );
        assert_eq!(event.series.as_ref().map(|s| s.count), Some(2));
    }
    run.abort();
}
