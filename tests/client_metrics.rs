//! Each cluster's API requests, counted under its name on real API servers:
//! by status and method, with a throttled cluster's `429`s and the waits its
//! `Retry-After` asks for, and gone when the cluster leaves.

use std::time::{Duration, Instant};

use k8s_openapi::api::{
    core::v1::ConfigMap,
    flowcontrol::v1::{FlowSchema, PriorityLevelConfiguration},
    rbac::v1::ClusterRoleBinding,
};
use kube::{
    Api, Client,
    api::{DeleteParams, ListParams, PostParams, VersionMatch},
    config::{KubeConfigOptions, Kubeconfig},
};
use kube_multicluster::envtest::Envtest;
use kube_multicluster::layers::metrics::ClientMetrics;
use kube_multicluster::{Fleet, client};
use prometheus_client::{encoding::text::encode, registry::Registry};

/// A client over kube-multicluster's own stack, retrying as configured, for the
/// fleet to finish.
async fn fleet_client(kubeconfig: Kubeconfig, retry: bool) -> client::ClusterClient {
    let mut config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .expect("a config");
    config.default_retry = retry;
    client::cluster_client(config).expect("a client")
}

fn scrape(registry: &Registry) -> String {
    let mut text = String::new();
    encode(&mut text, registry).unwrap();
    text
}

