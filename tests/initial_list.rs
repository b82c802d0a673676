//! A watch lists by streaming where the API server allows it, and in pages
//! where it does not, with nothing lost either way.

mod support;

use kube::Client;
use kube_fleet_envtest::Envtest;
use support::{
    Running, create_config_map, expect_all, lists_served, request, streaming_lists_served,
    watches_served,
};

async fn create(client: &Client, names: &[&str]) {
    for name in names {
        create_config_map(client.clone(), name).await;
    }
}

#[tokio::test]
async fn streaming_lists_where_allowed_and_pages_where_refused_reconcile_everything() {
    let (streams, pages) = tokio::join!(
        Envtest::builder().clusters(["streams"]).start(),
        Envtest::builder()
            .clusters(["pages"])
            .apiserver_arg("--feature-gates=WatchList=false")
            .start(),
    );
    let (streams, pages) = (streams.unwrap(), pages.unwrap());
    let (streams_admin, pages_admin) =
        (streams.clusters()[0].client(), pages.clusters()[0].client());
    create(&streams_admin, &["before-1", "before-2"]).await;
    create(&pages_admin, &["before-1", "before-2"]).await;
    let streams_lists = lists_served(&streams_admin, "configmaps").await;
    let pages_lists = lists_served(&pages_admin, "configmaps").await;
    let streams_streamed = streaming_lists_served(&streams_admin, "configmaps").await;
    // The API server's own watches.
    let streams_watches = watches_served(&streams_admin, "configmaps").await;
    let pages_watches = watches_served(&pages_admin, "configmaps").await;

    let mut running = Running::new();
    let mut reconciled = running.config_maps();
    running.add_all(&streams);
    running.add_all(&pages);
    let everything_before = ["streams", "pages"]
        .into_iter()
        .flat_map(|cluster| ["before-1", "before-2"].map(|name| request(cluster, name)));
    expect_all(&mut reconciled, everything_before).await;
    running.wait_served("streams").await;
    running.wait_served("pages").await;

    // The refused cluster watches on after its paged list, as the other does.
    create(&streams_admin, &["after"]).await;
    create(&pages_admin, &["after"]).await;
    expect_all(
        &mut reconciled,
        [request("streams", "after"), request("pages", "after")],
    )
    .await;

    assert_eq!(
        lists_served(&streams_admin, "configmaps").await,
        streams_lists,
        "a streaming list is a watch: the API server answers no LIST"
    );
    assert_eq!(
        streaming_lists_served(&streams_admin, "configmaps").await,
        streams_streamed + 1,
        "the list was streamed"
    );
    assert!(
        lists_served(&pages_admin, "configmaps").await > pages_lists,
        "where streaming is refused, the watch lists in pages"
    );
    for (admin, before) in [
        (&streams_admin, streams_watches),
        (&pages_admin, pages_watches),
    ] {
        assert_eq!(
            watches_served(admin, "configmaps").await,
            before + 1,
            "one watch each, the refused one not retried"
        );
    }
}
