//! The RBAC rules a controller needs: reads from its watches, writes as
//! declared (`Controller::permissions`, built in `relations.rs`).

use super::{ClusterSelector, trigger::Watched};
use crate::rbac::{self, Permissions, Rule, Scope};

/// The rules for reading what `watched` names, each in the clusters its
/// watch runs in, and for the `writes` declared, in the controller's
/// `clusters`.
pub(super) fn needed<'a>(
    watched: impl Iterator<Item = (Watched, &'a ClusterSelector)>,
    writes: &[(Watched, Vec<String>)],
    clusters: &ClusterSelector,
) -> Permissions {
    let mut permissions = Permissions::new();
    for (watched, clusters) in watched {
        grant(&mut permissions, &watched, &rbac::READ, clusters);
    }
    for (written, verbs) in writes {
        grant(&mut permissions, written, verbs, clusters);
    }
    permissions
}

/// The verbs Kubernetes has among `verbs`, and a problem naming the others
/// (for writes of `kind`), if any.
pub(super) fn verbs_of(kind: &str, verbs: &[&str]) -> (Vec<String>, Option<String>) {
    let (known, unknown): (Vec<&str>, Vec<&str>) =
        verbs.iter().partition(|verb| rbac::is_verb(verb));
    let problem = (!unknown.is_empty()).then(|| {
        format!(
            "writes of {kind} name verbs Kubernetes does not have: {unknown:?} (it has {})",
            rbac::VERBS.join(", ")
        )
    });
    (known.into_iter().map(str::to_owned).collect(), problem)
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
