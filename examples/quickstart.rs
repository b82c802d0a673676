//! Starts a local fleet of three real Kubernetes API servers and shows how to
//! reach each of them.
//!
//! ```text
//! cargo run --example quickstart                 # runs until Ctrl-C
//! cargo run --example quickstart -- --run-for 5  # stops by itself after 5 seconds
//! ```
//!
//! Each cluster is a `kube-apiserver` on 127.0.0.1 with its own credentials,
//! all storing their data in one etcd; everything is removed on exit.

use std::{
    error::Error,
    time::{Duration, Instant},
};

use kube_fleet_envtest::Envtest;

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let run_for = parse_args()?;

    let started = Instant::now();
    let fleet = Envtest::start(3).await?;
    println!(
        "fleet of {} clusters ready in {:.1}s",
        fleet.clusters().len(),
        started.elapsed().as_secs_f64()
    );
    for cluster in fleet.clusters() {
        let version = cluster.client().apiserver_version().await?;
        println!(
            "{}  {}  {}  kubeconfig: {}",
            cluster.name(),
            version.git_version,
            cluster.server(),
            cluster.kubeconfig_path().display()
        );
    }

    match run_for {
        Some(duration) => tokio::time::sleep(duration).await,
        None => {
            println!("try: kubectl --kubeconfig <path> get namespaces; Ctrl-C stops the fleet");
            tokio::signal::ctrl_c().await?;
        }
    }
    drop(fleet);
    println!("fleet stopped");
    Ok(())
}

/// `--run-for SECONDS`, if given.
fn parse_args() -> Result<Option<Duration>, Box<dyn Error>> {
    let mut args = std::env::args().skip(1);
    match (args.next().as_deref(), args.next(), args.next()) {
        (None, ..) => Ok(None),
        (Some("--run-for"), Some(secs), None) => Ok(Some(Duration::from_secs_f64(
            secs.parse()
                .map_err(|e| format!("--run-for takes seconds, got {secs:?}: {e}"))?,
        ))),
        _ => Err("usage: quickstart [--run-for SECONDS]".into()),
    }
}
