//! Each engaged cluster's identity is read from the cluster itself: its
//! `ClusterProperty` where it has one, else its `kube-system` UID; once per
//! engagement; and a read that fails is an error, never another ID.

mod support;

use k8s_openapi::api::{
    core::v1::Namespace,
    rbac::v1::{ClusterRoleBinding, RoleRef, Subject},
};
use kube::{
    Api, Client,
    api::{ApiResource, DynamicObject, ObjectMeta, Patch, PatchParams, PostParams},
};
use kube_multicluster::envtest::{Envtest, TestCluster, crds_from_yaml};
use kube_multicluster::{
    Cluster, Fleet,
    identity::{ClusterIdentity, IdSource, IdentityError},
    rbac::{Permissions, Rule, Scope},
};
use serde_json::json;
use support::http2_client;

/// The About API's `ClusterProperty`, as its CRD defines it.
const CLUSTER_PROPERTY_CRD: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: clusterproperties.about.k8s.io
  annotations:
    # A *.k8s.io group: the API server takes the CRD only with this.
    api-approved.kubernetes.io: https://github.com/kubernetes/enhancements/tree/master/keps/sig-multicluster/2149-clusterid
spec:
  group: about.k8s.io
  names:
    kind: ClusterProperty
    listKind: ClusterPropertyList
    plural: clusterproperties
    singular: clusterproperty
  scope: Cluster
  versions:
    - name: v1alpha1
      served: true
      storage: true
      schema:
        openAPIV3Schema:
          type: object
          properties:
            spec:
              type: object
              properties:
                value:
                  type: string
"#;

fn cluster_properties(client: Client) -> Api<DynamicObject> {
    let resource = ApiResource {
        group: "about.k8s.io".into(),
        version: "v1alpha1".into(),
        api_version: "about.k8s.io/v1alpha1".into(),
        kind: "ClusterProperty".into(),
        plural: "clusterproperties".into(),
    };
    Api::all_with(client, &resource)
}

async fn install_cluster_property_crd(cluster: &TestCluster) {
    cluster
        .install_crds(crds_from_yaml(CLUSTER_PROPERTY_CRD).unwrap())
        .await
        .unwrap();
}

/// Sets the property `name` of `cluster` to `value`, creating it if need be.
async fn set_property(cluster: &TestCluster, name: &str, value: &str) {
    let property = json!({
        "apiVersion": "about.k8s.io/v1alpha1",
        "kind": "ClusterProperty",
        "metadata": { "name": name },
        "spec": { "value": value },
    });
    cluster_properties(cluster.client())
        .patch(
            name,
            &PatchParams::apply("identity-test").force(),
            &Patch::Apply(property),
        )
        .await
        .unwrap_or_else(|e| panic!("setting {name} in {}: {e}", cluster.name()));
}

async fn kube_system_uid(cluster: &TestCluster) -> String {
    Api::<Namespace>::all(cluster.client())
        .get("kube-system")
        .await
        .unwrap()
        .metadata
        .uid
        .expect("a UID")
}

/// Grants `user` the ClusterRole `role` made of `permissions`' member rules.
async fn grant(cluster: &TestCluster, user: &str, role: &str, permissions: &Permissions) {
    let client = cluster.client();
    Api::all(client.clone())
        .create(
            &PostParams::default(),
            &permissions.cluster_role(role, Scope::Members),
        )
        .await
        .unwrap();
    let binding = ClusterRoleBinding {
        metadata: ObjectMeta {
            name: Some(format!("{user}-{role}")),
            ..ObjectMeta::default()
        },
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "ClusterRole".into(),
            name: role.into(),
        },
        subjects: Some(vec![Subject {
            kind: "User".into(),
            name: user.into(),
            api_group: Some("rbac.authorization.k8s.io".into()),
            ..Subject::default()
        }]),
    };
    Api::<ClusterRoleBinding>::all(client)
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
}

/// The error a read gives, which must be one.
async fn identity_error(cluster: &Cluster) -> IdentityError {
    match cluster.identity().await {
        Ok(identity) => panic!("{}: read {identity:?}", cluster.name()),
        Err(error) => error,
    }
}

