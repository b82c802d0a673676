//! What the provider examples share: a controller that logs each reconcile,
//! and a wait for the fleet to hold given clusters.

#![allow(dead_code, unreachable_pub)]

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api, Client,
    api::{ObjectMeta, PostParams},
    runtime::watcher,
};
use kube_multicluster::{Action, Controller, Fleet, ObjectRequest};
use tower::{BoxError, service_fn};

/// Logs to stderr, `info` for the examples and kube-multicluster unless `RUST_LOG`
/// says otherwise; coloured on a terminal only, so that a file or a pipe
/// gets plain text.
pub fn logging() {
    use std::io::IsTerminal;

    tracing_subscriber::fmt()
        .with_env_filter(std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}

/// Runs a controller of ConfigMaps in every cluster of `fleet` that logs
/// each reconcile with its cluster.
pub fn log_config_maps(fleet: &Fleet) {
    let controller = Controller::<ConfigMap>::new(fleet, watcher::Config::default());
    tokio::spawn(controller.run(service_fn(|request: ObjectRequest<ConfigMap>| async move {
        tracing::info!(cluster = %request.cluster.name(), name = %request.request.name, "reconciled");
        Ok::<_, BoxError>(Action::await_change())
    })));
}

/// Waits until the fleet's clusters are `names` (in any order), logging
/// them, or fails after a minute.
pub async fn clusters_are(fleet: &Fleet, names: &[&str]) -> Result<(), BoxError> {
    let mut want: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
    want.sort();
    let now = || {
        let mut now: Vec<String> = fleet
            .clusters()
            .iter()
            .map(|c| c.name().to_string())
            .collect();
        now.sort();
        now
    };
    tokio::time::timeout(Duration::from_secs(60), async {
        while now() != want {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .map_err(|_| format!("the fleet holds {:?}, not {want:?}", now()))?;
    tracing::info!(clusters = ?want, "the fleet holds");
    Ok(())
}

/// Creates a ConfigMap `name` in `namespace`.
pub async fn config_map(client: Client, namespace: &str, name: &str) -> Result<(), kube::Error> {
    let config_map = ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    };
    Api::<ConfigMap>::namespaced(client, namespace)
        .create(&PostParams::default(), &config_map)
        .await?;
    Ok(())
}

/// The argument after `flag`, if given.
pub fn arg(flag: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1).cloned())
}

/// Whether `flag` is given.
pub fn flag(flag: &str) -> bool {
    std::env::args().any(|a| a == flag)
}

/// Waits up to a minute for `check` to hold, or fails naming `what`.
pub async fn wait_for<F, Fut>(what: &str, check: F) -> Result<(), BoxError>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<bool, BoxError>>,
{
    tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            if check().await? {
                return Ok::<_, BoxError>(());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .map_err(|_| format!("timed out waiting for {what}"))?
}
