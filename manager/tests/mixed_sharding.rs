//! Mixed sharding on a real API server: members sharded by cluster, a hub
//! run by every replica with its keys sharded by key over the same shard
//! Leases. A controller of the hub's parents, and a fan-out controller of the
//! members that makes each parent's child in every member. No key, of the
//! hub or a member, is reconciled by two replicas at once; every parent is
//! served and has its children; a killed replica's share of both moves
//! within the Lease timing.
//!
//! Test timings: a lease of 4 s, a renew deadline of 3 s, a retry period of
//! 1 s. The hub and the nine members are ten names for one API server, which
//! also holds the Leases.

mod support;

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api, Client,
    api::{ListParams, ObjectMeta, PostParams},
    runtime::watcher,
};
use kube_multicluster::{
    Action, ClusterName, Controller, Fleet, ObjectKey, ObjectRequest,
    controller::{ClusterSelector, Watch},
    provider::{ProgrammaticHandle, ProgrammaticProvider},
};
use kube_multicluster_envtest::Envtest;
use kube_multicluster_manager::{Error, LeaseParams, Manager, ShardStatus, Sharding};
use support::{
    PATIENCE, Records, assert_no_overlap, config_maps,
    endpoints::{Endpoints, listener},
};
use tokio::{task::JoinHandle, time::Instant};
use tower::{BoxError, Service};

const LEASE: Duration = Duration::from_secs(4);
const RENEW_DEADLINE: Duration = Duration::from_secs(3);
const RETRY: Duration = Duration::from_secs(1);
const MEMBERS: usize = 9;
const PARENTS: usize = 60;
const HUB: &str = "hub";

struct Replica {
    status: ShardStatus,
    /// Its `/metrics` and `/readyz`.
    endpoints: Endpoints,
    run: JoinHandle<Result<(), Error>>,
    /// Keeps its provider's stream open.
    _clusters: ProgrammaticHandle,
}

/// What a span is recorded under: a hub's key, or a member cluster.
fn what(request: &ObjectRequest<ConfigMap>) -> String {
    if request.cluster.name().as_str() == HUB {
        format!("{HUB}/{}", request.request.name)
    } else {
        request.cluster.name().to_string()
    }
}

fn is_hub(cluster: &ClusterName) -> bool {
    cluster.as_str() == HUB
}

fn start(name: &str, client: &Client, records: &Records, children: &Records) -> Replica {
    let fleet = Fleet::new();
    let (provider, handle) = ProgrammaticProvider::new();
    handle.engage(HUB, client.clone());
    for i in 0..MEMBERS {
        handle.engage(format!("m{i}"), client.clone());
    }
    let sharding = Sharding::new("mixed")
        .shards(16)
        .hub(ClusterSelector::matching(is_hub))
        .lease(
            LeaseParams::default()
                .namespace("default")
                .identity(name)
                .client(client.clone())
                .lease_duration(LEASE)
                .renew_deadline(RENEW_DEADLINE)
                .retry_period(RETRY),
        );
    let status = sharding.status();
    let parents = watcher::Config::default().labels("parent=true");
    // The hub's parents: each key sharded by key.
    let hub_side = Controller::<ConfigMap>::new(&fleet, parents.clone())
        .named("parents")
        .clusters(ClusterSelector::matching(is_hub));
    // The fan-out: in each member, a child per parent of the hub, written by
    // the member's owner.
    let member_side =
        Controller::<ConfigMap>::new(&fleet, watcher::Config::default().labels("none=true"))
            .named("children")
            .clusters(ClusterSelector::matching(|c| !is_hub(c)))
            .watches_across::<ConfigMap, _>(
                Watch::new(parents).in_clusters(ClusterSelector::matching(is_hub)),
                ClusterSelector::matching(|c| !is_hub(c)),
                |_, parent| [ObjectKey::of(parent)],
            );
    let (listener, port) = listener();
    let manager = Manager::new(&fleet)
        .provider(provider)
        .sharding(sharding)
        .endpoints_on(listener)
        .controller(
            hub_side,
            records.reconciler_by(
                name,
                Duration::from_millis(20),
                Duration::from_millis(300),
                what,
            ),
        )
        .controller(member_side, make_child(name, children));
    Replica {
        status,
        endpoints: Endpoints::new(port),
        run: tokio::spawn(manager.run()),
        _clusters: handle,
    }
}

/// Makes the child of the request's parent in its member (named after
/// both, as the members are one API server), recording who made it.
fn make_child(
    replica: &str,
    records: &Records,
) -> impl Service<ObjectRequest<ConfigMap>, Response = Action, Error = BoxError, Future: Send + 'static>
+ Send
+ 'static {
    let (records, replica) = (records.clone(), replica.to_owned());
    tower::service_fn(move |request: ObjectRequest<ConfigMap>| {
        let (records, replica) = (records.clone(), replica.clone());
        async move {
            let what = format!("{}/{}", request.cluster.name(), request.request.name);
            let _span = records.begin(&replica, what);
            let child = ConfigMap {
                metadata: ObjectMeta {
                    name: Some(format!(
                        "{}-{}",
                        request.request.name,
                        request.cluster.name()
                    )),
                    labels: Some([("child".to_owned(), "true".to_owned())].into()),
                    ..ObjectMeta::default()
                },
                ..ConfigMap::default()
            };
            match Api::<ConfigMap>::namespaced(request.cluster.client(), "default")
                .create(&PostParams::default(), &child)
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(status)) if status.code == 409 => {}
                Err(error) => return Err(BoxError::from(error)),
            }
            Ok(Action::await_change())
        }
    })
}

