//! `gather` on real API servers: a parent in the hub whose status holds one
//! entry per member, read from its children there, kept when a member is
//! cut off, dropped when it leaves, written beside other writers' fields and
//! at most once per interval, and kept through a restart of the controller.

mod support;

use support::eventually;

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api, CustomResource, CustomResourceExt,
    api::{DeleteParams, Patch, PatchParams, PostParams},
    runtime::watcher,
};
use kube_multicluster::envtest::{Envtest, FaultyLink, TestCluster};
use kube_multicluster::{
    Action, ClusterName, Controller, Fleet, ObjectRequest,
    controller::{ClusterSelector, Watch},
    gather::{ClusterEntry, Gather, Read, entries_schema},
    ownership::{Children, PARENT_UID_LABEL, ParentRef},
    provider::{ProgrammaticHandle, ProgrammaticProvider},
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tower::{BoxError, service_fn};

/// A parent whose children, ConfigMaps in the members, each hold a value.
#[derive(CustomResource, Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
#[kube(
    group = "gather.example.com",
    version = "v1",
    kind = "Rollout",
    namespaced,
    status = "RolloutStatus"
)]
pub struct RolloutSpec {
    value: String,
}

/// Each member's child, gathered, and a phase another writer sets.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
pub struct RolloutStatus {
    /// Another writer's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    phase: Option<String>,
    #[serde(default)]
    #[schemars(schema_with = "entries_list")]
    clusters: Vec<ClusterEntry>,
}

fn entries_list(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::Schema::try_from(entries_schema()).unwrap()
}

const INTERVAL: Duration = Duration::from_secs(1);

struct Setup {
    env: Envtest,
    fleet: Fleet,
    members: ProgrammaticHandle,
    rollouts: Api<Rollout>,
    gather: Gather<ConfigMap>,
    /// member-1 is reached through it.
    link: FaultyLink,
    writes: Arc<AtomicUsize>,
    controller: tokio::task::JoinHandle<()>,
}

impl Drop for Setup {
    fn drop(&mut self) {
        self.controller.abort();
    }
}

/// A hub (the local cluster) with the parent's controller, and three
/// members engaged, member-1 through a link that can be cut.
async fn setup() -> Setup {
    let env = Envtest::start(4).await.unwrap();
    let hub = &env.clusters()[0];
    hub.install_crds([Rollout::crd()]).await.unwrap();
    let fleet = Fleet::new();
    fleet.engage(ClusterName::local(), hub.client());
    let (provider, members) = ProgrammaticProvider::new();
    tokio::spawn({
        let fleet = fleet.clone();
        async move { fleet.run(provider).await }
    });
    let link = env.clusters()[1].link().unwrap();
    members.engage("member-1", link.client());
    members.engage("member-2", env.clusters()[2].client());
    members.engage("member-3", env.clusters()[3].client());
    let (gather, writes, controller) = start_controller(&fleet);
    Setup {
        rollouts: Api::namespaced(hub.client(), "default"),
        env,
        fleet,
        members,
        gather,
        link,
        writes,
        controller,
    }
}

/// The parent's controller on `fleet`, gathering into each parent's status:
/// its gather, a count of its writes, and its task.
fn start_controller(
    fleet: &Fleet,
) -> (
    Gather<ConfigMap>,
    Arc<AtomicUsize>,
    tokio::task::JoinHandle<()>,
) {
    let watch = Watch::new(watcher::Config::default().labels(PARENT_UID_LABEL))
        .in_clusters(ClusterSelector::Provided);
    let children = Children::<ConfigMap>::new(fleet, watch.clone());
    let gather = Gather::new(fleet, children, Read::field(".data.value").unwrap())
        .manager("rollout-status")
        .min_interval(INTERVAL);
    let writes = Arc::new(AtomicUsize::new(0));
    let controller = Controller::<Rollout>::new(fleet, watcher::Config::default())
        .clusters(ClusterSelector::Local)
        .owns_across::<ConfigMap>(watch)
        .reconcile_all_on(gather.changes(Duration::from_millis(200)));
    let reconcile = {
        let (gather, writes) = (gather.clone(), writes.clone());
        move |request: ObjectRequest<Rollout>| {
            let (gather, writes) = (gather.clone(), writes.clone());
            async move {
                let gathered = gather.write(&request).await?;
                if gathered.written {
                    writes.fetch_add(1, Ordering::SeqCst);
                }
                Ok::<Action, BoxError>(gathered.action())
            }
        }
    };
    let controller = tokio::spawn(async move {
        let _ = controller.run(service_fn(reconcile)).await;
    });
    (gather, writes, controller)
}

