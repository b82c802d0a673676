//! Setting up what the benchmarks measure: clients that reach an envtest
//! API server past its fault proxy, and ConfigMaps to list and patch.

#![allow(dead_code)]

use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api, Client,
    api::{ObjectMeta, PostParams},
};
use kube_multicluster::envtest::TestCluster;
use tower::BoxError;

/// The admin configuration of `cluster`, pointed at its API server itself:
/// envtest's fault proxy runs in the benchmark's own process and would add
/// its tasks, buffers and CPU to what is measured.
pub(crate) async fn direct_config(cluster: &TestCluster) -> Result<kube::Config, BoxError> {
    Ok(
        kube::Config::from_custom_kubeconfig(cluster.direct_kubeconfig(), &Default::default())
            .await?,
    )
}

/// A client from `config`: kube's own over HTTP/1.1 if `http1`, else
/// `kube_multicluster::client`'s.
pub(crate) fn client(config: kube::Config, http1: bool) -> Result<Client, BoxError> {
    Ok(if http1 {
        Client::try_from(config)?
    } else {
        kube_multicluster::client::client(config)?
    })
}

/// What a cluster is engaged with from `config`: kube's own client over
/// HTTP/1.1 if `http1`; a finished `kube_multicluster::client` if `finished` (the
/// fleet wraps it in a queue of its own); else a
/// `kube_multicluster::client::cluster_client`, which the fleet finishes.
pub(crate) fn engaged(
    config: kube::Config,
    http1: bool,
    finished: bool,
) -> Result<kube_multicluster::client::ClusterClient, BoxError> {
    Ok(if http1 || finished {
        client(config, http1)?.into()
    } else {
        kube_multicluster::client::cluster_client(config)?
    })
}

/// Creates `objects` ConfigMaps `cm-00000`, `cm-00001`, ... in the default
/// namespace, each with one data key, 16 at a time.
pub(crate) async fn fill(client: Client, objects: usize) -> Result<(), BoxError> {
    fill_sized(client, objects, 0).await
}

/// [`fill`], each ConfigMap's value padded to `size` bytes (if shorter).
pub(crate) async fn fill_sized(
    client: Client,
    objects: usize,
    size: usize,
) -> Result<(), BoxError> {
    let api = Api::<ConfigMap>::default_namespaced(client);
    let created = stream::iter(0..objects)
        .map(|i| {
            let api = api.clone();
            async move {
                let config_map = ConfigMap {
                    metadata: ObjectMeta {
                        name: Some(format!("cm-{i:05}")),
                        ..ObjectMeta::default()
                    },
                    data: Some(
                        [(
                            "key".to_owned(),
                            format!("{:-<size$}", format!("value-{i}")),
                        )]
                        .into(),
                    ),
                    ..ConfigMap::default()
                };
                api.create(&PostParams::default(), &config_map).await
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await;
    for result in created {
        result?;
    }
    Ok(())
}

/// The API server's `apiserver_request_total` series, from its own
/// `/metrics`: each series' labels, as written there, and its count.
pub(crate) async fn request_totals(client: &Client) -> Result<Vec<(String, f64)>, BoxError> {
    let text = client
        .request_text(http::Request::get("/metrics").body(Vec::new())?)
        .await?;
    Ok(text
        .lines()
        .filter_map(|line| line.strip_prefix("apiserver_request_total{"))
        .filter_map(|rest| {
            let (labels, value) = rest.rsplit_once("} ")?;
            Some((labels.to_owned(), value.parse().ok()?))
        })
        .collect())
}
