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
use kube_multicluster::envtest::Envtest;
use kube_multicluster::{
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
    parents_in(client, "default", mode).await;
}

async fn parents_in(client: kube::Client, namespace: &str, mode: &str) {
    let api = Api::<ConfigMap>::namespaced(client, namespace);
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
    make_if_absent_in(cluster, "default", parent, mode).await
}

/// [`make_if_absent`], in `namespace`.
async fn make_if_absent_in(
    cluster: &Cluster,
    namespace: &str,
    parent: &str,
    mode: &str,
) -> Result<(), BoxError> {
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
        Api::<Secret>::namespaced(cluster.client(), namespace)
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
    children_in(client, "default", mode).await
}

async fn children_in(client: kube::Client, namespace: &str, mode: &str) -> HashMap<String, usize> {
    let secrets = Api::<Secret>::namespaced(client, namespace)
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
async fn a_wait_that_runs_out_is_counted_and_not_waited_again_at_once() {
    let env = Envtest::start(1).await.unwrap();
    let cluster = &env.clusters()[0];
    let api = Api::<ConfigMap>::namespaced(cluster.client(), "default");
    let gauge = |name: &str, level: &str| ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(BTreeMap::from([("level".into(), level.into())])),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    };
    api.create(&PostParams::default(), &gauge("gauge-0", "5"))
        .await
        .unwrap();
    let fleet = Fleet::new();
    // A selector the API server reads and the controller cannot: it takes
    // the watch to hold every ConfigMap it writes, and waits for those the
    // watch will never show.
    let watch = watcher::Config::default().labels("level>1");
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let log = seen.clone();
    let reconcile = move |request: ObjectRequest<ConfigMap>| {
        let log = log.clone();
        async move {
            log.lock().unwrap().push(request.request.name.clone());
            // A record of each run, at a level out of the watch.
            let record = ConfigMap {
                metadata: ObjectMeta {
                    generate_name: Some("record-".into()),
                    labels: Some(BTreeMap::from([("level".into(), "0".into())])),
                    ..ObjectMeta::default()
                },
                ..ConfigMap::default()
            };
            Api::<ConfigMap>::namespaced(request.cluster.client(), "default")
                .create(&PostParams::default(), &record)
                .await?;
            Ok::<_, BoxError>(Action::await_change())
        }
    };
    let controller = Controller::<ConfigMap>::new(&fleet, watch)
        .with_config(Config::default().read_your_writes_within(Duration::from_secs(1)));
    tokio::spawn(controller.run(tower::service_fn(reconcile)));
    let engaged = fleet.engage(cluster.name(), cluster.client());
    eventually("the first run", || async {
        seen.lock().unwrap().len() == 1
    })
    .await;
    // Its record is written and answered before the next key comes: a key
    // taken while the record is still on its way has nothing to wait for.
    eventually("the first record", || async {
        engaged.read_your_writes().writes == 1
    })
    .await;
    // The next key waits for the record, which never shows, then runs.
    api.create(&PostParams::default(), &gauge("gauge-1", "5"))
        .await
        .unwrap();
    eventually("the second run", || async {
        seen.lock().unwrap().len() == 2
    })
    .await;
    let waits = engaged.read_your_writes();
    assert_eq!(waits.timeouts, 1, "{waits:?}");
    assert!(waits.waited_seconds >= 1.0, "{waits:?}");
    // The wait ran out lately: the next key does not wait again.
    let began = std::time::Instant::now();
    api.create(&PostParams::default(), &gauge("gauge-2", "5"))
        .await
        .unwrap();
    eventually("the third run", || async {
        seen.lock().unwrap().len() == 3
    })
    .await;
    assert!(
        began.elapsed() < Duration::from_secs(1),
        "{:?}",
        began.elapsed()
    );
    assert_eq!(engaged.read_your_writes().timeouts, 1);
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

#[tokio::test]
async fn namespaces_of_one_host_each_read_their_own_writes() {
    let env = Envtest::start(1).await.unwrap();
    let host_client = env.clusters()[0].client();
    let namespaces = ["team-a", "team-b"];
    for namespace in namespaces {
        let namespace = k8s_openapi::api::core::v1::Namespace {
            metadata: ObjectMeta {
                name: Some(namespace.into()),
                ..ObjectMeta::default()
            },
            ..Default::default()
        };
        Api::all(host_client.clone())
            .create(&PostParams::default(), &namespace)
            .await
            .unwrap();
    }
    for namespace in namespaces {
        parents_in(host_client.clone(), namespace, "views").await;
    }
    let fleet = Fleet::new();
    let runs = RunsBy::default();
    let counted = runs.clone();
    let controller =
        Controller::<ConfigMap>::new(&fleet, watcher::Config::default().labels("mode=views"))
            .watches::<Secret, _>(watcher::Config::default(), |_, _| None::<McRequest>);
    let reconcile = move |request: ObjectRequest<ConfigMap>| {
        let runs = counted.clone();
        async move {
            if runs.ran(&request.request) > RUNS {
                return Ok::<_, BoxError>(Action::await_change());
            }
            let namespace = request.request.namespace.clone().unwrap_or_default();
            make_if_absent_in(&request.cluster, &namespace, &request.request.name, "views").await?;
            Ok(Action::requeue(Duration::ZERO))
        }
    };
    tokio::spawn(controller.run(tower::service_fn(reconcile)));
    let host = kube_multicluster::cache::HostCache::new("host", host_client.clone());
    for namespace in namespaces {
        fleet.engage_view(namespace, host.view(namespace));
    }
    eventually("every parent ran its runs", || async {
        runs.finished(PARENTS * namespaces.len())
    })
    .await;
    for namespace in namespaces {
        let made = children_in(host_client.clone(), namespace, "views").await;
        assert_eq!(made.len(), PARENTS, "{namespace}: {made:?}");
        assert!(
            made.values().all(|n| *n == 1),
            "{namespace}: a parent has more than one child: {made:?}"
        );
    }
}

#[tokio::test]
async fn a_write_that_takes_the_last_finalizer_off_is_shown_by_the_objects_deletion() {
    let env = Envtest::start(1).await.unwrap();
    let cluster = &env.clusters()[0];
    let api = Api::<ConfigMap>::namespaced(cluster.client(), "default");
    for i in 0..5 {
        let held = ConfigMap {
            metadata: ObjectMeta {
                name: Some(format!("held-{i}")),
                labels: Some(BTreeMap::from([("mode".into(), "held".into())])),
                finalizers: Some(vec!["example.com/cleanup".into()]),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        };
        api.create(&PostParams::default(), &held).await.unwrap();
    }
    let fleet = Fleet::new();
    let reconcile = move |request: ObjectRequest<ConfigMap>| async move {
        let deleting = request
            .object
            .as_ref()
            .is_some_and(|o| o.metadata.deletion_timestamp.is_some());
        if deleting {
            Api::<ConfigMap>::namespaced(request.cluster.client(), "default")
                .patch(
                    &request.request.name,
                    &PatchParams::default(),
                    &Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}})),
                )
                .await?;
        }
        Ok::<_, BoxError>(Action::await_change())
    };
    let controller =
        Controller::<ConfigMap>::new(&fleet, watcher::Config::default().labels("mode=held"));
    tokio::spawn(controller.run(tower::service_fn(reconcile)));
    let engaged = fleet.engage(cluster.name(), cluster.client());
    for i in 0..5 {
        api.delete(&format!("held-{i}"), &Default::default())
            .await
            .unwrap();
    }
    eventually("every object gone", || async {
        api.list(&ListParams::default().labels("mode=held"))
            .await
            .unwrap()
            .items
            .is_empty()
    })
    .await;
    // The next reconciles there did not wait out the bound for a version
    // that no watch will ever show.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let waits = engaged.read_your_writes();
    assert_eq!(waits.writes, 5, "{waits:?}");
    assert_eq!(waits.timeouts, 0, "{waits:?}");
}