fn status_code(error: &IdentityError) -> Option<u16> {
    match error {
        IdentityError::Read {
            source: kube::Error::Api(status),
            ..
        } => Some(status.code),
        _ => None,
    }
}

#[tokio::test]
async fn without_a_cluster_id_property_the_id_is_the_kube_system_uid() {
    let env = Envtest::start(2).await.unwrap();
    // cluster-0 does not serve ClusterProperty; cluster-1 does, and has none.
    let (bare, with_crd) = (&env.clusters()[0], &env.clusters()[1]);
    install_cluster_property_crd(with_crd).await;
    let fleet = Fleet::new();

    let mut ids = Vec::new();
    for cluster in [bare, with_crd] {
        let engaged = fleet.engage(cluster.name(), http2_client(cluster));
        let identity = engaged.identity().await.unwrap();
        assert_eq!(identity.id(), kube_system_uid(cluster).await);
        assert_eq!(identity.source(), IdSource::KubeSystemNamespace);
        assert_eq!(identity.clusterset(), None);
        assert_eq!(identity.to_string(), identity.id());
        ids.push(identity.id().to_owned());
    }
    assert_ne!(ids[0], ids[1], "two clusters, two IDs");
}

#[tokio::test]
async fn a_cluster_id_property_is_the_id_and_the_clusterset_property_its_clusterset() {
    let env = Envtest::start(2).await.unwrap();
    let (east, west) = (&env.clusters()[0], &env.clusters()[1]);
    for cluster in [east, west] {
        install_cluster_property_crd(cluster).await;
    }
    set_property(east, ClusterIdentity::ID_PROPERTY, "east-1").await;
    set_property(east, ClusterIdentity::CLUSTERSET_PROPERTY, "prod").await;
    // A clusterset without an ID property: the ID falls back, the clusterset stays.
    set_property(west, ClusterIdentity::CLUSTERSET_PROPERTY, "prod").await;
    let fleet = Fleet::new();

    let east_identity = fleet
        .engage(east.name(), http2_client(east))
        .identity()
        .await
        .unwrap();
    assert_eq!(east_identity.id(), "east-1");
    assert_eq!(east_identity.source(), IdSource::ClusterProperty);
    assert_eq!(east_identity.clusterset(), Some("prod"));
    assert_eq!(east_identity.to_string(), "east-1");

    let west_identity = fleet
        .engage(west.name(), http2_client(west))
        .identity()
        .await
        .unwrap();
    assert_eq!(west_identity.id(), kube_system_uid(west).await);
    assert_eq!(west_identity.source(), IdSource::KubeSystemNamespace);
    assert_eq!(west_identity.clusterset(), Some("prod"));
    assert_ne!(east_identity, west_identity);
}

#[tokio::test]
async fn an_engagement_reads_its_identity_once_and_a_new_engagement_reads_it_again() {
    let env = Envtest::start(1).await.unwrap();
    let cluster = &env.clusters()[0];
    install_cluster_property_crd(cluster).await;
    set_property(cluster, ClusterIdentity::ID_PROPERTY, "east-1").await;
    let fleet = Fleet::new();
    let first = fleet.engage(cluster.name(), http2_client(cluster));
    assert_eq!(first.identity().await.unwrap().id(), "east-1");

    set_property(cluster, ClusterIdentity::ID_PROPERTY, "east-2").await;
    set_property(cluster, ClusterIdentity::CLUSTERSET_PROPERTY, "prod").await;
    let kept = first.identity().await.unwrap();
    assert_eq!(kept.id(), "east-1", "read once per engagement");
    assert_eq!(kept.clusterset(), None);
    assert_eq!(
        fleet.get(cluster.name()).unwrap().identity().await.unwrap(),
        kept,
        "every handle of the engagement shares it"
    );

    let second = fleet.engage(cluster.name(), http2_client(cluster));
    let read_again = second.identity().await.unwrap();
    assert_eq!(read_again.id(), "east-2");
    assert_eq!(read_again.clusterset(), Some("prod"));
    assert_eq!(first.identity().await.unwrap().id(), "east-1");
}

