//! Fleet-wide reads and writes on real API servers: a store of one type
//! across clusters with an index, and work in every cluster with one hung.

mod support;

use support::eventually;

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api,
    api::{ObjectMeta, PostParams},
    runtime::watcher,
};
use kube_multicluster::envtest::Envtest;
use kube_multicluster::{
    Fleet, ObjectKey,
    fleetwide::{FleetStore, for_each_cluster},
};
use tower::BoxError;

async fn create(client: kube::Client, name: &str, team: &str) {
    let config_map = ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some([("team".to_owned(), team.to_owned())].into()),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    };
    Api::<ConfigMap>::namespaced(client, "default")
        .create(&PostParams::default(), &config_map)
        .await
        .unwrap();
}

fn found(store: &FleetStore<ConfigMap>, team: &str) -> Vec<String> {
    let mut found: Vec<String> = store
        .indexed("team", team)
        .expect("the index exists")
        .iter()
        .map(|c| {
            format!(
                "{}/{}",
                c.cluster,
                c.object.metadata.name.as_deref().unwrap_or("")
            )
        })
        .collect();
    found.sort();
    found
}

#[tokio::test]
async fn a_fleet_store_reads_and_indexes_every_cluster_and_forgets_one_that_leaves() {
    let env = Envtest::start(2).await.unwrap();
    let (a, b) = (&env.clusters()[0], &env.clusters()[1]);
    create(a.client(), "one", "red").await;
    create(b.client(), "two", "red").await;
    create(b.client(), "three", "blue").await;
    let fleet = Fleet::new();
    fleet.engage("a", a.client());
    let labelled = watcher::Config::default().labels("team");
    let store = FleetStore::<ConfigMap>::new(&fleet, labelled).with_index("team", |cm| {
        cm.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("team").cloned())
            .into_iter()
            .collect()
    });
    assert!(store.indexed("no-such-index", "red").is_none());
    fleet.engage("b", b.client());
    // The index follows the stores a moment behind.
    eventually("both clusters read", || async {
        found(&store, "red").len() == 2 && found(&store, "blue").len() == 1
    })
    .await;
    assert_eq!(found(&store, "red"), ["a/one", "b/two"]);
    assert_eq!(found(&store, "blue"), ["b/three"]);
    assert_eq!(store.list().len(), 3);
    assert!(store.unsynced().is_empty());
    let key = ObjectKey::new(Some("default"), "three");
    assert!(store.get("b", &key).is_some() && store.get("a", &key).is_none());

    // Changes are indexed as they come.
    create(a.client(), "four", "blue").await;
    eventually("the new object indexed", || async {
        found(&store, "blue").len() == 2
    })
    .await;

    // A cluster that leaves is forgotten, in reads and in the index.
    fleet.disengage("b");
    eventually("b forgotten", || async {
        found(&store, "red") == ["a/one"] && found(&store, "blue") == ["a/four"]
    })
    .await;
    assert!(store.in_cluster("b").is_none());
    // And read again when it comes back.
    fleet.engage("b", b.client());
    eventually("b read again", || async { found(&store, "red").len() == 2 }).await;
}

#[tokio::test]
async fn work_in_every_cluster_goes_on_when_one_hangs_and_that_one_is_named() {
    let env = Envtest::start(3).await.unwrap();
    let fleet = Fleet::new();
    let link = env.clusters()[1].link().unwrap();
    fleet.engage("a", env.clusters()[0].client());
    fleet.engage("hung", link.client());
    fleet.engage("c", env.clusters()[2].client());
    link.hang();
    let mut clusters = fleet.clusters();
    clusters.sort_by(|x, y| x.name().cmp(y.name()));
    let done = for_each_cluster(clusters, 2, Duration::from_secs(8), |cluster| async move {
        Api::<ConfigMap>::namespaced(cluster.client(), "default")
            .create(&PostParams::default(), &support::config_map("made"))
            .await?;
        Ok::<_, BoxError>(())
    })
    .await;
    let failed: Vec<_> = done
        .errors()
        .map(|(name, e)| format!("{name}: {e}"))
        .collect();
    assert_eq!(failed, ["hung: no answer within 8s"]);
    assert_eq!(done.successes().count(), 2);
    for i in [0, 2] {
        let api = Api::<ConfigMap>::namespaced(env.clusters()[i].client(), "default");
        assert!(api.get_opt("made").await.unwrap().is_some());
    }
    let error = done.into_result().unwrap_err().to_string();
    assert!(
        error.starts_with("1 of 3 clusters failed: hung: "),
        "{error}"
    );
    link.restore();
}