#[tokio::test]
async fn a_write_no_watch_can_show_is_told_once_per_controller_cluster_and_resource() {
    let (logs, _guard) = support::capture_logs(tracing::Level::INFO);
    let env = Envtest::start(1).await.unwrap();
    let server = &env.clusters()[0];
    parents(server.client(), "uncovered").await;
    let fleet = Fleet::new();
    // Its children are Secrets, which it does not watch.
    let controller =
        Controller::<ConfigMap>::new(&fleet, watcher::Config::default().labels("mode=uncovered"))
            .named("uncovered");
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let reconcile = move |request: ObjectRequest<ConfigMap>| {
        let tx = tx.clone();
        async move {
            let child = Secret {
                metadata: ObjectMeta {
                    generate_name: Some(format!("{}-", request.request.name)),
                    ..ObjectMeta::default()
                },
                ..Secret::default()
            };
            Api::<Secret>::default_namespaced(request.cluster.client())
                .create(&PostParams::default(), &child)
                .await?;
            let _ = tx.send(request.request.name.clone());
            Ok::<_, BoxError>(Action::await_change())
        }
    };
    tokio::spawn(controller.run(tower::service_fn(reconcile)));
    fleet.engage("east", support::cluster_client(server));
    for _ in 0..PARENTS {
        tokio::time::timeout(support::PATIENCE, rx.recv())
            .await
            .expect("every parent reconciled")
            .unwrap();
    }
    // A write is looked at by the cluster's next dispatch: give it more,
    // each of which writes again.
    parents(server.client(), "uncovered-later").await;
    let later = Api::<ConfigMap>::default_namespaced(server.client());
    for i in 0..3 {
        let name = format!("uncovered-later-{i}");
        let mut parent = later.get(&name).await.unwrap();
        parent
            .labels_mut()
            .insert("mode".into(), "uncovered".into());
        later
            .replace(&name, &PostParams::default(), &parent)
            .await
            .unwrap();
        tokio::time::timeout(support::PATIENCE, rx.recv())
            .await
            .expect("a later parent reconciled")
            .unwrap();
    }
    let told = support::lines_with(
        &logs,
        &[
            "read-your-writes cannot cover",
            "secrets",
            "uncovered",
            "east",
        ],
    );
    assert_eq!(told.len(), 1, "{told:#?}");
    assert!(told[0].contains("INFO"), "{}", told[0]);
}
