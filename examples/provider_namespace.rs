//! The namespace provider: each namespace of one cluster is a cluster of its
//! own, seeing that namespace only, and all of them share one watch per type
//! at the API server.
//!
//! ```text
//! cargo run --example provider_namespace                          # one local API server and its namespaces
//! cargo run --example provider_namespace -- --selector tenant=true   # your cluster's labelled namespaces, until Ctrl-C
//! ```
//!
//! With no arguments it starts a local API server with three tenant
//! namespaces, shows that each namespace's cluster holds its own objects
//! only, that the API server serves one watch of ConfigMaps for all of them,
//! and that a namespace created later joins and one deleted leaves.

mod support;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::{
    Api, Client,
    api::{DeleteParams, ObjectMeta, PostParams},
};
use kube_multicluster::Fleet;
use kube_multicluster::envtest::Envtest;
use kube_multicluster::providers::namespace::NamespaceProvider;
use tower::BoxError;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    support::logging();
    let fleet = Fleet::new();
    support::log_config_maps(&fleet);
    if let Some(selector) = support::arg("--selector") {
        let host = kube::Client::try_default().await?;
        tokio::spawn(async move {
            tokio::signal::ctrl_c().await.ok();
            std::process::exit(0);
        });
        fleet
            .run(NamespaceProvider::new("host", host).selector(selector))
            .await;
        return Ok(());
    }

    let env = Envtest::start(1).await?;
    let admin = env.clusters()[0].client();
    for tenant in ["tenant-a", "tenant-b", "tenant-c"] {
        namespace(&admin, tenant).await?;
        support::config_map(admin.clone(), tenant, &format!("{tenant}-settings")).await?;
    }
    let provider = NamespaceProvider::new("host", admin.clone()).selector("tenant=true");
    let host = provider.host();
    tokio::spawn({
        let fleet = fleet.clone();
        async move { fleet.run(provider).await }
    });
    support::clusters_are(&fleet, &["tenant-a", "tenant-b", "tenant-c"]).await?;
    // Wait until each has read its ConfigMaps.
    for tenant in ["tenant-a", "tenant-b", "tenant-c"] {
        let cluster = fleet.get(tenant).ok_or("engaged")?;
        let store = loop {
            match cluster.store::<ConfigMap>() {
                Some(store) if !store.is_empty() => break store,
                _ => tokio::time::sleep(std::time::Duration::from_millis(50)).await,
            }
        };
        let names: Vec<_> = store
            .state()
            .iter()
            .map(|cm| cm.metadata.name.clone())
            .collect();
        tracing::info!(cluster = tenant, config_maps = ?names, "its own objects only");
    }
    tracing::info!(
        watches = host.watch_count(),
        "watches at the API server for every namespace"
    );

    tracing::info!("a namespace is created");
    namespace(&admin, "tenant-d").await?;
    support::clusters_are(&fleet, &["tenant-a", "tenant-b", "tenant-c", "tenant-d"]).await?;

    tracing::info!(
        "a namespace is deleted (it stays Terminating: no namespace controller runs here)"
    );
    Api::<Namespace>::all(admin.clone())
        .delete("tenant-b", &DeleteParams::default())
        .await?;
    support::clusters_are(&fleet, &["tenant-a", "tenant-c", "tenant-d"]).await?;
    Ok(())
}

async fn namespace(admin: &Client, name: &str) -> Result<(), kube::Error> {
    let namespace = Namespace {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some([("tenant".to_owned(), "true".to_owned())].into()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    Api::<Namespace>::all(admin.clone())
        .create(&PostParams::default(), &namespace)
        .await?;
    Ok(())
}
