//! The RBAC rules a controller needs: reads from its watches, writes as
//! declared.

use kube::{Resource, core::ApiResource};

use super::{
    ClusterSelector, Controller,
    trigger::{Trigger, Watched},
};
use crate::{
    cache::Watchable,
    rbac::{self, Permissions, Rule, Scope},
};

impl<K: Watchable> Controller<K> {
    /// The RBAC rules this controller needs, as built so far: `get`, `list`
    /// and `watch` on every type it watches (its own, and each type it
    /// [`owns`](Self::owns) or [`watches`](Self::watches), metadata-only or
    /// not), in the clusters each watch runs in; and what it
    /// [`writes`](Self::writes), in the clusters it [works
    /// in](Self::clusters). Rules for [`ClusterSelector::Local`] go to the local
    /// cluster's set, for [`ClusterSelector::Provided`] to the members', for
    /// [`ClusterSelector::All`] and [`ClusterSelector::Matching`] to both (a filter may
    /// select any cluster).
    ///
    /// A `DynamicObject` watch of a kind that discovery resolves
    /// ([`Watch::discover`](super::Watch::discover)) has no resource name
    /// until it runs: it gets a note, not a rule. A watch limited to one
    /// namespace ([`Watch::in_namespace`](super::Watch::in_namespace)) is
    /// granted cluster-wide here; a Role in that namespace would do.
    ///
    /// ```
    /// use k8s_openapi::api::core::v1::{ConfigMap, Secret};
    /// use kube::{discovery::Scope as KindScope, runtime::watcher};
    /// use kube_fleet::{Controller, Fleet, controller::{ClusterSelector, Watch}};
    ///
    /// let controller = Controller::<ConfigMap>::new(&Fleet::new(), watcher::Config::default())
    ///     .watches::<Secret, _>(Watch::default().in_clusters(ClusterSelector::Local), |_, _| None)
    ///     .watches_metadata::<kube::api::DynamicObject, _>(
    ///         Watch::default()
    ///             .in_clusters(ClusterSelector::Provided)
    ///             .discover("example.com", "Widget", KindScope::Namespaced),
    ///         |_, _| None,
    ///     )
    ///     .writes::<ConfigMap>(&["patch"])
    ///     .records_events();
    /// let yaml = controller.permissions().to_yaml("my-operator");
    /// let (local, member) = yaml.split_once("---\n").unwrap();
    /// assert!(local.contains(
    ///     "- apiGroups:\n  - \"\"\n  resources:\n  - configmaps\n  verbs:\n  - get\n  - list\n  - patch\n  - watch\n"
    /// ));
    /// assert!(local.contains("  resources:\n  - secrets\n  verbs:\n  - get\n  - list\n  - watch\n"));
    /// assert!(local.contains(
    ///     "- apiGroups:\n  - events.k8s.io\n  resources:\n  - events\n  verbs:\n  - create\n  - patch\n"
    /// ));
    /// assert!(!member.contains("secrets"));
    /// assert!(member.contains("\n# kind Widget in group example.com is resolved by discovery"));
    /// ```
    pub fn permissions(&self) -> Permissions {
        let mut permissions = Permissions::new();
        let own = self
            .for_trigger
            .iter()
            .map(|own| (own.watched(), &self.clusters));
        let related = self.triggers.iter().map(|trigger| {
            let clusters = trigger.clusters().unwrap_or(&self.clusters);
            (trigger.watched(), clusters)
        });
        for (watched, clusters) in own.chain(related) {
            grant(&mut permissions, &watched, &rbac::READ, clusters);
        }
        for (written, verbs) in &self.writes {
            grant(&mut permissions, written, verbs, &self.clusters);
        }
        permissions
    }

    /// Declares that the reconciler does `verbs` to `W` objects, in the
    /// clusters the controller works in, for [`permissions`](Self::permissions).
    /// The verbs are Kubernetes' ([`rbac::VERBS`]); any other is reported
    /// as [`Error::Invalid`](super::Error::Invalid) when the controller
    /// runs. Rights needed elsewhere (a hub's controller that writes in its
    /// members) are added to the [`Permissions`] by hand
    /// ([`Permissions::grant`]).
    ///
    /// ```
    /// use k8s_openapi::api::core::v1::ConfigMap;
    /// use kube::runtime::watcher;
    /// use kube_fleet::{Controller, Fleet, rbac::{Rule, Scope}};
    ///
    /// let controller = Controller::<ConfigMap>::new(&Fleet::new(), watcher::Config::default())
    ///     .writes::<ConfigMap>(&["patch", "update"]);
    /// assert_eq!(
    ///     controller.permissions().rules(Scope::Local),
    ///     [Rule::new("", "configmaps", ["get", "list", "patch", "update", "watch"])]
    /// );
    /// ```
    pub fn writes<W: Resource<DynamicType = ()>>(self, verbs: &[&str]) -> Self {
        let written = Watched::of::<W>(&());
        self.write(written, &W::kind(&()), verbs)
    }

    /// Like [`writes`](Self::writes), for the type `resource` describes.
    pub fn writes_with(self, resource: &ApiResource, verbs: &[&str]) -> Self {
        let written = Watched::of::<kube::api::DynamicObject>(resource);
        self.write(written, &resource.kind, verbs)
    }

    /// Declares that the reconciler records Kubernetes events: `create`
    /// and `patch` on `events.k8s.io` events, in the clusters the
    /// controller works in, for [`permissions`](Self::permissions).
    pub fn records_events(self) -> Self {
        let events = Watched::Resource {
            group: "events.k8s.io".to_owned(),
            plural: "events".to_owned(),
        };
        self.write(events, "Event", &["create", "patch"])
    }

