//! Two controllers: `push`, in the hub, copies ConfigMaps labelled
//! `kube-multicluster.dev/sync=true` into every provider cluster; `revert`, in each
//! provider cluster, puts back a copy that drifted from the hub's and deletes
//! a copy whose hub ConfigMap is gone.

#![allow(dead_code, unreachable_pub)]

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, ObjectMeta, Preconditions},
    runtime::watcher,
};
use kube_multicluster::{
    Action, ClusterName, Controller, Fleet, ObjectKey, ObjectRequest,
    apply::apply,
    controller::{ClusterSelector, Watch},
    finalizer::Event,
    fleetwide::{FleetStore, for_each_cluster},
    ownership::{Children, ParentRef},
};
use tower::{BoxError, service_fn};

/// The label that asks for a hub ConfigMap to be pushed.
pub const SYNC: &str = "kube-multicluster.dev/sync";
/// The field manager of the copies.
const MANAGER: &str = "sync-local-to-remote";
/// The finalizer that deletes the copies before a hub ConfigMap goes.
pub const FINALIZER: &str = "kube-multicluster.dev/sync";

/// The label on every copy.
pub const COPY: &str = "kube-multicluster.dev/sync-copy";

/// The hub's ConfigMaps, all of them: one whose label is removed must still
/// be seen, to delete its copies and release its finalizer.
fn in_hub() -> Watch {
    Watch::new(watcher::Config::default()).in_clusters(ClusterSelector::Local)
}

/// Whether a hub ConfigMap asks to be pushed: labelled, and not being
/// deleted.
fn wanted(source: &ConfigMap) -> bool {
    source.labels().get(SYNC).is_some_and(|v| v == "true")
        && source.metadata.deletion_timestamp.is_none()
}

fn copies() -> Watch {
    Watch::new(watcher::Config::default().labels(&format!("{COPY}=true")))
        .in_clusters(ClusterSelector::Provided)
}

/// Runs both controllers on `fleet`, whose local cluster is the hub.
pub async fn run(fleet: Fleet) -> Result<(), BoxError> {
    let (push, revert) = tokio::join!(push(fleet.clone()), revert(fleet));
    push.and(revert)
}

/// The hub's controller: pushes each labelled ConfigMap to every provider
/// cluster, and deletes the copies when it goes.
async fn push(fleet: Fleet) -> Result<(), BoxError> {
    let children = Children::<ConfigMap>::new(&fleet, copies());
    let controller = Controller::<ConfigMap>::new(&fleet, in_hub())
        .named("push")
        .clusters(ClusterSelector::Local)
        // A copy changed or deleted by hand wakes its hub ConfigMap.
        .owns_across::<ConfigMap>(copies())
        .reconcile_all_on(fleet.engagements().map(|_| ()))
        .reconcile_on(children.sweeps(Duration::from_secs(5)));
    let reconcile = move |request: ObjectRequest<ConfigMap>| {
        let (fleet, children) = (fleet.clone(), children.clone());
        async move {
            if request.object.is_none() {
                children.sweep(&request).await?;
                return Ok(Action::await_change());
            }
            let asked = request.object.as_deref().is_some_and(wanted);
            let finalizing = request
                .object
                .as_ref()
                .is_some_and(|cm| cm.finalizers().iter().any(|f| f == FINALIZER));
            if !asked && !finalizing {
                // Released: copies that show up since (pushed a moment
                // before its label went) go too.
                children.release(&request).await?;
            }
            request
                .finalize_if(asked, FINALIZER, |event| async {
                    match event {
                        Event::Apply(source) => {
                            // Copies of an earlier ConfigMap of this name go.
                            children.sweep(&request).await?;
                            let parent = ParentRef::of(request.cluster.name(), source.as_ref())?;
                            let copy = copy_of(&source, &parent);
                            let members = fleet
                                .clusters()
                                .into_iter()
                                .filter(|c| !c.name().is_local());
                            for_each_cluster(members, 8, Duration::from_secs(10), |cluster| {
                                let copy = copy.clone();
                                async move {
                                    let namespace = copy.namespace().unwrap_or_default();
                                    let api =
                                        Api::<ConfigMap>::namespaced(cluster.client(), &namespace);
                                    apply(&api, MANAGER, &copy).await?;
                                    Ok(())
                                }
                            })
                            .await
                            .into_result()?;
                        }
                        Event::Cleanup(_) => {
                            children.delete(&request, Duration::from_secs(10)).await?;
                        }
                    }
                    Ok(Action::await_change())
                })
                .await
        }
    };
    controller.run(service_fn(reconcile)).await?;
    Ok(())
}

