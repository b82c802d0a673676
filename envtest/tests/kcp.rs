//! kcp started by the harness: workspaces, an APIExport bound in two of
//! them, and one list through the export's virtual workspace that returns
//! the objects of both, each marked with its logical cluster.

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube_multicluster_envtest::{KCP_EXAMPLE_EXPORT, Kcp};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_export_bound_in_two_workspaces_is_listed_across_both() {
    let kcp = Kcp::start().await.expect("kcp starts");
    kcp.create_workspace("provider").await.unwrap();
    let a = kcp.create_workspace("consumer-a").await.unwrap();
    let b = kcp.create_workspace("consumer-b").await.unwrap();
    kcp.apply("root:provider", KCP_EXAMPLE_EXPORT)
        .await
        .unwrap();
    for consumer in ["root:consumer-a", "root:consumer-b"] {
        kcp.bind(
            consumer,
            "root:provider",
            "example.io",
            &[("configmaps", true)],
        )
        .await
        .unwrap();
    }
    let urls = kcp.endpoints("root:provider", "example.io").await.unwrap();
    assert_eq!(urls.len(), 1, "{urls:?}");
    let everywhere = kcp
        .client_at(&format!("{}/clusters/*", urls[0]))
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let listed = Api::<ConfigMap>::all(everywhere.clone())
            .list(&Default::default())
            .await;
        if let Ok(listed) = &listed {
            let mut clusters: Vec<String> = listed
                .items
                .iter()
                .filter_map(|c| {
                    c.metadata
                        .annotations
                        .as_ref()?
                        .get("kcp.io/cluster")
                        .cloned()
                })
                .collect();
            clusters.sort();
            let mut expected = vec![a.clone(), b.clone()];
            expected.sort();
            if clusters == expected {
                break;
            }
        }
        assert!(std::time::Instant::now() < deadline, "{listed:?}");
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
}