fn member(setup: &Setup, i: usize) -> &TestCluster {
    &setup.env.clusters()[i]
}

/// Creates the parent `name`, and its child holding `value` in each of
/// `members`.
async fn create(setup: &Setup, name: &str, members: &[usize]) {
    let parent = Rollout::new(name, RolloutSpec { value: "v".into() });
    let parent = setup
        .rollouts
        .create(&PostParams::default(), &parent)
        .await
        .unwrap();
    for &i in members {
        set_child(setup, &parent, i, &format!("value-{i}")).await;
    }
}

/// Applies the child of `parent` in member `i`, holding `value`.
async fn set_child(setup: &Setup, parent: &Rollout, i: usize, value: &str) {
    let mut child = ConfigMap::default();
    child.metadata.name = parent.metadata.name.clone();
    child.data = Some([("value".to_owned(), value.to_owned())].into());
    ParentRef::of(&ClusterName::local(), parent)
        .unwrap()
        .adopt(&mut child);
    let name = parent.metadata.name.clone().unwrap();
    // Written to the member's server, past the link the fleet uses.
    Api::<ConfigMap>::namespaced(member(setup, i).client(), "default")
        .patch(
            &name,
            &PatchParams::apply("test").force(),
            &Patch::Apply(&child),
        )
        .await
        .unwrap();
}

async fn entries(setup: &Setup, name: &str) -> Vec<ClusterEntry> {
    let parent = setup.rollouts.get(name).await.unwrap();
    parent.status.unwrap_or_default().clusters
}

async fn entry(setup: &Setup, name: &str, cluster: &str) -> Option<ClusterEntry> {
    let entries = entries(setup, name).await;
    entries.into_iter().find(|entry| entry.cluster == cluster)
}

#[tokio::test]
async fn every_member_gets_an_entry_with_the_value_read_and_one_without_a_child_says_so() {
    let setup = setup().await;
    create(&setup, "r", &[1, 2]).await;
    eventually("an entry per member, with its value", || async {
        let entries = entries(&setup, "r").await;
        let values: Vec<_> = entries.iter().map(|e| e.value.clone()).collect();
        values == [Some(json!("value-1")), Some(json!("value-2")), None]
    })
    .await;
    let entries = entries(&setup, "r").await;
    let names: Vec<_> = entries.iter().map(|e| e.cluster.as_str()).collect();
    assert_eq!(
        names,
        ["member-1", "member-2", "member-3"],
        "the hub is not read"
    );
    for entry in &entries[..2] {
        assert_eq!(entry.child.as_deref(), Some("r"));
        assert_eq!((entry.health.as_str(), entry.stale), ("Healthy", false));
        assert!(entry.last_seen.is_some());
    }
    assert_eq!(entries[2].child, None);
    assert_eq!(
        entries[2].message.as_deref(),
        Some("no child in this cluster")
    );

    // The entries in camelCase, as written.
    let raw = Api::<kube::api::DynamicObject>::namespaced_with(
        member(&setup, 0).client(),
        "default",
        &kube::api::ApiResource::erase::<Rollout>(&()),
    )
    .get("r")
    .await
    .unwrap();
    let first = &raw.data["status"]["clusters"][0];
    assert!(first.get("lastSeen").is_some(), "{first}");
    assert_eq!(first["stale"], false);
}

#[tokio::test]
async fn another_writers_status_field_survives_the_gathers_writes() {
    let setup = setup().await;
    create(&setup, "r", &[1, 2, 3]).await;
    eventually("three entries", || async {
        entries(&setup, "r").await.len() == 3
    })
    .await;
    let phase = json!({
        "apiVersion": "gather.example.com/v1", "kind": "Rollout",
        "metadata": { "name": "r" }, "status": { "phase": "Ready" },
    });
    setup
        .rollouts
        .patch_status(
            "r",
            &PatchParams::apply("phase-writer"),
            &Patch::Apply(&phase),
        )
        .await
        .unwrap();
    let parent = setup.rollouts.get("r").await.unwrap();
    set_child(&setup, &parent, 2, "changed").await;
    eventually("the change gathered", || async {
        entry(&setup, "r", "member-2").await.and_then(|e| e.value) == Some(json!("changed"))
    })
    .await;
    let status = setup.rollouts.get("r").await.unwrap().status.unwrap();
    assert_eq!(status.phase.as_deref(), Some("Ready"));
    assert_eq!(status.clusters.len(), 3);
}