/// Each provider cluster's controller: a copy that differs from the hub's
/// ConfigMap is put back; a copy whose hub ConfigMap is gone is deleted.
async fn revert(fleet: Fleet) -> Result<(), BoxError> {
    let hub = FleetStore::<ConfigMap>::new(&fleet, in_hub());
    let controller = Controller::<ConfigMap>::new(&fleet, copies())
        .named("revert")
        .clusters(ClusterSelector::Provided);
    let reconcile = move |request: ObjectRequest<ConfigMap>| {
        let hub = hub.clone();
        async move {
            let Some(copy) = &request.object else {
                return Ok(Action::await_change());
            };
            let Some(Ok(parent)) = ParentRef::of_child(copy.as_ref()) else {
                return Ok(Action::await_change()); // not a copy of ours
            };
            if !parent.is_a::<ConfigMap>() || !parent.cluster.is_local() {
                return Ok(Action::await_change()); // not a copy of a hub ConfigMap
            }
            // Until the hub's ConfigMaps are known, nothing is proven.
            if hub.in_cluster(parent.cluster.as_str()).is_none() || !hub.unsynced().is_empty() {
                return Ok(Action::requeue(Duration::from_secs(1)));
            }
            let key = ObjectKey::new(parent.namespace.clone(), parent.name.clone());
            let api = Api::<ConfigMap>::namespaced(
                request.cluster.client(),
                &copy.namespace().unwrap_or_default(),
            );
            match hub.get(parent.cluster.as_str(), &key) {
                Some(source)
                    if source.metadata.uid.as_deref() == Some(parent.uid.as_str())
                        && wanted(&source) =>
                {
                    if copy.data != source.data || copy.binary_data != source.binary_data {
                        tracing::info!(%request, "drifted from the hub: putting it back");
                        apply(&api, MANAGER, &copy_of(&source, &parent)).await?;
                    }
                }
                _ => {
                    tracing::info!(%request, "its hub ConfigMap is gone: deleting it");
                    // Only this version: one the hub adopted since is kept.
                    let params = DeleteParams {
                        preconditions: Some(Preconditions {
                            uid: copy.metadata.uid.clone(),
                            resource_version: copy.metadata.resource_version.clone(),
                        }),
                        ..DeleteParams::default()
                    };
                    match api.delete(&copy.name_any(), &params).await {
                        Ok(_) => {}
                        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
                        Err(error) => return Err(error.into()),
                    }
                }
            }
            Ok::<_, BoxError>(Action::await_change())
        }
    };
    controller.run(service_fn(reconcile)).await?;
    Ok(())
}

/// The copy of a hub ConfigMap: same name, namespace and data, marked as
/// its child.
pub fn copy_of(source: &ConfigMap, parent: &ParentRef) -> ConfigMap {
    let mut copy = ConfigMap {
        metadata: ObjectMeta {
            name: source.metadata.name.clone(),
            namespace: source.metadata.namespace.clone(),
            ..ObjectMeta::default()
        },
        data: source.data.clone(),
        binary_data: source.binary_data.clone(),
        immutable: None,
    };
    copy.labels_mut().insert(COPY.to_owned(), "true".to_owned());
    parent.adopt(&mut copy);
    copy
}

/// The name the hub has in the fleet.
pub fn hub() -> ClusterName {
    ClusterName::local()
}
