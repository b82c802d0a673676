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
    Action, ClusterName, Controller, Fleet, McRequest, ObjectRequest, ReconcileReason,
    controller::Config,
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
            let parent = request.request.name.clone();
            let secrets = request.cluster.store::<Secret>().expect("watched");
            let found = secrets
                .state()
                .iter()
                .any(|s| s.labels().get("parent") == Some(&parent));
            if !found {
                let child = Secret {
                    metadata: ObjectMeta {
                        generate_name: Some(format!("{parent}-")),
                        labels: Some(BTreeMap::from([
                            ("parent".into(), parent.clone()),
                            ("mode".into(), mode.into()),
                        ])),
                        ..ObjectMeta::default()
                    },
                    ..Secret::default()
                };
                Api::<Secret>::namespaced(request.cluster.client(), "default")
                    .create(&PostParams::default(), &child)
                    .await?;
            }
            Ok(Action::requeue(Duration::ZERO))
        }
    };
    tokio::spawn(controller.run(tower::service_fn(reconcile)));
    runs
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
