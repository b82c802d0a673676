//! What is registered in each cluster, and how it is written and removed:
//! one `ValidatingWebhookConfiguration` and one
//! `MutatingWebhookConfiguration` named after the server, labelled as its
//! own, and the `spec.conversion` of each converted CRD.

mod keep;

pub(crate) use keep::{follow, unregister_all};

use k8s_openapi::{
    ByteString,
    api::admissionregistration::v1::{
        MutatingWebhook, MutatingWebhookConfiguration, ServiceReference, ValidatingWebhook,
        ValidatingWebhookConfiguration, WebhookClientConfig,
    },
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use kube::{
    Api, Client,
    api::{DeleteParams, Patch, PatchParams, Preconditions},
};
use kube_multicluster::{ClusterName, controller::ClusterSelector};
use serde::{Serialize, de::DeserializeOwned};
use serde_json::json;

use crate::{server::path_of, token::Tokens};

/// The label every registration carries: `app.kubernetes.io/managed-by`.
pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// The label naming the server a registration belongs to.
pub const SERVER_LABEL: &str = kube_multicluster::prefixed!("webhook-server");
/// The annotation naming the server process that last wrote a
/// registration: a replica removes only what it wrote itself, so that one
/// that lets a cluster go (its shard moved) does not remove what the new
/// owner has just written.
pub(crate) const WRITER_ANNOTATION: &str = kube_multicluster::prefixed!("webhook-written-by");
/// The field manager registrations are applied with.
const FIELD_MANAGER: &str = kube_multicluster::prefixed!("webhooks");

/// A cluster-scoped object registration reads and writes.
trait Registered:
    kube::Resource<DynamicType = ()> + Clone + Serialize + DeserializeOwned + std::fmt::Debug
{
}

impl<K> Registered for K where
    K: kube::Resource<DynamicType = ()> + Clone + Serialize + DeserializeOwned + std::fmt::Debug
{
}

/// A Service in the local cluster that reaches the server.
#[derive(Clone, Debug)]
pub(crate) struct ServiceRef {
    pub(crate) namespace: String,
    pub(crate) name: String,
    pub(crate) port: u16,
}

/// Everything registered, for any cluster.
#[derive(Debug)]
pub(crate) struct Plan {
    pub(crate) name: String,
    /// The validating webhooks, kept in the mutating form (its fields and
    /// one more) until written.
    pub(crate) validating: Vec<MutatingWebhook>,
    pub(crate) mutating: Vec<MutatingWebhook>,
    pub(crate) conversions: Vec<String>,
    pub(crate) service: Option<ServiceRef>,
    pub(crate) url: Option<String>,
    pub(crate) members: ClusterSelector,
    pub(crate) tokens: Tokens,
    /// This process, as [`WRITER_ANNOTATION`] names it.
    pub(crate) writer: String,
}

/// Whose registrations a removal takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Whose {
    /// Those this process wrote last.
    Mine,
    /// Those of any process of this server (at an uninstall).
    Any,
}

impl Plan {
    /// Whether `cluster` is registered in: the local one through the
    /// Service, the ones the members' selector takes through the URL.
    pub(crate) fn selects(&self, cluster: &ClusterName) -> bool {
        (cluster.is_local() && self.service.is_some())
            || (self.url.is_some() && self.members.selects(cluster))
    }

    /// How `cluster` reaches `webhook`, with the CA bundle `ca`.
    pub(crate) fn client_config(
        &self,
        cluster: &ClusterName,
        webhook: &str,
        ca: &str,
    ) -> WebhookClientConfig {
        let path = path_of(&self.tokens, cluster, webhook);
        let ca_bundle = Some(ByteString(ca.as_bytes().to_vec()));
        match (&self.service, &self.url) {
            (Some(service), _) if cluster.is_local() => WebhookClientConfig {
                ca_bundle,
                service: Some(ServiceReference {
                    name: service.name.clone(),
                    namespace: service.namespace.clone(),
                    path: Some(path),
                    port: Some(i32::from(service.port)),
                }),
                url: None,
            },
            (_, url) => WebhookClientConfig {
                ca_bundle,
                service: None,
                url: Some(format!("{}{path}", url.as_deref().unwrap_or_default())),
            },
        }
    }

