//! Which objects a watch holds: its resource, namespace and selectors, to
//! tell whether a write will show in it.

use std::collections::BTreeMap;

use kube::{Resource, runtime::watcher};

use super::TypeInfo;
use crate::client::Written;

/// What a watch holds, as far as a write can be checked against it.
#[derive(Debug, Clone)]
pub(super) struct Scope {
    group: String,
    resource: String,
    /// `None`: every namespace.
    namespace: Option<String>,
    labels: Option<String>,
    fields: Option<String>,
}

impl Scope {
    pub(super) fn of<T: Resource<DynamicType: TypeInfo>>(
        dyntype: &T::DynamicType,
        namespace: Option<&str>,
        config: &watcher::Config,
    ) -> Self {
        Self {
            group: T::group(dyntype).into_owned(),
            resource: T::plural(dyntype).into_owned(),
            namespace: namespace.map(str::to_owned),
            labels: config.label_selector.clone(),
            fields: config.field_selector.clone(),
        }
    }

    /// Whether the object `written` wrote is of this watch's resource, in
    /// any namespace.
    pub(super) fn of_resource(&self, written: &Written) -> bool {
        written.id.group == self.group && written.id.resource == self.resource
    }

    /// Whether the object `written` wrote is of this watch's resource and
    /// in its namespace.
    pub(super) fn covers(&self, written: &Written) -> bool {
        self.of_resource(written)
            && (self.namespace.is_none() || self.namespace == written.id.namespace)
    }

    /// Whether this watch's selectors select the object as `written` left
    /// it. A selector it cannot read is taken to select it.
    pub(super) fn selects(&self, written: &Written) -> bool {
        let id = &written.id;
        self.labels
            .as_deref()
            .is_none_or(|selector| labels_select(selector, &written.labels))
            && self
                .fields
                .as_deref()
                .is_none_or(|selector| fields_select(selector, id.namespace.as_deref(), &id.name))
    }
}

/// Splits a selector at its top-level commas (not those in `in (a,b)`).
fn terms(selector: &str) -> Vec<&str> {
    let mut terms = Vec::new();
    let (mut depth, mut start) = (0usize, 0);
    for (at, c) in selector.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                terms.push(selector[start..at].trim());
                start = at + 1;
            }
            _ => {}
        }
    }
    terms.push(selector[start..].trim());
    terms.retain(|term| !term.is_empty());
    terms
}

/// Whether a label selector (`a=b,c!=d,e,!f,g in (h,i),j notin (k)`)
/// selects `labels`; a term it cannot read selects.
pub(super) fn labels_select(selector: &str, labels: &BTreeMap<String, String>) -> bool {
    terms(selector).into_iter().all(|term| {
        let set = |rest: &str| -> Option<Vec<String>> {
            let rest = rest.trim().strip_prefix('(')?.strip_suffix(')')?;
            Some(rest.split(',').map(|v| v.trim().to_owned()).collect())
        };
        if let Some(key) = term.strip_prefix('!') {
            return !labels.contains_key(key.trim());
        }
        if let Some((key, rest)) = term.split_once(" notin ") {
            return set(rest).is_none_or(|values| {
                labels
                    .get(key.trim())
                    .is_none_or(|value| !values.contains(value))
            });
        }
        if let Some((key, rest)) = term.split_once(" in ") {
            return set(rest).is_none_or(|values| {
                labels
                    .get(key.trim())
                    .is_some_and(|value| values.contains(value))
            });
        }
        if let Some((key, value)) = term.split_once("!=") {
            return labels.get(key.trim()).map(String::as_str) != Some(value.trim());
        }
        if let Some((key, value)) = term.split_once('=') {
            let value = value.strip_prefix('=').unwrap_or(value);
            return labels.get(key.trim()).map(String::as_str) == Some(value.trim());
        }
        // `exists`, or a form not read here (`key>1`, say).
        if term.contains(['<', '>', ' ']) {
            return true;
        }
        labels.contains_key(term)
    })
}

/// Whether a field selector selects the object `namespace/name`; a field
/// other than `metadata.name` and `metadata.namespace` selects.
pub(super) fn fields_select(selector: &str, namespace: Option<&str>, name: &str) -> bool {
    terms(selector).into_iter().all(|term| {
        let (field, value, equal) = match term.split_once("!=") {
            Some((field, value)) => (field, value, false),
            None => match term.split_once('=') {
                Some((field, value)) => (field, value.strip_prefix('=').unwrap_or(value), true),
                None => return true,
            },
        };
        let actual = match field.trim() {
            "metadata.name" => name,
            "metadata.namespace" => namespace.unwrap_or(""),
            _ => return true,
        };
        (actual == value.trim()) == equal
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn label_selectors_select_as_the_api_server_does() {
        let app = labels(&[("app", "web"), ("tier", "front")]);
        assert!(labels_select("app=web", &app));
        assert!(labels_select("app==web,tier", &app));
        assert!(!labels_select("app!=web", &app));
        assert!(labels_select("!owner", &app));
        assert!(!labels_select("!app", &app));
        assert!(labels_select("tier in (front, back),app notin (db)", &app));
        assert!(!labels_select("tier in (back)", &app));
        assert!(!labels_select("owner", &app));
        assert!(labels_select("owner notin (x)", &app), "absent is not in");
        assert!(labels_select("replicas>1", &app), "not read: selects");
    }

    #[test]
    fn field_selectors_on_name_and_namespace_select() {
        assert!(fields_select("metadata.name=a", Some("ns"), "a"));
        assert!(!fields_select("metadata.name==b", Some("ns"), "a"));
        assert!(fields_select(
            "metadata.namespace!=kube-system",
            Some("ns"),
            "a"
        ));
        assert!(!fields_select(
            "metadata.namespace=kube-system",
            Some("ns"),
            "a"
        ));
        assert!(
            fields_select("spec.nodeName=n1", Some("ns"), "a"),
            "not read: selects"
        );
    }
}
