//! How each webhook is registered: its name, the requests it is sent, what
//! the API server does when it fails, and how long it waits.

use std::time::Duration;

use k8s_openapi::{
    api::admissionregistration::v1::RuleWithOperations,
    apimachinery::pkg::apis::meta::v1::LabelSelector,
};
use kube::Resource;

use crate::{admission::Operation, error::Error};

/// The API server's wait for a webhook by default, as its own default.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// What the API server does with a request when the webhook cannot be
/// reached, times out or answers with an error; see the "Webhooks" chapter
/// for how to choose.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FailurePolicy {
    /// Refuse the request (the default): nothing is admitted unchecked, and
    /// while no replica answers, the writes the webhook covers fail.
    #[default]
    Fail,
    /// Admit the request unchecked: writes go on while the operator is down.
    Ignore,
}

impl FailurePolicy {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Fail => "Fail",
            Self::Ignore => "Ignore",
        }
    }
}

/// One admission webhook as it is registered in each cluster: a
/// fully-qualified name (`validate.widgets.example.com`), the requests it is
/// sent, its failure policy and timeout, and optional selectors.
///
/// Without a [`rule`](Self::rule), it is sent the
/// [`operations`](Self::operations) (create and update by default) on the
/// handler's own resource, at its version.
///
/// ```
/// use std::time::Duration;
/// use kube_multicluster_webhook::{FailurePolicy, Operation, Webhook};
///
/// let webhook = Webhook::new("validate.widgets.example.com")
///     .operations([Operation::Create, Operation::Update, Operation::Delete])
///     .failure_policy(FailurePolicy::Ignore)
///     .timeout(Duration::from_secs(5));
/// assert_eq!(webhook.name(), "validate.widgets.example.com");
/// ```
#[derive(Clone, Debug)]
pub struct Webhook {
    pub(crate) name: String,
    pub(crate) operations: Vec<Operation>,
    pub(crate) rules: Vec<RuleWithOperations>,
    pub(crate) failure_policy: FailurePolicy,
    pub(crate) timeout: Duration,
    pub(crate) namespace_selector: Option<LabelSelector>,
    pub(crate) object_selector: Option<LabelSelector>,
}

impl Webhook {
    /// A webhook named `name`, which must be a fully-qualified DNS name of
    /// at least three labels, unique among the server's webhooks.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            operations: vec![Operation::Create, Operation::Update],
            rules: Vec::new(),
            failure_policy: FailurePolicy::Fail,
            timeout: DEFAULT_TIMEOUT,
            namespace_selector: None,
            object_selector: None,
        }
    }

    /// The webhook's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The operations on the handler's resource it is sent, without a
    /// [`rule`](Self::rule).
    pub fn operations(mut self, operations: impl IntoIterator<Item = Operation>) -> Self {
        self.operations = operations.into_iter().collect();
        self
    }

    /// A rule of the requests it is sent, in place of the default one;
    /// several add up.
    pub fn rule(mut self, rule: RuleWithOperations) -> Self {
        self.rules.push(rule);
        self
    }

    /// What the API server does when the webhook fails
    /// ([`FailurePolicy::Fail`] by default). A handler that fails, panics or
    /// runs out of time is answered for by the server with the same policy.
    pub fn failure_policy(mut self, policy: FailurePolicy) -> Self {
        self.failure_policy = policy;
        self
    }

    /// How long the API server waits (1 to 30 whole seconds; 10 by
    /// default; a fraction is refused at start). The handler is given four fifths of it, so that its
    /// failure is answered before the API server gives up.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Only requests for objects in namespaces these labels select.
    pub fn namespace_selector(mut self, selector: LabelSelector) -> Self {
        self.namespace_selector = Some(selector);
        self
    }

    /// Only requests for objects these labels select.
    pub fn object_selector(mut self, selector: LabelSelector) -> Self {
        self.object_selector = Some(selector);
        self
    }

    /// The rules as registered: the given ones, or the default one on `K`.
    pub(crate) fn rules_for<K: Resource<DynamicType = ()>>(&self) -> Vec<RuleWithOperations> {
        if !self.rules.is_empty() {
            return self.rules.clone();
        }
        let operations = self
            .operations
            .iter()
            .map(|operation| {
                match operation {
                    Operation::Create => "CREATE",
                    Operation::Update => "UPDATE",
                    Operation::Delete => "DELETE",
                    Operation::Connect => "CONNECT",
                }
                .to_owned()
            })
            .collect();
        vec![RuleWithOperations {
            api_groups: Some(vec![K::group(&()).into_owned()]),
            api_versions: Some(vec![K::version(&()).into_owned()]),
            operations: Some(operations),
            resources: Some(vec![K::plural(&()).into_owned()]),
            scope: Some("*".to_owned()),
        }]
    }

    pub(crate) fn check(&self) -> Result<(), Error> {
        check_name(&self.name)?;
        check_timeout(&self.name, self.timeout)
    }
}

