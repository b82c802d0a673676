//! Two replicas on one Lease, on a real API server: one reconciles at a
//! time, a graceful stop hands over at once, a leader cut off from the API
//! server stops at its renew deadline, before its successor starts, a
//! leader whose manager is dropped stops at once, two processes given one
//! identity never both lead, and the Lease's owner references and
//! finalizers outlast its writes.
//!
//! Test timings: a lease of 4 s, a renew deadline of 3 s, a retry period
//! of 1 s (up to 1.2 s with jitter).

mod support;

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::{
    api::{coordination::v1::Lease, core::v1::ConfigMap},
    apimachinery::pkg::apis::meta::v1::OwnerReference,
};
use kube::{
    Api, Client,
    api::{ObjectMeta, PostParams},
    runtime::watcher,
};
use kube_multicluster::{Controller, Fleet, controller::Config};
use kube_multicluster_envtest::Envtest;
use kube_multicluster_manager::{
    ElectionStatus, Error, LeaderElection, LeaseParams, Manager, Role,
};
use support::{PATIENCE, Records, assert_no_overlap, config_maps};
use tokio::{sync::oneshot, task::JoinHandle, time::Instant};

const LEASE: Duration = Duration::from_secs(4);
const RENEW_DEADLINE: Duration = Duration::from_secs(3);
const RETRY: Duration = Duration::from_secs(1);
/// How late past an instant a stopped reconcile's end may be recorded: the
/// time for its task to be polled once more.
const SCHEDULING: Duration = Duration::from_millis(100);

struct Replica {
    status: ElectionStatus,
    stop: Option<oneshot::Sender<()>>,
    run: JoinHandle<Result<(), Error>>,
}

impl Replica {
    /// A replica named `name` that reaches the Lease and the member
    /// cluster through `client`, and records its reconciles in `records`.
    fn start(name: &str, label: &str, client: Client, records: &Records) -> Self {
        Self::start_as(name, name, label, client, records)
    }

    /// A replica of identity `identity` whose reconciles are recorded as
    /// `recorded`'s.
    fn start_as(
        identity: &str,
        recorded: &str,
        label: &str,
        client: Client,
        records: &Records,
    ) -> Self {
        Self::start_with(identity, recorded, label, client, records, false).0
    }

