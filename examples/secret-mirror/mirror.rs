//! The secret mirror: Secrets labelled `kube-multicluster.dev/mirror=true` in the
//! reference cluster (the local one) are mirrored into every other cluster.

#![allow(dead_code, unreachable_pub)]

use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, ObjectMeta, PostParams, Preconditions},
    runtime::watcher,
};
use kube_multicluster::{
    Action, Controller, Fleet, ObjectKey, ObjectRequest,
    controller::{ClusterSelector, Watch},
    fleetwide::FleetStore,
};
use tower::{BoxError, service_fn};

/// The label that asks for a Secret of the reference cluster to be mirrored.
pub const MIRROR: &str = "kube-multicluster.dev/mirror";
/// The label every mirror carries.
pub const MIRRORED: &str = "kube-multicluster.dev/mirrored";

/// The sources: labelled Secrets in the reference cluster.
fn sources() -> Watch {
    Watch::new(watcher::Config::default().labels(&format!("{MIRROR}=true")))
        .in_clusters(ClusterSelector::Local)
}

/// Runs the mirror on `fleet`, whose local cluster is the reference.
pub async fn run(fleet: Fleet) -> Result<(), BoxError> {
    // The same watch of the sources that the controller runs: read, not copied.
    let store = FleetStore::<Secret>::new(&fleet, sources());
    let mirrors = Watch::new(watcher::Config::default().labels(&format!("{MIRRORED}=true")))
        .in_clusters(ClusterSelector::Provided);
    let controller = Controller::<Secret>::new(&fleet, mirrors)
        .named("secret-mirror")
        .clusters(ClusterSelector::Provided)
        // A source that changes asks for its mirror in every member, and a
        // member that joins is asked for every mirror.
        .watches_across::<Secret, _>(sources(), ClusterSelector::Provided, |_, source| {
            [ObjectKey::of(source)]
        });
    let reconcile = move |request: ObjectRequest<Secret>| {
        let store = store.clone();
        async move { reconcile(request, &store).await }
    };
    controller.run(service_fn(reconcile)).await?;
    Ok(())
}

/// Makes the mirror `request` names match its source, or go with it.
async fn reconcile(
    request: ObjectRequest<Secret>,
    store: &FleetStore<Secret>,
) -> Result<Action, BoxError> {
    // Until the reference cluster's Secrets are known, a missing source
    // proves nothing: never delete a mirror on a guess.
    let local = kube_multicluster::ClusterName::local();
    if store.in_cluster(local.as_str()).is_none() || !store.unsynced().is_empty() {
        return Ok(Action::requeue(Duration::from_secs(1)));
    }
    let key = ObjectKey::new(
        request.request.namespace.clone(),
        request.request.name.clone(),
    );
    let namespace = key.namespace.clone().unwrap_or_default();
    let api = Api::<Secret>::namespaced(request.cluster.client(), &namespace);
    let source = store.get(local.as_str(), &key);
    match (source, &request.object) {
        (None, None) => {}
        (None, Some(mirror)) => {
            // The source is gone, or no longer asks for mirrors.
            delete(&api, mirror).await?;
        }
        (Some(source), None) => {
            api.create(&PostParams::default(), &mirror_of(&source))
                .await?;
        }
        (Some(source), Some(mirror)) => {
            let want = mirror_of(&source);
            let frozen = mirror.immutable == Some(true)
                && (mirror.data != want.data || mirror.immutable != want.immutable);
            if mirror.type_ != want.type_ || frozen {
                // A Secret's type cannot change, nor an immutable one's
                // data: make it anew.
                delete(&api, mirror).await?;
                api.create(&PostParams::default(), &want).await?;
            } else if mirror.data != want.data
                || mirror.immutable != want.immutable
                || mirror.string_data.is_some()
            {
                // Changed at the source, or edited by hand: put it back.
                let mut put = want;
                put.metadata.resource_version = mirror.resource_version();
                put.metadata.labels = Some(merged_labels(mirror, &source));
                api.replace(&mirror.name_any(), &PostParams::default(), &put)
                    .await?;
            }
        }
    }
    Ok(Action::await_change())
}

/// The mirror a source asks for.
pub fn mirror_of(source: &Secret) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: source.metadata.name.clone(),
            namespace: source.metadata.namespace.clone(),
            labels: Some([(MIRRORED.to_owned(), "true".to_owned())].into()),
            ..ObjectMeta::default()
        },
        type_: source.type_.clone(),
        data: source.data.clone(),
        immutable: source.immutable,
        string_data: None,
    }
}

/// The mirror's labels, with the mark of a mirror.
fn merged_labels(mirror: &Secret, _source: &Secret) -> std::collections::BTreeMap<String, String> {
    let mut labels = mirror.labels().clone();
    labels.insert(MIRRORED.to_owned(), "true".to_owned());
    labels
}

async fn delete(api: &Api<Secret>, mirror: &Secret) -> Result<(), kube::Error> {
    let params = DeleteParams {
        preconditions: mirror.metadata.uid.clone().map(|uid| Preconditions {
            uid: Some(uid),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(&mirror.name_any(), &params).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => Ok(()),
        Err(error) => Err(error),
    }
}
