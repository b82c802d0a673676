//! Handlers with their types erased: a review's bytes in, the answer's
//! bytes out. Every way a handler can fail (an error, a panic, running out
//! of time, a request of another shape) is answered here, by the webhook's
//! failure policy, so the API server always gets a review back.

use std::{panic::AssertUnwindSafe, sync::Arc, time::Duration};

use bytes::Bytes;
use futures::{FutureExt, future::BoxFuture};
use kube::{
    Resource,
    core::{
        Status, TypeMeta,
        admission::{AdmissionResponse, AdmissionReview},
        conversion::{ConversionResponse, ConversionReview},
    },
};
use kube_multicluster::Cluster;
use serde::{Serialize, de::DeserializeOwned};
use tower::{BoxError, Service, ServiceExt};

use crate::{
    admission::{AdmissionRequest, Answer, Verdict},
    conversion::ConversionRequest,
    webhook::{FailurePolicy, Webhook},
};

/// The API server's own wait for a conversion webhook, which no setting
/// changes.
const CONVERSION_WAIT: Duration = Duration::from_secs(30);

/// What kind of webhook a handler serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Validating,
    Mutating,
    Conversion,
}

/// How a request was answered, for the metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    Allowed,
    Mutated,
    Denied,
    Converted,
    /// The handler returned an error, or a conversion of the wrong shape.
    Error,
    Panic,
    Timeout,
    /// The body was not a review the handler's type can read.
    Malformed,
}

impl Outcome {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Allowed => "allowed",
            Self::Mutated => "mutated",
            Self::Denied => "denied",
            Self::Converted => "converted",
            Self::Error => "error",
            Self::Panic => "panic",
            Self::Timeout => "timeout",
            Self::Malformed => "malformed",
        }
    }
}

/// An answer: the review's bytes, and how it was reached.
#[derive(Debug)]
pub(crate) struct Reply {
    pub(crate) body: Vec<u8>,
    pub(crate) outcome: Outcome,
}

pub(crate) type Call = Arc<dyn Fn(Bytes, Cluster) -> BoxFuture<'static, Reply> + Send + Sync>;

/// One handler, ready to be called.
#[derive(Clone)]
pub(crate) struct Handler {
    pub(crate) name: Arc<str>,
    pub(crate) kind: Kind,
    pub(crate) call: Call,
}

impl std::fmt::Debug for Handler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handler")
            .field("name", &self.name)
            .field("kind", &self.kind)
            .finish_non_exhaustive()
    }
}

/// Why a handler gave no answer of its own.
struct Failed {
    outcome: Outcome,
    message: String,
}

/// Runs `call` for at most `budget`, catching a panic.
async fn guarded<T, F>(budget: Duration, call: F) -> Result<T, Failed>
where
    F: Future<Output = Result<T, BoxError>>,
{
    match tokio::time::timeout(budget, AssertUnwindSafe(call).catch_unwind()).await {
        Ok(Ok(Ok(answer))) => Ok(answer),
        Ok(Ok(Err(error))) => Err(Failed {
            outcome: Outcome::Error,
            message: format!("failed: {error}"),
        }),
        Ok(Err(panic)) => Err(Failed {
            outcome: Outcome::Panic,
            message: format!("panicked: {}", kube_multicluster::panic_message(&*panic)),
        }),
        Err(_) => Err(Failed {
            outcome: Outcome::Timeout,
            message: format!("gave no answer within {budget:?}"),
        }),
    }
}

/// A handler's call: each request served by `serve` with a clone of
/// `service`. The one kept is behind a lock, so that the service need not
/// be `Sync`.
fn erase<S, F, Fut>(webhook: Arc<str>, service: S, serve: F) -> Call
where
    S: Clone + Send + 'static,
    F: Fn(S, Arc<str>, Bytes, Cluster) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Reply> + Send + 'static,
{
    let service = std::sync::Mutex::new(service);
    Arc::new(move |body: Bytes, cluster: Cluster| {
        let service = service.lock().unwrap_or_else(|e| e.into_inner()).clone();
        serve(service, webhook.clone(), body, cluster).boxed()
    })
}

/// Waits for `service` to be ready, and calls it with `request`.
async fn call_once<S, R>(mut service: S, request: R) -> Result<S::Response, BoxError>
where
    S: Service<R>,
    S::Error: Into<BoxError>,
{
    let ready = service.ready().await.map_err(Into::into)?;
    ready.call(request).await.map_err(Into::into)
}

/// The time a handler is given: four fifths of the API server's wait, so
/// that its failure is answered before the API server gives up.
pub(crate) fn budget(wait: Duration) -> Duration {
    wait.mul_f64(0.8)
}

