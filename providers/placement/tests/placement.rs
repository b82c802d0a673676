//! Placement decisions written, changed and deleted in a hub API server
//! while the fleet runs, choosing which of the inner provider's member API
//! servers are engaged.

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api,
    api::{
        ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
    },
    runtime::watcher,
};
use kube_multicluster::{
    Action, ClusterName, Controller, Fleet, FleetEvent, ObjectRequest,
    provider::{Problems, ProgrammaticHandle, ProgrammaticProvider},
};
use kube_multicluster_envtest::{Envtest, TestCluster, crds_from_yaml};
use kube_multicluster_provider_placement::{
    Decisions, PLACEMENT_LABEL, PlacementProvider, placement_decision,
};
use tokio::sync::mpsc;
use tower::BoxError;

const PATIENCE: Duration = Duration::from_secs(30);
const NS: &str = "default";

async fn start() -> Envtest {
    let env = Envtest::builder()
        .clusters(["hub", "east", "west", "north"])
        .start()
        .await
        .unwrap();
    let crds = crds_from_yaml(include_str!("crds.yaml")).unwrap();
    env.clusters()[0].install_crds(crds).await.unwrap();
    env
}

fn rollout() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("example.com", "v1", "Rollout"),
        "rollouts",
    )
}

/// Creates the decision `name` of `resource`, labelled `labels`, with no
/// status.
async fn create(hub: &TestCluster, resource: &ApiResource, name: &str, labels: &[(&str, &str)]) {
    let mut object = DynamicObject::new(name, resource).within(NS);
    object.metadata.labels = Some(
        labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
    );
    Api::<DynamicObject>::namespaced_with(hub.client(), NS, resource)
        .create(&PostParams::default(), &object)
        .await
        .unwrap();
}

/// Writes `status.decisions` of the decision `name`, through the status
/// subresource.
async fn decide(
    hub: &TestCluster,
    resource: &ApiResource,
    name: &str,
    decisions: serde_json::Value,
) {
    Api::<DynamicObject>::namespaced_with(hub.client(), NS, resource)
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "status": { "decisions": decisions } })),
        )
        .await
        .unwrap();
}

/// `status.decisions` naming `clusters`, as OCM writes it.
fn naming(clusters: &[&str]) -> serde_json::Value {
    clusters
        .iter()
        .map(|cluster| serde_json::json!({ "clusterName": cluster, "reason": "" }))
        .collect()
}

async fn delete(hub: &TestCluster, resource: &ApiResource, name: &str) {
    Api::<DynamicObject>::namespaced_with(hub.client(), NS, resource)
        .delete(name, &DeleteParams::default())
        .await
        .unwrap();
}

struct Running {
    fleet: Fleet,
    events: mpsc::UnboundedReceiver<FleetEvent>,
    reconciled: mpsc::UnboundedReceiver<ClusterName>,
    problems: Problems,
}

/// Runs `provider` in a fleet with a controller of ConfigMaps.
fn run(provider: PlacementProvider) -> Running {
    let problems = provider.problems();
    let fleet = Fleet::new();
    let events = fleet.subscribe().events;
    let (tx, reconciled) = mpsc::unbounded_channel();
    let controller = Controller::<ConfigMap>::new(&fleet, watcher::Config::default());
    tokio::spawn(controller.run(tower::service_fn(
        move |request: ObjectRequest<ConfigMap>| {
            let _ = tx.send(request.request.cluster);
            async { Ok::<_, BoxError>(Action::await_change()) }
        },
    )));
    tokio::spawn({
        let fleet = fleet.clone();
        async move { fleet.run(provider).await }
    });
    Running {
        fleet,
        events,
        reconciled,
        problems,
    }
}

