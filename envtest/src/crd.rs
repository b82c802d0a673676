//! Installing CustomResourceDefinitions and waiting until they are served.

use std::time::{Duration, Instant};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::{
    Api, Client, ResourceExt,
    api::{Patch, PatchParams},
    runtime::wait::{await_condition, conditions::is_crd_established},
};

use crate::{DEFAULT_START_TIMEOUT, Error, Result, process::Deadline};

/// The field manager of everything the harness applies to its clusters:
/// CRDs, credentials and kcp's objects. It takes the prefix every name of the
/// crate family takes (`kube_multicluster::PREFIX`).
pub const FIELD_MANAGER: &str = "kube-multicluster.dev/envtest";

/// Parses CRDs from YAML, one per document (`---` between documents).
///
/// Empty documents are skipped; anything that is not a
/// `CustomResourceDefinition` is an error naming its position.
///
/// ```
/// let crds = kube_multicluster_envtest::crds_from_yaml(r#"
/// apiVersion: apiextensions.k8s.io/v1
/// kind: CustomResourceDefinition
/// metadata: { name: widgets.example.com }
/// spec:
///   group: example.com
///   names: { kind: Widget, plural: widgets, singular: widget }
///   scope: Namespaced
///   versions:
///     - name: v1
///       served: true
///       storage: true
///       schema: { openAPIV3Schema: { type: object, x-kubernetes-preserve-unknown-fields: true } }
/// "#).unwrap();
/// assert_eq!(crds[0].spec.names.kind, "Widget");
/// ```
pub fn crds_from_yaml(yaml: &str) -> Result<Vec<CustomResourceDefinition>> {
    let documents: Vec<serde_json::Value> =
        serde_saphyr::from_multiple(yaml).map_err(|source| Error::CrdParse { source })?;
    documents
        .into_iter()
        .filter(|doc| !doc.is_null())
        .enumerate()
        .map(|(index, doc)| {
            let kind = doc.get("kind").and_then(|k| k.as_str()).unwrap_or_default();
            if kind != "CustomResourceDefinition" {
                return Err(Error::NotACrd {
                    index,
                    kind: kind.to_owned(),
                });
            }
            serde_json::from_value(doc).map_err(|source| Error::CrdDecode { index, source })
        })
        .collect()
}

/// Installs CRDs with server-side apply (so installing twice is harmless) and
/// waits until each is established and its resource is served.
///
/// ```no_run
/// # async fn example(client: kube::Client) -> kube_multicluster_envtest::Result<()> {
/// let yaml = std::fs::read_to_string("crds/widgets.yaml").unwrap();
/// kube_multicluster_envtest::install_crds(&client, kube_multicluster_envtest::crds_from_yaml(&yaml)?).await?;
/// # Ok(())
/// # }
/// ```
pub async fn install_crds(
    client: &Client,
    crds: impl IntoIterator<Item = CustomResourceDefinition>,
) -> Result<()> {
    install(client, "the cluster", crds, DEFAULT_START_TIMEOUT).await
}

pub(crate) async fn install(
    client: &Client,
    cluster: &str,
    crds: impl IntoIterator<Item = CustomResourceDefinition>,
    timeout: Duration,
) -> Result<()> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let mut installed = Vec::new();
    for mut crd in crds {
        crd.status = None;
        crd.metadata.resource_version = None;
        crd.metadata.managed_fields = None;
        let name = crd.name_any();
        api.patch(&name, &params, &Patch::Apply(&crd))
            .await
            .map_err(|e| Error::kube(format!("applying CRD {name} to {cluster}"), e))?;
        installed.push(crd);
    }
    let started = Instant::now();
    for crd in &installed {
        let name = crd.name_any();
        let established = await_condition(api.clone(), &name, is_crd_established());
        match tokio::time::timeout_at((started + timeout).into(), established).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                return Err(Error::io(
                    format!("watching CRD {name} in {cluster}"),
                    std::io::Error::other(e),
                ));
            }
            Err(_) => {
                return Err(Error::Timeout {
                    what: format!("CRD {name} in {cluster} to be established"),
                    after: timeout,
                    last_error: None,
                });
            }
        }
        wait_served(client, cluster, crd, started, timeout).await?;
    }
    Ok(())
}

/// Waits until discovery lists the CRD's resource in each served version,
/// after which requests for it no longer answer 404.
async fn wait_served(
    client: &Client,
    cluster: &str,
    crd: &CustomResourceDefinition,
    started: Instant,
    timeout: Duration,
) -> Result<()> {
    let plural = &crd.spec.names.plural;
    for version in crd.spec.versions.iter().filter(|v| v.served) {
        let group_version = format!("{}/{}", crd.spec.group, version.name);
        let what = format!("{plural}.{group_version} in {cluster} to be served");
        let deadline = Deadline::new(what, started, timeout, Duration::from_millis(50));
        loop {
            let why = match client.list_api_group_resources(&group_version).await {
                Ok(list) if list.resources.iter().any(|r| &r.name == plural) => break,
                Ok(_) => format!("{plural} not yet listed"),
                Err(e) => e.to_string(),
            };
            deadline.not_yet(Some(why)).await?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yaml_documents_of_another_kind_are_named_in_the_error() {
        let yaml = "---\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: { name: x }\n";
        match crds_from_yaml(yaml) {
            Err(Error::NotACrd { index: 0, kind }) => assert_eq!(kind, "ConfigMap"),
            other => panic!("expected NotACrd, got {other:?}"),
        }
    }

    #[test]
    fn invalid_crd_documents_are_an_error_not_a_panic() {
        let yaml = "kind: CustomResourceDefinition\nspec: 3\n";
        assert!(matches!(
            crds_from_yaml(yaml),
            Err(Error::CrdDecode { index: 0, .. })
        ));
        assert!(matches!(
            crds_from_yaml("kind: [unclosed"),
            Err(Error::CrdParse { .. })
        ));
    }
}
