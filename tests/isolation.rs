//! One cluster's trouble stays in that cluster: a missing type, a forbidden
//! type, a hung API server and a throttled cluster each affect only their own
//! cluster and controller, against real API servers.

mod support;

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use k8s_openapi::api::{
    core::v1::{ConfigMap, Secret},
    rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, RoleRef, Subject},
};
use kube::{
    Api, CustomResource, CustomResourceExt,
    api::{ObjectMeta, Patch, PatchParams, PostParams},
    runtime::watcher,
};
use kube_multicluster::envtest::Envtest;
use kube_multicluster::{
    Action, Controller, McRequest, ObjectRequest, cache::WatchState, controller::Config,
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use support::*;
use tokio::time::Instant;
use tower::{BoxError, service_fn};

#[derive(CustomResource, Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[kube(
    group = "test.kube-multicluster.dev",
    version = "v1",
    kind = "Widget",
    namespaced
)]
struct WidgetSpec {
    size: u32,
}

fn widget(name: &str) -> Widget {
    let mut widget = Widget::new(name, WidgetSpec { size: 1 });
    widget.metadata.namespace = Some("default".into());
    widget
}

#[tokio::test]
async fn a_cluster_without_a_crd_serves_other_controllers_and_the_crd_is_picked_up_once_installed()
{
    let env = Envtest::start(2).await.unwrap();
    let (with, without) = (&env.clusters()[0], &env.clusters()[1]);
    with.install_crds([Widget::crd()]).await.unwrap();
    for cluster in env.clusters() {
        create_config_map(cluster.client(), "everywhere").await;
    }
    let mut running = Running::new();
    let mut config_maps = running.config_maps();
    let (service, mut widgets) = recorder();
    let widget_controller = Controller::<Widget>::new(&running.fleet, watcher::Config::default());
    let widget_status = widget_controller.status();
    running.spawn(widget_controller, service);
    running.add_all(&env);

    // The ConfigMap controller serves both clusters, CRD or not.
    expect_all(
        &mut config_maps,
        [
            request("cluster-0", "everywhere"),
            request("cluster-1", "everywhere"),
        ],
    )
    .await;
    // The Widget controller serves the cluster that has the type...
    Api::<Widget>::namespaced(with.client(), "default")
        .create(&PostParams::default(), &widget("first"))
        .await
        .unwrap();
    expect_all(&mut widgets, [request("cluster-0", "first")]).await;
    // ...and says why it does not serve the other.
    let cluster = failing(&widget_status, "cluster-1", PATIENCE).await;
    assert!(!cluster.serving);
    // In words, naming the kind and its group and version, not as the API
    // server's plain-text 404 that kube cannot parse.
    let WatchState::Failing { reason } = &cluster.watches[0].state else {
        panic!("{cluster}");
    };
    assert!(
        reason.contains("Widget (test.kube-multicluster.dev/v1) is not served by this cluster"),
        "{reason}"
    );
    assert!(!reason.contains("Failed to parse"), "{reason}");
    assert!(!widget_status.is_synced());

    // Installed later, the type is picked up without a restart.
    without.install_crds([Widget::crd()]).await.unwrap();
    Api::<Widget>::namespaced(without.client(), "default")
        .create(&PostParams::default(), &widget("later"))
        .await
        .unwrap();
    // The watch retries with backoff (up to 30 s between attempts).
    let patience = Duration::from_secs(90);
    tokio::time::timeout(patience, widget_status.synced())
        .await
        .expect("the Widget controller serves cluster-1 once its CRD is there");
    expect_all(&mut widgets, [request("cluster-1", "later")]).await;
}