impl Running {
    /// The next fleet event, as `+name` (engaged) or `-name` (disengaged).
    async fn event(&mut self) -> String {
        let event = tokio::time::timeout(PATIENCE, self.events.recv())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "no fleet event within {PATIENCE:?}; problems: {:?}",
                    self.problems.current()
                )
            })
            .unwrap();
        match event {
            FleetEvent::Engaged(cluster) => format!("+{}", cluster.name()),
            FleetEvent::Disengaged(name) => format!("-{name}"),
        }
    }

    /// The next fleet events, `n` of them, sorted.
    async fn events(&mut self, n: usize) -> Vec<String> {
        let mut events = Vec::new();
        for _ in 0..n {
            events.push(self.event().await);
        }
        events.sort();
        events
    }

    /// No fleet event for a while.
    async fn quiet(&mut self) {
        let event = tokio::time::timeout(Duration::from_secs(2), self.events.recv()).await;
        assert!(
            event.is_err(),
            "unexpected fleet event {:?}",
            event.unwrap()
        );
    }

    /// The fleet's clusters, sorted.
    fn clusters(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .fleet
            .clusters()
            .iter()
            .map(|c| c.name().to_string())
            .collect();
        names.sort();
        names
    }

    /// Waits until a ConfigMap of `cluster` is reconciled: the cluster is
    /// served, not only engaged.
    async fn reconciled(&mut self, cluster: &str) {
        tokio::time::timeout(PATIENCE, async {
            while let Some(name) = self.reconciled.recv().await {
                if name.as_ref() == cluster {
                    return;
                }
            }
        })
        .await
        .unwrap_or_else(|_| panic!("nothing of {cluster} reconciled within {PATIENCE:?}"));
    }

    async fn problem(&self, source: &str) -> String {
        tokio::time::timeout(
            PATIENCE,
            self.problems.wait_for(|set| set.contains_key(source)),
        )
        .await
        .unwrap_or_else(|_| panic!("no problem of {source} in {:?}", self.problems.current()))
        .remove(source)
        .unwrap()
    }
}

/// The inner provider, offering the members of `env` named in `names`.
fn offer(env: &Envtest, names: &[&str]) -> (ProgrammaticProvider, ProgrammaticHandle) {
    let (inner, clusters) = ProgrammaticProvider::new();
    for name in names {
        clusters.engage(*name, env.cluster(name).unwrap().client());
    }
    (inner, clusters)
}

#[tokio::test]
async fn only_clusters_placement_decisions_name_are_engaged_and_they_follow_the_decisions() {
    let env = start().await;
    let hub = &env.clusters()[0];
    let resource = placement_decision();
    let web = [(PLACEMENT_LABEL, "web")];
    create(hub, &resource, "web-1", &web).await;
    decide(hub, &resource, "web-1", naming(&["east"])).await;
    // A decision of another placement is not read.
    create(hub, &resource, "api-1", &[(PLACEMENT_LABEL, "api")]).await;
    decide(hub, &resource, "api-1", naming(&["west", "north"])).await;

    let (inner, clusters) = offer(&env, &["east", "west", "north"]);
    let mut running = run(PlacementProvider::new(
        hub.client(),
        Decisions::placement(NS, "web"),
        inner,
    ));
    assert_eq!(running.event().await, "+east");
    running.reconciled("east").await;
    running.quiet().await;
    assert_eq!(running.clusters(), ["east"]);

    // A cluster added to the decision joins; one removed leaves.
    decide(hub, &resource, "web-1", naming(&["east", "west"])).await;
    assert_eq!(running.event().await, "+west");
    running.reconciled("west").await;
    decide(hub, &resource, "web-1", naming(&["west"])).await;
    assert_eq!(running.event().await, "-east");
    assert_eq!(running.clusters(), ["west"]);

    // A deleted decision takes the clusters no other decision names.
    create(hub, &resource, "web-2", &web).await;
    decide(hub, &resource, "web-2", naming(&["west", "north"])).await;
    assert_eq!(running.event().await, "+north");
    // A cluster moving from one decision to another stays engaged.
    decide(hub, &resource, "web-2", naming(&["west"])).await;
    decide(hub, &resource, "web-1", naming(&["west", "north"])).await;
    running.quiet().await;
    assert_eq!(running.clusters(), ["north", "west"]);
    decide(hub, &resource, "web-2", naming(&["west", "north"])).await;
    decide(hub, &resource, "web-1", naming(&["west"])).await;
    delete(hub, &resource, "web-1").await;
    running.quiet().await;
    assert_eq!(running.clusters(), ["north", "west"]);
    delete(hub, &resource, "web-2").await;
    assert_eq!(running.events(2).await, ["-north", "-west"]);
    assert!(running.clusters().is_empty());

    // Named again: engaged again from the inner provider's engagement.
    create(hub, &resource, "web-3", &web).await;
    decide(hub, &resource, "web-3", naming(&["east"])).await;
    assert_eq!(running.event().await, "+east");
    running.reconciled("east").await;

    // The inner provider's disengage of a named cluster passes through,
    // and the decision naming it now names a cluster it does not offer.
    clusters.disengage("east");
    assert_eq!(running.event().await, "-east");
    let problem = running
        .problem("PlacementDecision default/web-3, cluster \"east\"")
        .await;
    assert!(problem.contains("no cluster \"east\""), "{problem}");
    running.quiet().await;
    assert!(running.clusters().is_empty());
}

