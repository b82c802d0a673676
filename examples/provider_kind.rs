//! The kind provider: the kind clusters on this machine, found by running
//! `kind get clusters` every few seconds, each named as kind names it.
//!
//! ```text
//! cargo run --example provider_kind                     # a stand-in `kind` that answers from a local fleet
//! cargo run --example provider_kind -- --real           # the kind clusters on this machine, until Ctrl-C
//! cargo run --example provider_kind -- --real --prefix dev-
//! ```
//!
//! With no arguments it starts two local API servers and writes a small
//! script that answers `kind get clusters` and `kind get kubeconfig --name`
//! from them, as kind would for two clusters `dev-a` and `dev-b`, plus a
//! `prod` that the prefix `dev-` leaves out. It then "deletes" `dev-b` and
//! the fleet follows.

mod support;

use std::{os::unix::fs::PermissionsExt, time::Duration};

use kube_multicluster::Fleet;
use kube_multicluster::envtest::Envtest;
use kube_multicluster::providers::kind::KindProvider;
use tower::BoxError;

/// Answers as kind does, from the files beside it.
const KIND: &str = r#"#!/bin/sh
dir=$(dirname "$0")
case "$*" in
"get clusters") cat "$dir/clusters" ;;
"get kubeconfig --name "*) cat "$dir/$4.yaml" || exit 1 ;;
*) echo "ERROR: unknown command: $*" >&2; exit 2 ;;
esac
"#;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    support::logging();
    let fleet = Fleet::new();
    support::log_config_maps(&fleet);
    if support::flag("--real") {
        let mut provider = KindProvider::new();
        if let Some(prefix) = support::arg("--prefix") {
            provider = provider.prefix(prefix);
        }
        tokio::spawn(async move {
            tokio::signal::ctrl_c().await.ok();
            std::process::exit(0);
        });
        fleet.run(provider).await;
        return Ok(());
    }

    let env = Envtest::start(2).await?;
    let dir = env.dir().join("kind");
    std::fs::create_dir_all(&dir)?;
    // `prod` is the second server again, under another name.
    let clusters = [
        ("dev-a", &env.clusters()[0]),
        ("dev-b", &env.clusters()[1]),
        ("prod", &env.clusters()[1]),
    ];
    for (name, cluster) in clusters {
        let kubeconfig = serde_json::to_string(cluster.kubeconfig())?;
        std::fs::write(dir.join(format!("{name}.yaml")), kubeconfig)?;
    }
    support::config_map(env.clusters()[0].client(), "default", "in-dev-a").await?;
    support::config_map(env.clusters()[1].client(), "default", "in-dev-b").await?;
    std::fs::write(dir.join("clusters"), "dev-a\ndev-b\nprod\n")?;
    let kind = dir.join("kind");
    std::fs::write(&kind, KIND)?;
    std::fs::set_permissions(&kind, std::fs::Permissions::from_mode(0o755))?;

    let provider = KindProvider::new()
        .executable(&kind)
        .prefix("dev-")
        .interval(Duration::from_millis(500));
    tokio::spawn({
        let fleet = fleet.clone();
        async move { fleet.run(provider).await }
    });
    support::clusters_are(&fleet, &["dev-a", "dev-b"]).await?;

    tracing::info!("kind delete cluster --name dev-b");
    std::fs::write(dir.join("clusters"), "dev-a\nprod\n")?;
    support::clusters_are(&fleet, &["dev-a"]).await?;
    Ok(())
}