#[tokio::test]
async fn a_forbidden_type_fails_only_that_watch_and_says_why() {
    let env = Envtest::start(1).await.unwrap();
    let cluster = &env.clusters()[0];
    // "limited" may read ConfigMaps but not Secrets.
    let role = ClusterRole {
        metadata: ObjectMeta {
            name: Some("read-config-maps".into()),
            ..ObjectMeta::default()
        },
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec![String::new()]),
            resources: Some(vec!["configmaps".into()]),
            verbs: vec!["get".into(), "list".into(), "watch".into()],
            ..PolicyRule::default()
        }]),
        ..ClusterRole::default()
    };
    let binding = ClusterRoleBinding {
        metadata: ObjectMeta {
            name: Some("limited-reads-config-maps".into()),
            ..ObjectMeta::default()
        },
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "ClusterRole".into(),
            name: "read-config-maps".into(),
        },
        subjects: Some(vec![Subject {
            kind: "User".into(),
            name: "limited".into(),
            api_group: Some("rbac.authorization.k8s.io".into()),
            ..Subject::default()
        }]),
    };
    Api::<ClusterRole>::all(cluster.client())
        .create(&PostParams::default(), &role)
        .await
        .unwrap();
    Api::<ClusterRoleBinding>::all(cluster.client())
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
    create_config_map(cluster.client(), "readable").await;

    let mut running = Running::new();
    // One controller needs Secrets too; the other only ConfigMaps.
    let (service, mut needs_secrets) = recorder();
    let with_secrets = Controller::<ConfigMap>::new(&running.fleet, watcher::Config::default())
        .watches::<Secret, _>(watcher::Config::default(), |_, _| None::<McRequest>);
    let status = with_secrets.status();
    running.spawn(with_secrets, service);
    let mut config_maps_only = running.config_maps();
    running
        .provider
        .engage("restricted", cluster.client_for("limited", &[]).unwrap());

    expect_all(&mut config_maps_only, [request("restricted", "readable")]).await;
    let cluster = failing(&status, "restricted", PATIENCE).await;
    assert!(!cluster.serving);
    let reasons: Vec<_> = cluster.failing().collect();
    assert_eq!(reasons.len(), 1, "only the Secret watch fails: {cluster}");
    assert_eq!(reasons[0].kind, "Secret");
    assert!(
        matches!(&reasons[0].state, WatchState::Failing { reason } if reason.contains("forbidden")),
        "{cluster}"
    );
    let config_map_watch = cluster.watches.iter().find(|w| w.kind == "ConfigMap");
    assert_eq!(config_map_watch.unwrap().state, WatchState::Synced);
    let ran = drain_for(&mut needs_secrets, Duration::from_secs(1)).await;
    assert!(
        ran.is_empty(),
        "no key runs before every watch syncs: {ran:?}"
    );
}

/// Reconciles that read their object from the API server and come back at
/// once, counting completions per cluster and reconciles in flight.
#[derive(Clone, Default)]
struct Load {
    done: Arc<Mutex<HashMap<String, u64>>>,
    in_flight: Arc<Mutex<HashMap<String, usize>>>,
    most_in_flight: Arc<Mutex<HashMap<String, usize>>>,
}

impl Load {
    fn done(&self, cluster: &str) -> u64 {
        self.done.lock().unwrap().get(cluster).copied().unwrap_or(0)
    }

    fn most_in_flight(&self, cluster: &str) -> usize {
        let most = self.most_in_flight.lock().unwrap();
        most.get(cluster).copied().unwrap_or(0)
    }

    /// Completions per second in the healthy clusters over `window`.
    async fn healthy_rate(&self, window: Duration) -> f64 {
        let count = || self.done("cluster-0") + self.done("cluster-2");
        let before = count();
        tokio::time::sleep(window).await;
        (count() - before) as f64 / window.as_secs_f64()
    }
}