/// An admission handler of `K` for `webhook`, erased.
pub(crate) fn admission<K, S>(webhook: &Webhook, kind: Kind, service: S) -> Handler
where
    K: Resource + Clone + Serialize + DeserializeOwned + Send + Sync + 'static,
    S: Service<AdmissionRequest<K>, Response = Verdict<K>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
{
    let (policy, budget) = (webhook.failure_policy, budget(webhook.timeout));
    let webhook: Arc<str> = webhook.name.as_str().into();
    let call = erase(
        webhook.clone(),
        service,
        move |service: S, webhook: Arc<str>, body: Bytes, cluster: Cluster| async move {
            let value: serde_json::Value = match serde_json::from_slice(&body) {
                Ok(value) => value,
                Err(error) => {
                    return Reply {
                        body: admission_review(AdmissionResponse::invalid(format!(
                            "webhook {webhook:?}: the body is not JSON: {error}"
                        ))),
                        outcome: Outcome::Malformed,
                    };
                }
            };
            let uid = uid_of(&value);
            // The object as sent, which a mutation's patch applies to.
            let raw = (kind == Kind::Mutating)
                .then(|| value.pointer("/request/object").cloned())
                .flatten();
            let request = || -> Result<kube::core::admission::AdmissionRequest<K>, BoxError> {
                Ok(serde_json::from_value::<AdmissionReview<K>>(value)?.try_into()?)
            };
            let request = match request() {
                Ok(request) => request,
                Err(error) => {
                    let failed = Failed {
                        outcome: Outcome::Malformed,
                        message: format!("could not read the request: {error}"),
                    };
                    return failure(&webhook, policy, uid, failed);
                }
            };
            let response = AdmissionResponse::from(&request);
            let original = raw.zip(request.object.clone());
            let request = AdmissionRequest::new(request, cluster, &webhook);
            match guarded(budget, call_once(service, request)).await {
                Ok(verdict) => answer(&webhook, policy, response, uid, original, verdict),
                Err(failed) => failure(&webhook, policy, uid, failed),
            }
        },
    );
    Handler {
        name: webhook,
        kind,
        call,
    }
}

/// A conversion handler, erased.
pub(crate) fn conversion<S>(name: &str, service: S) -> Handler
where
    S: Service<ConversionRequest, Response = Vec<serde_json::Value>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
{
    let webhook: Arc<str> = name.into();
    let budget = budget(CONVERSION_WAIT);
    let call = erase(
        webhook.clone(),
        service,
        move |service: S, webhook: Arc<str>, body: Bytes, cluster: Cluster| async move {
            let request = || -> Result<kube::core::conversion::ConversionRequest, BoxError> {
                Ok(serde_json::from_slice::<ConversionReview>(&body)?.try_into()?)
            };
            let request = match request() {
                Ok(request) => request,
                Err(error) => {
                    let status = Status::failure(
                        &format!("webhook {webhook:?}: could not read the request: {error}"),
                        "BadRequest",
                    );
                    return Reply {
                        body: encode(&ConversionResponse::invalid(status).into_review()),
                        outcome: Outcome::Malformed,
                    };
                }
            };
            let stub = kube::core::conversion::ConversionRequest {
                types: request.types.clone(),
                uid: request.uid.clone(),
                desired_api_version: request.desired_api_version.clone(),
                objects: Vec::new(),
            };
            let response = ConversionResponse::for_request(stub);
            let count = request.objects.len();
            let desired = request.desired_api_version.clone();
            let request = ConversionRequest::new(request, cluster, &webhook);
            let converted = guarded(budget, call_once(service, request))
                .await
                .and_then(|objects| check_converted(&objects, count, &desired).map(|()| objects));
            match converted {
                Ok(objects) => Reply {
                    body: encode(&response.success(objects).into_review()),
                    outcome: Outcome::Converted,
                },
                Err(failed) => {
                    tracing::warn!(webhook = %webhook, reason = %failed.message, "a conversion failed");
                    let status = Status::failure(
                        &format!("conversion webhook {webhook:?} {}", failed.message),
                        "ConversionFailed",
                    );
                    Reply {
                        body: encode(&response.failure(status).into_review()),
                        outcome: failed.outcome,
                    }
                }
            }
        },
    );
    Handler {
        name: webhook,
        kind: Kind::Conversion,
        call,
    }
}

fn check_converted(
    objects: &[serde_json::Value],
    count: usize,
    desired: &str,
) -> Result<(), Failed> {
    let wrong = |message: String| Failed {
        outcome: Outcome::Error,
        message,
    };
    if objects.len() != count {
        return Err(wrong(format!(
            "returned {} objects for {count}",
            objects.len()
        )));
    }
    for (i, object) in objects.iter().enumerate() {
        let version = object.get("apiVersion").and_then(|v| v.as_str());
        if version != Some(desired) {
            return Err(wrong(format!(
                "returned object {i} at apiVersion {version:?}, not {desired:?}"
            )));
        }
    }
    Ok(())
}

