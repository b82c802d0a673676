//! Cluster health on real API servers: healthy while it answers and its
//! watches run, degraded while a watch fails there, unreachable while its
//! API server is cut off or hangs, and healthy again once it answers; told
//! in `Fleet::status().health` and in `kube_multicluster_cluster_health`.

mod support;

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    api::{ApiResource, DynamicObject, GroupVersionKind},
    runtime::watcher,
};
use kube_multicluster::envtest::Envtest;
use kube_multicluster::layers::metrics::FleetCollector;
use kube_multicluster::{
    Cluster, Fleet,
    client::{ClientOptions, KeepAlive},
    health::ClusterHealth,
};
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
        fleet.status().health,
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
        text.contains(r#"kube_multicluster_cluster_health{cluster="east",state="degraded"} 1"#),
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
        text.contains(r#"kube_multicluster_cluster_health{cluster="east",state="unreachable"} 1"#),
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
    link: &kube_multicluster::envtest::FaultyLink,
) -> kube_multicluster::client::ClusterClient {
    let mut config =
        kube::Config::from_custom_kubeconfig(link.kubeconfig().clone(), &Default::default())
            .await
            .unwrap();
    config.connect_timeout = Some(Duration::from_secs(2));
    ClientOptions::default()
        .keep_alive(KeepAlive::new(
            Duration::from_secs(1),
            Duration::from_secs(1),
        ))
        .cluster_client(config)
        .unwrap()
}

/// A client through `link` as the providers build them: the default
/// keep-alive, kube's connect timeout.
async fn default_client_through(
    link: &kube_multicluster::envtest::FaultyLink,
) -> kube_multicluster::client::ClusterClient {
    let config =
        kube::Config::from_custom_kubeconfig(link.kubeconfig().clone(), &Default::default())
            .await
            .unwrap();
    kube_multicluster::client::cluster_client(config).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_cluster_that_is_gone_is_found_by_its_keep_alive() {
    let env = Envtest::start(1).await.unwrap();
    let link = env.clusters()[0].link().unwrap();
    let fleet = Fleet::with_config(kube_multicluster::FleetConfig {
        keep_alive: None,
        duplicates: kube_multicluster::Duplicates::Ignore,
        ..kube_multicluster::FleetConfig::default()
    });
    // Nothing asks it anything: no watch, no request, no identity read.
    let east = fleet.engage("east", default_client_through(&link).await);
    link.cut_off();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        east.health(),
        ClusterHealth::Healthy,
        "nothing has asked the cluster anything"
    );

    // The same cluster, gone as quietly, in a fleet that asks the silent.
    let quick = KeepAlive::new(Duration::from_secs(1), Duration::from_secs(1));
    let asking = Fleet::with_config(kube_multicluster::FleetConfig {
        keep_alive: Some(quick),
        duplicates: kube_multicluster::Duplicates::Ignore,
        ..kube_multicluster::FleetConfig::default()
    });
    let asked = asking.engage("east", default_client_through(&link).await);
    // Its bound is 1 s + 1 s and the sweep's second, far below the default
    // terms' 16 s: found in time only by the terms the fleet was given.
    let found = tokio::time::timeout(
        Duration::from_secs(8),
        becomes(&asked, "unreachable, found by the keep-alive", |health| {
            matches!(health, ClusterHealth::Unreachable { .. })
        }),
    )
    .await;
    assert!(
        found.is_ok(),
        "not found within the fleet's own terms: {}",
        asked.health()
    );
    assert_eq!(asking.config().keep_alive, Some(quick));
    link.restore();
    becomes(&asked, "healthy once restored", ClusterHealth::is_healthy).await;

    // A cluster's own terms hold whatever the fleet's are.
    let fleet = Fleet::with_config(kube_multicluster::FleetConfig {
        keep_alive: None,
        duplicates: kube_multicluster::Duplicates::Ignore,
        ..kube_multicluster::FleetConfig::default()
    });
    let west = fleet.engage(
        "west",
        default_client_through(&link).await.with_keep_alive(quick),
    );
    link.cut_off();
    becomes(
        &west,
        "unreachable, found by its own keep-alive",
        |health| matches!(health, ClusterHealth::Unreachable { .. }),
    )
    .await;
    link.restore();
}

/// How many clusters the outage tests run at once: each is one run, with
/// a connection, a client and a health of its own.
const RUNS: usize = 10;

/// `RUNS` clusters, each one API server's through a link of its own, with a
/// ConfigMap controller served in each.
async fn served_through_links(
    env: &Envtest,
) -> (
    support::Running,
    tokio::sync::mpsc::UnboundedReceiver<kube_multicluster::McRequest>,
    Vec<kube_multicluster::envtest::FaultyLink>,
) {
    let mut running = support::Running::new();
    let reconciled = running.config_maps();
    let mut links = Vec::new();
    for run in 0..RUNS {
        let link = env.clusters()[0].link().unwrap();
        running
            .provider
            .engage(format!("run-{run}"), default_client_through(&link).await);
        links.push(link);
    }
    for run in 0..RUNS {
        running.wait_served(&format!("run-{run}")).await;
    }
    (running, reconciled, links)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_back_from_a_long_outage_resumes_its_watches_at_once() {
    // Long enough for every watch's backoff to have grown to its cap
    // (0.8 s doubling to 30 s): without a resume, an object made after the
    // outage waits for the next retry, up to 30 s.
    const OUTAGE: Duration = Duration::from_secs(75);
    const BOUND: Duration = Duration::from_secs(2);
    let env = Envtest::start(1).await.unwrap();
    let (running, mut reconciled, links) = served_through_links(&env).await;
    let fleet = running.fleet.clone();
    for link in &links {
        link.cut_off();
    }
    eventually("every run is unreachable", || async {
        fleet
            .status()
            .health
            .iter()
            .all(|(_, health)| matches!(health, ClusterHealth::Unreachable { .. }))
    })
    .await;
    tokio::time::sleep(OUTAGE).await;
    for link in &links {
        link.restore();
    }
    // Made at once, straight to the API server: each run's watch sees it
    // only once it runs again.
    let api = kube::Api::<ConfigMap>::default_namespaced(env.clusters()[0].client());
    let made = tokio::time::Instant::now();
    api.create(
        &Default::default(),
        &support::config_map("after-the-outage"),
    )
    .await
    .unwrap();
    let mut late = Vec::new();
    let wanted: Vec<_> = (0..RUNS)
        .map(|run| support::request(&format!("run-{run}"), "after-the-outage"))
        .collect();
    let mut missing: std::collections::HashSet<_> = wanted.into_iter().collect();
    while !missing.is_empty() {
        let Ok(Some(request)) =
            tokio::time::timeout(Duration::from_secs(60), reconciled.recv()).await
        else {
            panic!("not reconciled within a minute: {missing:?}");
        };
        if missing.remove(&request) {
            late.push((request.cluster.to_string(), made.elapsed()));
        }
    }
    println!("reconciled after the outage: {late:?}");
    let slow: Vec<_> = late.iter().filter(|(_, took)| *took > BOUND).collect();
    assert!(
        slow.is_empty(),
        "reconciled later than {BOUND:?} after the outage: {slow:?} (all: {late:?})"
    );
    // Healthy means every watch runs again.
    eventually("every run is healthy", || async {
        fleet
            .status()
            .health
            .iter()
            .all(|(_, health)| health.is_healthy())
    })
    .await;
    for status in &running.statuses {
        for cluster in status.clusters() {
            assert!(cluster.failing().next().is_none(), "{cluster}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_cluster_is_unreachable_within_its_keep_alive_bound() {
    let bound = KeepAlive::DEFAULT.bound();
    assert!(bound <= Duration::from_secs(20), "{bound:?}");
    let env = Envtest::start(1).await.unwrap();
    let (running, _reconciled, links) = served_through_links(&env).await;
    let fleet = running.fleet.clone();
    // Quiet for a while first: the watches hear nothing, and the clusters
    // are asked only because they are silent.
    tokio::time::sleep(Duration::from_secs(12)).await;
    // Each hangs at another moment: another phase of its pings and asks.
    let mut hung = std::collections::BTreeMap::new();
    for (run, link) in links.iter().enumerate() {
        link.hang();
        hung.insert(format!("run-{run}"), tokio::time::Instant::now());
        tokio::time::sleep(Duration::from_millis(1300)).await;
    }
    let began = tokio::time::Instant::now();
    let mut found = std::collections::BTreeMap::new();
    while found.len() < RUNS && began.elapsed() < bound + Duration::from_secs(30) {
        for (name, health) in fleet.status().health {
            if let ClusterHealth::Unreachable { down_for, .. } = health {
                let after = hung[name.as_str()].elapsed();
                found.entry(name.to_string()).or_insert((after, down_for));
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!("found unreachable (after the hang, down for): {found:?}");
    assert_eq!(found.len(), RUNS, "not all found unreachable: {found:?}");
    for (name, (after, down_for)) in &found {
        assert!(
            *after <= bound,
            "{name} found unreachable {after:?} after it hung, past {bound:?}: {found:?}"
        );
        // Down since it was last heard from, which was before it hung.
        assert!(
            *down_for + Duration::from_millis(200) >= *after,
            "{name} said to be down for {down_for:?}, {after:?} after it hung"
        );
    }
    for link in &links {
        link.restore();
    }
    eventually("every run is healthy again", || async {
        fleet
            .status()
            .health
            .iter()
            .all(|(_, health)| health.is_healthy())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_unreachable_for_too_long_is_set_aside_and_engaged_again_when_it_answers() {
    let env = Envtest::start(2).await.unwrap();
    let (east_server, west_server) = (&env.clusters()[0], &env.clusters()[1]);
    let link = east_server.link().unwrap();
    let mut running = support::Running::with_config(kube_multicluster::FleetConfig {
        set_aside_after: Some(Duration::from_secs(2)),
        ..kube_multicluster::FleetConfig::default()
    });
    let fleet = running.fleet.clone();
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
        fleet.status().set_aside == ["east"] && fleet.get("east").is_none()
    })
    .await;
    assert!(!first.is_engaged());
    let health = fleet.status().health;
    assert!(
        matches!(&health[0], (name, ClusterHealth::Unreachable { down_for, .. })
            if name == "east" && *down_for >= Duration::from_secs(2)),
        "{health:?}"
    );
    assert_eq!(health[1], ("west".into(), ClusterHealth::Healthy));
    let text = scrape(&registry);
    for series in [
        "kube_multicluster_engaged_clusters 1",
        "kube_multicluster_set_aside_clusters 1",
        r#"kube_multicluster_cluster_health{cluster="east",state="unreachable"} 1"#,
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
        fleet.status().set_aside.is_empty() && fleet.get("east").is_some_and(|c| c.is_engaged())
    })
    .await;
    let again = fleet.get("east").unwrap();
    assert!(!first.is_engaged(), "a new engagement, not the old one");
    support::expect_all(&mut reconciled, [support::request("east", "east-while")]).await;
    assert_eq!(again.health(), ClusterHealth::Healthy);

    // Its provider still decides: a disengage while set aside forgets it.
    link.cut_off();
    eventually("east is set aside again", || async {
        fleet.status().set_aside == ["east"]
    })
    .await;
    running.provider.disengage("east");
    eventually("east is forgotten", || async {
        fleet.status().set_aside.is_empty()
    })
    .await;
    link.restore();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(fleet.get("east").is_none(), "a forgotten cluster stays out");
}
