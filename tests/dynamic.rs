//! Controllers of types known only at run time: `DynamicObject` with an
//! `ApiResource`, against real API servers.

mod support;

use std::collections::HashSet;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api, CustomResource, CustomResourceExt, Resource,
    api::{ApiResource, DynamicObject, GroupVersionKind, PostParams},
    discovery::Scope,
};
use kube_multicluster::envtest::Envtest;
use kube_multicluster::{Controller, ObjectRequest, controller::Watch};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use support::*;

/// Only to install the CRD and create objects; the controller never names
/// this type.
#[derive(CustomResource, Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[kube(
    group = "dynamic.kube-multicluster.dev",
    version = "v1",
    kind = "Gadget",
    namespaced
)]
struct GadgetSpec {
    size: u32,
}

fn gadgets() -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(
        "dynamic.kube-multicluster.dev",
        "v1",
        "Gadget",
    ))
}

async fn create_gadget(client: kube::Client, name: &str) {
    let mut gadget = Gadget::new(name, GadgetSpec { size: 1 });
    gadget.metadata.namespace = Some("default".into());
    Api::<Gadget>::namespaced(client, "default")
        .create(&PostParams::default(), &gadget)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_dynamic_controller_reconciles_where_its_crd_exists_and_starts_where_it_appears() {
    let env = Envtest::start(3).await.unwrap();
    let (with, without) = (&env.clusters()[..2], &env.clusters()[2]);
    for cluster in with {
        cluster.install_crds([Gadget::crd()]).await.unwrap();
        create_gadget(cluster.client(), "g").await;
    }

    let mut running = Running::new();
    let (objects_tx, mut objects) = tokio::sync::mpsc::unbounded_channel();
    let service = tower::service_fn(move |request: ObjectRequest<DynamicObject>| {
        // The object arrives typed as the API server sent it.
        if let Some(object) = &request.object {
            let _ = objects_tx.send((
                request.request.clone(),
                object.types.as_ref().map(|t| t.kind.clone()),
                object.data["spec"]["size"].as_u64(),
            ));
        }
        async { Ok::<_, tower::BoxError>(kube_multicluster::Action::await_change()) }
    });
    let controller = Controller::<DynamicObject>::new(
        &running.fleet,
        Watch::default().resource(gadgets(), Scope::Namespaced),
    );
    assert!(
        format!("{controller:?}").contains("\"gadget\""),
        "named after the kind it watches: {controller:?}"
    );
    let status = controller.status();
    running.spawn(controller, service);
    running.add_all(&env);

    let mut seen = HashSet::new();
    while seen.len() < 2 {
        let (request, kind, size) = tokio::time::timeout(PATIENCE, objects.recv())
            .await
            .expect("both clusters with the CRD reconcile")
            .unwrap();
        assert_eq!((kind.as_deref(), size), (Some("Gadget"), Some(1)));
        seen.insert(request.cluster.to_string());
    }
    assert_eq!(
        seen,
        HashSet::from(["cluster-0".into(), "cluster-1".into()])
    );
    // The third cluster waits for its watch, which says why.
    let cluster = failing(&status, without.name(), PATIENCE).await;
    assert_eq!(
        cluster.failing().next().map(|w| w.kind.as_str()),
        Some("Gadget"),
        "{cluster}"
    );

    // The CRD appears there: the controller starts there, no restart.
    without.install_crds([Gadget::crd()]).await.unwrap();
    create_gadget(without.client(), "late").await;
    let (request, _, _) = tokio::time::timeout(std::time::Duration::from_secs(90), async {
        loop {
            let seen = objects.recv().await.unwrap();
            if seen.0.cluster == without.name() {
                return seen;
            }
        }
    })
    .await
    .expect("the third cluster is served once its CRD is installed");
    assert_eq!(request.name, "late");
}

#[tokio::test]
async fn a_dynamic_owner_is_reconciled_when_its_children_change() {
    let env = Envtest::start(1).await.unwrap();
    let cluster = &env.clusters()[0];
    cluster.install_crds([Gadget::crd()]).await.unwrap();
    create_gadget(cluster.client(), "parent").await;
    let parent = Api::<Gadget>::namespaced(cluster.client(), "default")
        .get("parent")
        .await
        .unwrap();

    let mut running = Running::new();
    let (service, mut rx) = recorder::<ObjectRequest<DynamicObject>>();
    running.spawn(
        Controller::<DynamicObject>::new(
            &running.fleet,
            Watch::default().resource(gadgets(), Scope::Namespaced),
        )
        .owns::<ConfigMap>(kube::runtime::watcher::Config::default()),
        service,
    );
    running.add_all(&env);
    expect_all(&mut rx, [request("cluster-0", "parent")]).await;
    let _ = drain_for(&mut rx, std::time::Duration::from_millis(300)).await;

    let mut child = config_map("child");
    child.metadata.owner_references = Some(vec![parent.controller_owner_ref(&()).unwrap()]);
    Api::<ConfigMap>::namespaced(cluster.client(), "default")
        .create(&PostParams::default(), &child)
        .await
        .unwrap();
    expect_all(&mut rx, [request("cluster-0", "parent")]).await;
}

#[tokio::test]
async fn a_dynamic_watch_without_its_resource_is_a_clear_error() {
    let fleet = kube_multicluster::Fleet::new();
    let (service, _rx) = recorder::<ObjectRequest<DynamicObject>>();
    let error = Controller::<DynamicObject>::new(&fleet, kube::runtime::watcher::Config::default())
        .run(service)
        .await
        .expect_err("a DynamicObject controller must be told its type");
    assert!(
        error.to_string().contains("Watch::resource"),
        "the error says what is missing: {error}"
    );
}

/// The same kind served at another version: only to install its CRD.
mod v2 {
    use kube::CustomResource;
    use schemars::JsonSchema;
    use serde::{Deserialize, Serialize};

    #[derive(CustomResource, Clone, Debug, Deserialize, Serialize, JsonSchema)]
    #[kube(
        group = "dynamic.kube-multicluster.dev",
        version = "v2",
        kind = "Gadget",
        namespaced
    )]
    pub(crate) struct GadgetSpec {
        pub(crate) size: u32,
    }
}