fn uid_of(review: &serde_json::Value) -> String {
    review
        .pointer("/request/uid")
        .and_then(|uid| uid.as_str())
        .unwrap_or_default()
        .to_owned()
}

/// `response` in an `admission.k8s.io/v1` review, encoded.
fn admission_review(response: AdmissionResponse) -> Vec<u8> {
    let mut review = response.into_review();
    review.types = TypeMeta {
        api_version: "admission.k8s.io/v1".into(),
        kind: "AdmissionReview".into(),
    };
    encode(&review)
}

fn answer<K: Serialize>(
    webhook: &str,
    policy: FailurePolicy,
    mut response: AdmissionResponse,
    uid: String,
    original: Option<(serde_json::Value, K)>,
    verdict: Verdict<K>,
) -> Reply {
    if !verdict.warnings.is_empty() {
        response.warnings = Some(verdict.warnings);
    }
    let outcome = match verdict.answer {
        Answer::Allow => Outcome::Allowed,
        Answer::Deny { message, code } => {
            response = response.deny(message);
            response.result.code = code;
            response.result.reason = reason_of(code).to_owned();
            Outcome::Denied
        }
        Answer::Mutate(object) => match original {
            // A validating webhook, or a request without an object (a
            // delete): nothing to patch.
            None => Outcome::Allowed,
            Some((raw, before)) => {
                let typed = serde_json::to_value(&before)
                    .and_then(|before| Ok((before, serde_json::to_value(&*object)?)));
                let patched = typed
                    .map_err(|e| e.to_string())
                    .and_then(|(before, after)| {
                        let patch = crate::patch::patch(&raw, &before, &after);
                        if patch.0.is_empty() {
                            return Ok(None);
                        }
                        response
                            .clone()
                            .with_patch(patch)
                            .map(Some)
                            .map_err(|e| e.to_string())
                    });
                match patched {
                    Ok(None) => Outcome::Allowed,
                    Ok(Some(patched)) => {
                        response = patched;
                        Outcome::Mutated
                    }
                    Err(error) => {
                        let failed = Failed {
                            outcome: Outcome::Error,
                            message: format!("returned an object that cannot be written: {error}"),
                        };
                        return failure(webhook, policy, uid, failed);
                    }
                }
            }
        },
    };
    Reply {
        body: admission_review(response),
        outcome,
    }
}

/// The answer for a handler that gave none of its own: a denial that says
/// why, or, under [`FailurePolicy::Ignore`], an admission with a warning.
fn failure(webhook: &str, policy: FailurePolicy, uid: String, failed: Failed) -> Reply {
    let message = format!("admission webhook {webhook:?} {}", failed.message);
    tracing::warn!(webhook, reason = %failed.message, "an admission handler gave no answer of its own");
    let mut response = AdmissionResponse::invalid(&message);
    response.uid = uid;
    match policy {
        FailurePolicy::Fail => {
            response.result = Status::failure(&message, "InternalError").with_code(500);
        }
        FailurePolicy::Ignore => {
            response.allowed = true;
            response.result = Status::success();
            response.warnings = Some(vec![format!(
                "{message}; its failure policy (Ignore) admits the request"
            )]);
        }
    }
    Reply {
        body: admission_review(response),
        outcome: failed.outcome,
    }
}

/// A denial of a request the server will not hand to its handler (a bad
/// token, a cluster not engaged here), whatever the failure policy: the
/// API server must not admit it because the check could not run.
pub(crate) fn refuse(kind: Kind, body: &[u8], message: &str) -> Vec<u8> {
    let value: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
    match kind {
        Kind::Conversion => {
            let status = Status::failure(message, "Forbidden").with_code(403);
            let mut response = ConversionResponse::invalid(status);
            response.uid = uid_of(&value);
            response.types = Some(TypeMeta {
                api_version: "apiextensions.k8s.io/v1".into(),
                kind: "ConversionReview".into(),
            });
            encode(&response.into_review())
        }
        Kind::Validating | Kind::Mutating => {
            let mut response = AdmissionResponse::invalid(message);
            response.uid = uid_of(&value);
            response.result = Status::failure(message, "Forbidden").with_code(403);
            admission_review(response)
        }
    }
}

fn reason_of(code: u16) -> &'static str {
    match code {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        409 => "Conflict",
        422 => "Invalid",
        429 => "TooManyRequests",
        _ if code >= 500 => "InternalError",
        _ => "Forbidden",
    }
}

fn encode(review: &impl Serialize) -> Vec<u8> {
    serde_json::to_vec(review).unwrap_or_else(|error| {
        // A review of strings and numbers always serializes; should one
        // not, the API server gets a body it rejects, and its failure
        // policy decides.
        format!("{{\"error\":{:?}}}", error.to_string()).into_bytes()
    })
}
