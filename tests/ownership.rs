//! Cross-cluster ownership on real API servers: a parent whose cleanup
//! skipped a cluster is asked for again only until that cluster is known to
//! hold none of its children.

mod support;

use support::eventually;

use std::{sync::Arc, time::Duration};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, ObjectMeta, Patch, PatchParams, PostParams},
    runtime::watcher,
};
use kube_multicluster::envtest::Envtest;
use kube_multicluster::{
    Action, ClusterName, Controller, Fleet, ObjectRequest,
    controller::{ClusterSelector, Watch},
    finalizer::Event,
    ownership::{Children, PARENT_UID_LABEL, ParentRef},
};
use tokio::sync::mpsc;
use tower::{BoxError, service_fn};

fn cm(name: &str, labels: &[(&str, &str)]) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("default".into()),
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    }
}

fn start(fleet: &Fleet) -> (Children<ConfigMap>, mpsc::UnboundedReceiver<String>) {
    let copies = Watch::new(watcher::Config::default().labels(PARENT_UID_LABEL))
        .in_clusters(ClusterSelector::Provided);
    let children = Children::<ConfigMap>::new(fleet, copies.clone());
    let (tx, rx) = mpsc::unbounded_channel();
    // As the docs wire it: a child that reaches its cluster's store only
    // after the parent's cleanup read it wakes the parent, whose sweep
    // deletes it.
    let controller = Controller::<ConfigMap>::new(fleet, watcher::Config::default())
        .clusters(ClusterSelector::Local)
        .owns_across::<ConfigMap>(copies)
        .reconcile_on(children.sweeps(Duration::from_millis(200)));
    let fleet2 = fleet.clone();
    let ch = children.clone();
    let tx = Arc::new(tx);
    tokio::spawn(controller.run(service_fn(move |request: ObjectRequest<ConfigMap>| {
        let (children, fleet, tx) = (ch.clone(), fleet2.clone(), tx.clone());
        async move {
            let _ = tx.send(request.request.name.clone());
            if request.object.is_none() {
                children.sweep(&request).await?;
                return Ok(Action::await_change());
            }
            let object = request.object.as_deref();
            let wanted = object.is_some_and(|p| p.labels().get("parent").is_some_and(|v| v == "yes"));
            let finalizing = object.is_some_and(|p| {
                p.finalizers().iter().any(|f| f == "adv.example.com/children")
            });
            if !wanted && !finalizing {
                children.release(&request).await?;
            }
            request
                .finalize_if(wanted, "adv.example.com/children", |event| async {
                    match event {
                        Event::Apply(parent) => {
                            let parent = ParentRef::of(request.cluster.name(), parent.as_ref())?;
                            let m1 = fleet.get("m1").unwrap();
                            let mut child = cm(&request.request.name, &[]);
                            parent.adopt(&mut child);
                            match Api::<ConfigMap>::namespaced(m1.client(), "default")
                                .create(&PostParams::default(), &child)
                                .await
                            {
                                Ok(_) => {}
                                Err(kube::Error::Api(s)) if s.code == 409 => {}
                                Err(e) => return Err(e.into()),
                            }
                        }
                        Event::Cleanup(_) => {
                            let done = children.delete(&request, Duration::from_secs(2)).await?;
                            tracing::info!(deleted = ?done.deleted, skipped = ?done.skipped, "cleanup");
                        }
                    }
                    Ok::<_, BoxError>(Action::await_change())
                })
                .await
        }
    })));
    (children, rx)
}

/// A hub and one member, the controller of `start` running, and a parent
/// `name` in the hub whose child has reached the member.
async fn hub_and_member_with_child(
    name: &str,
) -> (
    Envtest,
    Children<ConfigMap>,
    Api<ConfigMap>,
    Api<ConfigMap>,
    ConfigMap,
) {
    let env = Envtest::start(2).await.unwrap();
    let fleet = Fleet::new();
    fleet.engage(ClusterName::local(), env.clusters()[0].client());
    fleet.engage("m1", env.clusters()[1].client());
    let (children, _rx) = start(&fleet);
    let hub = Api::<ConfigMap>::namespaced(env.clusters()[0].client(), "default");
    let m1 = Api::<ConfigMap>::namespaced(env.clusters()[1].client(), "default");
    let parent = parent_with_child(&hub, &m1, name).await;
    (env, children, hub, m1, parent)
}

/// Makes the parent `name` in the hub and waits for its child in m1.
async fn parent_with_child(hub: &Api<ConfigMap>, m1: &Api<ConfigMap>, name: &str) -> ConfigMap {
    let parent = hub
        .create(&PostParams::default(), &cm(name, &[("parent", "yes")]))
        .await
        .unwrap();
    eventually("child in m1", || async {
        m1.get_opt(name).await.unwrap().is_some()
    })
    .await;
    parent
}

