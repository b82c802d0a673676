//! A controller reads its own writes on real API servers: a child made "if
//! absent" by a reconcile requeued at once is made once, and the watch
//! event of a controller's own write waits behind the start-up backlog.

mod support;

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, Mutex},
    time::Duration,
};

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::{
    Api, ResourceExt,
    api::{ListParams, ObjectMeta, Patch, PatchParams, PostParams},
    runtime::watcher,
};
use kube_fleet::envtest::Envtest;
use kube_fleet::{
    Action, Cluster, ClusterName, Controller, Fleet, McRequest, ObjectRequest, ReconcileReason,
    controller::{ClusterSelector, Config, Watch},
};
use support::eventually;
use tower::BoxError;

const PARENTS: usize = 20;
/// Runs of each parent: the first makes the child, the others are requeued
/// at once and must find it.
const RUNS: u32 = 4;

async fn parents(client: kube::Client, mode: &str) {
    let api = Api::<ConfigMap>::namespaced(client, "default");
    for i in 0..PARENTS {
        let parent = ConfigMap {
            metadata: ObjectMeta {
                name: Some(format!("{mode}-{i}")),
                labels: Some(BTreeMap::from([("mode".into(), mode.into())])),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        };
        api.create(&PostParams::default(), &parent).await.unwrap();
    }
}

/// A controller of the parents labelled `mode=<mode>`: each run makes a
/// child Secret (named by the server) if it finds none for its parent in
/// the cache, and is requeued at once until it ran [`RUNS`] times.
fn make_once(fleet: &Fleet, mode: &'static str, config: Config) -> RunsBy {
    let runs = RunsBy::default();
    let controller = Controller::<ConfigMap>::new(
        fleet,
        watcher::Config::default().labels(&format!("mode={mode}")),
    )
    .named(format!("children-{mode}"))
    .with_config(config)
    .watches::<Secret, _>(watcher::Config::default(), |_, _| None::<McRequest>);
    let counted = runs.clone();
    let reconcile = move |request: ObjectRequest<ConfigMap>| {
        let runs = counted.clone();
        async move {
            let run = runs.ran(&request.request);
            if run > RUNS {
                return Ok::<_, BoxError>(Action::await_change());
            }
            make_if_absent(&request.cluster, &request.request.name, mode).await?;
            Ok(Action::requeue(Duration::ZERO))
        }
    };
    tokio::spawn(controller.run(tower::service_fn(reconcile)));
    runs
}

/// Makes a child Secret of `parent` (named by the server) in `cluster`
/// if its cache holds none.
async fn make_if_absent(cluster: &Cluster, parent: &str, mode: &str) -> Result<(), BoxError> {
    let found = cluster
        .store::<Secret>()
        .expect("watched")
        .state()
        .iter()
        .any(|s| s.labels().get("parent").map(String::as_str) == Some(parent));
    if !found {
        let child = Secret {
            metadata: ObjectMeta {
                generate_name: Some(format!("{parent}-")),
                labels: Some(BTreeMap::from([
                    ("parent".into(), parent.to_owned()),
                    ("mode".into(), mode.to_owned()),
                ])),
                ..ObjectMeta::default()
            },
            ..Secret::default()
        };
        Api::<Secret>::namespaced(cluster.client(), "default")
            .create(&PostParams::default(), &child)
            .await?;
    }
    Ok(())
}

/// How many times each key ran.
#[derive(Clone, Default)]
struct RunsBy(Arc<Mutex<HashMap<McRequest, u32>>>);

impl RunsBy {
    fn ran(&self, key: &McRequest) -> u32 {
        let mut runs = self.0.lock().unwrap();
        let run = runs.entry(key.clone()).or_default();
        *run += 1;
        *run
    }

    fn finished(&self, keys: usize) -> bool {
        let runs = self.0.lock().unwrap();
        runs.len() == keys && runs.values().all(|r| *r >= RUNS)
    }
}

/// The children of each parent of `mode` in `client`'s cluster.
async fn children(client: kube::Client, mode: &str) -> HashMap<String, usize> {
    let secrets = Api::<Secret>::namespaced(client, "default")
        .list(&ListParams::default().labels(&format!("mode={mode}")))
        .await
        .unwrap();
    let mut children = HashMap::new();
    for secret in secrets {
        *children
            .entry(secret.labels()["parent"].clone())
            .or_default() += 1;
    }
    children
}

#[tokio::test]
async fn a_child_made_if_absent_by_a_reconcile_requeued_at_once_is_made_once_in_every_cluster() {
    let env = Envtest::start(2).await.unwrap();
    let fleet = Fleet::new();
    for cluster in env.clusters() {
        parents(cluster.client(), "reads").await;
        parents(cluster.client(), "stale").await;
    }
    // Both at once, on the same watches: one reads its writes (the
    // default), the other does not.
    let reads = make_once(&fleet, "reads", Config::default());
    let stale = make_once(&fleet, "stale", Config::default().read_your_writes(false));
    for cluster in env.clusters() {
        fleet.engage(cluster.name(), cluster.client());
    }
    let keys = PARENTS * env.clusters().len();
    eventually("every parent ran its runs", || async {
        reads.finished(keys) && stale.finished(keys)
    })
    .await;

    let mut made_twice = 0;
    for cluster in env.clusters() {
        let made = children(cluster.client(), "reads").await;
        assert_eq!(made.len(), PARENTS, "{}: {made:?}", cluster.name());
        assert!(
            made.values().all(|n| *n == 1),
            "{}: a parent has more than one child: {made:?}",
            cluster.name()
        );
        let stale = children(cluster.client(), "stale").await;
        made_twice += stale.values().filter(|n| **n > 1).count();
        let engaged = fleet.get(&ClusterName::from(cluster.name())).unwrap();
        let waits = engaged.read_your_writes();
        assert!(waits.writes >= PARENTS as u64, "{waits:?}");
        assert!(waits.waits > 0, "{waits:?}");
        assert_eq!(waits.timeouts, 0, "{waits:?}");
    }
    // Without it, a run requeued at once reads a cache that has not seen
    // the child yet.
    assert!(
        made_twice > 0,
        "without reading its writes, no parent's child was made twice"
    );
}

#[tokio::test]
async fn the_echo_of_an_own_write_runs_behind_the_start_up_backlog() {
    const OBJECTS: usize = 60;
    let env = Envtest::start(2).await.unwrap();
    for cluster in env.clusters() {
        let api = Api::<ConfigMap>::namespaced(cluster.client(), "default");
        for i in 0..OBJECTS {
            let object = ConfigMap {
                metadata: ObjectMeta {
                    name: Some(format!("object-{i}")),
                    labels: Some(BTreeMap::from([("backlog".into(), "yes".into())])),
                    ..ObjectMeta::default()
                },
                ..ConfigMap::default()
            };
            api.create(&PostParams::default(), &object).await.unwrap();
        }
    }
    let fleet = Fleet::new();
    let started: Arc<Mutex<Vec<(ClusterName, String, ReconcileReason)>>> = Arc::default();
    let log = started.clone();
    let reconcile = move |request: ObjectRequest<ConfigMap>| {
        let log = log.clone();
        async move {
            log.lock().unwrap().push((
                request.request.cluster.clone(),
                request.request.name.clone(),
                request.reason.clone(),
            ));
            let labelled = request
                .object
                .as_ref()
                .is_some_and(|o| o.labels().contains_key("labelled"));
            if !labelled {
                Api::<ConfigMap>::namespaced(request.cluster.client(), "default")
                    .patch(
                        &request.request.name,
                        &PatchParams::default(),
                        &Patch::Merge(
                            serde_json::json!({"metadata": {"labels": {"labelled": "yes"}}}),
                        ),
                    )
                    .await?;
            }
            Ok::<_, BoxError>(Action::await_change())
        }
    };
    let controller =
        Controller::<ConfigMap>::new(&fleet, watcher::Config::default().labels("backlog=yes"))
            .with_config(Config::default().cluster_concurrency(4));
    tokio::spawn(controller.run(tower::service_fn(reconcile)));
    for cluster in env.clusters() {
        fleet.engage(cluster.name(), cluster.client());
    }
    let echoed = |cluster: &str| {
        started
            .lock()
            .unwrap()
            .iter()
            .filter(|(c, _, r)| {
                c.as_str() == cluster && matches!(r, ReconcileReason::OwnWrite { .. })
            })
            .count()
    };
    for cluster in env.clusters() {
        eventually("every label's echo ran", || async {
            echoed(cluster.name()) == OBJECTS
        })
        .await;
    }
    let started = started.lock().unwrap().clone();
    for cluster in env.clusters() {
        let runs: Vec<_> = started
            .iter()
            .filter(|(c, _, _)| c.as_str() == cluster.name())
            .collect();
        let last_listed = runs
            .iter()
            .rposition(|(_, _, r)| *r == ReconcileReason::Listed)
            .unwrap();
        let first_echo = runs
            .iter()
            .position(|(_, _, r)| matches!(r, ReconcileReason::OwnWrite { kind } if &**kind == "ConfigMap"))
            .unwrap();
        assert!(
            last_listed < first_echo,
            "{}: an echo ran at {first_echo}, before the backlog's last key at {last_listed}",
            cluster.name()
        );
        // Nothing else ran: one listed run and one echo per object.
        assert_eq!(runs.len(), 2 * OBJECTS, "{}", cluster.name());
    }
}

#[tokio::test]
async fn past_its_wait_a_controller_reads_its_object_through_the_api_and_counts_it() {
    let env = Envtest::start(1).await.unwrap();
    let cluster = &env.clusters()[0];
    let api = Api::<ConfigMap>::namespaced(cluster.client(), "default");
    let gauge = ConfigMap {
        metadata: ObjectMeta {
            name: Some("gauge".into()),
            labels: Some(BTreeMap::from([("level".into(), "5".into())])),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    };
    api.create(&PostParams::default(), &gauge).await.unwrap();
    let fleet = Fleet::new();
    // A selector the API server reads and the controller cannot: it takes
    // the watch to hold every ConfigMap it writes, and waits for it.
    let watch = watcher::Config::default().labels("level>1");
    let seen: Arc<Mutex<Vec<Option<String>>>> = Arc::default();
    let log = seen.clone();
    let reconcile = move |request: ObjectRequest<ConfigMap>| {
        let log = log.clone();
        async move {
            let level = request
                .object
                .as_ref()
                .map(|o| o.labels().get("level").cloned().unwrap_or_default());
            log.lock().unwrap().push(level.clone());
            if level.as_deref() == Some("5") {
                // Out of the watch's selector: it shows a deletion, never
                // this version.
                Api::<ConfigMap>::namespaced(request.cluster.client(), "default")
                    .patch(
                        "gauge",
                        &PatchParams::default(),
                        &Patch::Merge(serde_json::json!({"metadata": {"labels": {"level": "0"}}})),
                    )
                    .await?;
            }
            Ok::<_, BoxError>(Action::await_change())
        }
    };
    let controller = Controller::<ConfigMap>::new(&fleet, watch)
        .with_config(Config::default().read_your_writes_within(Duration::from_secs(1)));
    tokio::spawn(controller.run(tower::service_fn(reconcile)));
    let engaged = fleet.engage(cluster.name(), cluster.client());
    eventually("the wait ran out", || async {
        engaged.read_your_writes().timeouts == 1
    })
    .await;
    eventually("the object was reconciled as the API has it", || async {
        seen.lock()
            .unwrap()
            .iter()
            .any(|l| l.as_deref() == Some("0"))
    })
    .await;
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen[0].as_deref(), Some("5"), "{seen:?}");
    assert!(
        !seen.contains(&None),
        "read as deleted from the cache rather than through the API: {seen:?}"
    );
}

#[tokio::test]
async fn a_hub_reconcile_that_makes_a_child_in_a_member_waits_for_the_members_cache() {
    let env = Envtest::start(2).await.unwrap();
    let (hub, member) = (&env.clusters()[0], &env.clusters()[1]);
    parents(hub.client(), "fan").await;
    let fleet = Fleet::new();
    let runs = RunsBy::default();
    let counted = runs.clone();
    let member_name = ClusterName::from(member.name());
    let hub_only = ClusterSelector::matching({
        let hub = ClusterName::from(hub.name());
        move |name| *name == hub
    });
    let members = ClusterSelector::matching({
        let member = member_name.clone();
        move |name| *name == member
    });
    let controller =
        Controller::<ConfigMap>::new(&fleet, watcher::Config::default().labels("mode=fan"))
            .clusters(hub_only)
            .watches::<Secret, _>(
                Watch::new(watcher::Config::default()).in_clusters(members),
                |_, _| None::<McRequest>,
            );
    let fleet_in = fleet.clone();
    let reconcile = move |request: ObjectRequest<ConfigMap>| {
        let (runs, fleet, member_name) = (counted.clone(), fleet_in.clone(), member_name.clone());
        async move {
            if runs.ran(&request.request) > RUNS {
                return Ok::<_, BoxError>(Action::await_change());
            }
            let member = fleet.get(&member_name).expect("engaged");
            make_if_absent(&member, &request.request.name, "fan").await?;
            Ok(Action::requeue(Duration::ZERO))
        }
    };
    tokio::spawn(controller.run(tower::service_fn(reconcile)));
    // The member first, so that its watch runs when the hub's keys do.
    fleet.engage(member.name(), member.client());
    fleet.engage(hub.name(), hub.client());
    eventually("every parent ran its runs", || async {
        runs.finished(PARENTS)
    })
    .await;
    let made = children(member.client(), "fan").await;
    assert_eq!(made.len(), PARENTS, "{made:?}");
    assert!(
        made.values().all(|n| *n == 1),
        "a parent has more than one child in the member: {made:?}"
    );
}
