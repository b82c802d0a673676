//! Credentials for any user and groups, checked by real API servers' RBAC.

use std::time::{Duration, Instant};

use k8s_openapi::api::{
    authentication::v1::SelfSubjectReview,
    core::v1::{ConfigMap, Namespace},
    rbac::v1::{ClusterRole, PolicyRule, Role, RoleBinding, RoleRef, Subject},
};
use kube::{
    Api, Client,
    api::{ListParams, ObjectMeta, PostParams},
};
use kube_multicluster_envtest::Envtest;

async fn list_config_maps(client: Client, namespace: &str) -> kube::Result<Vec<ConfigMap>> {
    Api::<ConfigMap>::namespaced(client, namespace)
        .list(&ListParams::default())
        .await
        .map(|list| list.items)
}

fn is_forbidden(result: &kube::Result<Vec<ConfigMap>>) -> bool {
    matches!(result, Err(kube::Error::Api(status)) if status.code == 403)
}

/// RBAC takes effect once the API server's informers see the binding.
async fn eventually_allowed(client: Client, namespace: &str) {
    let started = Instant::now();
    loop {
        let result = list_config_maps(client.clone(), namespace).await;
        if result.is_ok() {
            return;
        }
        assert!(
            is_forbidden(&result) && started.elapsed() < Duration::from_secs(10),
            "still not allowed: {result:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn users_get_what_rbac_grants_them_and_masters_get_everything() {
    let fleet = Envtest::start(1).await.expect("fleet starts");
    let cluster = &fleet.clusters()[0];
    let admin = cluster.client();

    let alice = cluster.client_for("alice", &[]).expect("client for alice");
    let denied = list_config_maps(alice.clone(), "default").await;
    assert!(is_forbidden(&denied), "alice without bindings: {denied:?}");

    let reader = Role {
        metadata: ObjectMeta {
            name: Some("config-map-reader".into()),
            ..ObjectMeta::default()
        },
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec![String::new()]),
            resources: Some(vec!["configmaps".into()]),
            verbs: vec!["list".into()],
            ..PolicyRule::default()
        }]),
    };
    Api::<Role>::default_namespaced(admin.clone())
        .create(&PostParams::default(), &reader)
        .await
        .expect("create role");
    let subject = |kind: &str, name: &str| Subject {
        api_group: Some("rbac.authorization.k8s.io".into()),
        kind: kind.into(),
        name: name.into(),
        namespace: None,
    };
    let binding = RoleBinding {
        metadata: ObjectMeta {
            name: Some("config-map-readers".into()),
            ..ObjectMeta::default()
        },
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "Role".into(),
            name: "config-map-reader".into(),
        },
        subjects: Some(vec![
            subject("User", "alice"),
            subject("Group", "config-readers"),
        ]),
    };
    Api::<RoleBinding>::default_namespaced(admin.clone())
        .create(&PostParams::default(), &binding)
        .await
        .expect("create role binding");

    // The same client is now allowed in `default`, and only there.
    eventually_allowed(alice.clone(), "default").await;
    let elsewhere = list_config_maps(alice, "kube-system").await;
    assert!(
        is_forbidden(&elsewhere),
        "alice in kube-system: {elsewhere:?}"
    );

    // Every group of the certificate counts, not only the first.
    let dave = cluster
        .client_for("dave", &["staff", "config-readers"])
        .expect("client for dave");
    eventually_allowed(dave.clone(), "default").await;
    let review = Api::<SelfSubjectReview>::all(dave)
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await
        .expect("self subject review");
    let user = review.status.unwrap().user_info.unwrap();
    assert_eq!(user.username.as_deref(), Some("dave"));
    let groups = user.groups.unwrap_or_default();
    for group in ["staff", "config-readers", "system:authenticated"] {
        assert!(
            groups.iter().any(|g| g == group),
            "{group} not in {groups:?}"
        );
    }

    // system:masters may do anything, also as a later group.
    let root = cluster
        .client_for("root", &["staff", "system:masters"])
        .expect("client for root");
    list_config_maps(root.clone(), "kube-system")
        .await
        .expect("masters list config maps anywhere");
    Api::<Namespace>::all(root.clone())
        .list(&ListParams::default())
        .await
        .expect("masters list namespaces");
    Api::<ClusterRole>::all(root)
        .list(&ListParams::default())
        .await
        .expect("masters list cluster roles");
}

#[tokio::test]
async fn kubeconfigs_for_users_are_self_contained_and_debug_shows_no_keys() {
    let fleet = Envtest::start(1).await.expect("fleet starts");
    let cluster = &fleet.clusters()[0];
    let kubeconfig = cluster
        .kubeconfig_for("erin", &["staff"])
        .expect("kubeconfig for erin");
    assert_eq!(kubeconfig.current_context.as_deref(), Some("cluster-0"));
    assert_eq!(kubeconfig.auth_infos[0].name, "erin");
    let server = kubeconfig.clusters[0]
        .cluster
        .as_ref()
        .unwrap()
        .server
        .as_deref();
    assert_eq!(server, Some(cluster.server()));

    // It works on its own, written out and read back.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("erin.kubeconfig");
    std::fs::write(&path, serde_json::to_string(&kubeconfig).unwrap()).unwrap();
    let read = kube::config::Kubeconfig::read_from(&path).unwrap();
    let config = kube::Config::from_custom_kubeconfig(read, &Default::default())
        .await
        .unwrap();
    let review = Api::<SelfSubjectReview>::all(Client::try_from(config).unwrap())
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await
        .expect("self subject review");
    let user = review.status.unwrap().user_info.unwrap();
    assert_eq!(user.username.as_deref(), Some("erin"));

    // Debug output shows neither certificates nor keys, in PEM or base64.
    let auth = kubeconfig.auth_infos[0].auth_info.as_ref().unwrap();
    let cert = auth.client_certificate_data.as_deref().unwrap();
    let debug = format!("{cluster:?} {:?}", cluster.link().unwrap());
    assert!(!debug.contains("BEGIN"), "{debug}");
    assert!(!debug.contains(&cert[100..140]), "{debug}");
}