#[tokio::test]
async fn a_hung_cluster_cannot_take_the_slots_the_others_need() {
    let env = Envtest::start(3).await.unwrap();
    for cluster in env.clusters() {
        for i in 0..20 {
            create_config_map(cluster.client(), &format!("cm-{i}")).await;
        }
    }
    let mut running = Running::new();
    let fleet = running.fleet.clone();
    let load = Load::default();
    let service = service_fn({
        let load = load.clone();
        move |request: ObjectRequest<ConfigMap>| {
            let (load, fleet) = (load.clone(), fleet.clone());
            let request = request.request;
            async move {
                let cluster = request.cluster.to_string();
                {
                    let mut in_flight = load.in_flight.lock().unwrap();
                    let now = in_flight.entry(cluster.clone()).or_default();
                    *now += 1;
                    let mut most = load.most_in_flight.lock().unwrap();
                    let most = most.entry(cluster.clone()).or_default();
                    *most = (*most).max(*now);
                }
                let client = fleet.get(&request.cluster).unwrap().client();
                let namespace = request.namespace.as_deref().unwrap_or("default");
                let read = Api::<ConfigMap>::namespaced(client, namespace)
                    .get_opt(&request.name)
                    .await;
                *load.in_flight.lock().unwrap().get_mut(&cluster).unwrap() -= 1;
                read?;
                *load.done.lock().unwrap().entry(cluster).or_default() += 1;
                Ok::<_, BoxError>(Action::requeue(Duration::ZERO))
            }
        }
    });
    let controller = Controller::<ConfigMap>::new(&running.fleet, watcher::Config::default())
        .with_config(Config::default().concurrency(16));
    running.spawn(controller, service);
    running.add_all(&env);
    for cluster in env.clusters() {
        running.wait_served(cluster.name()).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let normal = load.healthy_rate(Duration::from_secs(3)).await;
    assert!(normal > 0.0);

    // cluster-1 stops answering: its reconciles hang, holding their slots.
    // (Before, while it alone was served, it could use them all.)
    load.most_in_flight.lock().unwrap().clear();
    env.clusters()[1].hang();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let during = load.healthy_rate(Duration::from_secs(3)).await;
    let held = load.most_in_flight("cluster-1");
    env.clusters()[1].restore();

    eprintln!(
        "healthy clusters: {normal:.0}/s normally, {during:.0}/s with cluster-1 hung holding {held} slots"
    );
    assert!(
        held <= 8,
        "a hung cluster holds at most half of 16 slots: {held}"
    );
    // Were the hung cluster to take every slot, the others would stop
    // (a rate near 0); a quarter leaves room for a busy machine's noise.
    assert!(
        during >= normal / 4.0,
        "the others keep their pace: {during:.0}/s against {normal:.0}/s"
    );
}

#[tokio::test]
async fn a_throttled_key_that_changes_while_it_waits_runs_once_and_is_counted() {
    let env = Envtest::start(1).await.unwrap();
    let client = env.clusters()[0].client();
    let api = Api::<ConfigMap>::namespaced(client.clone(), "default");
    let marked = |name: &str| {
        let mut cm = config_map(name);
        cm.metadata.labels = Some([("throttle".to_owned(), "yes".to_owned())].into());
        cm
    };
    for name in ["a", "b", "c"] {
        api.create(&PostParams::default(), &marked(name))
            .await
            .unwrap();
    }
    let mut running = Running::new();
    let (service, mut rx) = recorder();
    // One reconcile every two seconds in this cluster.
    let controller = Controller::<ConfigMap>::new(
        &running.fleet,
        watcher::Config::default().labels("throttle=yes"),
    )
    .with_config(Config::default().cluster_rate_limit(0.5, 1));
    let depth = controller.queue_depth();
    running.spawn(controller, service);
    running.add_all(&env);

    let first = tokio::time::timeout(PATIENCE, rx.recv())
        .await
        .unwrap()
        .unwrap();
    let waiting = ["a", "b", "c"]
        .into_iter()
        .find(|n| *n != first.name)
        .unwrap();
    for value in ["2", "3"] {
        api.patch(
            waiting,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "data": { "value": value } })),
        )
        .await
        .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(depth.get(), 2, "both throttled keys are counted, once each");

    let started = Instant::now();
    let rest = drain_for(&mut rx, Duration::from_secs(7)).await;
    let names: Vec<_> = rest.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names.len(), 2, "two more reconciles, no more: {names:?}");
    assert!(names.contains(&waiting), "{names:?}");
    assert!(started.elapsed() >= Duration::from_secs(3));
    assert_eq!(depth.get(), 0);
}