/// Removes the parent `name`'s label, and waits for its child in m1 and its
/// finalizer to go.
async fn released(hub: &Api<ConfigMap>, m1: &Api<ConfigMap>, name: &str) {
    hub.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({ "metadata": { "labels": { "parent": null } } })),
    )
    .await
    .unwrap();
    eventually("child gone", || async {
        m1.get_opt(name).await.unwrap().is_none()
    })
    .await;
    eventually("finalizer gone", || async {
        let parent = hub.get(name).await.unwrap();
        parent.metadata.finalizers.unwrap_or_default().is_empty()
    })
    .await;
}

/// A hub, a member m1, and a member m2 whose watches are forbidden (never
/// synced), with the controller of `start` running.
async fn with_a_member_that_cannot_sync() -> (
    Envtest,
    Children<ConfigMap>,
    mpsc::UnboundedReceiver<String>,
    Api<ConfigMap>,
    Api<ConfigMap>,
) {
    let env = Envtest::start(2).await.unwrap();
    let fleet = Fleet::new();
    fleet.engage(ClusterName::local(), env.clusters()[0].client());
    fleet.engage("m1", env.clusters()[1].client());
    // Same server, no RBAC: its watches are forbidden, never synced.
    fleet.engage("m2", env.clusters()[1].client_for("alice", &[]).unwrap());
    let (children, rx) = start(&fleet);
    let hub = Api::<ConfigMap>::namespaced(env.clusters()[0].client(), "default");
    let m1 = Api::<ConfigMap>::namespaced(env.clusters()[1].client(), "default");
    (env, children, rx, hub, m1)
}

/// Deletes the parent `name` in the hub and waits for it to be gone.
async fn deleted(hub: &Api<ConfigMap>, name: &str) {
    hub.delete(name, &DeleteParams::default()).await.unwrap();
    eventually("parent gone", || async {
        hub.get_opt(name).await.unwrap().is_none()
    })
    .await;
}

/// Makes a child `name` of `parent` in m1, as a late writer would, and
/// waits for it to be deleted.
async fn late_child_goes(m1: &Api<ConfigMap>, parent: &ConfigMap, name: &str) {
    let mut late = cm(name, &[]);
    ParentRef::of(&ClusterName::local(), parent)
        .unwrap()
        .adopt(&mut late);
    m1.create(&PostParams::default(), &late).await.unwrap();
    eventually("late child gone", || async {
        m1.get_opt(name).await.unwrap().is_none()
    })
    .await;
}

async fn count_for(
    rx: &mut mpsc::UnboundedReceiver<String>,
    name: &str,
    during: Duration,
) -> usize {
    while rx.try_recv().is_ok() {}
    tokio::time::sleep(during).await;
    let mut n = 0;
    while let Ok(seen) = rx.try_recv() {
        if seen == name {
            n += 1;
        }
    }
    n
}

