//! The provider's state, driven by fake watches: clusters engaged and
//! disengaged as bindings, shards and the slice change, and problems told.

use std::collections::HashMap;

use futures::channel::mpsc;

use super::*;

type Sender = mpsc::UnboundedSender<Result<watcher::Event<DynamicObject>, watcher::Error>>;

/// The fake watches of bindings, by shard URL, taken by the first
/// shard of that URL.
static FAKES: Mutex<Option<HashMap<String, Events>>> = Mutex::new(None);

fn fake_bindings(shard: &Shard) -> Events {
    let url = shard.host.name().to_string();
    let mut fakes = FAKES.lock().unwrap();
    fakes
        .get_or_insert_default()
        .remove(&url)
        .unwrap_or_else(|| futures::stream::pending().boxed())
}

/// The fake watches of LogicalClusters, by shard URL.
static FAKE_PATHS: Mutex<Option<HashMap<String, Events>>> = Mutex::new(None);

fn fake_paths(shard: &Shard) -> Events {
    let url = shard.host.name().to_string();
    let mut fakes = FAKE_PATHS.lock().unwrap();
    fakes
        .get_or_insert_default()
        .remove(&url)
        .unwrap_or_else(|| futures::stream::pending().boxed())
}

/// A fake watch of LogicalClusters for the shard at `url`.
fn paths(url: &str) -> Sender {
    let (tx, rx) = mpsc::unbounded();
    FAKE_PATHS
        .lock()
        .unwrap()
        .get_or_insert_default()
        .insert(url.to_owned(), rx.boxed());
    tx
}

fn logical_cluster(cluster: &str, path: &str) -> DynamicObject {
    object(serde_json::json!({
        "apiVersion": "core.kcp.io/v1alpha1", "kind": "LogicalCluster",
        "metadata": {"name": "cluster", "annotations": {"kcp.io/cluster": cluster, "kcp.io/path": path}},
    }))
}

/// A fake watch of bindings for the shard at `url`.
fn shard(url: &str) -> Sender {
    let (tx, rx) = mpsc::unbounded();
    FAKES
        .lock()
        .unwrap()
        .get_or_insert_default()
        .insert(url.to_owned(), rx.boxed());
    tx
}

fn object(value: serde_json::Value) -> DynamicObject {
    serde_json::from_value(value).unwrap()
}

fn binding(name: &str, cluster: &str) -> DynamicObject {
    object(serde_json::json!({
        "apiVersion": "apis.kcp.io/v1alpha2", "kind": "APIBinding",
        "metadata": {"name": name, "annotations": {"kcp.io/cluster": cluster}},
    }))
}

fn slice(urls: &[&str]) -> DynamicObject {
    let endpoints: Vec<_> = urls
        .iter()
        .map(|url| serde_json::json!({"url": url}))
        .collect();
    object(serde_json::json!({
        "apiVersion": "apis.kcp.io/v1alpha1", "kind": "APIExportEndpointSlice",
        "metadata": {"name": "example.io"},
        "status": {"endpoints": endpoints},
    }))
}

fn listed(tx: &Sender, objects: Vec<DynamicObject>) {
    tx.unbounded_send(Ok(watcher::Event::Init)).unwrap();
    for object in objects {
        tx.unbounded_send(Ok(watcher::Event::InitApply(object)))
            .unwrap();
    }
    tx.unbounded_send(Ok(watcher::Event::InitDone)).unwrap();
}

fn send(tx: &Sender, event: watcher::Event<DynamicObject>) {
    tx.unbounded_send(Ok(event)).unwrap();
}

/// A provider's state on a fake slice; its events and problems.
fn started() -> (Sender, BoxStream<'static, ClusterEvent>, Problems) {
    started_with(|state| state)
}

/// [`started`], the state first changed by `with`.
fn started_with(with: fn(State) -> State) -> (Sender, BoxStream<'static, ClusterEvent>, Problems) {
    let config = Config::new("https://kcp.invalid/clusters/root".parse().unwrap());
    let workspace = kube_multicluster::client::client(config.clone()).unwrap();
    let problems = Problems::new();
    let mut state = State::new(
        config,
        "example.io".into(),
        workspace,
        problems.clone(),
        Arc::default(),
    );
    state.watch_bindings = fake_bindings;
    state.watch_paths = fake_paths;
    let state = with(state);
    let (tx, rx) = mpsc::unbounded();
    (tx, state.events_from(rx.boxed()), problems)
}

