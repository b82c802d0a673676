//! Replicas sharding clusters, on a real API server: each cluster run by
//! one replica, a dead replica's clusters taken over within the bound, a
//! joining replica taking only its share, no two replicas ever running a
//! cluster at once, a restarted replica given its clusters back, and no
//! Lease left behind by a replica or a cluster that has gone.
//!
//! Test timings: a lease of 4 s, a renew deadline of 3 s, a retry period
//! of 1 s (up to 1.2 s with jitter). The nine clusters are nine names for
//! one API server, which also holds the Leases.

mod support;

use std::{collections::BTreeMap, time::Duration};

use k8s_openapi::{
    api::coordination::v1::Lease, apimachinery::pkg::apis::meta::v1::MicroTime, jiff::Timestamp,
};
use kube::{
    Api, Client,
    api::{ListParams, ObjectMeta, PostParams},
};
use kube_multicluster_envtest::Envtest;
use kube_multicluster_manager::{Ownership, Sharding};
use support::{
    LEASE, PATIENCE, RETRY, Records, Replica, assert_no_overlap, config_maps, lease_params,
};
use tokio::time::Instant;

const CLUSTERS: usize = 9;

/// Replica `name` of the set `test-shards`, offered the nine clusters.
fn start(name: &str, client: &Client, records: &Records) -> Replica {
    let clusters: Vec<String> = (0..CLUSTERS).map(|i| format!("c{i}")).collect();
    start_in("test-shards", &clusters, name, client, records)
}

/// Replica `name` of the set `set`, offered `clusters`.
fn start_in(
    set: &str,
    clusters: &[impl AsRef<str>],
    name: &str,
    client: &Client,
    records: &Records,
) -> Replica {
    start_counting(set, clusters, name, client, records, None)
}

/// [`start_in`], counting `shards` shards if given.
fn start_counting(
    set: &str,
    clusters: &[impl AsRef<str>],
    name: &str,
    client: &Client,
    records: &Records,
    shards: Option<u32>,
) -> Replica {
    let sharding = Sharding::new(set).lease(lease_params(name, client.clone()));
    let sharding = match shards {
        Some(shards) => sharding.shards(shards),
        None => sharding,
    };
    Replica::start(sharding, name, clusters, client, "sharded", records)
}

/// Who owns each cluster, by the replicas' own word.
fn owners(replicas: &[&Replica]) -> BTreeMap<String, Vec<String>> {
    let mut owners: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for replica in replicas {
        for cluster in replica.status.owned() {
            owners
                .entry(cluster.to_string())
                .or_default()
                .push(replica.name.clone());
        }
    }
    owners
}

/// Waits until every cluster is owned by exactly one of `replicas` and each
/// sees all of them live; returns the owners and when that was first seen.
async fn settled(replicas: &[&Replica]) -> (BTreeMap<String, String>, Instant) {
    settled_on(replicas, CLUSTERS).await
}