#[tokio::test]
async fn a_decision_naming_an_unknown_cluster_is_a_problem_until_the_inner_provider_offers_it() {
    let env = start().await;
    let hub = &env.clusters()[0];
    let resource = rollout();
    // The decisions name clusters `east`, ...; the inner provider calls them
    // `member/east`, ...
    let decisions = Decisions::new(resource.clone())
        .namespace(NS)
        .cluster_names(|name| ClusterName::new(format!("member/{name}")));
    let (inner, clusters) = ProgrammaticProvider::new();
    let member = |name: &str| env.cluster(name).unwrap().client();
    clusters.engage("member/east", member("east"));
    clusters.engage("member/west", member("west"));
    let mut running = run(PlacementProvider::new(hub.client(), decisions, inner));
    running.quiet().await;

    create(hub, &resource, "canary", &[]).await;
    decide(hub, &resource, "canary", naming(&["east", "north"])).await;
    assert_eq!(running.event().await, "+member/east");
    let source = "Rollout default/canary, cluster \"north\"";
    let problem = running.problem(source).await;
    assert!(problem.contains("no cluster \"member/north\""), "{problem}");
    // Nothing else changes.
    running.quiet().await;
    assert_eq!(running.clusters(), ["member/east"]);
    assert_eq!(
        running.problems.current().into_keys().collect::<Vec<_>>(),
        [source]
    );

    // Offered later: engaged, and the problem clears.
    clusters.engage("member/north", member("north"));
    assert_eq!(running.event().await, "+member/north");
    running.reconciled("member/north").await;
    assert!(
        running.problems.current().is_empty(),
        "{:?}",
        running.problems.current()
    );

    // A malformed decision is a problem of its own; the clusters it names
    // well still count, and the other decisions too.
    create(hub, &resource, "broken", &[]).await;
    decide(
        hub,
        &resource,
        "broken",
        serde_json::json!([{ "clusterName": 7 }, { "clusterName": "west" }]),
    )
    .await;
    assert_eq!(running.event().await, "+member/west");
    assert_eq!(
        running.problem("Rollout default/broken").await,
        "status.decisions[0].clusterName is not a string"
    );
    decide(hub, &resource, "broken", serde_json::json!("west")).await;
    assert_eq!(running.event().await, "-member/west");
    assert_eq!(
        running.problem("Rollout default/broken").await,
        "status.decisions is not a list"
    );
    assert_eq!(running.clusters(), ["member/east", "member/north"]);
    delete(hub, &resource, "broken").await;
    tokio::time::timeout(PATIENCE, running.problems.wait_for(|set| set.is_empty()))
        .await
        .unwrap_or_else(|_| panic!("problems left: {:?}", running.problems.current()));

    // The inner provider's disengage of a named cluster disengages it.
    clusters.disengage("member/north");
    assert_eq!(running.event().await, "-member/north");
    running.quiet().await;
    assert_eq!(running.clusters(), ["member/east"]);
}