/// The value of the one series line that starts with `prefix`.
fn value(text: &str, prefix: &str) -> Option<u64> {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .map(|v| v.parse().expect("a count"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_clusters_requests_are_counted_under_its_name_and_go_when_it_leaves() {
    let env = Envtest::start(1).await.unwrap();
    let cluster = &env.clusters()[0];
    // Two names for one API server, on purpose; and no identity reads
    // among the requests counted.
    let fleet = Fleet::with_config(kube_multicluster::FleetConfig {
        duplicates: kube_multicluster::Duplicates::Ignore,
        ..kube_multicluster::FleetConfig::default()
    });
    let mut registry = Registry::default();
    ClientMetrics::register(&mut registry, fleet.clone());

    // Two engagements of one API server: one through kube-multicluster's client,
    // one through kube's own (HTTP/1.1), which is counted from outside.
    let own = fleet.engage(
        "own",
        fleet_client(cluster.kubeconfig().clone(), true).await,
    );
    let kubes = fleet.engage("kubes", cluster.client());
    let missing = Api::<ConfigMap>::namespaced(own.client(), "default");
    for _ in 0..3 {
        assert!(missing.get_opt("nothing-here").await.unwrap().is_none());
    }
    Api::<ConfigMap>::namespaced(kubes.client(), "default")
        .list(&ListParams::default())
        .await
        .unwrap();

    assert_eq!(own.requests().total(), 3);
    assert_eq!(kubes.requests().total(), 1);
    let host = own.requests().host().expect("the server's host");
    let server: http::Uri = cluster.server().parse().unwrap();
    assert_eq!(host, server.authority().unwrap().as_str());
    assert_eq!(kubes.requests().host(), None);

    let text = scrape(&registry);
    let own_404 = format!(
        r#"rest_client_requests_total{{cluster="own",code="404",method="GET",host="{host}"}}"#
    );
    assert_eq!(value(&text, &own_404), Some(3), "{text}");
    let kubes_200 =
        r#"rest_client_requests_total{cluster="kubes",code="200",method="GET",host=""}"#;
    assert_eq!(value(&text, kubes_200), Some(1), "{text}");
    let own_count = format!(
        r#"rest_client_request_duration_seconds_count{{cluster="own",verb="GET",host="{host}"}}"#
    );
    assert_eq!(value(&text, &own_count), Some(3), "{text}");
    let own_inf = format!(
        r#"rest_client_request_duration_seconds_bucket{{le="+Inf",cluster="own",verb="GET",host="{host}"}}"#
    );
    assert_eq!(value(&text, &own_inf), Some(3), "{text}");

    // When a cluster leaves, its series go; engaged again, it starts over.
    fleet.disengage("own");
    let text = scrape(&registry);
    assert!(!text.contains(r#"cluster="own""#), "{text}");
    assert!(text.contains(r#"cluster="kubes""#), "{text}");
    let again = fleet.engage(
        "own",
        fleet_client(cluster.kubeconfig().clone(), true).await,
    );
    assert_eq!(again.requests().total(), 0);
    assert!(!scrape(&registry).contains(r#"cluster="own""#));
}

/// A priority level that admits nothing, and a flow schema that sends
/// `user`'s requests to it: the API server answers them `429` at once.
async fn throttle(admin: &Client, user: &str) {
    let level: PriorityLevelConfiguration = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "throttled" },
        "spec": {
            "type": "Limited",
            "limited": {
                "nominalConcurrencyShares": 0,
                "lendablePercent": 0,
                "borrowingLimitPercent": 0,
                "limitResponse": { "type": "Reject" },
            },
        },
    }))
    .unwrap();
    Api::<PriorityLevelConfiguration>::all(admin.clone())
        .create(&PostParams::default(), &level)
        .await
        .unwrap();
    let schema: FlowSchema = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "throttled" },
        "spec": {
            "priorityLevelConfiguration": { "name": "throttled" },
            "matchingPrecedence": 100,
            "rules": [{
                "subjects": [{ "kind": "User", "user": { "name": user } }],
                "resourceRules": [{
                    "verbs": ["*"], "apiGroups": ["*"], "resources": ["*"],
                    "namespaces": ["*"], "clusterScope": true,
                }],
            }],
        },
    }))
    .unwrap();
    Api::<FlowSchema>::all(admin.clone())
        .create(&PostParams::default(), &schema)
        .await
        .unwrap();
}

/// Requests that each hold a seat of their priority level for a few
/// seconds, kept going until stopped.
struct Jam {
    stop: tokio::sync::watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Jam {
    fn start(api: Api<ConfigMap>) -> Self {
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let tasks = (0..4)
            .map(|_| {
                let api = api.clone();
                let mut stopped = stopped.clone();
                tokio::spawn(async move {
                    let future = ListParams::default()
                        .at("999999999")
                        .matching(VersionMatch::NotOlderThan);
                    while !*stopped.borrow() {
                        tokio::select! {
                            _ = api.list(&future) => {}
                            _ = stopped.changed() => {}
                        }
                    }
                })
            })
            .collect();
        Self { stop, tasks }
    }

    async fn stop(self) {
        self.stop.send_replace(true);
        for task in self.tasks {
            task.await.unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_throttled_cluster_waits_as_retry_after_asks_and_is_counted_alone() {
    let env = Envtest::start(2).await.unwrap();
    let (calm, busy) = (&env.clusters()[0], &env.clusters()[1]);
    let user = "throttled-controller";
    let admin = busy.client();
    let binding: ClusterRoleBinding = serde_json::from_value(serde_json::json!({
        "metadata": { "name": user },
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin" },
        "subjects": [{ "apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user }],
    }))
    .unwrap();
    Api::<ClusterRoleBinding>::all(admin.clone())
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
    throttle(&admin, user).await;

    // The level's one seat held by lists that wait for a resource version
    // the server has not reached (it gives up on each after a few seconds).
    let kubeconfig = busy.kubeconfig_for(user, &[]).unwrap();
    let probe = Api::<ConfigMap>::namespaced(
        fleet_client(kubeconfig.clone(), false).await.into_client(),
        "default",
    );
    let jam = Jam::start(probe.clone());
    // Until the API server applies the flow schema, which a client that
    // does not retry sees as a 429.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match probe.list(&ListParams::default()).await {
            Err(kube::Error::Api(status)) if status.code == 429 => break,
            other => {
                assert!(Instant::now() < deadline, "never throttled: {other:?}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    let mut raw = http::Request::get("/api/v1/namespaces/default/configmaps")
        .body(Vec::new())
        .unwrap();
    raw.headers_mut()
        .insert("accept", "application/json".parse().unwrap());
    let answer = probe
        .clone()
        .into_client()
        .send(raw.map(Into::into))
        .await
        .unwrap();
    assert_eq!(answer.status(), 429);
    let retry_after: u64 = answer.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(retry_after >= 1, "Retry-After: {retry_after}");

    // No identity reads among the requests counted.
    let fleet = Fleet::with_config(kube_multicluster::FleetConfig {
        duplicates: kube_multicluster::Duplicates::Ignore,
        ..kube_multicluster::FleetConfig::default()
    });
    let mut registry = Registry::default();
    ClientMetrics::register(&mut registry, fleet.clone());
    let calm = fleet.engage("calm", fleet_client(calm.kubeconfig().clone(), true).await);
    let busy = fleet.engage("busy", fleet_client(kubeconfig, true).await);

    // The busy cluster's list waits for the server; the calm cluster's
    // requests go on meanwhile.
    let started = Instant::now();
    let waiting = tokio::spawn({
        let api = Api::<ConfigMap>::namespaced(busy.client(), "default");
        async move {
            api.list(&ListParams::default())
                .await
                .map(|l| l.items.len())
        }
    });
    let calm_api = Api::<ConfigMap>::namespaced(calm.client(), "default");
    let opened = Duration::from_secs(3 * retry_after);
    while started.elapsed() < opened {
        let asked = Instant::now();
        calm_api.list(&ListParams::default()).await.unwrap();
        assert!(
            asked.elapsed() < Duration::from_secs(1),
            "the calm cluster waited"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(!waiting.is_finished(), "the throttled list ended early");
    jam.stop().await;
    Api::<FlowSchema>::all(admin)
        .delete("throttled", &DeleteParams::default())
        .await
        .unwrap();
    let listed = tokio::time::timeout(Duration::from_secs(30), waiting)
        .await
        .expect("the throttled list went on once the server let it")
        .unwrap();
    assert!(listed.is_ok(), "{listed:?}");
    let took = started.elapsed();

    // Each attempt waited as the server asked (an API server asks for
    // longer waits as it goes on rejecting): no more 429s than the time
    // allowed at the first answer's pace, not the dozen that the client's
    // own backoff, from 5 ms, would have sent.
    let throttled = busy.requests().throttled();
    let paced = took.as_secs() / retry_after;
    println!(
        "throttled {throttled} times in {took:?} (first Retry-After {retry_after} s): {:?}",
        busy.requests().counts(),
    );
    assert!(throttled >= 2, "throttled {throttled} times");
    assert!(
        throttled <= paced + 1,
        "throttled {throttled} times in {took:?}"
    );
    assert_eq!(calm.requests().throttled(), 0);
    assert!(calm.requests().total() >= 3);

    let text = scrape(&registry);
    let host = busy.requests().host().unwrap();
    let busy_429 = format!(
        r#"rest_client_requests_total{{cluster="busy",code="429",method="GET",host="{host}"}}"#
    );
    assert_eq!(value(&text, &busy_429), Some(throttled), "{text}");
    let busy_200 = format!(
        r#"rest_client_requests_total{{cluster="busy",code="200",method="GET",host="{host}"}}"#
    );
    assert_eq!(value(&text, &busy_200), Some(1), "{text}");
    assert!(!text.contains(r#"cluster="calm",code="429""#), "{text}");
}
