//! Prepares the binaries the envtest harness runs, or runs a fleet by hand.
//!
//! ```text
//! kube-multicluster-envtest install      # find or build kube-apiserver and etcd, print their directory
//! kube-multicluster-envtest install kcp  # find or build kcp, print its path
//! kube-multicluster-envtest start 3      # run three clusters until Ctrl-C, printing their kubeconfigs
//! ```
//!
//! Tests build the binaries on first use anyway; running `install` first
//! shows the build on its own and keeps its minutes out of the first test.

use std::process::ExitCode;

use kube_multicluster_envtest::{Binaries, Envtest, KcpBinary};

const USAGE: &str = "\
usage: kube-multicluster-envtest install [kcp] | start [N]

install      finds kube-apiserver and etcd (in $KUBEBUILDER_ASSETS or the cache), building
             them with go if needed, and prints the directory that holds them
install kcp  finds kcp (at $KCP_BINARY or in the cache), building it with go if needed (a few
             minutes), and prints its path
start        runs N clusters (default 1) on one etcd until Ctrl-C, printing each cluster's
             name, address and kubeconfig, and the process ids of the fleet";

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["install"] => install().await,
        ["install", "kcp"] => install_kcp().await,
        ["start"] => start(1).await,
        ["start", n] => match n.parse() {
            Ok(n) => start(n).await,
            Err(_) => Err(format!("start takes a number of clusters, got {n:?}")),
        },
        _ => {
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kube-multicluster-envtest: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn install() -> Result<(), String> {
    let binaries = Binaries::find().await.map_err(|e| e.to_string())?;
    let dir = binaries
        .kube_apiserver
        .parent()
        .unwrap_or(&binaries.kube_apiserver);
    println!("{}", dir.display());
    Ok(())
}

async fn install_kcp() -> Result<(), String> {
    let kcp = KcpBinary::find().await.map_err(|e| e.to_string())?;
    println!("{}", kcp.path.display());
    Ok(())
}

async fn start(n: usize) -> Result<(), String> {
    let fleet = Envtest::start(n).await.map_err(|e| e.to_string())?;
    for cluster in fleet.clusters() {
        println!(
            "{}\t{}\t{}",
            cluster.name(),
            cluster.server(),
            cluster.kubeconfig_path().display()
        );
    }
    let pids: Vec<String> = fleet.pids().iter().map(u32::to_string).collect();
    println!("pids\t{}", pids.join(" "));
    let _ = tokio::signal::ctrl_c().await;
    Ok(())
}
