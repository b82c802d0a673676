//! Prepares the binaries the envtest harness runs, ahead of the tests.
//!
//! ```text
//! kube-fleet-envtest install   # find or build kube-apiserver and etcd, print their directory
//! ```
//!
//! Tests build the binaries on first use anyway; running this first shows the
//! build on its own and keeps its minutes out of the first test's time.

use std::process::ExitCode;

use kube_fleet_envtest::Binaries;

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["install"] => match Binaries::find().await {
            Ok(binaries) => {
                let dir = binaries
                    .kube_apiserver
                    .parent()
                    .unwrap_or(&binaries.kube_apiserver);
                println!("{}", dir.display());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("kube-fleet-envtest: {e}");
                ExitCode::FAILURE
            }
        },
        _ => {
            eprintln!(
                "usage: kube-fleet-envtest install\n\n\
                 Finds kube-apiserver and etcd (in $KUBEBUILDER_ASSETS or the cache), building \
                 them with go if needed, and prints the directory that holds them."
            );
            ExitCode::from(2)
        }
    }
}