    /// The URL (or Service path) `cluster` is sent to for `webhook`, as
    /// registered.
    pub(crate) fn address_of(&self, cluster: &ClusterName, webhook: &str) -> String {
        let config = self.client_config(cluster, webhook, "");
        match (config.url, config.service) {
            (Some(url), _) => url,
            (None, Some(service)) => format!(
                "https://{}.{}.svc:{}{}",
                service.name,
                service.namespace,
                service.port.unwrap_or(443),
                service.path.unwrap_or_default()
            ),
            (None, None) => String::new(),
        }
    }

    fn labels(&self) -> std::collections::BTreeMap<String, String> {
        [
            (MANAGED_BY.to_owned(), kube_multicluster::PREFIX.to_owned()),
            (SERVER_LABEL.to_owned(), self.name.clone()),
        ]
        .into()
    }

    fn is_ours(&self, meta: &ObjectMeta) -> bool {
        meta.labels
            .as_ref()
            .and_then(|labels| labels.get(SERVER_LABEL))
            == Some(&self.name)
    }

    /// Writes every registration in `cluster` through `client`.
    pub(crate) async fn register(
        &self,
        client: &Client,
        cluster: &ClusterName,
        ca: &str,
    ) -> Result<(), String> {
        self.keep_configuration(
            client,
            &self.validating,
            cluster,
            ca,
            |metadata, webhooks| ValidatingWebhookConfiguration {
                metadata,
                webhooks: Some(webhooks.into_iter().map(validating).collect()),
            },
        )
        .await?;
        self.keep_configuration(client, &self.mutating, cluster, ca, |metadata, webhooks| {
            MutatingWebhookConfiguration {
                metadata,
                webhooks: Some(webhooks),
            }
        })
        .await?;
        let crds = Api::<CustomResourceDefinition>::all(client.clone());
        for crd in &self.conversions {
            let mut config = serde_json::to_value(self.client_config(cluster, crd, ca))
                .map_err(|e| e.to_string())?;
            // A merge patch keeps what it does not name: a URL written over
            // a Service (or the other way) must take the other out.
            for key in ["url", "service"] {
                if config.get(key).is_none() {
                    config[key] = serde_json::Value::Null;
                }
            }
            let patch = json!({
                "metadata": {"annotations": {WRITER_ANNOTATION: self.writer}},
                "spec": {"conversion": {
                "strategy": "Webhook",
                "webhook": {
                    "clientConfig": config,
                    "conversionReviewVersions": ["v1"],
                },
            }}});
            crds.patch(crd, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(|e| match &e {
                    kube::Error::Api(status) if status.code == 404 => format!(
                        "CustomResourceDefinition {crd} is not installed, so its conversion webhook cannot be set"
                    ),
                    _ => format!("setting the conversion webhook of CustomResourceDefinition {crd}: {e}"),
                })?;
        }
        Ok(())
    }

    /// Removes this server's webhook configurations from the cluster of
    /// `client` (those this process wrote, or any of this server's), and at
    /// an uninstall ([`Whose::Any`]) the conversions it set; it touches
    /// nothing that is not the server's.
    pub(crate) async fn unregister(&self, client: &Client, whose: Whose) -> Result<(), String> {
        self.remove_configuration::<ValidatingWebhookConfiguration>(client, whose)
            .await?;
        self.remove_configuration::<MutatingWebhookConfiguration>(client, whose)
            .await?;
        // A CRD's conversion stays when a cluster leaves: set back to
        // `None`, the API server would hand out stored objects relabelled,
        // not converted, while refused conversions fail loudly. It goes
        // at an uninstall only.
        if whose == Whose::Mine {
            return Ok(());
        }
        let crds = Api::<CustomResourceDefinition>::all(client.clone());
        for crd in &self.conversions {
            let Some(current) = crds
                .get_opt(crd)
                .await
                .map_err(|e| format!("reading CustomResourceDefinition {crd}: {e}"))?
            else {
                continue;
            };
            if !self.wrote(&current.metadata, whose) {
                continue;
            }
            let version = current.metadata.resource_version.clone();
            let ours = current
                .spec
                .conversion
                .and_then(|conversion| conversion.webhook)
                .and_then(|webhook| webhook.client_config)
                .is_some_and(|config| {
                    self.is_our_address(&serde_json::to_value(config).unwrap_or_default())
                });
            if !ours {
                continue;
            }
            // Only if nobody wrote the CRD since it was read.
            let patch = json!({
                "metadata": {"resourceVersion": version, "annotations": {WRITER_ANNOTATION: null}},
                "spec": {"conversion": {"strategy": "None", "webhook": null}},
            });
            match crds
                .patch(crd, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {}
                // Written since: no longer this process's to remove.
                Err(kube::Error::Api(status)) if status.code == 409 || status.code == 404 => {}
                Err(e) => {
                    return Err(format!(
                        "removing the conversion webhook of CustomResourceDefinition {crd}: {e}"
                    ));
                }
            }
        }
        Ok(())
    }

    /// Whether a conversion webhook's address is one this server writes
    /// (under any token: a restart may have changed the key).
    fn is_our_address(&self, config: &serde_json::Value) -> bool {
        let text = |pointer: &str| config.pointer(pointer).and_then(|v| v.as_str());
        let fleet_path = |path: &str| path.starts_with("/fleet/");
        if let (Some(url), Some(base)) = (text("/url"), &self.url)
            && let Some(path) = url.strip_prefix(base.as_str())
        {
            return fleet_path(path);
        }
        self.service.as_ref().is_some_and(|ours| {
            text("/service/namespace") == Some(ours.namespace.as_str())
                && text("/service/name") == Some(ours.name.as_str())
                && text("/service/path").is_some_and(fleet_path)
        })
    }

    /// Writes the configuration `build` makes of `entries` (each given
    /// `cluster`'s address), or removes this server's if there are none.
    async fn keep_configuration<C: Registered>(
        &self,
        client: &Client,
        entries: &[MutatingWebhook],
        cluster: &ClusterName,
        ca: &str,
        build: impl FnOnce(ObjectMeta, Vec<MutatingWebhook>) -> C,
    ) -> Result<(), String> {
        if entries.is_empty() {
            return self.remove_configuration::<C>(client, Whose::Any).await;
        }
        let webhooks = entries
            .iter()
            .map(|webhook| MutatingWebhook {
                client_config: self.client_config(cluster, &webhook.name, ca),
                ..webhook.clone()
            })
            .collect();
        self.apply(client, &build(self.metadata(), webhooks)).await
    }

    /// Whether `meta`'s object is this process's to remove.
    fn wrote(&self, meta: &ObjectMeta, whose: Whose) -> bool {
        whose == Whose::Any
            || meta
                .annotations
                .as_ref()
                .and_then(|annotations| annotations.get(WRITER_ANNOTATION))
                == Some(&self.writer)
    }

    fn metadata(&self) -> ObjectMeta {
        ObjectMeta {
            name: Some(self.name.clone()),
            labels: Some(self.labels()),
            annotations: Some([(WRITER_ANNOTATION.to_owned(), self.writer.clone())].into()),
            ..ObjectMeta::default()
        }
    }

    async fn apply<K: Registered>(&self, client: &Client, object: &K) -> Result<(), String> {
        let (api, kind) = (Api::<K>::all(client.clone()), K::kind(&()));
        if let Some(existing) = api
            .get_opt(&self.name)
            .await
            .map_err(|e| format!("reading {kind} {}: {e}", self.name))?
            && !self.is_ours(existing.meta())
        {
            return Err(format!(
                "{kind} {} exists without the label {SERVER_LABEL}={}: it is not this operator's, and is left alone",
                self.name, self.name
            ));
        }
        api.patch(
            &self.name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(object),
        )
        .await
        .map_err(|e| format!("writing {kind} {}: {e}", self.name))?;
        Ok(())
    }

    async fn remove_configuration<K: Registered>(
        &self,
        client: &Client,
        whose: Whose,
    ) -> Result<(), String> {
        let (api, kind) = (Api::<K>::all(client.clone()), K::kind(&()));
        let Some(existing) = api
            .get_opt(&self.name)
            .await
            .map_err(|e| format!("reading {kind} {}: {e}", self.name))?
        else {
            return Ok(());
        };
        if !self.is_ours(existing.meta()) || !self.wrote(existing.meta(), whose) {
            return Ok(());
        }
        // Another replica's, written through its own address (a cluster
        // whose shard moved): its to keep.
        let value = serde_json::to_value(&existing).unwrap_or_default();
        if let Some(config) = value.pointer("/webhooks/0/clientConfig")
            && !self.is_our_address(config)
        {
            return Ok(());
        }
        // Only if nobody wrote it since it was read.
        let delete = DeleteParams::default().preconditions(Preconditions {
            resource_version: existing.meta().resource_version.clone(),
            uid: existing.meta().uid.clone(),
        });
        match api.delete(&self.name, &delete).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => Ok(()),
            Err(e) => Err(format!("removing {kind} {}: {e}", self.name)),
        }
    }
}