/// [`settled`], for `clusters` clusters.
async fn settled_on(replicas: &[&Replica], clusters: usize) -> (BTreeMap<String, String>, Instant) {
    let deadline = Instant::now() + PATIENCE;
    let names: Vec<String> = {
        let mut names: Vec<String> = replicas.iter().map(|r| r.name.clone()).collect();
        names.sort();
        names
    };
    loop {
        let owners = owners(replicas);
        let agreed = replicas
            .iter()
            .all(|r| r.status.replicas() == names && r.status.owned() == r.status.assigned());
        if agreed && owners.len() == clusters && owners.values().all(|o| o.len() == 1) {
            let single = owners
                .into_iter()
                .map(|(c, mut o)| (c, o.remove(0)))
                .collect();
            return (single, Instant::now());
        }
        let seen: Vec<Vec<String>> = replicas.iter().map(|r| r.status.replicas()).collect();
        assert!(
            Instant::now() < deadline,
            "not settled: {owners:?}, replicas seen: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Asserts that no two replicas' stretches of ownership of a cluster
/// overlap; a stretch still open ends at its renew deadline.
fn assert_no_overlapping_ownership(histories: &[(String, Vec<Ownership>)]) {
    for (i, (a, mine)) in histories.iter().enumerate() {
        for (b, theirs) in &histories[i + 1..] {
            for x in mine {
                for y in theirs.iter().filter(|y| y.cluster == x.cluster) {
                    let x_end = x.until.unwrap_or(x.deadline);
                    let y_end = y.until.unwrap_or(y.deadline);
                    assert!(
                        x_end <= y.from || y_end <= x.from,
                        "{a} and {b} both owned {}: {x:?} and {y:?}",
                        x.cluster
                    );
                }
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_split_nine_clusters_and_recover_from_a_dead_one() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()))
        .with_test_writer()
        .try_init();
    let env = Envtest::start(1).await.expect("envtest");
    let cluster = &env.clusters()[0];
    config_maps(cluster.client(), "sharded", 2).await;
    let client = cluster.client();
    let records = Records::default();

    let a = start("replica-a", &client, &records);
    let b = start("replica-b", &client, &records);
    let mut c = start("replica-c", &client, &records);
    let (before, _) = settled(&[&a, &b, &c]).await;
    println!("three replicas: {before:?}");
    for replica in [&a, &b, &c] {
        let share = before.values().filter(|o| **o == replica.name).count();
        assert!(share >= 1, "{} owns nothing of {before:?}", replica.name);
    }
    // Each cluster is reconciled, by its owner.
    let now = Instant::now();
    for (cluster, owner) in &before {
        let deadline = Instant::now() + PATIENCE;
        while !records
            .of(owner)
            .iter()
            .any(|s| s.cluster == *cluster && s.start >= now)
        {
            assert!(
                Instant::now() < deadline,
                "{owner} does not reconcile {cluster}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    // Kill c: no release, its Leases just stop being renewed.
    let orphans: Vec<String> = before
        .iter()
        .filter(|(_, o)| **o == "replica-c")
        .map(|(cluster, _)| cluster.clone())
        .collect();
    // Its future is dropped: it starts no reconcile after, and says it owns
    // nothing, though its Leases stay for the others to see run out.
    c.run.abort();
    // Dropped once the abort is taken in: a reconcile may start before.
    let _ = (&mut c.run).await;
    let killed = Instant::now();
    assert!(c.status.owned().is_empty(), "{:?}", c.status.owned());
    assert!(c.status.history().iter().all(|o| o.until.is_some()));
    let (after, _) = settled(&[&a, &b]).await;
    println!("after replica-c died: {after:?}");
    let c_history = c.status.history();
    for span in records.of("replica-c") {
        assert!(
            span.start < killed,
            "replica-c reconciled once dropped: {span:?}"
        );
    }
    for (cluster, owner) in &before {
        if owner != "replica-c" {
            assert_eq!(
                &after[cluster], owner,
                "{cluster} moved though its owner lived"
            );
        }
    }
    // Each orphan is reconciled by its new owner within the bound: the lease
    // duration, two retry periods (one to see the last renew, one to take
    // the Lease) and a second for the watch to sync.
    let bound = LEASE + RETRY.mul_f64(2.0 * 1.2) + Duration::from_secs(1);
    for cluster in &orphans {
        let owner = &after[cluster];
        let deadline = killed + PATIENCE;
        let first = loop {
            if let Some(span) = records
                .of(owner)
                .into_iter()
                .find(|s| s.cluster == *cluster && s.start >= killed)
            {
                break span.start;
            }
            assert!(
                Instant::now() < deadline,
                "{owner} never reconciled {cluster}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let moved = first - killed;
        println!("{cluster}: reconciled by {owner} {moved:?} after replica-c died");
        assert!(
            moved <= bound,
            "{cluster} moved in {moved:?} (bound {bound:?})"
        );
        // Not before c's Lease on it could have run out: its last renew was
        // at most a retry period before it died.
        assert!(
            moved >= LEASE - RETRY.mul_f64(1.2),
            "{cluster} moved too soon: {moved:?}"
        );
    }

    // A fourth replica joins: it takes some clusters, and only from others'
    // shares; no cluster moves between the old replicas.
    let d = start("replica-d", &client, &records);
    let (joined, _) = settled(&[&a, &b, &d]).await;
    println!("after replica-d joined: {joined:?}");
    let mut moved = 0;
    for (cluster, owner) in &joined {
        if *owner != after[cluster] {
            assert_eq!(owner, "replica-d", "{cluster} moved between old replicas");
            moved += 1;
        }
    }
    assert!(moved >= 1, "replica-d took nothing: {joined:?}");
    println!("{moved} of {CLUSTERS} clusters moved to replica-d");

    // Graceful stops release everything.
    let mut histories = vec![("replica-c".to_owned(), c_history)];
    for mut replica in [a, b, d] {
        histories.push(replica.stop().await);
    }
    assert_no_overlapping_ownership(&histories);
    assert_no_overlap(&records.all());
}

/// The set's Leases, by name.
async fn leases(client: &Client, set: &str) -> BTreeMap<String, Lease> {
    Api::<Lease>::namespaced(client.clone(), "default")
        .list(&ListParams::default().labels(&format!("kube-multicluster.dev/shards={set}")))
        .await
        .expect("the Leases")
        .items
        .into_iter()
        .map(|lease| (lease.metadata.name.clone().unwrap_or_default(), lease))
        .collect()
}

fn kind(lease: &Lease) -> &str {
    lease
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get("kube-multicluster.dev/lease"))
        .map_or("", String::as_str)
}

fn shard_of(lease: &Lease) -> Option<u32> {
    lease
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("kube-multicluster.dev/shard"))
        .and_then(|shard| shard.parse().ok())
}

fn holder(lease: &Lease) -> Option<&str> {
    lease.spec.as_ref()?.holder_identity.as_deref()
}

/// A Lease `<set>-<name>` of the set, of `kind`, with one annotation, held
/// by `holder` for `seconds` from now.
fn lease(
    set: &str,
    name: &str,
    kind: &str,
    annotation: (&str, &str),
    holder: &str,
    seconds: i32,
) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some(format!("{set}-{name}")),
            labels: Some(
                [
                    ("kube-multicluster.dev/shards".to_owned(), set.to_owned()),
                    ("kube-multicluster.dev/lease".to_owned(), kind.to_owned()),
                ]
                .into(),
            ),
            annotations: Some([(annotation.0.to_owned(), annotation.1.to_owned())].into()),
            ..ObjectMeta::default()
        },
        spec: Some(k8s_openapi::api::coordination::v1::LeaseSpec {
            holder_identity: Some(holder.into()),
            lease_duration_seconds: Some(seconds),
            renew_time: Some(MicroTime(Timestamp::now())),
            ..Default::default()
        }),
    }
}

/// Creates `lease` in the default namespace.
async fn plant(client: &Client, lease: Lease) {
    let name = lease.metadata.name.clone();
    Api::<Lease>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &lease)
        .await
        .unwrap_or_else(|e| panic!("creating the Lease {name:?}: {e}"));
}

/// Waits until `gone` holds of the set's Leases; returns when it did.
async fn until_leases(
    client: &Client,
    set: &str,
    what: &str,
    gone: impl Fn(&BTreeMap<String, Lease>) -> bool,
) -> Instant {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let leases = leases(client, set).await;
        if gone(&leases) {
            return Instant::now();
        }
        assert!(Instant::now() < deadline, "{what}: {:?}", leases.keys());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_of_replicas_and_clusters_that_left_are_deleted_and_a_restarted_replica_gets_its_clusters_back()
 {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()))
        .with_test_writer()
        .try_init();
    const SET: &str = "tidy-shards";
    let env = Envtest::start(1).await.expect("envtest");
    let client = env.clusters()[0].client();
    config_maps(client.clone(), "sharded", 2).await;
    let records = Records::default();

    // The Lease of a replica that died long ago, with a duration of 1 s: a
    // live replica deletes it once it has seen it run out for ten times
    // that.
    plant(
        &client,
        lease(
            SET,
            "member-ghost",
            "member",
            ("kube-multicluster.dev/shard-count", "64"),
            "ghost_0",
            1,
        ),
    )
    .await;
    // And the Lease of a cluster that a replica from before shards held
    // when it died: nobody will release or delete it but the sweep.
    plant(
        &client,
        lease(
            SET,
            "cluster-orphan",
            "cluster",
            ("kube-multicluster.dev/cluster", "long-gone"),
            "ghost_0",
            1,
        ),
    )
    .await;
    let planted = Instant::now();

    let mut a = start_in(SET, &["c0", "c1", "c2"], "replica-a", &client, &records);
    let mut b = start_in(SET, &["c0", "c1", "c2"], "replica-b", &client, &records);
    let (before, _) = settled_on(&[&a, &b], 3).await;
    println!("two replicas: {before:?}");

    // Each cluster in a shard of its own, fenced by the shard's Lease.
    let sharding = Sharding::new(SET);
    let shard = |cluster: &str| sharding.shard_of(cluster);
    let shards: Vec<u32> = ["c0", "c1", "c2"].map(shard).into();
    assert!(shards[0] != shards[1] && shards[0] != shards[2] && shards[1] != shards[2]);
    let fenced = leases(&client, SET).await;
    let mut held: Vec<u32> = fenced
        .values()
        .filter(|l| kind(l) == "shard" && holder(l).is_some())
        .filter_map(shard_of)
        .collect();
    held.sort();
    let mut expected_shards = shards.clone();
    expected_shards.sort();
    assert_eq!(held, expected_shards, "{fenced:?}");

    // The providers no longer offer c0: its owner deletes its shard's Lease.
    a.clusters.disengage("c0");
    b.clusters.disengage("c0");
    let removed = Instant::now();
    let gone = until_leases(&client, SET, "c0's shard's Lease stays", |leases| {
        leases.values().all(|l| shard_of(l) != Some(shard("c0")))
    })
    .await;
    println!(
        "c0's shard's Lease deleted {:?} after the providers removed it",
        gone - removed
    );
    let (kept, _) = settled_on(&[&a, &b], 2).await;
    let mut expected = before.clone();
    expected.remove("c0");
    assert_eq!(kept, expected, "clusters moved when c0 left");

    // B dies and comes back under its identity, with a new holder: once its
    // old Leases have run out, it runs the same clusters as before.
    let b_holder = |leases: &BTreeMap<String, Lease>| {
        leases
            .values()
            .filter(|l| kind(l) == "member")
            .filter_map(holder)
            .find(|h| h.starts_with("replica-b_"))
            .map(str::to_owned)
    };
    let old_holder = b_holder(&leases(&client, SET).await).expect("b's Lease");
    b.run.abort();
    let _ = (&mut b.run).await;
    let b_history = b.status.history();
    let restarted = Instant::now();
    let mut b = start_in(SET, &["c1", "c2"], "replica-b", &client, &records);
    let (after, _) = settled_on(&[&a, &b], 2).await;
    let new_holder = b_holder(&leases(&client, SET).await).expect("b's Lease");
    println!(
        "restarted replica-b ({old_holder} then {new_holder}) settled {:?} after the restart: {after:?}",
        restarted.elapsed()
    );
    assert_ne!(old_holder, new_holder);
    assert_eq!(after, expected, "the restarted replica runs other clusters");

    // A graceful stop deletes the replica's own Lease.
    b.stop().await;
    let left = leases(&client, SET).await;
    assert_eq!(b_holder(&left), None, "{left:?}");
    assert!(
        left.values().filter(|l| kind(l) == "member").all(|l| {
            holder(l).is_some_and(|h| h.starts_with("replica-a_"))
                || l.metadata.name.as_deref() == Some("tidy-shards-member-ghost")
        }),
        "{left:?}"
    );

    // The ghost's Lease goes, and the orphaned cluster's, not before they
    // have run out ten times over.
    let name = format!("{SET}-member-ghost");
    let orphan = format!("{SET}-cluster-orphan");
    let ghost_gone = until_leases(&client, SET, "the ghost's Leases stay", |leases| {
        !leases.contains_key(&name) && !leases.contains_key(&orphan)
    })
    .await;
    println!(
        "the ghost's Lease deleted {:?} after it was written",
        ghost_gone - planted
    );
    assert!(ghost_gone - planted >= Duration::from_secs(11));

    // A's stop leaves the Leases of the shards of the clusters still
    // offered, released, and nothing else.
    a.stop().await;
    let left = leases(&client, SET).await;
    let mut fenced: Vec<u32> = left.values().filter_map(shard_of).collect();
    fenced.sort();
    let mut offered = vec![shard("c1"), shard("c2")];
    offered.sort();
    assert_eq!(fenced, offered, "{left:?}");
    assert!(
        left.values()
            .all(|l| kind(l) == "shard" && holder(l).is_none()),
        "{left:?}"
    );
    assert_no_overlapping_ownership(&[
        ("replica-a".into(), a.status.history()),
        ("replica-b (first run)".into(), b_history),
        ("replica-b".into(), b.status.history()),
    ]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_runs_nothing_beside_one_counting_other_shards_or_of_an_earlier_release() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()))
        .with_test_writer()
        .try_init();
    const SET: &str = "count-shards";
    let env = Envtest::start(1).await.expect("envtest");
    let client = env.clusters()[0].client();
    config_maps(client.clone(), "sharded", 2).await;
    let records = Records::default();
    let clusters = ["c0", "c1", "c2"];

    let a = start_in(SET, &clusters, "replica-a", &client, &records);
    settled_on(&[&a], 3).await;

    // B counts 32 shards where A counts the default 64: a cluster would
    // fall in different shards for each, so neither runs anything.
    let mut b = start_counting(SET, &clusters, "replica-b", &client, &records, Some(32));
    let deadline = Instant::now() + PATIENCE;
    while !(a.status.owned().is_empty() && a.status.replicas().len() == 2) {
        assert!(
            Instant::now() < deadline,
            "replica-a still runs {:?}, sees {:?}",
            a.status.owned(),
            a.status.replicas()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let quiet = Instant::now();
    // A's last stretch ended at most a renew deadline ago, and nothing of
    // either starts for three retry periods.
    tokio::time::sleep(RETRY * 3).await;
    assert!(b.status.owned().is_empty(), "{:?}", b.status.owned());
    assert!(b.status.history().is_empty(), "{:?}", b.status.history());
    assert!(a.status.assigned().is_empty() && b.status.assigned().is_empty());
    for replica in ["replica-a", "replica-b"] {
        for span in records.of(replica) {
            assert!(
                span.start < quiet,
                "{replica} reconciled while the counts disagree: {span:?}"
            );
        }
    }

    // B leaves: A runs every cluster again.
    b.stop().await;
    let left = Instant::now();
    let (owners, back) = settled_on(&[&a], 3).await;
    println!(
        "replica-a ran {owners:?} again {:?} after replica-b left",
        back - left
    );

    // A replica of a release that fenced each cluster (its Lease of kind
    // `replica`) runs its own share of the clusters: while it lives, A
    // runs nothing; once its Lease has run out, A runs everything again.
    plant(
        &client,
        lease(
            SET,
            "replica-earlier",
            "replica",
            ("kube-multicluster.dev/note", "earlier"),
            "earlier_0",
            3,
        ),
    )
    .await;
    let deadline = Instant::now() + PATIENCE;
    while !a.status.owned().is_empty() {
        assert!(
            Instant::now() < deadline,
            "replica-a runs {:?} beside a replica of an earlier release",
            a.status.owned()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (owners, _) = settled_on(&[&a], 3).await;
    assert_eq!(owners.len(), 3);
}