#[tokio::test]
async fn each_object_is_reconciled_once_at_start_up() {
    let env = Envtest::start(1).await.unwrap();
    let client = env.clusters()[0].client();
    let api = Api::<ConfigMap>::namespaced(client.clone(), "default");
    for i in 0..20 {
        let mut cm = config_map(&format!("cm-{i}"));
        cm.metadata.labels = Some([("once".to_owned(), "yes".to_owned())].into());
        api.create(&PostParams::default(), &cm).await.unwrap();
    }
    let watch = watcher::Config::default().labels("once=yes");
    let mut running = Running::new();
    let (first_service, mut first) = recorder();
    running.spawn(
        Controller::<ConfigMap>::new(&running.fleet, watch.clone()),
        first_service,
    );
    // Ten clusters (names) on one API server, each with its own watch.
    let names: Vec<String> = (0..10).map(|i| format!("c-{i}")).collect();
    for name in &names {
        running.provider.engage(name.as_str(), client.clone());
    }
    for name in &names {
        running.wait_served(name).await;
    }
    // A second controller joins watches that have synced already.
    let (second_service, mut second) = recorder();
    running.spawn(
        Controller::<ConfigMap>::new(&running.fleet, watch),
        second_service,
    );
    for name in &names {
        running.wait_served(name).await;
    }

    for (controller, rx) in [("first", &mut first), ("second", &mut second)] {
        let seen = drain_for(rx, Duration::from_secs(2)).await;
        let mut counts: HashMap<McRequest, usize> = HashMap::new();
        for request in seen {
            *counts.entry(request).or_default() += 1;
        }
        assert_eq!(
            counts.len(),
            200,
            "{controller}: every object of every cluster"
        );
        let twice: Vec<_> = counts.iter().filter(|(_, n)| **n > 1).collect();
        assert!(
            twice.is_empty(),
            "{controller} reconciled some more than once: {twice:?}"
        );
    }
}