    fn write(mut self, written: Watched, kind: &str, verbs: &[&str]) -> Self {
        let (known, unknown): (Vec<&str>, Vec<&str>) =
            verbs.iter().partition(|verb| rbac::is_verb(verb));
        if !unknown.is_empty() {
            self.problems.push(format!(
                "writes of {kind} name verbs Kubernetes does not have: {unknown:?} (it has {})",
                rbac::VERBS.join(", ")
            ));
        }
        let known = known.into_iter().map(str::to_owned).collect();
        self.writes.push((written, known));
        self
    }
}

/// Grants `verbs` on `resource` in `clusters`; for a resource that each
/// cluster's discovery names, notes what to grant instead.
fn grant(
    permissions: &mut Permissions,
    resource: &Watched,
    verbs: &[impl AsRef<str>],
    clusters: &ClusterSelector,
) {
    let scopes: &[Scope] = match clusters {
        ClusterSelector::Local => &[Scope::Local],
        ClusterSelector::Provided => &[Scope::Members],
        ClusterSelector::All | ClusterSelector::Matching(_) => &[Scope::Local, Scope::Members],
    };
    let verbs = verbs.iter().map(AsRef::as_ref);
    match resource {
        Watched::Resource { group, plural } => {
            for scope in scopes {
                permissions.grant(*scope, Rule::new(group, plural, verbs.clone()));
            }
        }
        Watched::Discovered { group, kind } => {
            let group = match group.as_str() {
                "" => "the core group".to_owned(),
                group => format!("group {group}"),
            };
            let clusters = match scopes {
                [Scope::Local] => "the local cluster",
                [Scope::Members] => "the member clusters",
                _ => "the local and member clusters",
            };
            let verbs = verbs.collect::<Vec<_>>().join(", ");
            permissions.note(format!(
                "kind {kind} in {group} is resolved by discovery: grant {verbs} on its resource in {clusters}"
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::{
        apps::v1::Deployment,
        core::v1::{ConfigMap, Secret},
    };
    use kube::{api::DynamicObject, core::discovery::Scope as KindScope, runtime::watcher};

    use crate::{
        controller::{ClusterSelector, Controller, Error, Watch},
        fleet::Fleet,
        rbac::{Rule, Scope},
    };

    #[test]
    fn each_watch_is_granted_reads_in_the_clusters_it_runs_in() {
        let fleet = Fleet::new();
        let permissions = Controller::<ConfigMap>::new(
            &fleet,
            Watch::default().in_clusters(ClusterSelector::Provided),
        )
        .owns_metadata::<Secret>(watcher::Config::default())
        .watches::<Deployment, _>(
            Watch::default().in_clusters(ClusterSelector::Local),
            |_, _| None,
        )
        .watches::<DynamicObject, _>(
            Watch::default()
                .in_clusters(ClusterSelector::matching(|name| name == "east"))
                .resource(
                    kube::api::ApiResource::erase::<Deployment>(&()),
                    KindScope::Namespaced,
                ),
            |_, _| None,
        )
        .permissions();
        let read = ["get", "list", "watch"];
        assert_eq!(
            permissions.rules(Scope::Local),
            [Rule::new("apps", "deployments", read)]
        );
        assert_eq!(
            permissions.rules(Scope::Members),
            [
                Rule::new("", "configmaps", read),
                Rule::new("", "secrets", read),
                Rule::new("apps", "deployments", read),
            ]
        );
        assert!(permissions.notes.is_empty());
    }

    #[test]
    fn a_kind_resolved_by_discovery_is_a_note_not_a_rule() {
        let permissions = Controller::<DynamicObject>::new(
            &Fleet::new(),
            Watch::default()
                .in_clusters(ClusterSelector::Local)
                .discover("", "Widget", KindScope::Namespaced),
        )
        .permissions();
        assert!(permissions.local.is_empty() && permissions.members.is_empty());
        assert_eq!(
            permissions.notes,
            [
                "kind Widget in the core group is resolved by discovery: grant get, list, watch on its resource in the local cluster"
            ]
        );
    }

    #[test]
    fn writes_follow_the_controller_clusters_chosen_after_them() {
        let permissions = Controller::<ConfigMap>::new(&Fleet::new(), watcher::Config::default())
            .writes::<Secret>(&["create", "delete", "create"])
            .records_events()
            .clusters(ClusterSelector::Local)
            .permissions();
        assert!(permissions.members.is_empty());
        assert_eq!(
            permissions.rules(Scope::Local),
            [
                Rule::new("", "configmaps", ["get", "list", "watch"]),
                Rule::new("", "secrets", ["create", "delete"]),
                Rule::new("events.k8s.io", "events", ["create", "patch"]),
            ]
        );
    }

    #[tokio::test]
    async fn an_unknown_verb_is_reported_when_the_controller_runs() {
        let controller = Controller::<ConfigMap>::new(&Fleet::new(), watcher::Config::default())
            .writes::<ConfigMap>(&["patch", "pach"]);
        assert_eq!(
            controller.permissions().rules(Scope::Local),
            [Rule::new(
                "",
                "configmaps",
                ["get", "list", "patch", "watch"]
            )]
        );
        let ran = controller
            .run(tower::service_fn(
                |_: crate::object_request::ObjectRequest<ConfigMap>| async {
                    Ok::<_, tower::BoxError>(crate::action::Action::await_change())
                },
            ))
            .await;
        let Err(Error::Invalid { reason, .. }) = ran else {
            panic!("ran: {ran:?}");
        };
        assert!(
            reason.contains("\"pach\"") && reason.contains("ConfigMap"),
            "{reason}"
        );
    }
}
