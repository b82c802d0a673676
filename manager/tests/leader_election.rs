//! Two replicas on one Lease, on a real API server: one reconciles at a
//! time, a graceful stop hands over at once, and a leader cut off from the
//! API server stops at its renew deadline, before its successor starts.
//!
//! Test timings: a lease of 4 s, a renew deadline of 3 s, a retry period
//! of 1 s (up to 1.2 s with jitter).

mod support;

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{Client, runtime::watcher};
use kube_fleet::{Controller, Fleet};
use kube_fleet_envtest::Envtest;
use kube_fleet_manager::{Error, LeaderElection, Manager};
use support::{PATIENCE, Records, assert_no_overlap, config_maps};
use tokio::{sync::oneshot, task::JoinHandle, time::Instant};

const LEASE: Duration = Duration::from_secs(4);
const RENEW_DEADLINE: Duration = Duration::from_secs(3);
const RETRY: Duration = Duration::from_secs(1);
/// How late past an instant a stopped reconcile's end may be recorded: the
/// time for its task to be polled once more.
const SCHEDULING: Duration = Duration::from_millis(100);

struct Replica {
    stop: Option<oneshot::Sender<()>>,
    run: JoinHandle<Result<(), Error>>,
}

impl Replica {
    /// A replica named `name` that reaches the Lease and the member
    /// cluster through `client`, and records its reconciles in `records`.
    fn start(name: &str, label: &str, client: Client, records: &Records) -> Self {
        let fleet = Fleet::new();
        fleet.engage("member", client.clone());
        let controller = Controller::<ConfigMap>::new(
            &fleet,
            watcher::Config::default().labels(&format!("{label}=true")),
        )
        .named("echo");
        let (stop, stopped) = oneshot::channel::<()>();
        let manager = Manager::new(&fleet)
            .leader_election(
                LeaderElection::new(format!("{label}-leader"))
                    .namespace("default")
                    .identity(name)
                    .client(client)
                    .lease_duration(LEASE)
                    .renew_deadline(RENEW_DEADLINE)
                    .retry_period(RETRY),
            )
            .graceful_shutdown_on(async move {
                let _ = stopped.await;
            })
            .controller(
                controller,
                records.reconciler(name, Duration::from_millis(50), Duration::from_millis(100)),
            );
        Self {
            stop: Some(stop),
            run: tokio::spawn(manager.run()),
        }
    }
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

    let stopping = Instant::now();
    let _ = a.stop.take().expect("a runs").send(());
    let stopped = tokio::time::timeout(PATIENCE, &mut a.run)
        .await
        .expect("a stops")
        .expect("a's task");
    assert!(stopped.is_ok(), "a graceful stop ends well: {stopped:?}");
    let released = Instant::now();
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