#[tokio::test]
async fn a_member_cut_off_is_stale_with_its_last_value_and_fresh_again_once_restored() {
    let setup = setup().await;
    create(&setup, "r", &[1, 2]).await;
    eventually("member-1's value", || async {
        entry(&setup, "r", "member-1").await.and_then(|e| e.value) == Some(json!("value-1"))
    })
    .await;

    setup.link.cut_off();
    let cut = Instant::now();
    eventually("member-1 stale", || async {
        entry(&setup, "r", "member-1")
            .await
            .is_some_and(|e| e.stale)
    })
    .await;
    let stale_after = cut.elapsed();
    let stale = entry(&setup, "r", "member-1").await.unwrap();
    assert_eq!(stale.value, Some(json!("value-1")), "its last value");
    assert_eq!(stale.health, "Unreachable");
    assert!(stale.last_seen.is_some());
    let member_2 = entry(&setup, "r", "member-2").await.unwrap();
    assert!(!member_2.stale, "{member_2:?}");
    println!("a member cut off shows stale after {stale_after:?}");

    setup.link.restore();
    eventually("member-1 fresh", || async {
        entry(&setup, "r", "member-1")
            .await
            .is_some_and(|e| !e.stale && e.health == "Healthy")
    })
    .await;
    let fresh = entry(&setup, "r", "member-1").await.unwrap();
    assert_eq!(fresh.value, Some(json!("value-1")));
    assert!(fresh.last_seen.unwrap().0 > stale.last_seen.unwrap().0);
}

/// Writes `value` into member-2's child of `r`, and waits until it is
/// gathered: one reconcile more.
async fn reconcile_again(setup: &Setup, value: &str) {
    let parent = setup.rollouts.get("r").await.unwrap();
    set_child(setup, &parent, 2, value).await;
    eventually("member-2's change gathered", || async {
        entry(setup, "r", "member-2").await.and_then(|e| e.value) == Some(json!(value))
    })
    .await;
}

#[tokio::test]
async fn a_cut_off_members_time_stays_the_same_across_reconciles() {
    let setup = setup().await;
    create(&setup, "r", &[1, 2]).await;
    eventually("member-1's value", || async {
        entry(&setup, "r", "member-1").await.and_then(|e| e.value) == Some(json!("value-1"))
    })
    .await;
    setup.link.cut_off();
    eventually("member-1 unreachable", || async {
        entry(&setup, "r", "member-1")
            .await
            .is_some_and(|e| e.stale && e.health == "Unreachable")
    })
    .await;
    let seen = entry(&setup, "r", "member-1").await.unwrap().last_seen;
    assert!(seen.is_some());
    for n in 0..4 {
        reconcile_again(&setup, &format!("again-{n}")).await;
        tokio::time::sleep(INTERVAL).await;
        let now = entry(&setup, "r", "member-1").await.unwrap();
        assert!(now.stale);
        assert_eq!(now.last_seen, seen, "after {} reconciles", n + 1);
    }
}

