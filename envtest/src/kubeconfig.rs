//! Kubeconfigs for the users of one test cluster.

use base64::{Engine, engine::general_purpose::STANDARD};
use kube::{
    Client, Config,
    config::{
        AuthInfo, Cluster, Context, ExecConfig, Kubeconfig, NamedAuthInfo, NamedCluster,
        NamedContext,
    },
};

use crate::{
    Error, Result,
    pki::{CertificateAuthority, ClientCertificate},
};

/// A self-contained kubeconfig (certificates inline) with one cluster, one
/// user and one context; the cluster and the context are named after the
/// cluster and the context is current.
pub(crate) fn kubeconfig(
    cluster: &str,
    server: &str,
    ca: &CertificateAuthority,
    user: &str,
    credentials: &ClientCertificate,
) -> Kubeconfig {
    Kubeconfig {
        clusters: vec![NamedCluster {
            name: cluster.to_owned(),
            cluster: Some(Cluster {
                server: Some(server.to_owned()),
                certificate_authority_data: Some(STANDARD.encode(ca.cert())),
                ..Cluster::default()
            }),
            other: Default::default(),
        }],
        auth_infos: vec![NamedAuthInfo {
            name: user.to_owned(),
            auth_info: Some(AuthInfo {
                client_certificate_data: Some(STANDARD.encode(&credentials.cert)),
                client_key_data: Some(STANDARD.encode(&credentials.key).into()),
                ..AuthInfo::default()
            }),
            other: Default::default(),
        }],
        contexts: vec![NamedContext {
            name: cluster.to_owned(),
            context: Some(Context {
                cluster: cluster.to_owned(),
                user: Some(user.to_owned()),
                ..Context::default()
            }),
            other: Default::default(),
        }],
        current_context: Some(cluster.to_owned()),
        ..Kubeconfig::default()
    }
}

/// The server URL of a kubeconfig made by [`kubeconfig`].
pub(crate) fn server(kubeconfig: &Kubeconfig) -> &str {
    kubeconfig.clusters[0]
        .cluster
        .as_ref()
        .and_then(|c| c.server.as_deref())
        .unwrap_or_default()
}

/// The same kubeconfig for another server URL.
pub(crate) fn with_server(kubeconfig: &Kubeconfig, server: &str) -> Kubeconfig {
    let mut kubeconfig = kubeconfig.clone();
    if let Some(cluster) = kubeconfig.clusters[0].cluster.as_mut() {
        cluster.server = Some(server.to_owned());
    }
    kubeconfig
}

/// The `ExecCredential` a plugin prints to hand out `credentials`.
pub(crate) fn exec_credential(credentials: &ClientCertificate) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "client.authentication.k8s.io/v1",
        "kind": "ExecCredential",
        "status": {
            "clientCertificateData": credentials.cert,
            "clientKeyData": credentials.key,
        }
    })
}

/// The same kubeconfig with its user's credentials taken from the exec
/// plugin `command` instead.
pub(crate) fn with_exec(kubeconfig: &Kubeconfig, command: &str) -> Kubeconfig {
    let mut kubeconfig = kubeconfig.clone();
    kubeconfig.auth_infos[0].auth_info = Some(AuthInfo {
        exec: Some(ExecConfig {
            api_version: Some("client.authentication.k8s.io/v1".to_owned()),
            command: Some(command.to_owned()),
            ..ExecConfig::default()
        }),
        ..AuthInfo::default()
    });
    kubeconfig
}

/// The client configuration for a kubeconfig made by [`kubeconfig`].
pub(crate) fn config(kubeconfig: Kubeconfig, cluster: &str) -> Result<Config> {
    Config::try_from(kubeconfig).map_err(|source| Error::Kubeconfig {
        cluster: cluster.to_owned(),
        source,
    })
}

/// A client for a kubeconfig made by [`kubeconfig`]. Must be called within a
/// Tokio runtime.
pub(crate) fn client(kubeconfig: Kubeconfig, cluster: &str) -> Result<Client> {
    Client::try_from(config(kubeconfig, cluster)?)
        .map_err(|e| Error::kube(format!("building a client for cluster {cluster}"), e))
}