/// The next event: `+name` for an engage, `-name` for a disengage.
async fn next(events: &mut BoxStream<'static, ClusterEvent>) -> String {
    let event = tokio::time::timeout(Duration::from_secs(5), events.next())
        .await
        .expect("an event")
        .expect("never ends");
    match event {
        ClusterEvent::EngageView { name, .. } => format!("+{name}"),
        ClusterEvent::Disengage { name } => format!("-{name}"),
        other => panic!("{other:?}"),
    }
}

async fn quiet(events: &mut BoxStream<'static, ClusterEvent>) {
    let more = tokio::time::timeout(Duration::from_millis(200), events.next()).await;
    assert!(
        more.is_err(),
        "no more events: {:?}",
        more.map(|e| e.map(|e| format!("{e:?}")))
    );
}

#[tokio::test]
async fn clusters_follow_their_bindings_across_relists_and_deletions() {
    let a = shard("https://a.invalid/services/apiexport/x/example.io");
    let (slices, mut events, _) = started();
    listed(
        &slices,
        vec![slice(&[
            "https://a.invalid/services/apiexport/x/example.io",
        ])],
    );
    listed(
        &a,
        vec![
            binding("example.io", "c1"),
            binding("example.io", "c2"),
            binding("other", "c2"),
        ],
    );
    let mut engaged = [next(&mut events).await, next(&mut events).await];
    engaged.sort();
    assert_eq!(engaged, ["+c1", "+c2"]);
    // A relist after an outage in which c1's binding and one of c2's went.
    listed(&a, vec![binding("other", "c2")]);
    assert_eq!(next(&mut events).await, "-c1");
    quiet(&mut events).await;
    // One being deleted counts as gone.
    let mut going = binding("other", "c2");
    going.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        k8s_openapi::jiff::Timestamp::now(),
    ));
    send(&a, watcher::Event::Apply(going));
    assert_eq!(next(&mut events).await, "-c2");
    // Bound again, then deleted.
    send(&a, watcher::Event::Apply(binding("example.io", "c1")));
    assert_eq!(next(&mut events).await, "+c1");
    send(&a, watcher::Event::Delete(binding("example.io", "c1")));
    assert_eq!(next(&mut events).await, "-c1");
}

#[tokio::test]
async fn a_cluster_seen_on_two_shards_moves_when_the_first_lets_it_go() {
    let (url_a, url_b) = (
        "https://a.invalid/two/example.io",
        "https://b.invalid/two/example.io",
    );
    let (a, b) = (shard(url_a), shard(url_b));
    let (slices, mut events, _) = started();
    listed(&slices, vec![slice(&[url_a, url_b])]);
    listed(&a, vec![binding("example.io", "c1")]);
    assert_eq!(next(&mut events).await, "+c1");
    listed(
        &b,
        vec![binding("example.io", "c1"), binding("example.io", "c2")],
    );
    assert_eq!(next(&mut events).await, "+c2");
    quiet(&mut events).await;
    // a lets c1 go: engaged again from b, not disengaged.
    send(&a, watcher::Event::Delete(binding("example.io", "c1")));
    assert_eq!(next(&mut events).await, "+c1");
    quiet(&mut events).await;
    // The slice drops b: its clusters go.
    send(&slices, watcher::Event::Apply(slice(&[url_a])));
    let mut gone = [next(&mut events).await, next(&mut events).await];
    gone.sort();
    assert_eq!(gone, ["-c1", "-c2"]);
}

