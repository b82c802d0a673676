//! What is read from a child: one of its conditions, or a field a JSONPath
//! selector finds.

use std::{fmt, sync::Arc};

use jsonpath_rust::{parser::model::JpQuery, query::js_path_process};
use serde_json::Value;

use super::{entry::ChildCondition, error::Error};

/// What [`Gather`](super::Gather) reads from each child: one of its
/// conditions by type, or what a JSONPath selector finds.
///
/// ```
/// use kube_multicluster::gather::Read;
///
/// let complete = Read::condition("Complete");
/// let succeeded = Read::field(".status.succeeded")?;
/// let first_port = Read::field("$.spec.ports[0].port")?;
/// let ready = Read::field(r#".status.conditions[?(@.type=="Ready")].status"#)?;
/// assert!(Read::field(".status[").is_err());
/// # Ok::<(), kube_multicluster::gather::Error>(())
/// ```
#[derive(Clone)]
pub struct Read(What);

#[derive(Clone)]
enum What {
    Condition(String),
    Field {
        selector: String,
        query: Arc<JpQuery>,
    },
}

/// What one child gave.
pub(super) enum Found {
    Condition(ChildCondition),
    Value(Value),
    /// Nothing: why.
    Nothing(String),
}

impl Read {
    /// The child's condition of type `type_` in `status.conditions`: its
    /// status, reason, message and `lastTransitionTime`.
    pub fn condition(type_: impl Into<String>) -> Self {
        Self(What::Condition(type_.into()))
    }

    /// What the JSONPath expression `selector` finds in the child (RFC 9535,
    /// as the crate `jsonpath-rust` reads it: dotted names, array indices,
    /// filters such as `[?(@.type=="Complete")]`). kubectl's form is taken
    /// too: a selector that starts with `.` or `[` is read from the root,
    /// and the braces of `{.status.succeeded}` go. Several values found are
    /// written as an array.
    pub fn field(selector: &str) -> Result<Self, Error> {
        let trimmed = selector.trim();
        let trimmed = trimmed
            .strip_prefix('{')
            .and_then(|s| s.strip_suffix('}'))
            .unwrap_or(trimmed);
        let rooted = if trimmed.starts_with('.') || trimmed.starts_with('[') {
            format!("${trimmed}")
        } else {
            trimmed.to_owned()
        };
        let query = jsonpath_rust::parser::parse_json_path(&rooted).map_err(|e| {
            Error::InvalidSelector {
                selector: selector.to_owned(),
                source: e.into(),
            }
        })?;
        Ok(Self(What::Field {
            selector: selector.to_owned(),
            query: Arc::new(query),
        }))
    }

    /// What `child` (as JSON) gives.
    pub(super) fn of(&self, child: &Value) -> Found {
        match &self.0 {
            What::Condition(type_) => {
                let conditions = child
                    .pointer("/status/conditions")
                    .and_then(Value::as_array);
                let found = conditions
                    .into_iter()
                    .flatten()
                    .find(|c| c.get("type").and_then(Value::as_str) == Some(type_));
                match found.map(|c| serde_json::from_value::<ChildCondition>(c.clone())) {
                    Some(Ok(condition)) => Found::Condition(condition),
                    Some(Err(error)) => Found::Nothing(format!("condition {type_}: {error}")),
                    None => Found::Nothing(format!("no condition {type_}")),
                }
            }
            What::Field { selector, query } => match js_path_process(query, child) {
                Ok(found) => {
                    let mut values: Vec<Value> =
                        found.into_iter().map(|r| r.val().clone()).collect();
                    match values.len() {
                        0 => Found::Nothing(format!("nothing at {selector}")),
                        1 => Found::Value(values.remove(0)),
                        _ => Found::Value(Value::Array(values)),
                    }
                }
                Err(error) => Found::Nothing(format!("{selector}: {error}")),
            },
        }
    }
}

impl fmt::Debug for Read {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            What::Condition(type_) => f.debug_tuple("Condition").field(type_).finish(),
            What::Field { selector, .. } => f.debug_tuple("Field").field(selector).finish(),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn job() -> Value {
        json!({
            "metadata": { "name": "hello" },
            "status": {
                "succeeded": 1,
                "conditions": [
                    { "type": "SuccessCriteriaMet", "status": "True" },
                    { "type": "Complete", "status": "True", "reason": "Done",
                      "lastTransitionTime": "2025-01-01T12:00:00Z" },
                ],
            },
        })
    }

    fn value(read: &Read) -> Option<Value> {
        match read.of(&job()) {
            Found::Value(value) => Some(value),
            _ => None,
        }
    }

    #[test]
    fn a_selector_reads_dotted_paths_indices_and_filters_in_kubectls_form_too() {
        let read = |s| value(&Read::field(s).unwrap());
        assert_eq!(read(".status.succeeded"), Some(json!(1)));
        assert_eq!(read("{.status.succeeded}"), Some(json!(1)));
        assert_eq!(read("$.status.conditions[1].reason"), Some(json!("Done")));
        let complete = r#".status.conditions[?(@.type=="Complete")].status"#;
        assert_eq!(read(complete), Some(json!("True")));
        let either = r#".status.conditions[?@.status=="True" && (@.type=="Complete" || @.type=="Failed")].type"#;
        assert_eq!(read(either), Some(json!("Complete")));
        assert_eq!(
            read(".status.conditions[*].type"),
            Some(json!(["SuccessCriteriaMet", "Complete"]))
        );
        assert_eq!(read(".status.failed"), None);
    }

    #[test]
    fn a_condition_is_read_by_type_and_a_missing_one_says_so() {
        let Found::Condition(complete) = Read::condition("Complete").of(&job()) else {
            panic!("no condition read");
        };
        assert_eq!(
            (complete.status.as_str(), complete.reason.as_deref()),
            ("True", Some("Done"))
        );
        assert!(complete.last_transition_time.is_some());
        let Found::Nothing(why) = Read::condition("Failed").of(&job()) else {
            panic!("a condition read that is not there");
        };
        assert_eq!(why, "no condition Failed");
    }

    #[test]
    fn a_selector_that_does_not_parse_is_refused_naming_it() {
        let error = Read::field(".status[").unwrap_err();
        assert!(error.to_string().contains(".status["), "{error}");
    }
}
