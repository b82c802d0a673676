//! The harness against itself: every test starts a fleet of real API servers.

use std::path::Path;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api, Client, Config, CustomResource, CustomResourceExt,
    api::{ListParams, ObjectMeta, PostParams},
    config::{KubeConfigOptions, Kubeconfig},
};
use kube_multicluster_envtest::{Envtest, Error};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

fn config_map(name: &str, value: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        data: Some([("value".to_owned(), value.to_owned())].into()),
        ..ConfigMap::default()
    }
}

async fn create_config_map(client: Client, name: &str, value: &str) {
    Api::<ConfigMap>::default_namespaced(client)
        .create(&PostParams::default(), &config_map(name, value))
        .await
        .expect("create config map");
}

async fn get_config_map(client: Client, name: &str) -> kube::Result<Option<ConfigMap>> {
    Api::<ConfigMap>::default_namespaced(client)
        .get_opt(name)
        .await
}

fn process_exists(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

#[tokio::test]
async fn three_clusters_start_and_see_nothing_of_each_other() {
    let fleet = Envtest::start(3).await.expect("fleet starts");
    let names: Vec<_> = fleet.clusters().iter().map(|c| c.name()).collect();
    assert_eq!(names, ["cluster-0", "cluster-1", "cluster-2"]);

    let [a, b, c] = fleet.clusters() else {
        unreachable!()
    };
    create_config_map(a.client(), "only-in-a", "a").await;

    let in_a = get_config_map(a.client(), "only-in-a").await.unwrap();
    assert_eq!(in_a.unwrap().data.unwrap()["value"], "a");
    for other in [b, c] {
        let found = get_config_map(other.client(), "only-in-a").await.unwrap();
        assert!(
            found.is_none(),
            "{} sees cluster-0's ConfigMap",
            other.name()
        );
    }
}

#[tokio::test]
async fn credentials_of_one_cluster_are_refused_by_another() {
    let fleet = Envtest::start(2).await.expect("fleet starts");
    let [a, b] = fleet.clusters() else {
        unreachable!()
    };
    // A's CA and admin certificate, pointed at B's server.
    let mut crossed = a.kubeconfig().clone();
    crossed.clusters[0].cluster.as_mut().unwrap().server = Some(b.server().to_owned());
    let config = Config::from_custom_kubeconfig(crossed, &KubeConfigOptions::default())
        .await
        .unwrap();
    let client = Client::try_from(config).unwrap();
    assert!(get_config_map(client, "anything").await.is_err());

    // Debug output names the cluster but shows no key material.
    let debug = format!("{a:?}");
    assert!(debug.contains("cluster-0"));
    let key = a.kubeconfig().auth_infos[0].auth_info.as_ref().unwrap();
    let cert = key.client_certificate_data.as_deref().unwrap();
    assert!(!debug.contains(&cert[..40]));
}

#[tokio::test]
async fn kubeconfig_file_reaches_the_same_cluster() {
    let fleet = Envtest::start(1).await.expect("fleet starts");
    let cluster = &fleet.clusters()[0];
    create_config_map(cluster.client(), "from-memory", "1").await;

    let from_file =
        Kubeconfig::read_from(cluster.kubeconfig_path()).expect("kubeconfig file parses");
    assert_eq!(from_file.current_context.as_deref(), Some("cluster-0"));
    let config = Config::from_custom_kubeconfig(from_file, &KubeConfigOptions::default())
        .await
        .unwrap();
    let found = get_config_map(Client::try_from(config).unwrap(), "from-memory")
        .await
        .unwrap();
    assert!(found.is_some());
}

#[derive(CustomResource, Clone, Debug, PartialEq, Deserialize, Serialize, JsonSchema)]
#[kube(
    group = "envtest.kube-multicluster.dev",
    version = "v1",
    kind = "Gadget",
    namespaced
)]
struct GadgetSpec {
    size: u32,
    colour: String,
}

