//! Provider order is the truth: random sequences of engages and disengages,
//! with real and unreachable clients, leave each name in the state of its
//! last event, and no reconcile starts in a cluster after its Disengage was
//! applied (until it is engaged again).
//!
//! The sequences come from a fixed seed; a failure names the seed and case.
//! `PROVIDER_ORDER_SEED=<n> cargo test --test provider_order` replays others.

mod support;

use std::{
    collections::{BTreeSet, HashMap},
    sync::{Arc, Mutex},
    time::Duration,
};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{Client, Config, runtime::watcher};
use kube_multicluster::envtest::Envtest;
use kube_multicluster::{
    Action, ClusterName, Controller, Fleet, FleetEvent, ObjectRequest,
    provider::ProgrammaticProvider,
};
use support::create_config_map;
use tokio::time::Instant;
use tower::{BoxError, service_fn};

const CASES: u64 = 12;
const EVENTS_PER_CASE: usize = 40;
const NAMES_PER_CASE: u64 = 6;

/// xorshift64: small, seeded, reproducible.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Self(seed | 1)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// One event as the test sent it to the provider.
struct Sent {
    name: ClusterName,
    engage: bool,
    at: Instant,
}

/// A client to a port where nothing listens.
fn unreachable_client() -> Client {
    Client::try_from(Config::new("https://127.0.0.1:1".parse().unwrap())).unwrap()
}

#[tokio::test]
async fn provider_order_is_the_truth_for_every_interleaving() {
    let seed = std::env::var("PROVIDER_ORDER_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_2026_u64);
    let env = Envtest::start(2).await.unwrap();
    for cluster in env.clusters() {
        create_config_map(cluster.client(), "x").await;
    }
    let fleet = Fleet::new();
    let (provider, clusters) = ProgrammaticProvider::new();
    let provider_task = tokio::spawn({
        let fleet = fleet.clone();
        async move { fleet.run(provider).await }
    });

    // When each fleet event reached a subscriber: after it was applied.
    let applied: Arc<Mutex<Vec<(ClusterName, bool, Instant)>>> = Arc::default();
    let mut events = fleet.subscribe().events;
    let recorder = tokio::spawn({
        let applied = applied.clone();
        async move {
            while let Some(event) = events.recv().await {
                let (name, engaged) = match event {
                    FleetEvent::Engaged(cluster) => (cluster.name().clone(), true),
                    FleetEvent::Disengaged(name) => (name, false),
                };
                applied
                    .lock()
                    .unwrap()
                    .push((name, engaged, Instant::now()));
            }
        }
    });

    // Every reconcile's cluster and start; each key comes back every 5 ms.
    let starts: Arc<Mutex<Vec<(ClusterName, Instant)>>> = Arc::default();
    let service = service_fn({
        let starts = starts.clone();
        move |request: ObjectRequest<ConfigMap>| {
            let starts = starts.clone();
            async move {
                starts
                    .lock()
                    .unwrap()
                    .push((request.request.cluster, Instant::now()));
                Ok::<_, BoxError>(Action::requeue(Duration::from_millis(5)))
            }
        }
    });
    let controller =
        tokio::spawn(Controller::<ConfigMap>::new(&fleet, watcher::Config::default()).run(service));

    for case in 0..CASES {
        let context = format!("seed {seed}, case {case}");
        let mut rng = Rng::new(seed ^ (case + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let mut sent = Vec::new();
        for _ in 0..EVENTS_PER_CASE {
            let name = ClusterName::new(format!("case-{case}-{}", rng.below(NAMES_PER_CASE)));
            let engage = rng.below(2) == 0;
            let at = Instant::now();
            if engage {
                let client = match rng.below(3) {
                    0 => unreachable_client(),
                    i => env.clusters()[i as usize - 1].client(),
                };
                clusters.engage(name.clone(), client);
            } else {
                clusters.disengage(name.clone());
            }
            sent.push(Sent { name, engage, at });
            match rng.below(4) {
                0 => {}
                1 => tokio::task::yield_now().await,
                n => tokio::time::sleep(Duration::from_millis(n - 1)).await,
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;

        // The fleet holds exactly the names whose last event engaged them.
        let mut last = HashMap::new();
        for event in &sent {
            last.insert(event.name.clone(), event.engage);
        }
        let expected: BTreeSet<_> = last
            .iter()
            .filter(|(_, engaged)| **engaged)
            .map(|(name, _)| name.clone())
            .collect();
        let prefix = format!("case-{case}-");
        let actual: BTreeSet<_> = fleet
            .clusters()
            .iter()
            .map(|c| c.name().clone())
            .filter(|name| name.as_str().starts_with(&prefix))
            .collect();
        assert_eq!(
            actual, expected,
            "{context}: the fleet ends as the provider said"
        );

        check_no_reconcile_after_disengage(&sent, &applied, &starts, &context);

        for name in expected {
            clusters.disengage(name);
        }
    }
    controller.abort();
    recorder.abort();
    provider_task.abort();
}

/// For each name: the Disengages that took effect (a disengage of a name not
/// engaged publishes nothing) line up, in order, with those applied. Between
/// one being applied and the next Engage being *sent*, the cluster is out of
/// the fleet for certain, so no reconcile may start there.
fn check_no_reconcile_after_disengage(
    sent: &[Sent],
    applied: &Mutex<Vec<(ClusterName, bool, Instant)>>,
    starts: &Mutex<Vec<(ClusterName, Instant)>>,
    context: &str,
) {
    let applied = applied.lock().unwrap();
    let starts = starts.lock().unwrap();
    let names: BTreeSet<_> = sent.iter().map(|e| e.name.clone()).collect();
    for name in names {
        let mut engaged = false;
        let mut effective = Vec::new();
        for event in sent.iter().filter(|e| e.name == name) {
            if event.engage || engaged {
                effective.push(event);
            }
            engaged = event.engage;
        }
        let seen: Vec<_> = applied.iter().filter(|(n, ..)| *n == name).collect();
        assert_eq!(
            seen.len(),
            effective.len(),
            "{context}: {name} had every effective event applied once"
        );
        for (i, (event, (_, engaged, applied_at))) in effective.iter().zip(&seen).enumerate() {
            assert_eq!(
                event.engage, *engaged,
                "{context}: {name} event {i} in order"
            );
            if event.engage {
                continue;
            }
            let next_engage = effective[i + 1..].iter().find(|e| e.engage).map(|e| e.at);
            let late: Vec<_> = starts
                .iter()
                .filter(|(cluster, at)| {
                    *cluster == name && at > applied_at && next_engage.is_none_or(|next| *at < next)
                })
                .collect();
            assert!(
                late.is_empty(),
                "{context}: {} reconciles started in {name} after its disengage was applied",
                late.len()
            );
        }
    }
}