#[tokio::test]
async fn a_kind_found_by_discovery_is_watched_at_the_version_each_cluster_serves() {
    let env = Envtest::start(3).await.unwrap();
    let (at_v1, at_v2, later) = (&env.clusters()[0], &env.clusters()[1], &env.clusters()[2]);
    at_v1.install_crds([Gadget::crd()]).await.unwrap();
    create_gadget(at_v1.client(), "old").await;
    at_v2.install_crds([v2::Gadget::crd()]).await.unwrap();
    let mut newer = v2::Gadget::new("new", v2::GadgetSpec { size: 2 });
    newer.metadata.namespace = Some("default".into());
    Api::<v2::Gadget>::namespaced(at_v2.client(), "default")
        .create(&PostParams::default(), &newer)
        .await
        .unwrap();

    let mut running = Running::new();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let service = tower::service_fn(move |request: ObjectRequest<DynamicObject>| {
        if let Some(object) = &request.object {
            let version = object.types.as_ref().map(|t| t.api_version.clone());
            let _ = tx.send((request.request.clone(), version));
        }
        async { Ok::<_, tower::BoxError>(kube_multicluster::Action::await_change()) }
    });
    let controller = Controller::<DynamicObject>::new(
        &running.fleet,
        Watch::default().discover("dynamic.kube-multicluster.dev", "Gadget", Scope::Namespaced),
    );
    let status = controller.status();
    running.spawn(controller, service);
    running.add_all(&env);

    let mut versions = std::collections::HashMap::new();
    while versions.len() < 2 {
        let (request, version) = tokio::time::timeout(PATIENCE, rx.recv())
            .await
            .expect("both clusters that serve the kind reconcile")
            .unwrap();
        versions.insert(request.cluster.to_string(), version);
    }
    assert_eq!(
        versions,
        std::collections::HashMap::from([
            (
                "cluster-0".to_owned(),
                Some("dynamic.kube-multicluster.dev/v1".to_owned())
            ),
            (
                "cluster-1".to_owned(),
                Some("dynamic.kube-multicluster.dev/v2".to_owned())
            ),
        ])
    );
    // Where the kind is not served, the watch says so.
    let reason = failing_reason(&status, later.name()).await;
    assert!(reason.contains("Gadget"), "{reason}");

    later.install_crds([Gadget::crd()]).await.unwrap();
    create_gadget(later.client(), "late").await;
    let (request, _) = tokio::time::timeout(std::time::Duration::from_secs(90), async {
        loop {
            let seen = rx.recv().await.unwrap();
            if seen.0.cluster == later.name() {
                return seen;
            }
        }
    })
    .await
    .expect("the kind is found once it is served");
    assert_eq!(request.name, "late");
}

/// A second kind of the same group, served only at an older version.
mod alpha {
    use kube::CustomResource;
    use schemars::JsonSchema;
    use serde::{Deserialize, Serialize};

    #[derive(CustomResource, Clone, Debug, Deserialize, Serialize, JsonSchema)]
    #[kube(
        group = "dynamic.kube-multicluster.dev",
        version = "v1alpha1",
        kind = "Gizmo",
        namespaced
    )]
    pub(crate) struct GizmoSpec {
        pub(crate) size: u32,
    }
}

