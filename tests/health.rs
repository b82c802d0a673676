//! Cluster health on real API servers: healthy while it answers and its
//! watches run, degraded while a watch fails there, unreachable while its
//! API server is cut off or hangs, and healthy again once it answers; told
//! in `Fleet::health` and in `kube_fleet_cluster_health`.

mod support;

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    api::{ApiResource, DynamicObject, GroupVersionKind},
    runtime::watcher,
};
use kube_fleet::envtest::Envtest;
use kube_fleet::layers::metrics::FleetCollector;
use kube_fleet::{Cluster, Fleet, client::ClientOptions, health::ClusterHealth};
use prometheus_client::{encoding::text::encode, registry::Registry};
use support::eventually;

fn scrape(registry: &Registry) -> String {
    let mut text = String::new();
    encode(&mut text, registry).unwrap();
    text
}

async fn becomes(cluster: &Cluster, what: &str, is: impl Fn(&ClusterHealth) -> bool) {
    let within = tokio::time::timeout(Duration::from_secs(60), async {
        while !is(&cluster.health()) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    if within.await.is_err() {
        panic!("timed out waiting for {what}: {}", cluster.health());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clusters_health_follows_what_its_client_and_watches_find() {
    let env = Envtest::start(1).await.unwrap();
    let link = env.clusters()[0].link().unwrap();
    let mut config =
        kube::Config::from_custom_kubeconfig(link.kubeconfig().clone(), &Default::default())
            .await
            .unwrap();
    // A hung server is found out by an unanswered PING and a connection
    // that does not complete, each within seconds.
    config.connect_timeout = Some(Duration::from_secs(2));
    let client = ClientOptions::default()
        .keep_alive(Duration::from_secs(1), Duration::from_secs(1))
        .cluster_client(config)
        .unwrap();
    let fleet = Fleet::new();
    let mut registry = Registry::default();
    FleetCollector::register(&mut registry, fleet.clone());
    let east = fleet.engage("east", client);

    let config_maps = east.cache().watch::<ConfigMap>(&watcher::Config::default());
    eventually("the watch syncs", || async { config_maps.has_synced() }).await;
    assert_eq!(east.health(), ClusterHealth::Healthy);
    assert_eq!(
        fleet.health(),
        vec![(east.name().clone(), ClusterHealth::Healthy)]
    );

    // A type the cluster does not serve: degraded, the watch named.
    let widgets = ApiResource::from_gvk(&GroupVersionKind::gvk("example.com", "v1", "Widget"));
    let widget_watch =
        east.cache()
            .watch_with::<DynamicObject>(&widgets, None, &watcher::Config::default());
    becomes(
        &east,
        "degraded by the Widget watch",
        |health| matches!(health, ClusterHealth::Degraded { cause } if cause.contains("Widget")),
    )
    .await;
    let text = scrape(&registry);
    assert!(
        text.contains(r#"kube_fleet_cluster_health{cluster="east",state="degraded"} 1"#),
        "{text}"
    );
    drop(widget_watch);
    becomes(&east, "healthy without it", ClusterHealth::is_healthy).await;

    // Cut off: unreachable, with the cause; healthy again once restored.
    link.cut_off();
    becomes(
        &east,
        "unreachable when cut off",
        |health| matches!(health, ClusterHealth::Unreachable { cause, .. } if !cause.is_empty()),
    )
    .await;
    let text = scrape(&registry);
    assert!(
        text.contains(r#"kube_fleet_cluster_health{cluster="east",state="unreachable"} 1"#),
        "{text}"
    );
    link.restore();
    becomes(&east, "healthy once restored", ClusterHealth::is_healthy).await;

    // Hung: no answer at all.
    link.hang();
    becomes(&east, "unreachable when hung", |health| {
        matches!(health, ClusterHealth::Unreachable { .. })
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    match east.health() {
        ClusterHealth::Unreachable { down_for, .. } => {
            assert!(down_for >= Duration::from_secs(1), "{down_for:?}")
        }
        other => panic!("{other}"),
    }
    link.restore();
    becomes(
        &east,
        "healthy once it answers again",
        ClusterHealth::is_healthy,
    )
    .await;

    // The series goes with the cluster.
    fleet.disengage("east");
    assert!(!scrape(&registry).contains(r#"cluster="east""#));
}