#[tokio::test]
async fn problems_are_told_by_source_and_go_when_they_end() {
    let url = "https://a.invalid/problems/example.io";
    let a = shard(url);
    let (slices, mut events, problems) = started();
    listed(&slices, vec![slice(&[])]);
    let source = "APIExportEndpointSlice example.io";
    // Told as the provider's events are read.
    quiet(&mut events).await;
    assert!(problems.get(source).unwrap().contains("lists no endpoint"));
    send(&slices, watcher::Event::Apply(slice(&[url])));
    let mut rejecting = binding("example.io", "c1");
    rejecting.data = serde_json::json!({
        "spec": {"permissionClaims": [{"group": "", "resource": "configmaps", "state": "Rejected"}]},
        "status": {"exportPermissionClaims": [{"group": "", "resource": "configmaps"}]},
    });
    listed(&a, vec![rejecting]);
    assert_eq!(next(&mut events).await, "+c1");
    assert_eq!(problems.get(source), None);
    let claim = problems
        .get("APIBinding example.io in c1")
        .expect("the claim");
    assert!(claim.contains("configmaps"), "{claim}");
    // A failing watch is told; a retry's Init does not clear it; an
    // event does.
    a.unbounded_send(Err(watcher::Error::NoResourceVersion))
        .unwrap();
    send(&a, watcher::Event::Init);
    quiet(&mut events).await;
    let shard_source = format!("kcp shard {url}");
    assert!(problems.get(&shard_source).is_some());
    send(&a, watcher::Event::Apply(binding("example.io", "c1")));
    quiet(&mut events).await;
    assert_eq!(problems.get(&shard_source), None);
    assert!(
        problems.get("APIBinding example.io in c1").is_none(),
        "accepted now"
    );
}

#[tokio::test]
async fn named_by_path_a_cluster_waits_for_its_path_and_goes_with_it() {
    let url = "https://a.invalid/paths/example.io";
    let (a, a_paths) = (shard(url), paths(url));
    let (slices, mut events, problems) = started_with(State::by_path);
    listed(&slices, vec![slice(&[url])]);
    listed(&a, vec![binding("example.io", "c1")]);
    quiet(&mut events).await;
    // Listed without c1's path: reported, not engaged.
    listed(&a_paths, vec![logical_cluster("c2", "root:other")]);
    quiet(&mut events).await;
    let unknown = problems.get("logical cluster c1").expect("reported");
    assert!(unknown.contains("logicalclusters"), "{unknown}");
    send(
        &a_paths,
        watcher::Event::Apply(logical_cluster("c1", "root:team-a")),
    );
    assert_eq!(next(&mut events).await, "+root:team-a");
    assert_eq!(problems.get("logical cluster c1"), None);
    // Its LogicalCluster goes (the workspace is deleted): so does it.
    send(
        &a_paths,
        watcher::Event::Delete(logical_cluster("c1", "root:team-a")),
    );
    assert_eq!(next(&mut events).await, "-root:team-a");
}

#[tokio::test]
async fn named_by_path_one_path_names_one_cluster_at_a_time() {
    let url = "https://a.invalid/same-path/example.io";
    let (a, a_paths) = (shard(url), paths(url));
    let (slices, mut events, problems) = started_with(State::by_path);
    listed(&slices, vec![slice(&[url])]);
    listed(&a_paths, vec![logical_cluster("old", "root:team")]);
    listed(&a, vec![binding("example.io", "old")]);
    assert_eq!(next(&mut events).await, "+root:team");
    // The workspace made again: a new logical cluster with the same path,
    // seen before the old one goes.
    send(
        &a_paths,
        watcher::Event::Apply(logical_cluster("new", "root:team")),
    );
    send(&a, watcher::Event::Apply(binding("example.io", "new")));
    quiet(&mut events).await;
    let taken = problems.get("logical cluster new").expect("reported");
    assert!(taken.contains("logical cluster old"), "{taken}");
    // The old one goes: the name is the new one's.
    send(
        &a_paths,
        watcher::Event::Delete(logical_cluster("old", "root:team")),
    );
    assert_eq!(next(&mut events).await, "-root:team");
    assert_eq!(next(&mut events).await, "+root:team");
    quiet(&mut events).await;
    assert_eq!(problems.get("logical cluster new"), None);
    // An empty path names nothing.
    send(
        &a_paths,
        watcher::Event::Apply(logical_cluster("blank", "")),
    );
    send(&a, watcher::Event::Apply(binding("example.io", "blank")));
    quiet(&mut events).await;
}
