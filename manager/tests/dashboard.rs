//! The Grafana dashboard in `docs/dashboards/kube-multicluster.json` loads: it is
//! a well-formed dashboard whose variables are all defined, and every
//! metric its queries name is one a running manager exports on `/metrics`
//! (a sharded one and one under leader election, over a real API server).
//! So does every expression of the alert rules in
//! `docs/alerts/kube-multicluster.rules.yaml`, a well-formed rule file.

mod support;

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api,
    api::{Patch, PatchParams},
    runtime::watcher,
};
use kube_multicluster::{
    Action, Controller, Fleet, ObjectRequest, controller::ClusterSelector,
    provider::ProgrammaticProvider,
};
use kube_multicluster_envtest::Envtest;
use kube_multicluster_layers::{
    catch_panic::CatchPanicLayer,
    metrics::{MetricsLayer, ReconcileMetrics},
};
use kube_multicluster_manager::{LeaderElection, LeaseParams, Manager, Sharding};
use serde_json::Value;
use support::{
    PATIENCE, config_maps,
    endpoints::{Endpoints, listener},
};
use tokio::sync::oneshot;
use tower::{BoxError, ServiceBuilder, service_fn};

const DASHBOARD: &str = include_str!("../../docs/dashboards/kube-multicluster.json");
const RULES: &str = include_str!("../../docs/alerts/kube-multicluster.rules.yaml");

/// The alert rules, by name, with their expressions: each a well-formed
/// Prometheus rule (a name, an expression, a severity, a summary and a
/// description; `for` a duration if given).
fn alert_rules() -> BTreeMap<String, String> {
    let file: Value = serde_saphyr::from_str(RULES).expect("the rule file is YAML");
    let groups = file["groups"].as_array().expect("groups");
    assert!(!groups.is_empty(), "no group");
    let mut rules = BTreeMap::new();
    for group in groups {
        let group_name = group["name"].as_str().expect("a group's name");
        for rule in group["rules"].as_array().expect("a group's rules") {
            let alert = rule["alert"].as_str().expect("an alert's name").to_owned();
            let expr = rule["expr"].as_str().expect("an expr").to_owned();
            assert!(
                ["critical", "warning", "info"]
                    .contains(&rule["labels"]["severity"].as_str().unwrap_or("")),
                "{group_name}/{alert}: severity"
            );
            for field in ["summary", "description"] {
                assert!(
                    rule["annotations"][field]
                        .as_str()
                        .is_some_and(|t| !t.is_empty()),
                    "{group_name}/{alert}: {field}"
                );
            }
            if let Some(wait) = rule.get("for") {
                let wait = wait.as_str().expect("for: a duration");
                assert!(
                    wait.len() > 1
                        && wait.ends_with(['s', 'm', 'h'])
                        && wait[..wait.len() - 1].chars().all(|c| c.is_ascii_digit()),
                    "{group_name}/{alert}: for {wait}"
                );
            }
            let open = expr.matches('(').count();
            assert_eq!(
                open,
                expr.matches(')').count(),
                "{alert}: parentheses of {expr}"
            );
            assert!(rules.insert(alert.clone(), expr).is_none(), "{alert} twice");
        }
    }
    rules
}

/// Grafana's own variables, which a dashboard need not define.
const BUILTIN: [&str; 3] = ["__rate_interval", "__interval", "__range"];

/// The metric names a PromQL query reads: the names left once label
/// matchers, ranges, grouping clauses and strings are taken out, that are
/// not functions or aggregations (followed by `(`), numbers or keywords.
fn metrics_in(query: &str) -> BTreeSet<String> {
    let mut plain = String::new();
    let mut depth = 0;
    for c in query.chars() {
        match c {
            '{' | '[' => depth += 1,
            '}' | ']' => depth -= 1,
            _ if depth == 0 => plain.push(c),
            _ => {}
        }
    }
    // Each word, with the first character after it that is not a space.
    let mut words: Vec<(String, char)> = Vec::new();
    let mut word = String::new();
    for c in plain.chars().chain(std::iter::once(' ')) {
        if c.is_ascii_alphanumeric() || c == '_' || c == ':' {
            word.push(c);
        } else {
            if !word.is_empty() {
                words.push((std::mem::take(&mut word), c));
            }
            if !c.is_whitespace()
                && let Some(last) = words.last_mut()
                && last.1.is_whitespace()
            {
                last.1 = c;
            }
        }
    }
    let mut names = BTreeSet::new();
    let mut grouping = false;
    for (i, (word, next)) in words.iter().enumerate() {
        if grouping {
            grouping = *next != ')';
            continue;
        }
        // Label lists: `by (...)`, `without (...)`, `on (...)`,
        // `ignoring (...)`, `group_left (...)`.
        let labels = ["by", "without", "on", "ignoring"].contains(&word.as_str())
            || (["group_left", "group_right"].contains(&word.as_str()) && *next == '(');
        if labels {
            grouping = *next == '(' || next.is_whitespace();
            continue;
        }
        // A function, or an aggregation before its grouping clause.
        let function = *next == '('
            || words
                .get(i + 1)
                .is_some_and(|(after, _)| after == "by" || after == "without");
        let number = word.chars().next().is_some_and(|c| c.is_ascii_digit());
        let keyword = ["bool", "group_left", "group_right", "offset"].contains(&word.as_str());
        if !function && !number && !keyword {
            names.insert(word.clone());
        }
    }
    names
}

