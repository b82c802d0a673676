//! Owner references across clusters on real API servers: a reconcile that
//! writes a child to another cluster with an owner reference to its parent
//! is refused before the write is sent (the member's garbage collector would
//! delete the child, and the next reconcile make it again, without end);
//! the same child in the parent's own cluster, and one marked with
//! `ParentRef::adopt` in the member, are written.

mod support;

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api, Resource, ResourceExt,
    api::{ObjectMeta, PostParams},
    runtime::watcher,
};
use kube_multicluster::envtest::Envtest;
use kube_multicluster::{
    Action, Controller, ObjectRequest,
    apply::apply,
    ownership::{OwnerReferenceAcross, ParentRef},
};
use support::{Running, capture_warnings, lines_with};
use tokio::sync::mpsc;
use tower::{BoxError, service_fn};

fn config_map(name: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("default".into()),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    }
}

/// What a reconcile's three writes came to: into the member with an owner
/// reference, the same in the parent's cluster, and adopted into the member.
#[derive(Debug)]
struct Writes {
    across: Result<(), String>,
    refused: Option<OwnerReferenceAcross>,
    at_home: Result<(), String>,
    adopted: Result<(), String>,
}

#[tokio::test]
async fn a_child_in_another_cluster_with_an_owner_reference_to_its_parent_is_refused() {
    let (logs, _guard) = capture_warnings();
    let env = Envtest::start(2).await.unwrap();
    let (hub, member) = (&env.clusters()[0], &env.clusters()[1]);
    let mut parent = config_map("parent");
    parent.labels_mut().insert("role".into(), "parent".into());
    Api::<ConfigMap>::default_namespaced(hub.client())
        .create(&PostParams::default(), &parent)
        .await
        .unwrap();

    let mut running = Running::new();
    let (tx, mut rx) = mpsc::unbounded_channel::<Writes>();
    let fleet = running.fleet.clone();
    let member_name = member.name().to_owned();
    let reconcile = service_fn(move |request: ObjectRequest<ConfigMap>| {
        let (fleet, tx, member_name) = (fleet.clone(), tx.clone(), member_name.clone());
        async move {
            let Some(parent) = request.object.clone() else {
                return Ok::<_, BoxError>(Action::await_change());
            };
            let member = fleet
                .get(member_name.as_str())
                .expect("the member is engaged");
            let mut child = config_map("child");
            child.metadata.owner_references = Some(vec![parent.controller_owner_ref(&()).unwrap()]);
            let into = |cluster: &kube_multicluster::Cluster| {
                Api::<ConfigMap>::default_namespaced(cluster.client())
            };
            let across = apply(&into(&member), "copier", &child).await;
            let refused = match &across {
                Err(kube::Error::Service(error)) => {
                    error.downcast_ref::<OwnerReferenceAcross>().cloned()
                }
                _ => None,
            };
            let at_home = apply(&into(&request.cluster), "copier", &child).await;
            let mut adopted = config_map("adopted");
            ParentRef::of(request.cluster.name(), parent.as_ref())?.adopt(&mut adopted);
            let adopted = apply(&into(&member), "copier", &adopted).await;
            let text = |result: Result<ConfigMap, kube::Error>| {
                result.map(drop).map_err(|e| e.to_string())
            };
            let _ = tx.send(Writes {
                across: text(across),
                refused,
                at_home: text(at_home),
                adopted: text(adopted),
            });
            Ok(Action::await_change())
        }
    });
    let controller = Controller::<ConfigMap>::new(
        &running.fleet,
        watcher::Config::default().labels("role=parent"),
    );
    running.spawn(controller, reconcile);
    running.add_all(&env);

    let writes = tokio::time::timeout(Duration::from_secs(60), rx.recv())
        .await
        .expect("the parent is reconciled")
        .unwrap();
    let refused = writes
        .refused
        .expect("the write across was refused with its own error");
    assert_eq!(refused.cluster.as_str(), member.name());
    assert_eq!(refused.owner_cluster.as_str(), hub.name());
    assert_eq!(refused.owner, "default/parent");
    let text = writes.across.unwrap_err();
    assert!(
        text.contains("ownerReferences") && text.contains("owns_across"),
        "{text}"
    );
    writes
        .at_home
        .expect("the child in its parent's own cluster is written");
    writes
        .adopted
        .expect("the adopted child is written to the member");

    let (in_hub, in_member) = (
        Api::<ConfigMap>::default_namespaced(hub.client()),
        Api::<ConfigMap>::default_namespaced(member.client()),
    );
    assert!(
        in_member.get_opt("child").await.unwrap().is_none(),
        "nothing was sent"
    );
    assert!(in_member.get_opt("adopted").await.unwrap().is_some());
    let home = in_hub.get("child").await.unwrap();
    assert_eq!(
        home.owner_references()[0].uid,
        Api::<ConfigMap>::default_namespaced(hub.client())
            .get("parent")
            .await
            .unwrap()
            .uid()
            .unwrap()
    );
    // A refused write says nothing of whether the member answers.
    let down = lines_with(&logs, &[member.name(), "does not answer"]);
    assert!(down.is_empty(), "{down:#?}");
}
