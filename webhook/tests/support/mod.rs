//! A Widget CRD served at v1 and v2, handlers that check, default and
//! convert it, and an HTTPS client that speaks to the webhook server
//! directly.

#![allow(dead_code, unreachable_pub)]

use std::{sync::Arc, time::Duration};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use kube::{
    Api, Client, CustomResource,
    api::{ApiResource, DynamicObject, GroupVersionKind, PostParams},
};
use kube_multicluster_webhook::{
    AdmissionRequest, Conversion, ConversionRequest, Verdict, Webhook, Webhooks,
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio_rustls::rustls::{self, pki_types::CertificateDer};
use tower::{BoxError, service_fn};

/// How long a registration may take to be enforced.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// The Widget at v1, the stored version.
#[derive(CustomResource, Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
#[kube(group = "example.com", version = "v1", kind = "Widget", namespaced)]
pub struct WidgetSpec {
    pub size: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub color: Option<String>,
    /// A plain `Option`, written as `null` when absent: the patch must
    /// still apply to an object without it.
    #[serde(default)]
    pub shape: Option<String>,
}

pub const CRD: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: { name: widgets.example.com }
spec:
  group: example.com
  names: { kind: Widget, plural: widgets, singular: widget, listKind: WidgetList }
  scope: Namespaced
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema:
          type: object
          properties:
            spec:
              type: object
              properties:
                size: { type: integer }
                color: { type: string }
                shape: { type: string }
    - name: v2
      served: true
      storage: false
      schema:
        openAPIV3Schema:
          type: object
          properties:
            spec:
              type: object
              properties:
                length: { type: integer }
                color: { type: string }
                shape: { type: string }
"#;

pub const VALIDATE: &str = "validate.widgets.example.com";
pub const DEFAULT: &str = "default.widgets.example.com";
pub const CONVERT: &str = "widgets.example.com";

/// Installs the CRD in `client`'s cluster.
pub async fn install_crd(client: &Client) {
    let crds = kube_multicluster_envtest::crds_from_yaml(CRD).unwrap();
    kube_multicluster_envtest::install_crds(client, crds)
        .await
        .unwrap();
}

/// A fleet of API servers named `names`, each with the Widget CRD, all
/// engaged in one `Fleet` under their names.
pub async fn widget_fleet(
    names: &[&str],
) -> (kube_multicluster_envtest::Envtest, kube_multicluster::Fleet) {
    let env = kube_multicluster_envtest::Envtest::builder()
        .clusters(names.iter().copied())
        .start()
        .await
        .unwrap();
    let fleet = kube_multicluster::Fleet::new();
    for cluster in env.clusters() {
        install_crd(&cluster.client()).await;
        fleet.engage(cluster.name(), cluster.client());
    }
    (env, fleet)
}

/// Widgets over size 10 are refused, naming the cluster that asked.
pub async fn validate(request: AdmissionRequest<Widget>) -> Result<Verdict<Widget>, BoxError> {
    let Some(widget) = &request.object else {
        return Ok(Verdict::allow());
    };
    match widget.metadata.name.as_deref() {
        Some("boom") => panic!("the handler broke on purpose"),
        Some("hang") => std::future::pending::<()>().await,
        Some("fail") => return Err("the handler failed on purpose".into()),
        _ => {}
    }
    if widget.spec.size > 10 {
        return Ok(Verdict::deny(format!(
            "size {} is over 10 in cluster {}",
            widget.spec.size,
            request.cluster().name().as_str()
        ))
        .code(422));
    }
    Ok(Verdict::allow())
}

/// Widgets without a colour are made blue, and without a shape round.
pub async fn default(request: AdmissionRequest<Widget>) -> Result<Verdict<Widget>, BoxError> {
    let Some(mut widget) = request.into_inner().object else {
        return Ok(Verdict::allow());
    };
    widget.spec.color.get_or_insert_with(|| "blue".into());
    widget.spec.shape.get_or_insert_with(|| "round".into());
    Ok(Verdict::mutate(widget))
}

/// v1's `size` is v2's `length`.
pub async fn convert(request: ConversionRequest) -> Result<Vec<Value>, BoxError> {
    let desired = request.desired_api_version().to_owned();
    let mut out = Vec::new();
    for mut object in request.into_objects() {
        let spec = object["spec"].as_object_mut().ok_or("no spec")?;
        match desired.as_str() {
            "example.com/v2" => {
                if let Some(size) = spec.remove("size") {
                    spec.insert("length".into(), size);
                }
            }
            "example.com/v1" => {
                if let Some(length) = spec.remove("length") {
                    spec.insert("size".into(), length);
                }
            }
            other => return Err(format!("no version {other}").into()),
        }
        object["apiVersion"] = json!(desired);
        out.push(object);
    }
    Ok(out)
}

/// The three webhooks, over `url`, registered in every cluster.
pub fn widget_webhooks(name: &str, url: &str) -> Webhooks {
    Webhooks::new(name)
        .validate(
            Webhook::new(VALIDATE).timeout(Duration::from_secs(3)),
            service_fn(validate),
        )
        .mutate(Webhook::new(DEFAULT), service_fn(default))
        .convert(Conversion::new(CONVERT), service_fn(convert))
        .external_url(url)
        .members(kube_multicluster::controller::ClusterSelector::All)
}

/// A loopback listener on a free port, and its URL.
pub fn listener() -> (std::net::TcpListener, String) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!(
        "https://127.0.0.1:{}",
        listener.local_addr().unwrap().port()
    );
    (listener, url)
}