/// A validating webhook of the same settings.
fn validating(webhook: MutatingWebhook) -> ValidatingWebhook {
    ValidatingWebhook {
        admission_review_versions: webhook.admission_review_versions,
        client_config: webhook.client_config,
        failure_policy: webhook.failure_policy,
        match_conditions: webhook.match_conditions,
        match_policy: webhook.match_policy,
        name: webhook.name,
        namespace_selector: webhook.namespace_selector,
        object_selector: webhook.object_selector,
        rules: webhook.rules,
        side_effects: webhook.side_effects,
        timeout_seconds: webhook.timeout_seconds,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::token::KeySource;

    fn plan(service: Option<ServiceRef>, url: Option<&str>) -> Plan {
        Plan {
            name: "my-operator".into(),
            validating: Vec::new(),
            mutating: Vec::new(),
            conversions: Vec::new(),
            service,
            url: url.map(str::to_owned),
            members: ClusterSelector::Provided,
            tokens: Tokens::new(&KeySource::Bytes(vec![1; 32])).unwrap(),
            writer: "me".into(),
        }
    }

    #[test]
    fn the_local_cluster_goes_through_the_service_and_members_through_the_url() {
        let service = ServiceRef {
            namespace: "operators".into(),
            name: "webhooks".into(),
            port: 443,
        };
        let plan = plan(Some(service), Some("https://webhooks.example.com"));
        let local = plan.client_config(&ClusterName::local(), "v.widgets.example.com", "CA");
        let reference = local.service.expect("through the Service");
        assert_eq!(
            (reference.namespace.as_str(), reference.name.as_str()),
            ("operators", "webhooks")
        );
        assert_eq!(reference.port, Some(443));
        let path = reference.path.unwrap();
        assert!(path.starts_with("/fleet/~/"), "{path}");
        assert!(path.ends_with("/v.widgets.example.com"), "{path}");
        assert_eq!(local.url, None);
        assert_eq!(local.ca_bundle.unwrap().0, b"CA");

        let member = plan.client_config(&"east/1".into(), "v.widgets.example.com", "CA");
        let url = member.url.expect("through the URL");
        assert!(
            url.starts_with("https://webhooks.example.com/fleet/east%2F1/"),
            "{url}"
        );
        assert_eq!(member.service, None);
        assert!(plan.selects(&ClusterName::local()) && plan.selects(&"east/1".into()));
        assert!(plan.is_our_address(&json!({ "url": url })));
        assert!(!plan.is_our_address(&json!({ "url": "https://elsewhere/fleet/x" })));
    }

    #[test]
    fn without_a_service_the_local_cluster_is_left_out_unless_selected() {
        let plan = plan(None, Some("https://webhooks.example.com"));
        assert!(!plan.selects(&ClusterName::local()));
        assert!(plan.selects(&"member".into()));
        let nowhere = super::tests::plan(None, None);
        assert!(!nowhere.selects(&"member".into()));
    }
}
