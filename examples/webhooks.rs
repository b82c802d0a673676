//! Admission and conversion webhooks for a hub and two members, from one
//! server in the manager.
//!
//! ```text
//! cargo run --example webhooks
//! ```
//!
//! It starts three local API servers (`hub`, `member-a`, `member-b`) and
//! installs a `Widget` CRD served at `v1` (stored) and `v2` in each. The
//! manager serves three webhooks and registers them in every cluster as it
//! is engaged, each cluster through a URL with a token of its own:
//!
//! - a validating one that refuses a widget over size 10, naming the
//!   cluster that asked;
//! - a mutating one that paints a widget without a colour blue;
//! - the CRD's conversion, where v1's `size` is v2's `length`.
//!
//! In each cluster it then tries a widget too big (refused), makes one that
//! fits (stored blue) and reads it back at v2 (converted), printing what
//! each cluster answered, and exits.

mod support;

use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use kube::{
    Api, Client, CustomResource,
    api::{ApiResource, DynamicObject, GroupVersionKind, PostParams},
};
use kube_multicluster::{
    Fleet,
    controller::ClusterSelector,
    envtest::Envtest,
    manager::Manager,
    webhook::{AdmissionRequest, Conversion, ConversionRequest, Verdict, Webhook, Webhooks},
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tower::{BoxError, service_fn};

/// The Widget at v1, its stored version.
#[derive(CustomResource, Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[kube(group = "example.com", version = "v1", kind = "Widget", namespaced)]
struct WidgetSpec {
    size: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    color: Option<String>,
}

/// Refuses widgets over size 10; the message names the cluster that asked.
async fn validate(request: AdmissionRequest<Widget>) -> Result<Verdict<Widget>, BoxError> {
    let Some(widget) = &request.object else {
        return Ok(Verdict::allow());
    };
    if widget.spec.size > 10 {
        let cluster = request.cluster().name().as_str().to_owned();
        return Ok(Verdict::deny(format!(
            "a widget of size {} does not fit in {cluster}: 10 at most",
            widget.spec.size
        ))
        .code(422));
    }
    Ok(Verdict::allow())
}

/// Paints widgets without a colour blue.
async fn default(request: AdmissionRequest<Widget>) -> Result<Verdict<Widget>, BoxError> {
    let Some(mut widget) = request.into_inner().object else {
        return Ok(Verdict::allow());
    };
    widget.spec.color.get_or_insert_with(|| "blue".to_owned());
    Ok(Verdict::mutate(widget))
}

/// Converts between v1 (`size`) and v2 (`length`).
async fn convert(request: ConversionRequest) -> Result<Vec<Value>, BoxError> {
    let desired = request.desired_api_version().to_owned();
    let (from, to) = match desired.as_str() {
        "example.com/v2" => ("size", "length"),
        "example.com/v1" => ("length", "size"),
        other => return Err(format!("Widget has no version {other}").into()),
    };
    request
        .into_objects()
        .into_iter()
        .map(|mut widget| {
            let spec = widget["spec"]
                .as_object_mut()
                .ok_or("a widget without spec")?;
            if let Some(value) = spec.remove(from) {
                spec.insert(to.to_owned(), value);
            }
            widget["apiVersion"] = json!(desired);
            Ok(widget)
        })
        .collect()
}

const CRD: &str = r#"
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
            spec: { type: object, properties: { size: { type: integer }, color: { type: string } } }
    - name: v2
      served: true
      storage: false
      schema:
        openAPIV3Schema:
          type: object
          properties:
            spec: { type: object, properties: { length: { type: integer }, color: { type: string } } }
"#;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    support::logging();
    let env = Envtest::builder()
        .clusters(["hub", "member-a", "member-b"])
        .start()
        .await?;
    let fleet = Fleet::new();
    for cluster in env.clusters() {
        cluster
            .install_crds(kube_multicluster::envtest::crds_from_yaml(CRD)?)
            .await?;
        fleet.engage(cluster.name(), cluster.client());
    }

    // The API servers run on this machine, so they reach the server on the
    // loopback address; a real deployment gives the address the members
    // reach (a LoadBalancer, an Ingress) and certificates from a Secret.
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let url = format!("https://127.0.0.1:{}", listener.local_addr()?.port());
    let webhooks = Webhooks::new("widgets-example")
        .validate(
            Webhook::new("validate.widgets.example.com"),
            service_fn(validate),
        )
        .mutate(
            Webhook::new("default.widgets.example.com"),
            service_fn(default),
        )
        .convert(Conversion::new("widgets.example.com"), service_fn(convert))
        .external_url(url)
        // The hub too: here it is reached through the URL, as the members.
        .members(ClusterSelector::All)
        .unregister_on_shutdown();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let manager = Manager::new(&fleet)
        .webhooks_on(webhooks, listener)
        .graceful_shutdown_on(async move {
            let _ = stopped.await;
        });
    let running = tokio::spawn(manager.run());

    for cluster in env.clusters() {
        let name = cluster.name();
        let client = cluster.client();
        let refused = until_refused(&client, name).await?;
        println!("{name}: a widget of size 11 is refused: {refused}");
        let made = Api::<Widget>::namespaced(client.clone(), "default")
            .create(
                &PostParams::default(),
                &Widget::new(
                    "small",
                    WidgetSpec {
                        size: 3,
                        color: None,
                    },
                ),
            )
            .await?;
        let color = made.spec.color.as_deref().unwrap_or("none");
        println!("{name}: a widget of size 3 is stored {color}");
        let v2 = read_at_v2(&client, "small").await?;
        println!("{name}: read at v2, its spec is {}", v2.data["spec"]);
        if color != "blue" || v2.data["spec"]["length"] != 3 {
            return Err(format!("{name}: not defaulted or not converted").into());
        }
    }

    // A clean stop removes the registrations, as asked above.
    let _ = stop.send(());
    running.await??;
    for cluster in env.clusters() {
        let left = Api::<ValidatingWebhookConfiguration>::all(cluster.client())
            .get_opt("widgets-example")
            .await?;
        if left.is_some() {
            return Err(format!("{}: the registration was not removed", cluster.name()).into());
        }
    }
    println!("stopped; the registrations are removed from every cluster");
    Ok(())
}

/// Tries a widget of size 11 until the webhooks are in force in the
/// cluster (its registration is written as it is engaged, and its API
/// server reads it within a second or so); the refusal's message.
async fn until_refused(client: &Client, cluster: &str) -> Result<String, BoxError> {
    let api = Api::<Widget>::namespaced(client.clone(), "default");
    let big = Widget::new(
        "big",
        WidgetSpec {
            size: 11,
            color: None,
        },
    );
    for _ in 0..300 {
        match api.create(&PostParams::default(), &big).await {
            Err(kube::Error::Api(status)) if status.code == 422 => return Ok(status.message),
            // The CRD's storage starts again as its conversion is set.
            Err(kube::Error::Api(status)) if status.code == 503 => {}
            Err(other) => return Err(other.into()),
            Ok(_) => {
                api.delete("big", &Default::default()).await?;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Err(format!("the webhooks were not in force in {cluster} within a minute").into())
}

async fn read_at_v2(client: &Client, name: &str) -> Result<DynamicObject, BoxError> {
    let v2 = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("example.com", "v2", "Widget"),
        "widgets",
    );
    Ok(
        Api::<DynamicObject>::namespaced_with(client.clone(), "default", &v2)
            .get(name)
            .await?,
    )
}