pub fn widget(name: &str, size: i64) -> Widget {
    Widget::new(
        name,
        WidgetSpec {
            size,
            color: None,
            shape: None,
        },
    )
}

/// Creates `widget` in `default`, retrying while the webhooks are not yet
/// enforced there: until `enforced` says the answer shows they are.
pub async fn create_until(
    client: &Client,
    widget: &Widget,
    enforced: impl Fn(&Result<Widget, kube::Error>) -> bool,
) -> Result<Widget, kube::Error> {
    let api: Api<Widget> = Api::namespaced(client.clone(), "default");
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let name = widget.metadata.name.clone().unwrap();
        let result = api.create(&PostParams::default(), widget).await;
        if enforced(&result) {
            return result;
        }
        if result.is_ok() {
            api.delete(&name, &Default::default()).await.ok();
            // Gone before the next try.
            while api.get_opt(&name).await.ok().flatten().is_some() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the webhooks were not enforced within {PATIENCE:?}: last answer {result:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The message of an API error, or a panic naming what came instead.
pub fn message(result: &Result<Widget, kube::Error>) -> String {
    match result {
        Err(kube::Error::Api(status)) => status.message.clone(),
        other => panic!("expected an API error, got {other:?}"),
    }
}

/// The Widget `name` read at v2.
pub async fn read_v2(client: &Client, name: &str) -> DynamicObject {
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("example.com", "v2", "Widget"),
        "widgets",
    );
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &resource);
    api.get(name).await.unwrap()
}

/// Posts `body` to the webhook server at `path` over HTTPS, trusting
/// `ca` (PEM); the status and the body answered.
pub async fn post(port: u16, ca: &str, path: &str, body: Value) -> (u16, Value) {
    let (status, body, _) = post_seeing_certificate(port, ca, path, body).await;
    (status, body)
}

/// As [`post`], with the certificate the server presented (DER).
pub async fn post_seeing_certificate(
    port: u16,
    ca: &str,
    path: &str,
    body: Value,
) -> (u16, Value, Vec<u8>) {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let tls = connector
        .connect("127.0.0.1".try_into().unwrap(), tcp)
        .await
        .unwrap();
    let presented = tls.get_ref().1.peer_certificates().unwrap()[0]
        .as_ref()
        .to_vec();
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
            .await
            .unwrap();
    tokio::spawn(connection);
    let request = hyper::Request::post(path)
        .header("content-type", "application/json")
        .header("host", format!("127.0.0.1:{port}"))
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    let status = response.status().as_u16();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let value = serde_json::from_slice(&bytes)
        .unwrap_or(Value::String(String::from_utf8_lossy(&bytes).into_owned()));
    (status, value, presented)
}

/// An AdmissionReview asking to create Widget `name` of `size`.
pub fn review(name: &str, size: i64) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "0000-1111",
            "kind": {"group": "example.com", "version": "v1", "kind": "Widget"},
            "resource": {"group": "example.com", "version": "v1", "resource": "widgets"},
            "name": name,
            "namespace": "default",
            "operation": "CREATE",
            "userInfo": {"username": "tester"},
            "object": {
                "apiVersion": "example.com/v1",
                "kind": "Widget",
                "metadata": {"name": name, "namespace": "default"},
                "spec": {"size": size}
            },
            "oldObject": null,
            "dryRun": false
        }
    })
}

/// The path of `address` (a URL as registered).
pub fn path_of(address: &str) -> String {
    let rest = address.strip_prefix("https://").unwrap();
    rest[rest.find('/').unwrap()..].to_owned()
}