/// The replica that last started a reconcile of each key or member.
fn runners(records: &Records, since: Instant) -> BTreeMap<String, BTreeSet<String>> {
    let mut runners: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for span in records.all().into_iter().filter(|s| s.start >= since) {
        runners
            .entry(span.cluster)
            .or_default()
            .insert(span.replica);
    }
    runners
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hub_keys_and_members_are_sharded_and_a_dead_replicas_share_of_both_moves() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()))
        .with_test_writer()
        .try_init();
    let env = Envtest::start(1).await.expect("envtest");
    let client = env.clusters()[0].client();
    config_maps(client.clone(), "parent", PARENTS).await;
    let records = Records::default();
    let replicas = ["replica-a", "replica-b", "replica-c"];
    let children = Records::default();
    let mut running: Vec<Replica> = replicas
        .iter()
        .map(|name| start(name, &client, &records, &children))
        .collect();

    // Every parent in the hub is served, and has its child made in every
    // member.
    let began = Instant::now();
    let deadline = began + PATIENCE * 2;
    loop {
        let parents = runners(&records, began).len();
        let made = runners(&children, began).len();
        if parents == PARENTS && made == PARENTS * MEMBERS {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{parents} of {PARENTS} parents served, {made} of {} children made",
            PARENTS * MEMBERS
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Settled: each hub key runs on one replica, and every replica runs
    // some hub keys and some members (never the hub as a cluster).
    tokio::time::sleep(LEASE).await;
    let settled = Instant::now();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let steady = runners(&records, settled);
    assert_eq!(steady.len(), PARENTS, "every parent runs on");
    for (what, by) in &steady {
        assert_eq!(by.len(), 1, "{what} runs on {by:?}");
    }
    for (replica, running) in replicas.iter().zip(&running) {
        assert!(
            steady.values().any(|by| by.contains(*replica)),
            "{replica} runs no hub key: {steady:?}"
        );
        let owned = running.status.owned();
        assert!(!owned.is_empty(), "{replica} runs no member");
        assert!(
            owned.iter().all(|c| !is_hub(c)),
            "the hub is run as a cluster"
        );
    }

    // Each replica reports how many shards' hub keys it runs: all the
    // shards between the three.
    let mut held = 0;
    for replica in &running {
        let (_, metrics) = replica.endpoints.get("/metrics").await.unwrap();
        let line = metrics
            .lines()
            .find(|l| l.starts_with("kube_multicluster_shard_hub_shards{"))
            .unwrap_or_else(|| panic!("no hub shards gauge: {metrics}"));
        held += line.rsplit(' ').next().unwrap().parse::<u32>().unwrap();
    }
    assert_eq!(held, 16);

    // Kill c: its Leases stop being renewed. Its share: its hub keys, and
    // its members, where the children are made again by their new owner.
    let mut c_share: Vec<String> = steady
        .iter()
        .filter(|(_, by)| by.contains("replica-c"))
        .map(|(what, _)| what.clone())
        .collect();
    c_share.extend(
        running[2]
            .status
            .owned()
            .iter()
            .map(|member| format!("{member}/")),
    );
    assert!(!c_share.is_empty());
    let c = running.pop().unwrap();
    c.run.abort();
    let killed = Instant::now();
    let _ = c.run.await;
    // Its share of hub keys and members runs elsewhere within the bound:
    // the lease, two retry periods (with jitter) and a second to sync.
    let bound = LEASE + RETRY.mul_f64(2.0 * 1.2) + Duration::from_secs(1);
    let deadline = killed + PATIENCE;
    let mut moves = Vec::new();
    for what in &c_share {
        let first = loop {
            let moved = records
                .all()
                .into_iter()
                .chain(children.all())
                .filter(|s| {
                    (s.cluster == *what
                        || what.ends_with('/') && s.cluster.starts_with(what.as_str()))
                        && s.replica != "replica-c"
                        && s.start >= killed
                })
                .map(|s| s.start)
                .min();
            if let Some(first) = moved {
                break first;
            }
            assert!(Instant::now() < deadline, "{what} never moved");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert!(
            first - killed <= bound,
            "{what} moved after {:?}, beyond {bound:?}",
            first - killed
        );
        moves.push(first - killed);
    }
    moves.sort();
    let hub_keys = c_share.iter().filter(|w| !w.ends_with('/')).count();
    println!(
        "replica-c ran {hub_keys} hub keys and {} members; they moved within {:?} to {:?}",
        c_share.len() - hub_keys,
        moves.first(),
        moves.last()
    );
    for span in records
        .all()
        .into_iter()
        .filter(|s| s.replica == "replica-c")
    {
        assert!(span.start < killed, "replica-c ran once dropped: {span:?}");
    }
    // Never two replicas at once, on a hub key or in a member.
    assert_no_overlap(&records.all());
    // Every parent's child is in every member, made by the member's owner
    // of the moment: each once, but where a dead replica's made it.
    let made = children.all();
    assert_no_overlap(&made);
    let deadline = Instant::now() + PATIENCE;
    loop {
        let listed = Api::<ConfigMap>::namespaced(client.clone(), "default")
            .list(&ListParams::default().labels("child=true"))
            .await
            .unwrap();
        if listed.items.len() == PARENTS * MEMBERS {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{} of {} children",
            listed.items.len(),
            PARENTS * MEMBERS
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let by_member: BTreeMap<String, BTreeSet<String>> =
        children
            .all()
            .into_iter()
            .fold(BTreeMap::new(), |mut by, span| {
                let member = span.cluster.split('/').next().unwrap().to_owned();
                by.entry(member).or_default().insert(span.replica);
                by
            });
    assert_eq!(by_member.len(), MEMBERS, "{by_member:?}");
    for replica in running {
        replica.run.abort();
    }
}
