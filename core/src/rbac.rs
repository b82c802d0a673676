//! The RBAC rules an operator needs, from what its controllers watch and
//! write.
//!
//! A [`Controller`](crate::Controller) knows every type it watches and in
//! which clusters ([`Controller::permissions`](crate::Controller::permissions));
//! what its reconciler writes it is told
//! ([`Controller::writes`](crate::Controller::writes)). The rules come in two
//! sets, since an operator usually holds different rights in the cluster it
//! runs in than in the clusters it manages: [`Scope::Local`] for the local
//! cluster ([`ClusterName::local`](crate::ClusterName::local)) and
//! [`Scope::Members`] for every other cluster of the fleet. A controller
//! that works in the local cluster only ([`ClusterSelector::Local`]) needs rules
//! there only, one that works in the providers' clusters
//! ([`ClusterSelector::Provided`]) in the members only, and one that works in all
//! or in [matching](crate::controller::ClusterSelector::Matching) clusters in both.
//!
//! [`Permissions::to_yaml`] prints both as ClusterRoles, for `kubectl
//! apply`; [`Permissions::cluster_role`] builds either as a `k8s-openapi`
//! object, to create through the API. Rights that no watch declares (what
//! a reconciler reads outside its watches, a cluster's
//! [identity](crate::identity::ClusterIdentity::rules)) are added with
//! [`Permissions::grant`].
//!
//! ```
//! use k8s_openapi::api::core::v1::{ConfigMap, Secret};
//! use kube::runtime::watcher;
//! use kube_multicluster::{Controller, Fleet, rbac::{Rule, Scope}};
//!
//! let controller = Controller::<ConfigMap>::new(&Fleet::new(), watcher::Config::default())
//!     .owns::<Secret>(watcher::Config::default())
//!     .writes::<Secret>(&["create", "patch"]);
//! let permissions = controller.permissions();
//! assert_eq!(
//!     permissions.rules(Scope::Members),
//!     [
//!         Rule::new("", "configmaps", ["get", "list", "watch"]),
//!         Rule::new("", "secrets", ["create", "get", "list", "patch", "watch"]),
//!     ]
//! );
//! let yaml = permissions.to_yaml("my-operator");
//! assert!(yaml.contains("  name: my-operator\n"));
//! assert!(yaml.contains("  name: my-operator-member\n"));
//! ```
//!
//! [`ClusterSelector::Local`]: crate::controller::ClusterSelector::Local
//! [`ClusterSelector::Provided`]: crate::controller::ClusterSelector::Provided
//! [`ClusterSelector`]: crate::controller::ClusterSelector

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt::Write,
};

use k8s_openapi::{
    api::rbac::v1::{ClusterRole, PolicyRule},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};

/// The verbs a rule may grant on a resource, as Kubernetes names them, and
/// `*` for all of them.
pub const VERBS: [&str; 9] = [
    "get",
    "list",
    "watch",
    "create",
    "update",
    "patch",
    "delete",
    "deletecollection",
    "*",
];

/// What a watch needs: a list, then a watch, and gets by name.
pub(crate) const READ: [&str; 3] = ["get", "list", "watch"];

/// Whether `verb` is one of [`VERBS`].
pub(crate) fn is_verb(verb: &str) -> bool {
    VERBS.contains(&verb)
}

/// One rule of a ClusterRole: these verbs on these resources of these API
/// groups (`""` is the core group), as a `PolicyRule` says it.
///
/// ```
/// use kube_multicluster::rbac::Rule;
///
/// let rule = Rule::new("apps", "deployments", ["patch", "get"]);
/// assert_eq!(rule.verbs, ["get", "patch"]);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Rule {
    /// The API groups, `""` for the core group.
    pub api_groups: Vec<String>,
    /// The resources, by plural (`configmaps`), or `plural/subresource`
    /// (`deployments/status`).
    pub resources: Vec<String>,
    /// The verbs, sorted.
    pub verbs: Vec<String>,
}

impl Rule {
    /// `verbs` (deduplicated and sorted; `*` stands for all) on `resource`
    /// of API `group`.
    pub fn new(
        group: impl Into<String>,
        resource: impl Into<String>,
        verbs: impl IntoIterator<Item = impl Into<String>>,
    ) -> Self {
        Self {
            api_groups: vec![group.into()],
            resources: vec![resource.into()],
            verbs: sorted_verbs(verbs.into_iter().map(Into::into).collect()),
        }
    }
}

impl From<Rule> for PolicyRule {
    fn from(rule: Rule) -> Self {
        Self {
            api_groups: Some(rule.api_groups),
            resources: Some(rule.resources),
            verbs: rule.verbs,
            ..Self::default()
        }
    }
}

/// `verbs` deduplicated and sorted; only `*` if they include it.
fn sorted_verbs(verbs: BTreeSet<String>) -> Vec<String> {
    if verbs.contains("*") {
        vec!["*".to_owned()]
    } else {
        verbs.into_iter().collect()
    }
}

