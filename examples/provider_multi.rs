//! The multi provider: several providers as one, each under a prefix, added
//! and removed while the fleet runs.
//!
//! ```text
//! cargo run --example provider_multi
//! ```
//!
//! It starts two local API servers. The first's kubeconfig is read by a
//! file provider under the prefix `files`; a while later the second's
//! namespaces join through a namespace provider under the prefix `tenants`
//! (`tenants#team-a`, ...); then the file provider is removed and its
//! cluster leaves, while the namespaces stay.

mod support;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ObjectMeta, PostParams};
use kube_multicluster::Fleet;
use kube_multicluster::envtest::Envtest;
use kube_multicluster::providers::file::FileProvider;
use kube_multicluster::providers::multi::MultiProvider;
use kube_multicluster::providers::namespace::NamespaceProvider;
use tower::BoxError;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    support::logging();
    let env = Envtest::start(2).await?;
    let (first, second) = (&env.clusters()[0], &env.clusters()[1]);
    for team in ["team-a", "team-b"] {
        let namespace = Namespace {
            metadata: ObjectMeta {
                name: Some(team.to_owned()),
                labels: Some([("team".to_owned(), "true".to_owned())].into()),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        Api::<Namespace>::all(second.client())
            .create(&PostParams::default(), &namespace)
            .await?;
    }

    let fleet = Fleet::new();
    support::log_config_maps(&fleet);
    let (multi, providers) = MultiProvider::new();
    tokio::spawn({
        let fleet = fleet.clone();
        async move { fleet.run(multi).await }
    });

    // The envtest fleet writes each cluster's kubeconfig to a file.
    let file = first.kubeconfig_path().to_owned();
    providers.add("files", FileProvider::new([&file]))?;
    let from_file = format!("files#{}+{}", file.display(), first.name());
    support::clusters_are(&fleet, &[&from_file]).await?;

    tracing::info!("a namespace provider joins under the prefix tenants");
    providers.add(
        "tenants",
        NamespaceProvider::new("second", second.client()).selector("team=true"),
    )?;
    support::clusters_are(&fleet, &[&from_file, "tenants#team-a", "tenants#team-b"]).await?;

    tracing::info!("the file provider is removed");
    providers.remove("files");
    support::clusters_are(&fleet, &["tenants#team-a", "tenants#team-b"]).await?;
    Ok(())
}