#[tokio::test]
async fn a_forbidden_read_is_an_error_naming_the_cluster_never_another_id() {
    let env = Envtest::start(1).await.unwrap();
    let cluster = &env.clusters()[0];
    let fleet = Fleet::new();
    let admin_view = fleet
        .engage("admin-view", http2_client(cluster))
        .identity()
        .await
        .unwrap();

    // No rights at all, on a cluster that does not even serve
    // ClusterProperty: forbidden, not "not found".
    let alice = fleet.engage("alice-view", cluster.client_for("alice", &[]).unwrap());
    let error = identity_error(&alice).await;
    assert_eq!(status_code(&error), Some(403), "{error}");
    let message = error.to_string();
    assert!(message.starts_with("cluster \"alice-view\": "), "{message}");
    assert!(message.contains("clusterproperties"), "{message}");

    // Namespaces only: the kube-system UID is readable, and still not taken.
    let mut namespaces_only = Permissions::new();
    namespaces_only.grant(Scope::Members, Rule::new("", "namespaces", ["get"]));
    grant(cluster, "alice", "read-namespaces", &namespaces_only).await;
    let error = identity_error(&alice).await;
    assert_eq!(status_code(&error), Some(403), "{error}");
    assert!(
        matches!(&error, IdentityError::Read { cluster, what, .. }
            if cluster == "alice-view"
                && (what == "ClusterProperty cluster.clusterset.k8s.io"
                    || what == "ClusterProperty clusterset.k8s.io")),
        "{error:?}"
    );

    // The rules the identity needs: the same engagement reads it now, as
    // the failures were not kept, and gets what the admin got.
    let mut identity_rules = Permissions::new();
    for rule in ClusterIdentity::rules() {
        identity_rules.grant(Scope::Members, rule);
    }
    grant(cluster, "alice", "read-identity", &identity_rules).await;
    let read = tokio::time::timeout(support::PATIENCE, async {
        loop {
            // RBAC changes reach the authorizer through its informers.
            match alice.identity().await {
                Ok(identity) => return identity,
                Err(error) if status_code(&error) == Some(403) => {
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
                Err(error) => panic!("{error}"),
            }
        }
    })
    .await
    .expect("alice reads the identity once granted its rules");
    assert_eq!(read, admin_view);
}

#[tokio::test]
async fn an_unreachable_cluster_is_an_error_until_it_answers_again() {
    let env = Envtest::start(1).await.unwrap();
    let cluster = &env.clusters()[0];
    let fleet = Fleet::new();
    let engaged = fleet.engage(cluster.name(), http2_client(cluster));

    cluster.cut_off();
    let error = identity_error(&engaged).await;
    assert!(
        matches!(&error, IdentityError::Read { cluster: name, .. } if name == cluster.name()),
        "{error:?}"
    );
    assert_eq!(status_code(&error), None, "no answer: {error}");
    cluster.restore();

    let identity = engaged.identity().await.unwrap();
    assert_eq!(identity.id(), kube_system_uid(cluster).await);
}

#[tokio::test]
async fn a_cluster_property_without_a_value_is_an_error() {
    let env = Envtest::start(1).await.unwrap();
    let cluster = &env.clusters()[0];
    install_cluster_property_crd(cluster).await;
    let empty = json!({
        "apiVersion": "about.k8s.io/v1alpha1",
        "kind": "ClusterProperty",
        "metadata": { "name": ClusterIdentity::ID_PROPERTY },
        "spec": {},
    });
    cluster_properties(cluster.client())
        .create(
            &PostParams::default(),
            &serde_json::from_value(empty).unwrap(),
        )
        .await
        .unwrap();
    let fleet = Fleet::new();
    let engaged = fleet.engage(cluster.name(), http2_client(cluster));

    let error = identity_error(&engaged).await;
    assert!(
        matches!(
            &error,
            IdentityError::NoValue {
                field: "spec.value",
                ..
            }
        ),
        "{error:?}"
    );
    assert_eq!(
        error.to_string(),
        format!(
            "cluster {:?}: ClusterProperty cluster.clusterset.k8s.io has no spec.value",
            cluster.name()
        )
    );
}
