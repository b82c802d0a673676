//! The kcp provider: every workspace (logical cluster) that binds an
//! APIExport is a cluster, all of them served through the export's virtual
//! workspace with one watch per type.
//!
//! ```text
//! cargo run --example provider_kcp                          # a local kcp, started for it
//! cargo run --example provider_kcp -- --slice widgets.example.io   # your kcp, until Ctrl-C
//! ```
//!
//! With no arguments it starts a local kcp (built with Go on first use, a
//! few minutes, then cached), makes a workspace that exports `example.io`
//! (a Widget, and a claim on ConfigMaps) and two that bind it, and shows
//! that each logical cluster is engaged under its name and reconciles its
//! own ConfigMaps only, that kcp serves one watch of ConfigMaps for all of
//! them, that a workspace that binds later joins, and that one whose
//! binding is deleted leaves. With `--slice NAME` it runs on the kcp your
//! kubeconfig reaches (its current context: the workspace that holds the
//! export), following the endpoint slice `NAME`.

mod support;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api,
    api::{ApiResource, DeleteParams, DynamicObject, GroupVersionKind},
};
use kube_multicluster::{
    Fleet,
    envtest::{KCP_EXAMPLE_EXPORT, Kcp},
    providers::kcp::KcpProvider,
};
use tower::BoxError;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    support::logging();
    let fleet = Fleet::new();
    support::log_config_maps(&fleet);
    if let Some(slice) = support::arg("--slice") {
        let config = kube::Config::infer().await?;
        tokio::spawn(async move {
            tokio::signal::ctrl_c().await.ok();
            std::process::exit(0);
        });
        let provider = KcpProvider::new(config, slice)?;
        let problems = provider.problems();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(std::time::Duration::from_secs(10)).await;
                for (source, problem) in problems.current() {
                    tracing::warn!(%source, %problem, "the kcp provider reports");
                }
            }
        });
        fleet.run(provider).await;
        return Ok(());
    }

    let kcp = Kcp::start().await?;
    kcp.create_workspace("provider").await?;
    kcp.apply("root:provider", KCP_EXAMPLE_EXPORT).await?;
    let mut tenants = Vec::new();
    for workspace in ["tenant-a", "tenant-b"] {
        tenants.push(tenant(&kcp, workspace).await?);
    }
    let provider = KcpProvider::new(kcp.config("root:provider").await?, "example.io")?;
    let (shards, problems) = (provider.shards(), provider.problems());
    let running = tokio::spawn({
        let fleet = fleet.clone();
        async move { fleet.run(provider).await }
    });
    let names: Vec<&str> = tenants.iter().map(|(_, c)| c.as_str()).collect();
    support::clusters_are(&fleet, &names).await?;

    // Each logical cluster's own ConfigMaps, in its own workspace.
    for (workspace, cluster) in &tenants {
        let client = kcp.client(&format!("root:{workspace}")).await?;
        let name = format!("{workspace}-settings");
        support::wait_for("the workspace's default namespace", || {
            let (client, name) = (client.clone(), name.clone());
            async move { Ok(support::config_map(client, "default", &name).await.is_ok()) }
        })
        .await?;
        let engaged = fleet.get(cluster.as_str()).ok_or("engaged")?;
        let names = || {
            let store = engaged.store::<ConfigMap>();
            let mut names: Vec<String> = store
                .iter()
                .flat_map(|store| store.state())
                .filter_map(|cm| cm.metadata.name.clone())
                .collect();
            names.sort();
            names
        };
        support::wait_for("its ConfigMap in its cache", || {
            let held = names();
            let name = name.clone();
            async move { Ok(held.contains(&name)) }
        })
        .await?;
        // Beside kcp's own kube-root-ca.crt, its settings and no other's.
        let held = names();
        tracing::info!(%workspace, %cluster, config_maps = ?held, "its own objects only");
        let settings: Vec<&String> = held.iter().filter(|n| n.ends_with("-settings")).collect();
        if settings != [&name] {
            return Err(format!("{workspace} holds {held:?}").into());
        }
    }
    tracing::info!(
        shards = shards.caches().len(),
        watches = shards.watch_count(),
        "watches at kcp for every logical cluster"
    );

    tracing::info!("a workspace binds the export");
    tenants.push(tenant(&kcp, "tenant-c").await?);
    let names: Vec<&str> = tenants.iter().map(|(_, c)| c.as_str()).collect();
    support::clusters_are(&fleet, &names).await?;

    tracing::info!("tenant-a's binding is deleted");
    let bindings = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("apis.kcp.io", "v1alpha2", "APIBinding"),
        "apibindings",
    );
    Api::<DynamicObject>::all_with(kcp.client("root:tenant-a").await?, &bindings)
        .delete("example.io", &DeleteParams::default())
        .await?;
    support::clusters_are(&fleet, &names[1..]).await?;
    if !problems.current().is_empty() {
        return Err(format!("problems: {:?}", problems.current()).into());
    }
    // The provider and the clusters' watches stop before kcp does.
    running.abort();
    for cluster in fleet.clusters() {
        fleet.disengage(cluster.name());
    }
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    Ok(())
}

/// Makes `workspace` and binds the export there, accepting its claim on
/// ConfigMaps; returns the workspace and its logical cluster.
async fn tenant(kcp: &Kcp, workspace: &str) -> Result<(String, String), BoxError> {
    let cluster = kcp.create_workspace(workspace).await?;
    let path = format!("root:{workspace}");
    kcp.bind(
        &path,
        "root:provider",
        "example.io",
        &[("configmaps", true)],
    )
    .await?;
    tracing::info!(%workspace, %cluster, "bound the export");
    Ok((workspace.to_owned(), cluster))
}
