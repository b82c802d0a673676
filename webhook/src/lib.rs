//! Admission and conversion webhooks for a fleet: one HTTPS server that
//! the local cluster and every member call, with handlers written as tower
//! services, and registrations written into each cluster as it joins and
//! removed as it leaves.
//!
//! - **Handlers** are [`tower::Service`]s, like reconcilers: a validating
//!   or mutating handler of `K` takes an [`AdmissionRequest<K>`] and answers
//!   a [`Verdict<K>`] (allow, deny with a message and code, or the changed
//!   object, from which the JSON patch is computed); a conversion handler
//!   takes a [`ConversionRequest`] and answers the converted objects. A
//!   handler that fails, panics or runs out of time is answered for by the
//!   server, as the webhook's [`FailurePolicy`] says: never a dropped
//!   connection.
//! - **Which cluster is asking**: each cluster is registered with a URL of
//!   its own, carrying a secret token made for it. The request is served
//!   with that [`Cluster`](kube_multicluster::Cluster) (its client, its caches);
//!   a request with another cluster's token, or none, is denied without
//!   the handler seeing it.
//! - **Certificates** come from files that are read again when they change
//!   (cert-manager's Secret, mounted), or are made at start
//!   ([`Certificates`]).
//! - **Registration**: one `ValidatingWebhookConfiguration` and one
//!   `MutatingWebhookConfiguration` named after the server, labelled
//!   [`SERVER_LABEL`], and each converted CRD's `spec.conversion`, in the
//!   local cluster through a Service ([`Webhooks::local_service`]) and, if
//!   asked, in every member through the server's external URL
//!   ([`Webhooks::external_url`]).
//!
//! With `kube-multicluster`'s manager, `Manager::webhooks` serves them on every
//! replica and writes the registrations from the leader; this crate's
//! [`Webhooks::start`] does it by hand.
//!
//! ```no_run
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use kube_multicluster::Fleet;
//! use kube_multicluster_webhook::{AdmissionRequest, Verdict, Webhook, Webhooks};
//! use tower::{BoxError, service_fn};
//!
//! # async fn example(fleet: Fleet) -> Result<(), BoxError> {
//! let webhooks = Webhooks::new("my-operator")
//!     .validate(
//!         Webhook::new("validate.configmaps.example.com"),
//!         service_fn(|request: AdmissionRequest<ConfigMap>| async move {
//!             let named_ok = request.object.as_ref().and_then(|o| o.metadata.name.as_deref()) != Some("forbidden");
//!             Ok::<_, BoxError>(if named_ok {
//!                 Verdict::allow()
//!             } else {
//!                 Verdict::deny(format!("not in cluster {}", request.cluster().name().as_str()))
//!             })
//!         }),
//!     )
//!     .external_url("https://webhooks.example.com:9443");
//! let listener = std::net::TcpListener::bind("0.0.0.0:9443")?;
//! let server = webhooks.start(&fleet, listener, None)?;
//! // Registers in every member as it joins, for as long as it runs.
//! server.register().await;
//! # Ok(())
//! # }
//! ```

#![cfg_attr(docsrs, feature(doc_cfg))]

mod admission;
mod certificates;
mod conversion;
mod error;
mod handler;
mod metrics;
mod patch;
mod registration;
mod running;
mod server;
mod token;
mod webhook;
mod webhooks;

pub use admission::{AdmissionRequest, Operation, Verdict};
pub use certificates::{Certificates, DEFAULT_RELOAD_EVERY};
pub use conversion::ConversionRequest;
pub use error::Error;
pub use registration::{MANAGED_BY, SERVER_LABEL};
pub use running::{WebhookServer, WebhookStatus};
pub use token::MIN_KEY_BYTES;
pub use webhook::{Conversion, DEFAULT_TIMEOUT, FailurePolicy, Webhook};
pub use webhooks::Webhooks;