/// Each reconcile's object name and the API version it came at.
type Versions = tokio::sync::mpsc::UnboundedReceiver<(String, Option<String>)>;

/// A reconciler that reports every object's name and API version.
fn versions_seen() -> (
    impl tower::Service<
        ObjectRequest<DynamicObject>,
        Response = kube_multicluster::Action,
        Error = tower::BoxError,
        Future: Send + 'static,
    > + Send
    + 'static,
    Versions,
) {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let service = tower::service_fn(move |request: ObjectRequest<DynamicObject>| {
        if let Some(object) = &request.object {
            let version = object.types.as_ref().map(|t| t.api_version.clone());
            let _ = tx.send((request.request.name.clone(), version));
        }
        async { Ok::<_, tower::BoxError>(kube_multicluster::Action::await_change()) }
    });
    (service, rx)
}

async fn version_of(
    rx: &mut Versions,
    name: &str,
    patience: std::time::Duration,
) -> Option<String> {
    tokio::time::timeout(patience, async {
        loop {
            let (seen, version) = rx.recv().await.unwrap();
            if seen == name {
                return version;
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{name} was never reconciled"))
}

#[tokio::test]
async fn a_discovered_kind_follows_its_crd_to_a_new_version_and_to_older_ones() {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

    let env = Envtest::start(1).await.unwrap();
    let cluster = &env.clusters()[0];
    // Gadget at v1, and in the same group Gizmo only at v1alpha1: the
    // group's preferred version (v1) does not have Gizmo.
    cluster
        .install_crds([Gadget::crd(), alpha::Gizmo::crd()])
        .await
        .unwrap();
    create_gadget(cluster.client(), "old").await;
    let mut gizmo = alpha::Gizmo::new("gizmo", alpha::GizmoSpec { size: 1 });
    gizmo.metadata.namespace = Some("default".into());
    Api::<alpha::Gizmo>::namespaced(cluster.client(), "default")
        .create(&PostParams::default(), &gizmo)
        .await
        .unwrap();

    let mut running = Running::new();
    let (gadgets, mut gadgets_seen) = versions_seen();
    running.spawn(
        Controller::<DynamicObject>::new(
            &running.fleet,
            Watch::default().discover("dynamic.kube-multicluster.dev", "Gadget", Scope::Namespaced),
        ),
        gadgets,
    );
    let (gizmos, mut gizmos_seen) = versions_seen();
    running.spawn(
        Controller::<DynamicObject>::new(
            &running.fleet,
            Watch::default().discover("dynamic.kube-multicluster.dev", "Gizmo", Scope::Namespaced),
        ),
        gizmos,
    );
    running.add_all(&env);
    assert_eq!(
        version_of(&mut gizmos_seen, "gizmo", PATIENCE)
            .await
            .as_deref(),
        Some("dynamic.kube-multicluster.dev/v1alpha1")
    );
    assert_eq!(
        version_of(&mut gadgets_seen, "old", PATIENCE)
            .await
            .as_deref(),
        Some("dynamic.kube-multicluster.dev/v1")
    );

    // The Gadget CRD goes, and comes back serving v2 only.
    let crds = Api::<CustomResourceDefinition>::all(cluster.client());
    let name = Gadget::crd().metadata.name.unwrap();
    crds.delete(&name, &Default::default()).await.unwrap();
    tokio::time::timeout(PATIENCE, async {
        while crds.get_opt(&name).await.unwrap().is_some() {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    })
    .await
    .unwrap();
    cluster.install_crds([v2::Gadget::crd()]).await.unwrap();
    let mut newer = v2::Gadget::new("new", v2::GadgetSpec { size: 2 });
    newer.metadata.namespace = Some("default".into());
    Api::<v2::Gadget>::namespaced(cluster.client(), "default")
        .create(&PostParams::default(), &newer)
        .await
        .unwrap();
    assert_eq!(
        version_of(&mut gadgets_seen, "new", std::time::Duration::from_secs(90))
            .await
            .as_deref(),
        Some("dynamic.kube-multicluster.dev/v2"),
        "the watch found the new version"
    );
}

#[tokio::test]
async fn a_scope_that_contradicts_discovery_is_reported() {
    let env = Envtest::start(1).await.unwrap();
    let mut running = Running::new();
    let (service, _seen) = versions_seen();
    // Namespaces are cluster-scoped.
    let controller = Controller::<DynamicObject>::new(
        &running.fleet,
        Watch::default().discover("", "Namespace", Scope::Namespaced),
    );
    let status = controller.status();
    running.spawn(controller, service);
    running.add_all(&env);
    let reason = failing_reason(&status, "cluster-0").await;
    assert!(
        reason.contains("cluster-scoped") && reason.contains("Scope::Namespaced"),
        "{reason}"
    );
}
