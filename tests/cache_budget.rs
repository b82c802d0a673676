//! A fleet-wide budget for cached bytes, on real API servers: clusters
//! engaged at once fill the caches only up to the budget, those beyond it
//! wait (told in the fleet's problems, their health and the budget's
//! figures), none is held half-listed, and they are served as room frees
//! up; a cluster whose first list alone is larger than the budget is told
//! so and never listed.

mod support;

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::Duration,
};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api, Client,
    api::{ObjectMeta, PostParams},
    runtime::watcher,
};
use kube_multicluster::{Action, Controller, FleetConfig, ObjectRequest, health::ClusterHealth};
use kube_multicluster::{Duplicates, envtest::Envtest};
use support::{Running, eventually};
use tower::{BoxError, service_fn};

const OBJECTS: usize = 20;

/// `OBJECTS` ConfigMaps of about 2 KiB, labelled `budget=true`.
async fn fill(client: Client) {
    let api = Api::<ConfigMap>::namespaced(client, "default");
    for i in 0..OBJECTS {
        let config_map = ConfigMap {
            metadata: ObjectMeta {
                name: Some(format!("big-{i}")),
                labels: Some([("budget".to_owned(), "true".to_owned())].into()),
                ..ObjectMeta::default()
            },
            data: Some([("data".to_owned(), "x".repeat(2048))].into()),
            ..ConfigMap::default()
        };
        api.create(&PostParams::default(), &config_map)
            .await
            .expect("a ConfigMap");
    }
}

/// A fleet with `config` and a controller of the labelled ConfigMaps that
/// counts its reconciles.
fn running(config: FleetConfig) -> (Running, Arc<AtomicUsize>) {
    let mut running = Running::with_config(FleetConfig {
        // The clusters are names for one API server.
        duplicates: Duplicates::Ignore,
        ..config
    });
    let reconciles = Arc::new(AtomicUsize::new(0));
    let controller = Controller::<ConfigMap>::new(
        &running.fleet,
        watcher::Config::default().labels("budget=true"),
    );
    running.spawn(
        controller,
        service_fn({
            let reconciles = reconciles.clone();
            move |_: ObjectRequest<ConfigMap>| {
                reconciles.fetch_add(1, Ordering::Relaxed);
                async { Ok::<_, BoxError>(Action::await_change()) }
            }
        }),
    );
    (running, reconciles)
}