/// `rules` as one rule per group and resource, holding every verb any of
/// them grants there, sorted by group and resource.
fn normalized<'a>(rules: impl IntoIterator<Item = &'a Rule>) -> Vec<Rule> {
    let mut merged: BTreeMap<(&str, &str), BTreeSet<String>> = BTreeMap::new();
    for rule in rules {
        for group in &rule.api_groups {
            for resource in &rule.resources {
                merged
                    .entry((group, resource))
                    .or_default()
                    .extend(rule.verbs.iter().cloned());
            }
        }
    }
    merged
        .into_iter()
        .filter(|(_, verbs)| !verbs.is_empty())
        .map(|((group, resource), verbs)| Rule::new(group, resource, verbs))
        .collect()
}

/// Which clusters a set of rules is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scope {
    /// The local cluster, where the operator runs
    /// ([`ClusterName::local`](crate::ClusterName::local)).
    Local,
    /// Every other cluster of the fleet: the providers' clusters.
    Members,
}

/// The rules an operator needs in the local cluster and in each member
/// cluster, and notes on what the rules cannot say (a type that discovery
/// resolves, a Lease that may live elsewhere).
///
/// Rules are kept one per API group and resource, sorted, with their verbs
/// deduplicated and sorted, so the output is the same from run to run;
/// rules pushed onto the fields directly are put in that form when read
/// through [`rules`](Self::rules), [`cluster_role`](Self::cluster_role) or
/// [`to_yaml`](Self::to_yaml).
///
/// ```
/// use kube_multicluster::rbac::{Permissions, Rule, Scope};
///
/// let mut permissions = Permissions::default();
/// permissions.grant(Scope::Local, Rule::new("", "configmaps", ["get", "list"]));
/// let mut more = Permissions::default();
/// more.grant(Scope::Local, Rule::new("", "configmaps", ["watch", "get"]));
/// more.grant(Scope::Members, Rule::new("apps", "deployments", ["patch"]));
/// permissions.merge(more);
/// assert_eq!(
///     permissions.rules(Scope::Local),
///     [Rule::new("", "configmaps", ["get", "list", "watch"])]
/// );
/// assert_eq!(permissions.rules(Scope::Members), [Rule::new("apps", "deployments", ["patch"])]);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Permissions {
    /// The rules for the local cluster.
    pub local: Vec<Rule>,
    /// The rules for every member cluster.
    pub members: Vec<Rule>,
    /// What the rules cannot say, for whoever grants them; printed as
    /// comments with the roles.
    pub notes: Vec<String>,
}

impl Permissions {
    /// No rules and no notes.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `rule` to the rules of `scope`.
    pub fn grant(&mut self, scope: Scope, rule: Rule) {
        let rules = match scope {
            Scope::Local => &mut self.local,
            Scope::Members => &mut self.members,
        };
        rules.push(rule);
        *rules = normalized(rules.iter());
    }

    /// Adds a note, unless it is there already.
    pub fn note(&mut self, note: impl Into<String>) {
        let note = note.into();
        if !self.notes.contains(&note) {
            self.notes.push(note);
        }
    }

    /// Adds `other`'s rules and notes to these: the verbs of rules on the
    /// same resource add up.
    pub fn merge(&mut self, other: Permissions) {
        self.local = normalized(self.local.iter().chain(&other.local));
        self.members = normalized(self.members.iter().chain(&other.members));
        for note in other.notes {
            self.note(note);
        }
    }

    /// The rules of `scope`, one per API group and resource, sorted.
    pub fn rules(&self, scope: Scope) -> Vec<Rule> {
        normalized(match scope {
            Scope::Local => &self.local,
            Scope::Members => &self.members,
        })
    }

