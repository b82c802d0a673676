//! What an admission handler is asked, and what it answers.

use std::{ops::Deref, sync::Arc};

use kube::Resource;
use kube_multicluster::Cluster;

pub use kube::core::admission::Operation;

/// One admission request, from the cluster that sent it: kube's
/// [`AdmissionRequest`](kube::core::admission::AdmissionRequest) (it
/// dereferences to it: `operation`, `object`, `old_object`, `user_info`,
/// `dry_run` and the rest), and the [`Cluster`] whose registered URL it came
/// through, with its client and caches.
#[derive(Debug)]
pub struct AdmissionRequest<K: Resource> {
    request: kube::core::admission::AdmissionRequest<K>,
    cluster: Cluster,
    webhook: Arc<str>,
}

impl<K: Resource> AdmissionRequest<K> {
    /// A request as the server makes it: for tests of a handler.
    pub fn new(
        request: kube::core::admission::AdmissionRequest<K>,
        cluster: Cluster,
        webhook: &str,
    ) -> Self {
        Self {
            request,
            cluster,
            webhook: webhook.into(),
        }
    }

    /// The cluster that asked: the one whose URL (and token) the request
    /// came through.
    pub fn cluster(&self) -> &Cluster {
        &self.cluster
    }

    /// The name of the webhook asked.
    pub fn webhook(&self) -> &str {
        &self.webhook
    }

    /// kube's request, owned.
    pub fn into_inner(self) -> kube::core::admission::AdmissionRequest<K> {
        self.request
    }
}

impl<K: Resource> Deref for AdmissionRequest<K> {
    type Target = kube::core::admission::AdmissionRequest<K>;

    fn deref(&self) -> &Self::Target {
        &self.request
    }
}

impl<K: Resource> std::fmt::Display for AdmissionRequest<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let namespace = self.request.namespace.as_deref().unwrap_or("");
        let slash = if namespace.is_empty() { "" } else { "/" };
        write!(
            f,
            "{:?} {}{slash}{} in {:?} ({})",
            self.request.operation,
            namespace,
            self.request.name,
            self.cluster.name().as_str(),
            self.webhook
        )
    }
}

/// An admission handler's answer: allow, deny with a message and an HTTP
/// code, or (for a mutating webhook) the object as it should be stored,
/// from which the server computes the JSON patch. Warnings go back to the
/// client that made the request (`kubectl` prints them).
///
/// ```
/// use k8s_openapi::api::core::v1::ConfigMap;
/// use kube_multicluster_webhook::Verdict;
///
/// let denied: Verdict<ConfigMap> = Verdict::deny("the name is taken").code(409);
/// assert!(!denied.is_allowed());
/// let allowed: Verdict<ConfigMap> = Verdict::allow().warning("the label `tier` is deprecated");
/// assert!(allowed.is_allowed());
/// ```
#[derive(Clone, Debug)]
#[must_use]
pub struct Verdict<K> {
    pub(crate) answer: Answer<K>,
    pub(crate) warnings: Vec<String>,
}

#[derive(Clone, Debug)]
pub(crate) enum Answer<K> {
    Allow,
    Deny { message: String, code: u16 },
    Mutate(Box<K>),
}

impl<K> Verdict<K> {
    fn from_answer(answer: Answer<K>) -> Self {
        Self {
            answer,
            warnings: Vec::new(),
        }
    }

    /// Admit the request as it is.
    pub fn allow() -> Self {
        Self::from_answer(Answer::Allow)
    }

    /// Refuse the request: the client sees `message`, with HTTP code 403
    /// unless [`code`](Self::code) says otherwise.
    pub fn deny(message: impl Into<String>) -> Self {
        Self::from_answer(Answer::Deny {
            message: message.into(),
            code: 403,
        })
    }

    /// The HTTP code of a denial (400 to 599; others are taken as 403).
    pub fn code(mut self, code: u16) -> Self {
        if let Answer::Deny { code: c, .. } = &mut self.answer {
            *c = if (400..600).contains(&code) {
                code
            } else {
                403
            };
        }
        self
    }

    /// Admit the request with the object changed to `object` (a mutating
    /// webhook's answer). The server sends the difference from the object
    /// asked about as a JSON patch; fields the type does not know are left
    /// as they were. From a validating webhook it is taken as
    /// [`allow`](Self::allow).
    pub fn mutate(object: K) -> Self {
        Self::from_answer(Answer::Mutate(Box::new(object)))
    }

    /// A warning for the client, whatever the answer.
    pub fn warning(mut self, warning: impl Into<String>) -> Self {
        self.warnings.push(warning.into());
        self
    }

    /// Whether the request is admitted.
    pub fn is_allowed(&self) -> bool {
        !matches!(self.answer, Answer::Deny { .. })
    }
}
