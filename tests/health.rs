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
    // A hung server is found out by an unanswered PING and a connection
    // that does not complete, each within seconds.
    let client = client_through(&link).await;
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

/// A client through `link` that finds a hung server within seconds.
async fn client_through(
    link: &kube_fleet::envtest::FaultyLink,
) -> kube_fleet::client::ClusterClient {
    let mut config =
        kube::Config::from_custom_kubeconfig(link.kubeconfig().clone(), &Default::default())
            .await
            .unwrap();
    config.connect_timeout = Some(Duration::from_secs(2));
    ClientOptions::default()
        .keep_alive(Duration::from_secs(1), Duration::from_secs(1))
        .cluster_client(config)
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_cluster_that_is_gone_is_found_by_the_idle_probe() {
    let env = Envtest::start(1).await.unwrap();
    let link = env.clusters()[0].link().unwrap();
    let fleet = Fleet::new()
        .with_idle_probe(None)
        .with_duplicates(kube_fleet::Duplicates::Ignore);
    // Nothing asks it anything: no watch, no request, no identity read.
    let east = fleet.engage("east", client_through(&link).await);
    link.cut_off();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        east.health(),
        ClusterHealth::Healthy,
        "nothing has asked the cluster anything"
    );

    fleet.clone().with_idle_probe(Some(Duration::from_secs(1)));
    becomes(&east, "unreachable, found by the idle probe", |health| {
        matches!(health, ClusterHealth::Unreachable { .. })
    })
    .await;
    link.restore();
    becomes(&east, "healthy once restored", ClusterHealth::is_healthy).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_unreachable_for_too_long_is_set_aside_and_engaged_again_when_it_answers() {
    let env = Envtest::start(2).await.unwrap();
    let (east_server, west_server) = (&env.clusters()[0], &env.clusters()[1]);
    let link = east_server.link().unwrap();
    let mut running = support::Running::new();
    let fleet = running
        .fleet
        .clone()
        .with_set_aside_after(Duration::from_secs(2));
    let mut registry = Registry::default();
    FleetCollector::register(&mut registry, fleet.clone());
    let mut reconciled = running.config_maps();
    running.provider.engage("east", client_through(&link).await);
    running
        .provider
        .engage("west", support::cluster_client(west_server));
    running.wait_served("east").await;
    running.wait_served("west").await;
    let first = fleet.get("east").unwrap();

    link.cut_off();
    eventually("east is set aside", || async {
        fleet.set_aside() == ["east"] && fleet.get("east").is_none()
    })
    .await;
    assert!(!first.is_engaged());
    let health = fleet.health();
    assert!(
        matches!(&health[0], (name, ClusterHealth::Unreachable { down_for, .. })
            if name == "east" && *down_for >= Duration::from_secs(2)),
        "{health:?}"
    );
    assert_eq!(health[1], ("west".into(), ClusterHealth::Healthy));
    let text = scrape(&registry);
    for series in [
        "kube_fleet_engaged_clusters 1",
        "kube_fleet_set_aside_clusters 1",
        r#"kube_fleet_cluster_health{cluster="east",state="unreachable"} 1"#,
    ] {
        assert!(text.contains(series), "{series} in {text}");
    }
    eventually("no controller serves east", || async {
        running.statuses[0].cluster("east").is_none()
    })
    .await;

    // The other cluster goes on.
    support::create_config_map(support::http2_client(west_server), "west-while").await;
    support::expect_all(&mut reconciled, [support::request("west", "west-while")]).await;

    // Written while set aside, straight to its API server.
    support::create_config_map(support::http2_client(east_server), "east-while").await;
    link.restore();
    eventually("east is engaged again", || async {
        fleet.set_aside().is_empty() && fleet.get("east").is_some_and(|c| c.is_engaged())
    })
    .await;
    let again = fleet.get("east").unwrap();
    assert!(!first.is_engaged(), "a new engagement, not the old one");
    support::expect_all(&mut reconciled, [support::request("east", "east-while")]).await;
    assert_eq!(again.health(), ClusterHealth::Healthy);

    // Its provider still decides: a disengage while set aside forgets it.
    link.cut_off();
    eventually("east is set aside again", || async {
        fleet.set_aside() == ["east"]
    })
    .await;
    running.provider.disengage("east");
    eventually("east is forgotten", || async {
        fleet.set_aside().is_empty()
    })
    .await;
    link.restore();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(fleet.get("east").is_none(), "a forgotten cluster stays out");
}