/// A member whose watch of the children cannot sync (here: forbidden) makes
/// no parent reconcile again while it cannot: it is asked about once its
/// watch syncs.
#[tokio::test]
async fn a_member_that_cannot_sync_asks_for_no_parent_until_it_does() {
    let (_env, children, mut rx, hub, m1) = with_a_member_that_cannot_sync().await;
    parent_with_child(&hub, &m1, "p").await;
    deleted(&hub, "p").await;
    eventually("child gone", || async {
        m1.get_opt("p").await.unwrap().is_none()
    })
    .await;
    // The child's deletion, once seen, wakes the gone parent once more.
    eventually("child gone from m1's store", || async {
        children
            .store()
            .in_cluster("m1")
            .unwrap_or_default()
            .is_empty()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let n = count_for(&mut rx, "p", Duration::from_secs(3)).await;
    assert!(
        n <= 1,
        "a gone parent with no children left anywhere was reconciled {n} times in 3s"
    );
    // Remembered for the member whose children are not known, which asks
    // for nothing until its watch syncs.
    assert_eq!(children.pending(), 1);
}

/// A member that had not synced yet when the parent went (it was joining,
/// or unreachable) and that holds none of its children once synced is not
/// asked about again.
#[tokio::test]
async fn a_member_that_syncs_later_without_children_is_never_cleared() {
    let env = Envtest::start(2).await.unwrap();
    let fleet = Fleet::new();
    fleet.engage(ClusterName::local(), env.clusters()[0].client());
    fleet.engage("m1", env.clusters()[1].client());
    let link = env.clusters()[1].link().unwrap();
    link.cut_off();
    fleet.engage("m2", link.client());
    let (children, mut rx) = start(&fleet);
    let hub = Api::<ConfigMap>::namespaced(env.clusters()[0].client(), "default");
    let m1 = Api::<ConfigMap>::namespaced(env.clusters()[1].client(), "default");
    parent_with_child(&hub, &m1, "q").await;
    deleted(&hub, "q").await;
    link.restore();
    eventually("m2 synced", || async {
        children.store().unsynced().is_empty()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let n = count_for(&mut rx, "q", Duration::from_secs(3)).await;
    assert!(
        n <= 1,
        "a swept parent was reconciled {n} times in 3s after every member synced"
    );
    assert_eq!(children.pending(), 0);
}

/// A child that reaches its cluster's store only after its parent's cleanup
/// read the stores (made a moment before the parent went, or by a writer
/// that lagged) wakes its parent, whose sweep deletes it.
#[tokio::test]
async fn a_child_that_appears_after_its_parent_went_is_swept() {
    let (_env, children, hub, m1, parent) = hub_and_member_with_child("r").await;
    deleted(&hub, "r").await;
    eventually("child gone", || async {
        m1.get_opt("r").await.unwrap().is_none()
    })
    .await;
    // The late child: it names the parent that is gone.
    late_child_goes(&m1, &parent, "r-late").await;
    assert_eq!(children.pending(), 0);
}

/// A parent released (its label removed) rather than deleted: its children
/// go, and so does one that shows up afterwards (made a moment before the
/// release, or by a writer that lagged), while the parent stays.
#[tokio::test]
async fn a_child_that_appears_after_its_parent_was_released_goes() {
    let (_env, children, hub, m1, _) = hub_and_member_with_child("s").await;
    released(&hub, &m1, "s").await;
    let parent = hub.get("s").await.unwrap();
    late_child_goes(&m1, &parent, "s-late").await;
    assert!(
        hub.get_opt("s").await.unwrap().is_some(),
        "the parent stays"
    );
    assert_eq!(children.pending(), 0);
}

/// A member whose children are not known (its watch cannot sync) holds up
/// no released parent: the finalizer comes off once the members that answer
/// are cleaned.
#[tokio::test]
async fn a_member_that_cannot_sync_holds_up_no_released_parent() {
    let (_env, children, _rx, hub, m1) = with_a_member_that_cannot_sync().await;
    parent_with_child(&hub, &m1, "t").await;
    released(&hub, &m1, "t").await;
    // Remembered for m2 only by the cleanup; the releases that follow, of
    // this and every other unwanted ConfigMap, record nothing.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(children.pending(), 1);
}

/// A member cut off while its store still holds a child: its watch fails
/// and the child cannot be deleted, and the cleanup names the member once,
/// with both causes.
#[tokio::test]
async fn a_skipped_cluster_is_named_once_with_every_cause() {
    let env = Envtest::start(2).await.unwrap();
    let fleet = Fleet::new();
    let hub_cluster = fleet.engage(ClusterName::local(), env.clusters()[0].client());
    let link = env.clusters()[1].link().unwrap();
    fleet.engage("m1", link.client());
    let children = Children::<ConfigMap>::new(
        &fleet,
        Watch::new(watcher::Config::default().labels(PARENT_UID_LABEL))
            .in_clusters(ClusterSelector::Provided),
    );
    let hub = Api::<ConfigMap>::namespaced(env.clusters()[0].client(), "default");
    let m1 = Api::<ConfigMap>::namespaced(env.clusters()[1].client(), "default");
    // Being deleted, so that the cleanup reports what it skipped.
    let mut parent = cm("p", &[]);
    parent.metadata.finalizers = Some(vec!["test/hold".into()]);
    hub.create(&PostParams::default(), &parent).await.unwrap();
    hub.delete("p", &DeleteParams::default()).await.unwrap();
    let parent = hub.get("p").await.unwrap();
    let mut child = cm("p", &[]);
    ParentRef::of(&ClusterName::local(), &parent)
        .unwrap()
        .adopt(&mut child);
    m1.create(&PostParams::default(), &child).await.unwrap();
    let request = ObjectRequest::new(
        hub_cluster,
        kube_multicluster::McRequest::new(ClusterName::local(), Some("default"), "p"),
        Some(Arc::new(parent)),
    );
    eventually("the child in the member's store", || async {
        !children.of(&request).is_empty()
    })
    .await;

    link.cut_off();
    eventually("the member's watch failing", || async {
        children
            .store()
            .clusters()
            .iter()
            .any(|(name, state)| name == "m1" && !state.is_synced())
    })
    .await;
    let deleted = children
        .delete(&request, Duration::from_secs(2))
        .await
        .unwrap();
    assert_eq!(deleted.skipped.len(), 1, "{:?}", deleted.skipped);
    let (cluster, why) = &deleted.skipped[0];
    assert_eq!(cluster, "m1");
    assert!(why.contains("its watch is"), "{why}");
    assert!(why.contains("; "), "one cause only: {why}");
    link.restore();
    hub.patch(
        "p",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({ "metadata": { "finalizers": null } })),
    )
    .await
    .unwrap();
}