/// Every sample name the text can hold, from its `# TYPE` lines: a
/// counter's `_total`, a histogram's `_bucket`, `_sum` and `_count`, a
/// gauge's own name.
fn exported(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let mut parts = rest.split_whitespace();
        let (Some(name), Some(kind)) = (parts.next(), parts.next()) else {
            continue;
        };
        let suffixes: &[&str] = match kind {
            "counter" => &["_total"],
            "histogram" => &["_bucket", "_sum", "_count"],
            _ => &[""],
        };
        names.extend(suffixes.iter().map(|s| format!("{name}{s}")));
    }
    names
}

/// Runs a manager of one cluster, `east`, with a controller whose
/// reconciles of `dashboard-0` fail, of `dashboard-1` panic and of the
/// others succeed, and `coordinate` (sharding or leader election), until
/// its `/metrics` show each outcome and the cluster's queue, and returns
/// that text.
async fn scrape(env: &Envtest, coordinate: impl FnOnce(Manager) -> Manager) -> String {
    let cluster = &env.clusters()[0];
    let fleet = Fleet::new();
    let (provider, clusters) = ProgrammaticProvider::new();
    let (listener, port) = listener();
    let (stop, stopped) = oneshot::channel::<()>();
    let mut manager = Manager::new(&fleet)
        .provider(provider)
        .endpoints_on(listener)
        .graceful_shutdown_on(async move {
            let _ = stopped.await;
        });
    let metrics = ReconcileMetrics::new(manager.registry()).follow(&fleet);
    let reconciler = ServiceBuilder::new()
        .layer(MetricsLayer::new(metrics))
        .layer(CatchPanicLayer::new())
        .service(service_fn(|request: ObjectRequest<ConfigMap>| async move {
            match request.request.name.as_str() {
                "dashboard-0" => Err::<Action, BoxError>("failing on purpose".into()),
                "dashboard-1" => panic!("panicking on purpose"),
                "dashboard-2" => {
                    // A write, which the controller then reads its own of.
                    let api = Api::<ConfigMap>::namespaced(request.cluster.client(), "default");
                    let patch = serde_json::json!({"metadata": {"annotations": {"seen": "yes"}}});
                    api.patch("dashboard-2", &PatchParams::default(), &Patch::Merge(patch))
                        .await?;
                    Ok(Action::requeue(Duration::from_secs(300)))
                }
                _ => Ok(Action::requeue(Duration::from_secs(300))),
            }
        }));
    let manager = coordinate(manager).controller(
        Controller::<ConfigMap>::new(&fleet, watcher::Config::default().labels("dashboard=true"))
            .named("configmaps"),
        reconciler,
    );
    let run = tokio::spawn(manager.run());
    clusters.engage("east", cluster.client());
    let endpoints = Endpoints::new(port);
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let text = loop {
        if let Ok((_, text)) = endpoints.get("/metrics").await
            && [
                "controller_runtime_reconcile_total",
                "controller_runtime_reconcile_errors_total",
                "controller_runtime_reconcile_panics_total",
            ]
            .iter()
            .all(|name| {
                text.contains(&format!(
                    r#"{name}{{controller="configmaps",cluster="east""#
                ))
            })
            && text.contains(
                r#"workqueue_depth{name="configmaps",controller="configmaps",cluster="east"}"#,
            )
            && text.contains(r#"kube_multicluster_read_your_writes_writes_total{cluster="east"}"#)
        {
            break text;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not every outcome in east on /metrics"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let _ = stop.send(());
    tokio::time::timeout(PATIENCE, run)
        .await
        .expect("stops")
        .expect("the manager's task")
        .expect("runs");
    text
}

#[test]
fn queries_name_metrics_and_skip_functions_labels_and_ranges() {
    let names = metrics_in(
        r#"histogram_quantile(0.99, sum by (cluster, le) (rate(workqueue_queue_duration_seconds_bucket{controller=~"$controller", cluster=~"$cluster"}[$__rate_interval])))"#,
    );
    assert_eq!(
        names,
        BTreeSet::from(["workqueue_queue_duration_seconds_bucket".to_owned()])
    );
    let names =
        metrics_in("sum by (instance) (kube_multicluster_engaged_clusters) / on (instance) up");
    assert_eq!(
        names,
        BTreeSet::from([
            "kube_multicluster_engaged_clusters".to_owned(),
            "up".to_owned()
        ])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_reads_only_metrics_the_manager_exports() {
    let dashboard: Value = serde_json::from_str(DASHBOARD).expect("the dashboard is JSON");
    assert!(dashboard["title"].as_str().is_some_and(|t| !t.is_empty()));
    assert!(dashboard["uid"].as_str().is_some_and(|t| !t.is_empty()));
    assert!(dashboard["schemaVersion"].as_u64().is_some());
    let variables: BTreeSet<&str> = dashboard["templating"]["list"]
        .as_array()
        .expect("templating.list")
        .iter()
        .map(|v| v["name"].as_str().expect("a variable's name"))
        .collect();
    for wanted in ["datasource", "job", "cluster", "controller"] {
        assert!(variables.contains(wanted), "variable {wanted}");
    }

    // Every query, by its panel's title.
    let mut queries: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut ids = BTreeSet::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        let id = panel["id"].as_u64().expect("a panel's id");
        assert!(ids.insert(id), "panel id {id} twice");
        let title = panel["title"].as_str().expect("a panel's title").to_owned();
        let grid = &panel["gridPos"];
        for field in ["h", "w", "x", "y"] {
            assert!(grid[field].as_u64().is_some(), "{title}: gridPos.{field}");
        }
        if panel["type"] == "row" {
            continue;
        }
        let targets = panel["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{title} queries nothing");
        for target in targets {
            assert!(target["refId"].as_str().is_some(), "{title}: refId");
            let expr = target["expr"].as_str().expect("an expr").to_owned();
            queries.entry(title.clone()).or_default().push(expr);
        }
    }
    assert!(queries.len() >= 12, "{} panels", queries.len());
    let mut named = BTreeSet::new();
    for (title, exprs) in &queries {
        for expr in exprs {
            for variable in expr.split('$').skip(1) {
                let variable: String = variable
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                assert!(
                    variables.contains(variable.as_str()) || BUILTIN.contains(&variable.as_str()),
                    "{title}: ${variable} is not defined"
                );
            }
            let metrics = metrics_in(expr);
            assert!(!metrics.is_empty(), "{title}: {expr} reads no metric");
            named.extend(metrics);
        }
    }

    let env = Envtest::start(1).await.expect("envtest");
    let client = env.clusters()[0].client();
    config_maps(client.clone(), "dashboard", 3).await;
    let sharded = scrape(&env, |manager| {
        manager.sharding(
            Sharding::new("dashboard-shards")
                .lease(
                    LeaseParams::default()
                        .namespace("default")
                        .identity("one")
                        .client(client.clone()),
                )
                // A hub that is not engaged: its keys' shards are reported.
                .hub(ClusterSelector::matching(|name| name.as_str() == "hub")),
        )
    })
    .await;
    let led = scrape(&env, |manager| {
        manager.leader_election(
            LeaderElection::new("dashboard-leader").lease(
                LeaseParams::default()
                    .namespace("default")
                    .identity("one")
                    .client(client.clone()),
            ),
        )
    })
    .await;
    let mut exported = exported(&sharded);
    exported.extend(self::exported(&led));
    let missing: Vec<_> = named.difference(&exported).collect();
    assert!(
        missing.is_empty(),
        "the dashboard reads {missing:?}, which no manager exports; exported: {exported:?}"
    );
    let rules = alert_rules();
    assert!(rules.len() >= 3, "{rules:?}");
    for (alert, expr) in &rules {
        let metrics = metrics_in(expr);
        assert!(!metrics.is_empty(), "{alert}: {expr} reads no metric");
        let missing: Vec<_> = metrics.difference(&exported).collect();
        assert!(
            missing.is_empty(),
            "the alert {alert} reads {missing:?}, which no manager exports"
        );
    }
    // Every coverage gauge, once the replica has listed the Leases: the
    // hub makes every shard offered, and one replica holds them all.
    for gauge in [
        "kube_multicluster_shards_unowned",
        "kube_multicluster_shards_misplaced",
        "kube_multicluster_shards_unowned_clusters",
        "kube_multicluster_shards_unowned_seconds",
    ] {
        let family = format!("{gauge}{{name=\"dashboard-shards\"}} ");
        assert!(sharded.contains(&family), "{gauge}: {sharded}");
    }
    // What a sharded replica says of its clusters.
    assert!(
        sharded.contains(
            r#"kube_multicluster_shard_owned{name="dashboard-shards",cluster="east",shard="#
        ),
        "{sharded}"
    );
    assert!(
        led.contains(r#"leader_election_master_status{name="dashboard-leader"} 1"#),
        "{led}"
    );
    assert!(
        sharded.contains(r#"kube_multicluster_shard_hub_shards{name="dashboard-shards"}"#),
        "{sharded}"
    );
}