#[tokio::test]
async fn a_controller_that_stops_leaves_no_watch_behind() {
    let env = Envtest::start(1).await.unwrap();
    let client = env.clusters()[0].client();
    let (config_maps, secrets) = (
        watches_served(&client, "configmaps").await,
        watches_served(&client, "secrets").await,
    );
    let mut running = Running::new();
    let (service, _rx) = recorder();
    let controller = Controller::<ConfigMap>::new(&running.fleet, watcher::Config::default())
        .owns_metadata::<Secret>(watcher::Config::default());
    running.spawn(controller, service);
    running.add_all(&env);
    running.wait_served("cluster-0").await;
    // Served means listed; the watch request itself follows the list.
    tokio::time::timeout(PATIENCE, async {
        while watches_served(&client, "configmaps").await < config_maps + 1
            || watches_served(&client, "secrets").await < secrets + 1
        {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("one watch of each type runs at the API server");
    assert_eq!(watches_served(&client, "configmaps").await, config_maps + 1);
    assert_eq!(watches_served(&client, "secrets").await, secrets + 1);

    // The controller stops; the cluster stays engaged.
    running.tasks.pop().unwrap().abort();
    tokio::time::timeout(PATIENCE, async {
        while watches_served(&client, "configmaps").await > config_maps
            || watches_served(&client, "secrets").await > secrets
        {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("its watches end at the API server");
    let cluster = running.fleet.get("cluster-0").expect("still engaged");
    assert_eq!(cluster.cache().watch_count(), 0);
}

#[tokio::test]
async fn a_wrong_certificate_authority_is_named_in_the_reason() {
    use kube::{Client, config::KubeConfigOptions};

    let env = Envtest::start(2).await.unwrap();
    // cluster-0's address, but cluster-1's CA: the server's certificate
    // cannot be verified.
    let mut kubeconfig = env.clusters()[0].kubeconfig().clone();
    let other_ca = env.clusters()[1].kubeconfig().clusters[0]
        .cluster
        .as_ref()
        .unwrap()
        .certificate_authority_data
        .clone();
    kubeconfig.clusters[0]
        .cluster
        .as_mut()
        .unwrap()
        .certificate_authority_data = other_ca;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .unwrap();
    let mut running = Running::new();
    let _rx = running.config_maps();
    running
        .provider
        .engage("wrong-ca", Client::try_from(config).unwrap());
    let cluster = failing(&running.statuses[0], "wrong-ca", PATIENCE).await;
    let WatchState::Failing { reason } = &cluster.watches[0].state else {
        unreachable!("failing")
    };
    assert!(
        reason.contains("certificate") || reason.contains("UnknownIssuer"),
        "the reason names the TLS failure, not only the connection: {reason}"
    );
}

#[tokio::test]
async fn a_cluster_that_cannot_sync_keeps_no_unread_changes_for_the_controller() {
    let env = Envtest::start(1).await.unwrap();
    let cluster = &env.clusters()[0];
    let mut running = Running::new();
    let (service, _rx) = recorder();
    // ConfigMaps, and Widgets they own: a type this cluster does not serve.
    let controller = Controller::<ConfigMap>::new(&running.fleet, watcher::Config::default())
        .owns::<Widget>(watcher::Config::default());
    let status = controller.status();
    running.spawn(controller, service);
    running.add_all(&env);
    failing(&status, "cluster-0", PATIENCE).await;

    // The ConfigMap watch runs and keeps its store, but nobody subscribes
    // to it, so changes made meanwhile pile up nowhere.
    for i in 0..20 {
        create_config_map(cluster.client(), &format!("churn-{i}")).await;
    }
    let engaged = running.fleet.get("cluster-0").unwrap();
    let config_maps = engaged
        .cache()
        .find::<ConfigMap>(&watcher::Config::default())
        .expect("the controller's ConfigMap watch runs");
    eventually("the ConfigMap watch synced", || async {
        config_maps.has_synced()
    })
    .await;
    assert_eq!(config_maps.subscribers(), 0);

    cluster.install_crds([Widget::crd()]).await.unwrap();
    tokio::time::timeout(Duration::from_secs(90), status.synced())
        .await
        .expect("served once the CRD is there");
    assert_eq!(config_maps.subscribers(), 1);
}

#[tokio::test]
async fn a_cluster_that_hangs_before_its_first_list_is_reported_after_the_sync_timeout() {
    let env = Envtest::start(2).await.unwrap();
    let (answers, hangs) = (&env.clusters()[0], &env.clusters()[1]);
    create_config_map(answers.client(), "here").await;
    hangs.hang();
    let mut running = Running::new();
    let (service, mut rx) = recorder();
    let controller = Controller::<ConfigMap>::new(&running.fleet, watcher::Config::default())
        .with_config(Config::default().sync_timeout(Duration::from_secs(1)));
    let status = controller.status();
    running.spawn(controller, service);
    running.add_all(&env);

    expect_all(&mut rx, [request("cluster-0", "here")]).await;
    // Nothing answers, so nothing fails: the timeout says so.
    let cluster = failing(&status, "cluster-1", PATIENCE).await;
    assert!(
        matches!(&cluster.watches[0].state, WatchState::Failing { reason } if reason.contains("not synced within 1s")),
        "{cluster}"
    );
    hangs.restore();
    tokio::time::timeout(PATIENCE, status.synced())
        .await
        .expect("served once it answers");
}