    /// [`start_as`](Self::start_as), as a warm standby if `warm`; with its
    /// fleet.
    fn start_with(
        identity: &str,
        recorded: &str,
        label: &str,
        client: Client,
        records: &Records,
        warm: bool,
    ) -> (Self, Fleet) {
        let fleet = Fleet::new();
        fleet.engage("member", client.clone());
        let controller = Controller::<ConfigMap>::new(
            &fleet,
            watcher::Config::default().labels(&format!("{label}=true")),
        )
        .named("echo")
        .with_config(Config::default().warm_standby(warm));
        let (stop, stopped) = oneshot::channel::<()>();
        let election = LeaderElection::new(format!("{label}-leader")).lease(
            LeaseParams::default()
                .namespace("default")
                .identity(identity)
                .client(client)
                .lease_duration(LEASE)
                .renew_deadline(RENEW_DEADLINE)
                .retry_period(RETRY),
        );
        let status = election.status();
        let manager = Manager::new(&fleet)
            .leader_election(election)
            .graceful_shutdown_on(async move {
                let _ = stopped.await;
            })
            .controller(
                controller,
                records.reconciler(
                    recorded,
                    Duration::from_millis(50),
                    Duration::from_millis(100),
                ),
            );
        let replica = Self {
            status,
            stop: Some(stop),
            run: tokio::spawn(manager.run()),
        };
        (replica, fleet)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warm_standby_keeps_its_watches_synced_and_takes_over_from_them() {
    let env = Envtest::start(1).await.expect("envtest");
    let cluster = &env.clusters()[0];
    config_maps(cluster.client(), "warm", 3).await;
    let records = Records::default();
    let config = watcher::Config::default().labels("warm=true");

    let mut a = Replica::start("a", "warm", cluster.client(), &records);
    records.first_after("a", Instant::now()).await;
    let (mut b, b_fleet) = Replica::start_with("b", "b", "warm", cluster.client(), &records, true);
    let (mut c, c_fleet) = Replica::start_with("c", "c", "warm", cluster.client(), &records, false);
    // The warm standby's watch runs and syncs while it does not lead; the
    // cold one's does not run.
    let member = |fleet: &Fleet| fleet.get("member").expect("engaged");
    let deadline = Instant::now() + PATIENCE;
    while member(&b_fleet).cache().watch_count() == 0 {
        assert!(Instant::now() < deadline, "b's watch did not start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let watch = member(&b_fleet).cache().watch::<ConfigMap>(&config);
    tokio::time::timeout(PATIENCE, watch.synced())
        .await
        .expect("b's watch syncs");
    assert_eq!(
        watch.store().state().len(),
        3,
        "b's cache holds the objects"
    );
    assert_eq!(
        member(&c_fleet).cache().watch_count(),
        0,
        "c watches nothing"
    );
    assert!(records.of("b").is_empty() && records.of("c").is_empty());

    // The cold standby leaves; the leader hands over to the warm one,
    // which reconciles every object.
    let _ = c.stop.take().expect("c runs").send(());
    let _ = tokio::time::timeout(PATIENCE, &mut c.run).await;
    let stopping = Instant::now();
    let _ = a.stop.take().expect("a runs").send(());
    let _ = tokio::time::timeout(PATIENCE, &mut a.run).await;
    records.first_after("b", stopping).await;
    let deadline = Instant::now() + PATIENCE;
    while records.of("b").len() < 3 {
        assert!(
            Instant::now() < deadline,
            "b reconciled {:?}",
            records.of("b")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(b.status.role(), Role::Leading);
    let _ = b.stop.take().expect("b runs").send(());
    let _ = tokio::time::timeout(PATIENCE, b.run).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_replica_reconciles_and_a_graceful_stop_hands_over_at_once() {
    let env = Envtest::start(1).await.expect("envtest");
    let cluster = &env.clusters()[0];
    config_maps(cluster.client(), "handover", 3).await;
    let records = Records::default();

    let mut a = Replica::start("a", "handover", cluster.client(), &records);
    let began = Instant::now();
    records.first_after("a", began).await;
    let mut b = Replica::start("b", "handover", cluster.client(), &records);
    // B tries the Lease every second and is refused: only A reconciles.
    tokio::time::sleep(LEASE + 2 * RETRY).await;
    assert!(records.of("b").is_empty(), "b reconciled while a led");
    assert!(records.of("a").len() > 10);

    // B's role changes are awaited, not polled.
    let mut b_roles = Box::pin(b.status.changes());
    assert_eq!(b_roles.next().await, Some(Role::Standby));
    let stopping = Instant::now();
    let _ = a.stop.take().expect("a runs").send(());
    let stopped = tokio::time::timeout(PATIENCE, &mut a.run)
        .await
        .expect("a stops")
        .expect("a's task");
    assert!(stopped.is_ok(), "a graceful stop ends well: {stopped:?}");
    let released = Instant::now();
    tokio::time::timeout(PATIENCE, b.status.became(Role::Leading))
        .await
        .expect("b leads");
    assert_eq!(b_roles.next().await, Some(Role::Leading));
    let b_first = records.first_after("b", stopping).await;
    let handover = b_first - stopping;
    println!(
        "graceful handover: a stopped {:?} after the signal, b reconciled {:?} after the signal",
        released - stopping,
        handover
    );
    assert!(
        handover < Duration::from_secs(2),
        "handover took {handover:?}"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_no_overlap(&records.all());

    let _ = b.stop.take().expect("b runs").send(());
    let b_stopped = tokio::time::timeout(PATIENCE, b.run)
        .await
        .expect("b stops");
    assert!(b_stopped.expect("b's task").is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_stops_at_its_renew_deadline_before_its_successor_starts() {
    let env = Envtest::start(1).await.expect("envtest");
    let cluster = &env.clusters()[0];
    config_maps(cluster.client(), "cutoff", 3).await;
    let records = Records::default();
    // A reaches the API server (its Lease and its cluster) only through its
    // own link; B has a connection of its own.
    let link = cluster.link().expect("a link");
    let mut a = Replica::start("a", "cutoff", link.client(), &records);
    records.first_after("a", Instant::now()).await;
    let mut b = Replica::start("b", "cutoff", cluster.client(), &records);
    tokio::time::sleep(LEASE).await;
    assert!(records.of("b").is_empty(), "b reconciled while a led");

    let cut = Instant::now();
    link.cut_off();
    // A's last renew began before the cut, so its renew deadline ends
    // within RENEW_DEADLINE of it.
    let ended = tokio::time::timeout(PATIENCE, &mut a.run)
        .await
        .expect("a stops by itself")
        .expect("a's task");
    let a_stopped = Instant::now();
    match ended {
        Err(Error::LeadershipLost { lease, reason }) => {
            assert_eq!(lease, "default/cutoff-leader");
            assert!(reason.contains("renew deadline"), "{reason}");
        }
        other => panic!("a should have lost the Lease: {other:?}"),
    }
    assert!(
        a_stopped - cut <= RENEW_DEADLINE + SCHEDULING,
        "a stopped {:?} after the cut",
        a_stopped - cut
    );
    let deadline = cut + RENEW_DEADLINE;
    for span in records.of("a") {
        assert!(
            span.start < deadline,
            "a started a reconcile after its renew deadline: {span:?}"
        );
        let end = span.end.expect("a's reconciles ended");
        assert!(
            end <= deadline + SCHEDULING,
            "a reconciled past its renew deadline: {span:?}"
        );
    }

    // B takes the Lease once it has seen A's last record unchanged for the
    // lease duration: within the lease duration and two retries (one to
    // see the record, one to take it) of the cut, plus its watch's sync.
    let b_first = records.first_after("b", cut).await;
    let takeover = b_first - cut;
    println!(
        "cut off: a stopped {:?} after the cut, b reconciled {:?} after it",
        a_stopped - cut,
        takeover
    );
    let bound = LEASE + RETRY.mul_f64(2.0 * 1.2) + Duration::from_secs(1);
    assert!(
        takeover <= bound,
        "b took over {takeover:?} after the cut (bound {bound:?})"
    );
    assert!(
        takeover > LEASE - RETRY.mul_f64(1.2),
        "b took over too soon: {takeover:?}"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_no_overlap(&records.all());
    link.restore();

    let _ = b.stop.take().expect("b runs").send(());
    let b_stopped = tokio::time::timeout(PATIENCE, b.run)
        .await
        .expect("b stops");
    assert!(b_stopped.expect("b's task").is_ok());
}

/// The Lease `name` in `default`.
async fn lease(client: &Client, name: &str) -> Lease {
    Api::<Lease>::namespaced(client.clone(), "default")
        .get(name)
        .await
        .expect("the Lease")
}

fn holder(lease: &Lease) -> String {
    lease
        .spec
        .as_ref()
        .and_then(|s| s.holder_identity.clone())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_manager_starts_no_reconcile_and_stops_leading() {
    let env = Envtest::start(1).await.expect("envtest");
    let cluster = &env.clusters()[0];
    config_maps(cluster.client(), "dropped", 3).await;
    let records = Records::default();
    let mut a = Replica::start("a", "dropped", cluster.client(), &records);
    records.first_after("a", Instant::now()).await;
    assert_eq!(a.status.role(), Role::Leading);

    a.run.abort();
    let _ = (&mut a.run).await;
    let dropped = Instant::now();
    assert_eq!(a.status.role(), Role::Stopped);
    tokio::time::sleep(Duration::from_millis(500)).await;
    for span in records.of("a") {
        assert!(
            span.start < dropped,
            "a reconcile started once dropped: {span:?}"
        );
        let end = span.end.expect("a's reconciles ended");
        assert!(
            end <= dropped + SCHEDULING,
            "a reconcile ran on once dropped: {span:?}"
        );
    }
    // The Lease is left to run out, not released: reconciles may have been
    // under way in tasks of their own.
    assert!(holder(&lease(&cluster.client(), "dropped-leader").await).starts_with("a_"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_of_one_identity_never_both_lead_and_a_restart_waits_for_the_lease() {
    let env = Envtest::start(1).await.expect("envtest");
    let cluster = &env.clusters()[0];
    config_maps(cluster.client(), "twin", 3).await;
    let records = Records::default();
    let mut first = Replica::start_as("a", "first", "twin", cluster.client(), &records);
    records.first_after("first", Instant::now()).await;
    let first_holder = holder(&lease(&cluster.client(), "twin-leader").await);
    assert!(first_holder.starts_with("a_"), "{first_holder}");

    // A second process given the same identity does not take the Lease as
    // its own.
    let mut second = Replica::start_as("a", "second", "twin", cluster.client(), &records);
    tokio::time::sleep(RETRY.mul_f64(2.0 * 1.2) + Duration::from_millis(200)).await;
    assert!(records.of("second").is_empty(), "both processes of a led");
    assert_eq!(second.status.role(), Role::Standby);

    // The first dies, as a restart would begin: the second takes over only
    // once the first's record has run out.
    first.run.abort();
    let killed = Instant::now();
    let _ = (&mut first.run).await;
    let takeover = records.first_after("second", killed).await - killed;
    let second_holder = holder(&lease(&cluster.client(), "twin-leader").await);
    println!(
        "one identity: {first_holder} then {second_holder}, {takeover:?} after the first died"
    );
    assert!(second_holder.starts_with("a_") && second_holder != first_holder);
    let bound = LEASE + RETRY.mul_f64(2.0 * 1.2) + Duration::from_secs(1);
    assert!(
        takeover <= bound,
        "took over in {takeover:?} (bound {bound:?})"
    );
    assert!(
        takeover > LEASE - RETRY.mul_f64(1.2),
        "took over too soon: {takeover:?}"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Recorded under two names, so that the two processes are compared.
    assert_no_overlap(&records.all());

    let _ = second.stop.take().expect("runs").send(());
    let stopped = tokio::time::timeout(PATIENCE, second.run)
        .await
        .expect("stops");
    assert!(stopped.expect("its task").is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_writes_keep_owner_references_finalizers_labels_and_annotations() {
    let env = Envtest::start(1).await.expect("envtest");
    let cluster = &env.clusters()[0];
    let client = cluster.client();
    config_maps(client.clone(), "kept", 1).await;
    let owner = Api::<ConfigMap>::namespaced(client.clone(), "default")
        .get("kept-0")
        .await
        .expect("the owner");
    let owner_references = vec![OwnerReference {
        api_version: "v1".into(),
        kind: "ConfigMap".into(),
        name: "kept-0".into(),
        uid: owner.metadata.uid.clone().expect("a uid"),
        ..OwnerReference::default()
    }];
    let finalizers = vec!["example.com/keep".to_owned()];
    let metadata = ObjectMeta {
        name: Some("kept-leader".into()),
        labels: Some([("team".to_owned(), "platform".to_owned())].into()),
        annotations: Some([("note".to_owned(), "set by hand".to_owned())].into()),
        owner_references: Some(owner_references.clone()),
        finalizers: Some(finalizers.clone()),
        ..ObjectMeta::default()
    };
    Api::<Lease>::namespaced(client.clone(), "default")
        .create(
            &PostParams::default(),
            &Lease {
                metadata,
                spec: None,
            },
        )
        .await
        .expect("the Lease");
    let records = Records::default();
    let mut a = Replica::start("a", "kept", client.clone(), &records);
    records.first_after("a", Instant::now()).await;
    // Renewed a few times, then released.
    tokio::time::sleep(RETRY * 2).await;
    let held = lease(&client, "kept-leader").await;
    let _ = a.stop.take().expect("runs").send(());
    let stopped = tokio::time::timeout(PATIENCE, &mut a.run)
        .await
        .expect("stops");
    assert!(stopped.expect("its task").is_ok());
    let released = lease(&client, "kept-leader").await;
    assert!(holder(&held).starts_with("a_"), "{held:?}");
    assert_eq!(holder(&released), "", "{released:?}");
    for lease in [held, released] {
        let metadata = &lease.metadata;
        assert_eq!(metadata.owner_references.as_ref(), Some(&owner_references));
        assert_eq!(metadata.finalizers.as_ref(), Some(&finalizers));
        assert_eq!(
            metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("team"))
                .map(String::as_str),
            Some("platform")
        );
        assert_eq!(
            metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get("note"))
                .map(String::as_str),
            Some("set by hand")
        );
    }
}
