//! How long a warm start of a three-cluster fleet takes, from nothing running
//! to every API server ready, and how long dropping it takes.
//!
//! ```text
//! cargo bench -p kube-multicluster-envtest --bench fleet_start            # 5 rounds
//! cargo bench -p kube-multicluster-envtest --bench fleet_start -- 10      # 10 rounds
//! ```
//!
//! The binaries are found or built before the first round, so a first build
//! is not counted.

use std::time::{Duration, Instant};

use kube_multicluster_envtest::{Binaries, Envtest};

#[tokio::main]
async fn main() -> kube_multicluster_envtest::Result<()> {
    // `cargo bench` passes `--bench`; the first number given is the round count.
    let rounds = std::env::args()
        .skip(1)
        .find_map(|arg| arg.parse::<usize>().ok())
        .unwrap_or(5);
    Binaries::find().await?;

    let (mut starts, mut stops) = (Vec::new(), Vec::new());
    for round in 1..=rounds {
        let started = Instant::now();
        let fleet = Envtest::start(3).await?;
        let start = started.elapsed();
        let stopping = Instant::now();
        drop(fleet);
        let stop = stopping.elapsed();
        println!("round {round}: start {start:.2?}, drop {stop:.2?}");
        starts.push(start);
        stops.push(stop);
    }
    println!("three-cluster fleet, {rounds} rounds:");
    println!("  start  {}", summary(&mut starts));
    println!("  drop   {}", summary(&mut stops));
    Ok(())
}

fn summary(times: &mut [Duration]) -> String {
    times.sort();
    format!(
        "min {:.2?}  median {:.2?}  max {:.2?}",
        times[0],
        times[times.len() / 2],
        times[times.len() - 1]
    )
}