/// The conversion webhook of one custom resource, named by its CRD
/// (`widgets.example.com`): the server writes the CRD's
/// `spec.conversion` in each cluster it registers in.
///
/// ```
/// use kube_multicluster_webhook::Conversion;
///
/// let conversion = Conversion::new("widgets.example.com");
/// assert_eq!(conversion.name(), "widgets.example.com");
/// ```
#[derive(Clone, Debug)]
pub struct Conversion {
    pub(crate) crd: String,
}

impl Conversion {
    /// The conversion webhook of the CRD named `crd`.
    pub fn new(crd: impl Into<String>) -> Self {
        Self { crd: crd.into() }
    }

    /// The CRD's name, which is also the webhook's.
    pub fn name(&self) -> &str {
        &self.crd
    }

    pub(crate) fn check(&self) -> Result<(), Error> {
        check_name(&self.crd)
    }
}

fn check_name(name: &str) -> Result<(), Error> {
    let invalid = |reason: &str| Error::Invalid {
        name: name.to_owned(),
        reason: reason.to_owned(),
    };
    let labels: Vec<&str> = name.split('.').collect();
    if labels.len() < 3 {
        return Err(invalid(
            "a webhook's name must be fully qualified, of three labels at least (validate.widgets.example.com)",
        ));
    }
    let label_ok = |label: &&str| {
        !label.is_empty()
            && label.len() <= 63
            && label
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !label.starts_with('-')
            && !label.ends_with('-')
    };
    if name.len() > 253 || !labels.iter().all(label_ok) {
        return Err(invalid(
            "a webhook's name must be a DNS name: lowercase letters, digits, '-' and '.'",
        ));
    }
    Ok(())
}

fn check_timeout(name: &str, timeout: Duration) -> Result<(), Error> {
    // The API server takes whole seconds: a fraction would be cut off
    // there, and the handler given more time than the API server waits.
    if timeout < Duration::from_secs(1)
        || timeout > Duration::from_secs(30)
        || timeout.subsec_nanos() != 0
    {
        return Err(Error::Invalid {
            name: name.to_owned(),
            reason: format!("the timeout must be 1 to 30 whole seconds, not {timeout:?}"),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_timeouts_the_api_server_refuses_are_refused_first() {
        assert!(Webhook::new("validate.widgets.example.com").check().is_ok());
        for bad in [
            "widgets",
            "a.b",
            "Validate.widgets.example.com",
            "a..b.c",
            "-a.b.c",
        ] {
            let error = Webhook::new(bad).check().unwrap_err().to_string();
            assert!(error.contains(bad), "{error}");
        }
        let error = Webhook::new("v.widgets.example.com")
            .timeout(Duration::from_secs(31))
            .check()
            .unwrap_err();
        assert!(
            error.to_string().contains("1 to 30 whole seconds"),
            "{error}"
        );
        let error = Webhook::new("v.widgets.example.com")
            .timeout(Duration::from_millis(2500))
            .check()
            .unwrap_err();
        assert!(error.to_string().contains("2.5s"), "{error}");
    }

    #[test]
    fn the_default_rule_is_the_resource_of_the_handler() {
        use k8s_openapi::api::apps::v1::Deployment;
        let rules = Webhook::new("v.deployments.example.com").rules_for::<Deployment>();
        assert_eq!(rules.len(), 1);
        assert_eq!(rules[0].api_groups, Some(vec!["apps".to_owned()]));
        assert_eq!(rules[0].resources, Some(vec!["deployments".to_owned()]));
        assert_eq!(
            rules[0].operations,
            Some(vec!["CREATE".to_owned(), "UPDATE".to_owned()])
        );
    }
}
