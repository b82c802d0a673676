//! A watch's transform changes every object before it is cached, and watches
//! are shared only where the same transform was given.

mod support;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::{
    Api,
    api::{ObjectMeta, PostParams},
    runtime::watcher,
};
use kube_multicluster::envtest::Envtest;
use kube_multicluster::{Action, Controller, ObjectRequest, cache::Transform, controller::Watch};
use support::{
    PATIENCE, Running, config_map, create_config_map, expect_all, recorder, request, watches_served,
};
use tokio::sync::mpsc;
use tower::BoxError;

/// What each reconcile of "settings" saw: whether its data was there, and
/// whether its annotation was.
type Seen = (bool, bool);

fn seeing(
    tx: mpsc::UnboundedSender<Seen>,
) -> impl tower::Service<
    ObjectRequest<ConfigMap>,
    Response = Action,
    Error = BoxError,
    Future: Send + 'static,
> + Send
+ 'static {
    tower::service_fn(move |request: ObjectRequest<ConfigMap>| {
        if let Some(object) = &request.object
            && request.request.name == "settings"
        {
            let annotated = object
                .metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key("note"));
            let _ = tx.send((object.data.is_some(), annotated));
        }
        async { Ok::<_, BoxError>(Action::await_change()) }
    })
}

async fn first(rx: &mut mpsc::UnboundedReceiver<Seen>) -> Seen {
    tokio::time::timeout(PATIENCE, rx.recv())
        .await
        .expect("reconciled")
        .expect("the reconciler runs")
}

#[tokio::test]
async fn transforms_shape_what_reconcilers_see_and_share_watches_only_when_the_same() {
    let env = Envtest::start(1).await.unwrap();
    let admin = env.clusters()[0].client();
    let mut settings = config_map("settings");
    settings.metadata.annotations = Some([("note".to_owned(), "x".repeat(1_000))].into());
    Api::<ConfigMap>::default_namespaced(admin.clone())
        .create(&PostParams::default(), &settings)
        .await
        .unwrap();
    let watches_before = watches_served(&admin, "configmaps").await;

    let no_data = Transform::object(|cm: &mut ConfigMap| cm.data = None);
    let no_note = Transform::metadata(|meta: &mut ObjectMeta| {
        if let Some(annotations) = meta.annotations.as_mut() {
            annotations.remove("note");
        }
    });
    let mut running = Running::new();
    let mut seen = Vec::new();
    for watch in [
        Watch::default(),
        Watch::default().transform(no_data.clone()),
        // The same transform again: the same watch.
        Watch::default().transform(no_data.clone()),
        Watch::default().transform(no_note),
    ] {
        let (tx, rx) = mpsc::unbounded_channel();
        running.spawn(
            Controller::<ConfigMap>::new(&running.fleet, watch),
            seeing(tx),
        );
        seen.push(rx);
    }
    running.add_all(&env);
    let mut saw = Vec::new();
    for rx in &mut seen {
        saw.push(first(rx).await);
    }
    assert_eq!(
        saw,
        [(true, true), (false, true), (false, true), (true, false)],
        "each controller sees its own watch's objects"
    );
    // A paged watch starts watching after its list: wait for all three.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let mut watches = watches_served(&admin, "configmaps").await;
    while watches < watches_before + 3 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        watches = watches_served(&admin, "configmaps").await;
    }
    assert_eq!(
        watches,
        watches_before + 3,
        "four controllers, three different watches"
    );
}

#[tokio::test]
async fn a_transform_of_another_type_is_refused_by_name() {
    let running = Running::new();
    let wrong = Transform::object(|secret: &mut Secret| secret.data = None);
    let controller = Controller::<ConfigMap>::new(
        &running.fleet,
        Watch::new(watcher::Config::default()).transform(wrong),
    );
    let (tx, _rx) = mpsc::unbounded_channel();
    let error = controller
        .run(seeing(tx))
        .await
        .expect_err("a Secret transform on a ConfigMap watch");
    let error = error.to_string();
    assert!(
        error.contains("ConfigMap") && error.contains("Secret") && error.contains("transform"),
        "{error}"
    );
}

#[tokio::test]
async fn a_transform_that_panics_loses_neither_the_object_nor_the_watch() {
    let env = Envtest::start(1).await.unwrap();
    let cluster = env.clusters()[0].name().to_owned();
    let admin = env.clusters()[0].client();
    create_config_map(admin.clone(), "before").await;
    let fragile = Transform::metadata(|meta: &mut ObjectMeta| {
        if meta.name.as_deref() == Some("boom") {
            panic!("a transform that cannot take this object");
        }
    });
    let mut running = Running::new();
    let (service, mut reconciled) = recorder();
    running.spawn(
        Controller::<ConfigMap>::new(&running.fleet, Watch::default().transform(fragile)),
        service,
    );
    running.add_all(&env);
    expect_all(&mut reconciled, [request(&cluster, "before")]).await;
    create_config_map(admin.clone(), "boom").await;
    create_config_map(admin, "after").await;
    expect_all(
        &mut reconciled,
        [request(&cluster, "boom"), request(&cluster, "after")],
    )
    .await;
}