#[tokio::test]
async fn entries_survive_a_restart_before_the_members_are_engaged_marked_stale() {
    let mut setup = setup().await;
    create(&setup, "r", &[1, 2, 3]).await;
    eventually("three values", || async {
        entries(&setup, "r").await.iter().all(|e| e.value.is_some())
    })
    .await;
    setup.link.cut_off();
    eventually("member-1 unreachable", || async {
        entry(&setup, "r", "member-1")
            .await
            .is_some_and(|e| e.stale && e.health == "Unreachable")
    })
    .await;
    let before = entries(&setup, "r").await;
    let seen = before[0].last_seen.clone();

    // The controller starts again, on a fleet whose provider has not
    // engaged the members yet.
    setup.controller.abort();
    let hub = member(&setup, 0).client();
    let fleet = Fleet::new();
    fleet.engage(ClusterName::local(), hub);
    let (provider, members) = ProgrammaticProvider::new();
    tokio::spawn({
        let fleet = fleet.clone();
        async move { fleet.run(provider).await }
    });
    let (_, _, controller) = start_controller(&fleet);
    setup.controller = controller;
    eventually("every entry stale", || async {
        entries(&setup, "r").await.iter().all(|e| e.stale)
    })
    .await;
    let kept = entries(&setup, "r").await;
    let values: Vec<_> = kept.iter().map(|e| e.value.clone()).collect();
    assert_eq!(
        values,
        [
            Some(json!("value-1")),
            Some(json!("value-2")),
            Some(json!("value-3"))
        ],
        "every value kept"
    );
    assert_eq!(kept[0].last_seen, seen, "member-1's time kept");
    assert_eq!(kept[1].last_seen, before[1].last_seen);

    // Engaged again: member-2 and member-3 fresh, member-1 still cut off,
    // its time as it was, reconcile after reconcile.
    members.engage("member-1", setup.link.client());
    members.engage("member-2", member(&setup, 2).client());
    members.engage("member-3", member(&setup, 3).client());
    eventually("member-2 and member-3 fresh", || async {
        let entries = entries(&setup, "r").await;
        entries.len() == 3 && !entries[1].stale && !entries[2].stale
    })
    .await;
    for n in 0..4 {
        reconcile_again(&setup, &format!("again-{n}")).await;
        tokio::time::sleep(INTERVAL).await;
        let now = entry(&setup, "r", "member-1").await.unwrap();
        assert!(now.stale, "{now:?}");
        assert_eq!(now.value, Some(json!("value-1")));
        assert_eq!(now.last_seen, seen, "after {} reconciles", n + 1);
    }
}

#[tokio::test]
async fn a_member_that_leaves_the_fleet_leaves_the_status() {
    let setup = setup().await;
    create(&setup, "r", &[1, 2, 3]).await;
    eventually("three entries", || async {
        entries(&setup, "r").await.len() == 3
    })
    .await;
    setup.members.disengage("member-2");
    eventually("member-2 gone from the status", || async {
        let entries = entries(&setup, "r").await;
        let names: Vec<_> = entries.iter().map(|e| e.cluster.clone()).collect();
        names == ["member-1", "member-3"]
    })
    .await;
    assert!(setup.fleet.get("member-2").is_none());
}

#[tokio::test]
async fn a_parent_is_written_at_most_once_per_interval_and_not_for_time_alone() {
    let setup = setup().await;
    create(&setup, "r", &[1, 2, 3]).await;
    eventually("three values", || async {
        entries(&setup, "r").await.iter().all(|e| e.value.is_some())
    })
    .await;
    tokio::time::sleep(INTERVAL).await;
    let parent = setup.rollouts.get("r").await.unwrap();

    // Thirty changes in three seconds: at most one write per interval.
    let before = setup.writes.load(Ordering::SeqCst);
    let started = Instant::now();
    for n in 0..30 {
        set_child(&setup, &parent, 1 + n % 3, &format!("change-{n}")).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eventually("the last change gathered", || async {
        entry(&setup, "r", "member-3").await.and_then(|e| e.value) == Some(json!("change-29"))
    })
    .await;
    let window = started.elapsed();
    let writes = setup.writes.load(Ordering::SeqCst) - before;
    let most = window.as_secs_f64() / INTERVAL.as_secs_f64() + 1.0;
    println!("{writes} writes for 30 changes in {window:?} (at most {most:.1})");
    assert!(writes as f64 <= most, "{writes} writes in {window:?}");
    assert!(writes >= 2, "{writes} writes");

    // Reconciles that change nothing read (a child's annotation) write
    // nothing, though the healthy members' times would move.
    let settled = setup.writes.load(Ordering::SeqCst);
    for i in 1..=3 {
        let touch = json!({ "metadata": { "annotations": { "touched": "yes" } } });
        Api::<ConfigMap>::namespaced(member(&setup, i).client(), "default")
            .patch("r", &PatchParams::default(), &Patch::Merge(&touch))
            .await
            .unwrap();
    }
    tokio::time::sleep(3 * INTERVAL).await;
    assert_eq!(setup.writes.load(Ordering::SeqCst), settled);

    // A deleted parent is not held.
    setup
        .rollouts
        .delete("r", &DeleteParams::default())
        .await
        .unwrap();
    eventually("no parent held", || async {
        setup.gather.parents_held() == 0
    })
    .await;
}