fn serving(running: &Running) -> Vec<String> {
    running.statuses[0]
        .clusters()
        .into_iter()
        .filter(|c| c.serving)
        .map(|c| c.cluster.to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clusters_beyond_the_budget_wait_whole_and_are_served_as_room_frees_up() {
    let env = Envtest::start(1).await.expect("envtest");
    let cluster = &env.clusters()[0];
    fill(cluster.client()).await;

    // What one cluster's cache holds, as the budget counts it.
    let (probe, _) = running(FleetConfig {
        cache_budget: Some(usize::MAX),
        ..FleetConfig::default()
    });
    probe.provider.engage("probe", cluster.client());
    probe.wait_served("probe").await;
    let one = probe.fleet.status().initial_lists.cached_bytes();
    drop(probe);
    assert!(
        one >= OBJECTS * 2048,
        "{one} bytes for {OBJECTS} objects of 2 KiB"
    );

    // Room for two and a half clusters; five engaged at once.
    let budget = one * 5 / 2;
    let (running, reconciles) = running(FleetConfig {
        cache_budget: Some(budget),
        ..FleetConfig::default()
    });
    let lists = running.fleet.status().initial_lists;
    assert_eq!(lists.cache_budget(), Some(budget));
    let most = Arc::new(AtomicUsize::new(0));
    let sampling = Arc::new(AtomicBool::new(true));
    let sampler = tokio::spawn({
        let (lists, most, sampling) = (lists.clone(), most.clone(), sampling.clone());
        async move {
            while sampling.load(Ordering::Relaxed) {
                most.fetch_max(lists.cached_bytes(), Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    });
    let names = ["c0", "c1", "c2", "c3", "c4"];
    for name in names {
        running.provider.engage(name, cluster.client());
    }
    eventually("two clusters served and three waiting for room", || async {
        serving(&running).len() == 2 && lists.waiting_for_room().len() == 3
    })
    .await;
    // Settled: no third one creeps in.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let served = serving(&running);
    assert_eq!(served.len(), 2, "{served:?}");
    assert_eq!(
        lists.cached_bytes(),
        2 * one,
        "only the served clusters' objects are held"
    );
    assert_eq!(reconciles.load(Ordering::Relaxed), 2 * OBJECTS);
    let waiting: Vec<&str> = names
        .iter()
        .copied()
        .filter(|n| !served.iter().any(|s| s == n))
        .collect();
    let problems = running.fleet.problems().current();
    for name in &waiting {
        let source = format!("cluster {name:?}: v1 ConfigMap labelled budget=true");
        let problem = problems
            .get(&source)
            .unwrap_or_else(|| panic!("no problem under {source}: {problems:?}"));
        assert!(problem.contains("cache budget"), "{problem}");
        let health = running.fleet.get(*name).expect("engaged").health();
        match health {
            ClusterHealth::Degraded { cause } => assert!(
                cause.contains("v1 ConfigMap") && cause.contains("waits for room"),
                "{cause}"
            ),
            other => panic!("{name}: {other:?}"),
        }
    }
    for name in &served {
        assert!(
            running
                .fleet
                .get(name.as_str())
                .expect("engaged")
                .health()
                .is_healthy()
        );
    }

    // One served cluster leaves: one waiting takes its room.
    running.provider.disengage(served[0].as_str());
    eventually("another cluster served in the room freed", || async {
        let now = serving(&running);
        now.len() == 2 && !now.contains(&served[0])
    })
    .await;
    assert_eq!(lists.waiting_for_room().len(), 2);
    assert_eq!(running.fleet.problems().current().len(), 2);
    eventually("its objects reconciled", || async {
        reconciles.load(Ordering::Relaxed) == 3 * OBJECTS
    })
    .await;

    // Every cluster leaves: nothing is held, nothing waits.
    for name in names {
        running.provider.disengage(name);
    }
    eventually("the caches empty and nothing waiting", || async {
        lists.cached_bytes() == 0 && lists.waiting_for_room().is_empty()
    })
    .await;
    assert!(running.fleet.problems().current().is_empty());
    sampling.store(false, Ordering::Relaxed);
    sampler.await.unwrap();
    let most = most.load(Ordering::Relaxed);
    println!("budget {budget} bytes, one cluster {one}, cached at most {most}");
    assert!(
        most <= budget,
        "cached {most} bytes, past the budget of {budget}"
    );
}

#[tokio::test]
async fn a_first_list_larger_than_the_whole_budget_is_told_and_never_made() {
    let env = Envtest::start(1).await.expect("envtest");
    let cluster = &env.clusters()[0];
    fill(cluster.client()).await;
    let (running, reconciles) = running(FleetConfig {
        cache_budget: Some(OBJECTS * 2048 / 2),
        ..FleetConfig::default()
    });
    running.provider.engage("large", cluster.client());
    let source = "cluster \"large\": v1 ConfigMap labelled budget=true";
    eventually("the list told too large", || async {
        running
            .fleet
            .problems()
            .get(source)
            .is_some_and(|p| p.contains("more than the whole cache budget"))
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let lists = running.fleet.status().initial_lists;
    assert_eq!(lists.cached_bytes(), 0, "nothing of it held");
    assert_eq!(reconciles.load(Ordering::Relaxed), 0);
    assert!(serving(&running).is_empty());
    // Its provider removes it: the problem goes with it.
    running.provider.disengage("large");
    eventually("the problem gone", || async {
        running.fleet.problems().get(source).is_none()
    })
    .await;
}