#[tokio::test]
async fn crds_install_and_their_objects_round_trip() {
    let fleet = Envtest::start(2).await.expect("fleet starts");
    let [a, b] = fleet.clusters() else {
        unreachable!()
    };

    // From a kube-derive type.
    a.install_crds([Gadget::crd()]).await.expect("CRD installs");
    // Installing again is harmless.
    a.install_crds([Gadget::crd()])
        .await
        .expect("CRD installs twice");
    let gadgets: Api<Gadget> = Api::default_namespaced(a.client());
    let spec = GadgetSpec {
        size: 3,
        colour: "teal".into(),
    };
    gadgets
        .create(&PostParams::default(), &Gadget::new("g1", spec.clone()))
        .await
        .expect("create gadget");
    assert_eq!(gadgets.get("g1").await.unwrap().spec, spec);

    // From YAML, into the other cluster only.
    let yaml = "---\n".to_owned() + &serde_json::to_string(&Gadget::crd()).unwrap() + "\n---\n";
    let crds = kube_multicluster_envtest::crds_from_yaml(&yaml).expect("YAML parses");
    assert_eq!(crds.len(), 1);
    let in_b: Api<Gadget> = Api::default_namespaced(b.client());
    assert!(
        in_b.list(&ListParams::default()).await.is_err(),
        "B has no Gadget CRD yet"
    );
    kube_multicluster_envtest::install_crds(&b.client(), crds)
        .await
        .expect("CRD installs from YAML");
    assert!(
        in_b.list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
}

#[tokio::test]
async fn a_stopped_cluster_fails_alone_and_restarts_with_its_data() {
    let fleet = Envtest::start(3).await.expect("fleet starts");
    let [a, b, c] = fleet.clusters() else {
        unreachable!()
    };
    create_config_map(a.client(), "survivor", "kept").await;
    let old_pid = a.pid().expect("running");

    a.stop();
    assert_eq!(a.pid(), None);
    assert!(!process_exists(old_pid), "stopped API server is gone");
    assert!(get_config_map(a.client(), "survivor").await.is_err());
    for other in [b, c] {
        get_config_map(other.client(), "survivor")
            .await
            .unwrap_or_else(|e| panic!("{} fails while cluster-0 is down: {e}", other.name()));
    }

    a.restart().await.expect("restarts");
    assert_ne!(a.pid(), Some(old_pid));
    // The client made before the stop works again, and the data survived.
    let found = get_config_map(a.client(), "survivor").await.unwrap();
    assert_eq!(found.unwrap().data.unwrap()["value"], "kept");
}

#[tokio::test]
async fn dropping_the_fleet_kills_every_process_and_removes_its_files() {
    let fleet = Envtest::start(2).await.expect("fleet starts");
    let pids = fleet.pids();
    assert_eq!(pids.len(), 3, "etcd and two API servers");
    assert!(pids.iter().all(|&pid| process_exists(pid)));
    let dir = fleet.dir().to_owned();
    assert!(dir.exists());

    drop(fleet);
    for pid in pids {
        assert!(!process_exists(pid), "process {pid} outlived the fleet");
    }
    assert!(!dir.exists(), "{} outlived the fleet", dir.display());
}

#[tokio::test]
async fn clusters_join_and_leave_a_running_fleet() {
    let mut fleet = Envtest::builder()
        .clusters(["hub"])
        .start()
        .await
        .expect("fleet starts");
    create_config_map(fleet.clusters()[0].client(), "on-hub", "1").await;

    let late = fleet.add_cluster("late").await.expect("cluster joins");
    assert!(
        get_config_map(late.client(), "on-hub")
            .await
            .unwrap()
            .is_none()
    );
    create_config_map(late.client(), "on-late", "1").await;
    assert!(matches!(
        fleet.add_cluster("late").await,
        Err(Error::ClusterName(name)) if name == "late"
    ));

    let late_pid = fleet.cluster("late").unwrap().pid().unwrap();
    assert!(fleet.remove_cluster("late"));
    assert!(!fleet.remove_cluster("late"));
    assert!(!process_exists(late_pid));
    assert!(fleet.cluster("late").is_none());

    // The same name later is a new, empty cluster.
    let again = fleet.add_cluster("late").await.expect("name is free again");
    assert!(
        get_config_map(again.client(), "on-late")
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(fleet.clusters().len(), 2);
}

#[tokio::test]
async fn duplicate_or_empty_names_are_refused_before_anything_starts() {
    for names in [vec!["a", "a"], vec![""]] {
        let err = Envtest::builder()
            .clusters(names)
            .start()
            .await
            .unwrap_err();
        assert!(matches!(err, Error::ClusterName(_)), "{err}");
    }
}
