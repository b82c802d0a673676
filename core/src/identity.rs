//! Which cluster an engaged [`Cluster`](crate::Cluster) is, whatever the
//! fleet calls it: its ID and the clusterset it belongs to, as the About API
//! (KEP-2149, "ClusterId for ClusterSet identification") defines them.
//!
//! A cluster's name in the fleet is the provider's: a kubeconfig context, a
//! Secret's name, a Cluster API `Cluster`. Two providers, or two processes,
//! can give one cluster two names. The ID is the cluster's own, read from the
//! cluster itself: the `ClusterProperty` `cluster.clusterset.k8s.io` where
//! the cluster has one, else the UID of its `kube-system` namespace.
//!
//! ```no_run
//! # async fn example(fleet: kube_multicluster::Fleet) -> Result<(), kube_multicluster::identity::IdentityError> {
//! let east = fleet.get("east").expect("engaged");
//! let identity = east.identity().await?;
//! println!("{} is {identity} ({:?})", east.name(), identity.source());
//! if let Some(clusterset) = identity.clusterset() {
//!     println!("in clusterset {clusterset}");
//! }
//! # Ok(())
//! # }
//! ```

use std::fmt;

use k8s_openapi::api::core::v1::Namespace;
use kube::{
    Api, Client,
    api::{ApiResource, DynamicObject},
};

use crate::{cluster_name::ClusterName, rbac::Rule};

/// The namespace whose UID is a cluster's ID when no property sets one.
const KUBE_SYSTEM: &str = "kube-system";

/// The ID of a cluster, and the clusterset it belongs to: see
/// [`Cluster::identity`](crate::Cluster::identity).
///
/// It displays as its [`id`](Self::id).
///
/// ```no_run
/// # async fn example(cluster: kube_multicluster::Cluster) -> Result<(), kube_multicluster::identity::IdentityError> {
/// use kube_multicluster::identity::IdSource;
///
/// let identity = cluster.identity().await?;
/// match identity.source() {
///     IdSource::ClusterProperty => println!("{} is {identity}", cluster.name()),
///     IdSource::KubeSystemNamespace => println!("{} is {identity} (no ClusterProperty)", cluster.name()),
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ClusterIdentity {
    id: String,
    source: IdSource,
    clusterset: Option<String>,
}

/// Where a cluster's [ID](ClusterIdentity::id) comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IdSource {
    /// The `spec.value` of the cluster's `ClusterProperty`
    /// [`cluster.clusterset.k8s.io`](ClusterIdentity::ID_PROPERTY).
    ClusterProperty,
    /// The UID of the cluster's `kube-system` namespace: the cluster has no
    /// `ClusterProperty` `cluster.clusterset.k8s.io`, or does not serve
    /// `ClusterProperty` at all. It stays the same for the life of the
    /// cluster, and a new cluster gets a new one.
    KubeSystemNamespace,
}

impl ClusterIdentity {
    /// An identity of `id`, from the `kube-system` namespace: for tests.
    #[cfg(test)]
    pub(crate) fn of(id: &str) -> Self {
        Self {
            id: id.to_owned(),
            source: IdSource::KubeSystemNamespace,
            clusterset: None,
        }
    }

    /// The name of the `ClusterProperty` whose value is the cluster's ID.
    pub const ID_PROPERTY: &str = "cluster.clusterset.k8s.io";

    /// The name of the `ClusterProperty` whose value names the clusterset
    /// the cluster belongs to.
    pub const CLUSTERSET_PROPERTY: &str = "clusterset.k8s.io";

    /// The cluster's ID.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Where the [ID](Self::id) comes from.
    pub fn source(&self) -> IdSource {
        self.source
    }

    /// The clusterset the cluster belongs to: the value of its
    /// `ClusterProperty` [`clusterset.k8s.io`](Self::CLUSTERSET_PROPERTY),
    /// `None` if it has none.
    pub fn clusterset(&self) -> Option<&str> {
        self.clusterset.as_deref()
    }

    /// The RBAC rules that reading an identity needs in a cluster: `get` on
    /// `namespaces` (for `kube-system`) and `get` on `clusterproperties` of
    /// `about.k8s.io`. Both are needed even where the cluster does not serve
    /// `ClusterProperty`: the API server checks the rules before it looks
    /// for the resource, so without the second one the read is forbidden,
    /// not found. Grant them where the operator reads identities, beside
    /// its controllers' [permissions](crate::Controller::permissions):
    ///
    /// ```
    /// use k8s_openapi::api::core::v1::ConfigMap;
    /// use kube::runtime::watcher;
    /// use kube_multicluster::{Controller, Fleet, identity::ClusterIdentity, rbac::{Rule, Scope}};
    ///
    /// let controller = Controller::<ConfigMap>::new(&Fleet::new(), watcher::Config::default());
    /// let mut permissions = controller.permissions();
    /// for rule in ClusterIdentity::rules() {
    ///     permissions.grant(Scope::Members, rule);
    /// }
    /// assert!(permissions.rules(Scope::Members).contains(&Rule::new("", "namespaces", ["get"])));
    /// ```
    ///
    /// A ClusterRole written by hand can narrow them further, with
    /// `resourceNames: ["kube-system"]` and `resourceNames:
    /// ["cluster.clusterset.k8s.io", "clusterset.k8s.io"]`.
    pub fn rules() -> [Rule; 2] {
        [
            Rule::new("", "namespaces", ["get"]),
            Rule::new("about.k8s.io", "clusterproperties", ["get"]),
        ]
    }
}

