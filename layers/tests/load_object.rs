//! Loading objects for reconcilers from a real cluster's cache.

use std::sync::Arc;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api,
    api::{ObjectMeta, PostParams},
    runtime::{reflector::ObjectRef, watcher},
};
use kube_fleet::{Action, Fleet, McRequest};
use kube_fleet_envtest::Envtest;
use kube_fleet_layers::{
    load_object::{LoadObjectLayer, ObjectRequest},
    resolve_cluster::ResolveClusterLayer,
};
use tokio::sync::mpsc;
use tower::{BoxError, ServiceBuilder, ServiceExt, service_fn};

async fn create(api: &Api<ConfigMap>, name: &str) {
    let object = ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    };
    api.create(&PostParams::default(), &object).await.unwrap();
}

/// Runs one request through resolve + load and returns what the reconciler got.
async fn load(fleet: &Fleet, request: McRequest) -> ObjectRequest<ConfigMap> {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let service = ServiceBuilder::new()
        .layer(ResolveClusterLayer::new(fleet.clone()))
        .layer(LoadObjectLayer::<ConfigMap>::new())
        .service(service_fn(move |request: ObjectRequest<ConfigMap>| {
            let tx = tx.clone();
            async move {
                tx.send(request).unwrap();
                Ok::<_, BoxError>(Action::await_change())
            }
        }));
    service.oneshot(request).await.unwrap();
    rx.recv().await.unwrap()
}

#[tokio::test]
async fn objects_come_from_the_shared_cache_without_a_copy_and_absent_ones_are_none() {
    let env = Envtest::start(1).await.unwrap();
    let client = env.clusters()[0].client();
    create(&Api::default_namespaced(client.clone()), "present").await;

    let fleet = Fleet::new();
    let cluster = fleet.engage("east", client);
    let watch = cluster
        .cache()
        .watch::<ConfigMap>(&watcher::Config::default());
    watch.synced().await;

    let loaded = load(&fleet, McRequest::new("east", Some("default"), "present")).await;
    let object = loaded.object.expect("present");
    let cached = watch
        .store()
        .get(&ObjectRef::new("present").within("default"))
        .unwrap();
    assert!(
        Arc::ptr_eq(&object, &cached),
        "the reconciler shares the cache's Arc"
    );

    let gone = load(&fleet, McRequest::new("east", Some("default"), "absent")).await;
    assert!(gone.object.is_none());
}

#[tokio::test]
async fn without_a_watch_in_that_cluster_the_object_is_read_from_the_api_server() {
    let env = Envtest::start(1).await.unwrap();
    let client = env.clusters()[0].client();
    create(&Api::default_namespaced(client.clone()), "present").await;

    let fleet = Fleet::new();
    let cluster = fleet.engage("west", client);
    assert_eq!(cluster.cache().watch_count(), 0);

    let loaded = load(&fleet, McRequest::new("west", Some("default"), "present")).await;
    assert_eq!(
        loaded.object.unwrap().metadata.name.as_deref(),
        Some("present")
    );
    let gone = load(&fleet, McRequest::new("west", Some("default"), "absent")).await;
    assert!(gone.object.is_none());
    assert_eq!(cluster.cache().watch_count(), 0, "reading starts no watch");
}