    /// The ClusterRole `name` that grants the rules of `scope`.
    ///
    /// ```
    /// use kube_multicluster::rbac::{Permissions, Rule, Scope};
    ///
    /// let mut permissions = Permissions::default();
    /// permissions.grant(Scope::Members, Rule::new("", "configmaps", ["get", "list", "watch"]));
    /// let role = permissions.cluster_role("my-operator-member", Scope::Members);
    /// assert_eq!(role.metadata.name.as_deref(), Some("my-operator-member"));
    /// assert_eq!(role.rules.unwrap()[0].verbs, ["get", "list", "watch"]);
    /// ```
    pub fn cluster_role(&self, name: &str, scope: Scope) -> ClusterRole {
        ClusterRole {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                ..ObjectMeta::default()
            },
            rules: Some(self.rules(scope).into_iter().map(Into::into).collect()),
            ..ClusterRole::default()
        }
    }

    /// Both ClusterRoles as one YAML stream of two documents, for `kubectl
    /// apply -f`: `name` for the local cluster, then `name-member` for the
    /// member clusters, each headed by the notes as comments.
    ///
    /// ```
    /// use kube_multicluster::rbac::{Permissions, Rule, Scope};
    ///
    /// let mut permissions = Permissions::default();
    /// permissions.grant(Scope::Members, Rule::new("", "configmaps", ["get", "list", "watch"]));
    /// permissions.note("kind Widget in group example.com is resolved by discovery");
    /// let yaml = permissions.to_yaml("my-operator");
    /// assert!(yaml.starts_with("# ClusterRole my-operator: for the local cluster\n"));
    /// assert!(yaml.contains("# kind Widget in group example.com is resolved by discovery\n"));
    /// assert!(yaml.contains("\n---\n"));
    /// assert!(yaml.ends_with(
    ///     "metadata:\n  name: my-operator-member\nrules:\n\
    ///      - apiGroups:\n  - \"\"\n  resources:\n  - configmaps\n  verbs:\n  - get\n  - list\n  - watch\n"
    /// ));
    /// ```
    pub fn to_yaml(&self, name: &str) -> String {
        let member = format!("{name}-member");
        let mut yaml = String::new();
        self.write_role(&mut yaml, name, Scope::Local, "for the local cluster");
        yaml.push_str("---\n");
        self.write_role(
            &mut yaml,
            &member,
            Scope::Members,
            "for every member cluster",
        );
        yaml
    }

    fn write_role(&self, yaml: &mut String, name: &str, scope: Scope, what: &str) {
        comment(yaml, &format!("ClusterRole {name}: {what}"));
        for note in &self.notes {
            comment(yaml, note);
        }
        yaml.push_str("apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\n");
        let _ = writeln!(yaml, "metadata:\n  name: {}", scalar(name));
        let rules = self.rules(scope);
        if rules.is_empty() {
            yaml.push_str("rules: []\n");
            return;
        }
        yaml.push_str("rules:\n");
        for rule in rules {
            let fields = [
                ("apiGroups", &rule.api_groups),
                ("resources", &rule.resources),
                ("verbs", &rule.verbs),
            ];
            for (i, (field, values)) in fields.into_iter().enumerate() {
                let lead = if i == 0 { "- " } else { "  " };
                let _ = writeln!(yaml, "{lead}{field}:");
                for value in values {
                    let _ = writeln!(yaml, "  - {}", scalar(value));
                }
            }
        }
    }
}

/// `text` as YAML comment lines: one per line of it, split at every
/// character YAML reads as a line break, so none of it escapes the comment.
fn comment(yaml: &mut String, text: &str) {
    let breaks = ['\n', '\r', '\u{85}', '\u{2028}', '\u{2029}'];
    let text = text.replace("\r\n", "\n");
    for line in text.trim_end_matches(breaks).split(breaks) {
        match line {
            "" => yaml.push_str("#\n"),
            line => {
                let _ = writeln!(yaml, "# {line}");
            }
        }
    }
}

/// `value` as a YAML scalar: plain where YAML reads it back as the same
/// string (a lower-case name such as `configmaps` or `apps`), else double
/// quoted (`""`, `*`, `true`, anything with other characters).
fn scalar(value: &str) -> String {
    const WORDS: [&str; 11] = [
        "y", "n", "yes", "no", "on", "off", "true", "false", "null", "nan", "inf",
    ];
    let plain = value.starts_with(|c: char| c.is_ascii_lowercase())
        && value
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "-./".contains(c))
        && !WORDS.contains(&value);
    if plain {
        value.to_owned()
    } else {
        // A JSON string is a YAML double-quoted scalar.
        serde_json::Value::from(value).to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_merge_per_group_and_resource_with_sorted_unique_verbs() {
        let rules = normalized(&[
            Rule::new("", "secrets", ["watch"]),
            Rule::new("", "configmaps", ["list", "get"]),
            Rule {
                api_groups: vec!["".into(), "apps".into()],
                resources: vec!["configmaps".into()],
                verbs: vec!["get".into(), "watch".into()],
            },
            Rule::new("apps", "deployments", ["patch", "*"]),
        ]);
        assert_eq!(
            rules,
            [
                Rule::new("", "configmaps", ["get", "list", "watch"]),
                Rule::new("", "secrets", ["watch"]),
                Rule::new("apps", "configmaps", ["get", "watch"]),
                Rule::new("apps", "deployments", ["*"]),
            ]
        );
    }

    #[test]
    fn scalars_are_quoted_where_yaml_would_read_them_otherwise() {
        assert_eq!(scalar("configmaps"), "configmaps");
        assert_eq!(scalar("coordination.k8s.io"), "coordination.k8s.io");
        assert_eq!(scalar("deployments/status"), "deployments/status");
        assert_eq!(scalar(""), "\"\"");
        assert_eq!(scalar("*"), "\"*\"");
        assert_eq!(scalar("on"), "\"on\"");
        assert_eq!(scalar("1.5"), "\"1.5\"");
        assert_eq!(scalar("My Operator: \"x\""), r#""My Operator: \"x\"""#);
    }

    #[test]
    fn notes_become_comment_lines_each() {
        let mut permissions = Permissions::new();
        permissions.note("one\r\n\ntwo\n");
        permissions.note("one\r\n\ntwo\n");
        let yaml = permissions.to_yaml("op");
        assert_eq!(yaml.matches("# one\n#\n# two\n").count(), 2, "{yaml}");
        assert!(yaml.contains("name: op-member\nrules: []\n"), "{yaml}");
    }
}
