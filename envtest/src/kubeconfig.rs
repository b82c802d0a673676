//! The admin kubeconfig of one test cluster.

use base64::{Engine, engine::general_purpose::STANDARD};
use kube::config::{
    AuthInfo, Cluster, Context, Kubeconfig, NamedAuthInfo, NamedCluster, NamedContext,
};

use crate::pki::Pki;

/// A self-contained kubeconfig (certificates inline) with one cluster, one
/// user and one context, all named after the cluster and current.
pub(crate) fn admin_kubeconfig(name: &str, server: &str, pki: &Pki) -> Kubeconfig {
    let user = format!("{name}-admin");
    Kubeconfig {
        clusters: vec![NamedCluster {
            name: name.to_owned(),
            cluster: Some(Cluster {
                server: Some(server.to_owned()),
                certificate_authority_data: Some(STANDARD.encode(&pki.ca_cert)),
                ..Cluster::default()
            }),
            other: Default::default(),
        }],
        auth_infos: vec![NamedAuthInfo {
            name: user.clone(),
            auth_info: Some(AuthInfo {
                client_certificate_data: Some(STANDARD.encode(&pki.admin_cert)),
                client_key_data: Some(STANDARD.encode(&pki.admin_key).into()),
                ..AuthInfo::default()
            }),
            other: Default::default(),
        }],
        contexts: vec![NamedContext {
            name: name.to_owned(),
            context: Some(Context {
                cluster: name.to_owned(),
                user: Some(user),
                ..Context::default()
            }),
            other: Default::default(),
        }],
        current_context: Some(name.to_owned()),
        ..Kubeconfig::default()
    }
}
