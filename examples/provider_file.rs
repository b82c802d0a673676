//! The file provider: every context of the kubeconfig files in a directory
//! is a cluster, followed as the files change.
//!
//! ```text
//! cargo run --example provider_file                           # a local fleet's kubeconfigs, in a directory it changes
//! cargo run --example provider_file -- --watch ~/.kube/fleet  # your own files, directories or globs, until Ctrl-C
//! ```
//!
//! With no arguments it starts two local API servers, writes a kubeconfig
//! for the first into a new directory, and then adds one for the second,
//! points the first file at the second server, writes a broken file and
//! deletes one: each step shows in the fleet, and the broken file only as a
//! problem. `--watch` reads what you name, with the default policy: exec
//! plugins, `insecure-skip-tls-verify` and the like are refused until you
//! allow them (`FileProvider::policy`).

mod support;

use std::path::Path;

use kube::config::Kubeconfig;
use kube_multicluster::Fleet;
use kube_multicluster::envtest::Envtest;
use kube_multicluster::providers::file::FileProvider;
use tower::BoxError;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    support::logging();
    let fleet = Fleet::new();
    support::log_config_maps(&fleet);
    if let Some(source) = support::arg("--watch") {
        let provider = FileProvider::new([source]);
        tokio::spawn(async move {
            tokio::signal::ctrl_c().await.ok();
            std::process::exit(0);
        });
        fleet.run(provider).await;
        return Ok(());
    }

    let env = Envtest::start(2).await?;
    let (east, west) = (&env.clusters()[0], &env.clusters()[1]);
    support::config_map(east.client(), "default", "on-east").await?;
    support::config_map(west.client(), "default", "on-west").await?;
    let dir = env.dir().join("kubeconfigs");
    std::fs::create_dir_all(&dir)?;
    let (east_file, west_file) = (dir.join("east.kubeconfig"), dir.join("west.kubeconfig"));
    write(&east_file, east.kubeconfig())?;

    let provider = FileProvider::new([&dir]);
    let problems = provider.problems();
    tokio::spawn({
        let fleet = fleet.clone();
        async move { fleet.run(provider).await }
    });
    let east_name = format!("{}+admin", east_file.display());
    let west_name = format!("{}+admin", west_file.display());
    support::clusters_are(&fleet, &[&east_name]).await?;

    tracing::info!("a second file is written");
    write(&west_file, west.kubeconfig())?;
    support::clusters_are(&fleet, &[&east_name, &west_name]).await?;

    tracing::info!("the first file is pointed at the second server: engaged again under its name");
    let before = fleet.get(east_name.as_str()).ok_or("east engaged")?;
    write(&east_file, west.kubeconfig())?;
    tokio::time::timeout(std::time::Duration::from_secs(30), before.disengaged()).await?;

    tracing::info!("a broken file: a problem, and no cluster");
    let broken = dir.join("broken.kubeconfig");
    std::fs::write(&broken, "clusters: [ {name: ")?;
    let broken = broken.display().to_string();
    let found = problems
        .wait_for(|set| set.contains_key(&broken))
        .await
        .remove(&broken)
        .unwrap_or_default();
    tracing::warn!(file = %broken, %found, "problem");

    tracing::info!("the second file is deleted");
    std::fs::remove_file(&west_file)?;
    support::clusters_are(&fleet, &[&east_name]).await?;
    Ok(())
}

/// Writes `kubeconfig` whole, by a rename, as kubectl does, with its one
/// context named `admin`.
fn write(path: &Path, kubeconfig: &Kubeconfig) -> Result<(), BoxError> {
    let mut kubeconfig = kubeconfig.clone();
    kubeconfig.contexts[0].name = "admin".to_owned();
    kubeconfig.current_context = Some("admin".to_owned());
    let partial = path.with_extension("partial");
    std::fs::write(&partial, serde_json::to_string(&kubeconfig)?)?;
    std::fs::rename(&partial, path)?;
    Ok(())
}