impl fmt::Display for ClusterIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.id)
    }
}

/// Why a cluster's identity could not be read. Each names the cluster, by
/// its name in the fleet, and what was being read.
///
/// No error is taken for an answer: where a read fails for any reason other
/// than "not found", the identity is not read, rather than read from
/// somewhere else. A cluster that forbids reading its `ClusterProperty`
/// thus never gets an ID other than the one it would get if the read were
/// allowed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IdentityError {
    /// A read failed: forbidden, timed out, the cluster unreachable.
    #[error("cluster {cluster:?}: reading {what}: {source}")]
    Read {
        /// The cluster's name in the fleet.
        cluster: ClusterName,
        /// What was being read: `ClusterProperty cluster.clusterset.k8s.io`,
        /// `namespace kube-system`.
        what: String,
        /// kube's error.
        #[source]
        source: kube::Error,
    },
    /// What was read has no value to take: a `ClusterProperty` without a
    /// string in `spec.value`, a namespace without a UID.
    #[error("cluster {cluster:?}: {what} has no {field}")]
    NoValue {
        /// The cluster's name in the fleet.
        cluster: ClusterName,
        /// What was read.
        what: String,
        /// The field it lacks.
        field: &'static str,
    },
}

/// Reads the identity of the cluster `cluster` through `client`: both
/// properties at once, then `kube-system` if the first is missing.
pub(crate) async fn read(
    cluster: &ClusterName,
    client: Client,
) -> Result<ClusterIdentity, IdentityError> {
    let properties = Api::<DynamicObject>::all_with(client.clone(), &cluster_property());
    let (id, clusterset) = tokio::try_join!(
        property(cluster, &properties, ClusterIdentity::ID_PROPERTY),
        property(cluster, &properties, ClusterIdentity::CLUSTERSET_PROPERTY),
    )?;
    let (id, source) = match id {
        Some(id) => (id, IdSource::ClusterProperty),
        None => (
            kube_system_uid(cluster, client).await?,
            IdSource::KubeSystemNamespace,
        ),
    };
    Ok(ClusterIdentity {
        id,
        source,
        clusterset,
    })
}

/// `about.k8s.io/v1alpha1` `ClusterProperty`, cluster-scoped.
fn cluster_property() -> ApiResource {
    ApiResource {
        group: "about.k8s.io".into(),
        version: "v1alpha1".into(),
        api_version: "about.k8s.io/v1alpha1".into(),
        kind: "ClusterProperty".into(),
        plural: "clusterproperties".into(),
    }
}

/// The value of the property `name`; `None` if the cluster has no such
/// property or serves no `ClusterProperty` (both are a 404).
async fn property(
    cluster: &ClusterName,
    properties: &Api<DynamicObject>,
    name: &str,
) -> Result<Option<String>, IdentityError> {
    let what = || format!("ClusterProperty {name}");
    let property = match properties.get(name).await {
        Ok(property) => property,
        // By the code, not the reason: where no CRD serves the resource, the
        // answer is a plain-text "404 page not found", not a `Status`.
        Err(kube::Error::Api(status)) if status.code == 404 => return Ok(None),
        Err(source) => {
            return Err(IdentityError::Read {
                cluster: cluster.clone(),
                what: what(),
                source,
            });
        }
    };
    match property.data["spec"]["value"].as_str() {
        Some(value) if !value.is_empty() => Ok(Some(value.to_owned())),
        _ => Err(IdentityError::NoValue {
            cluster: cluster.clone(),
            what: what(),
            field: "spec.value",
        }),
    }
}

async fn kube_system_uid(cluster: &ClusterName, client: Client) -> Result<String, IdentityError> {
    let what = || format!("namespace {KUBE_SYSTEM}");
    let namespace = Api::<Namespace>::all(client)
        .get(KUBE_SYSTEM)
        .await
        .map_err(|source| IdentityError::Read {
            cluster: cluster.clone(),
            what: what(),
            source,
        })?;
    namespace
        .metadata
        .uid
        .ok_or_else(|| IdentityError::NoValue {
            cluster: cluster.clone(),
            what: what(),
            field: "metadata.uid",
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_identity_displays_as_its_id() {
        let identity = ClusterIdentity {
            id: "east-1".into(),
            source: IdSource::ClusterProperty,
            clusterset: Some("prod".into()),
        };
        assert_eq!(identity.to_string(), "east-1");
    }

    #[test]
    fn errors_name_the_cluster_and_what_was_read() {
        let error = IdentityError::NoValue {
            cluster: "east".into(),
            what: "ClusterProperty cluster.clusterset.k8s.io".into(),
            field: "spec.value",
        };
        assert_eq!(
            error.to_string(),
            "cluster \"east\": ClusterProperty cluster.clusterset.k8s.io has no spec.value"
        );
    }

    #[test]
    fn identities_and_their_reads_are_send() {
        fn assert_send_sync<T: Send + Sync>() {}
        fn assert_send<T: Send>(_: &T) {}
        assert_send_sync::<ClusterIdentity>();
        assert_send_sync::<IdentityError>();
        // Type-checked only: a spawned task can await an identity.
        let _ = |cluster: crate::cluster::Cluster| async move { assert_send(&cluster.identity()) };
    }
}
