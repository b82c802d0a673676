//! What else a controller watches (the types it owns, and the types whose
//! changes map to its objects, in the same cluster or across the fleet),
//! what it writes, and the RBAC rules all of that needs.

use std::sync::Arc;

use kube::{
    Resource,
    core::{ApiResource, PartialObjectMeta},
};

use super::{
    ClusterSelector, Controller, Owner, Watch, permissions,
    trigger::{self, Trigger, WatchTrigger, Watched},
    watch::Resolved,
};
use crate::{
    cache::{Change, Watchable},
    cluster_name::ClusterName,
    rbac::Permissions,
    request::{McRequest, ObjectKey},
};

impl<K: Watchable> Controller<K> {
    /// Adds a trigger for `T`, watched as `watch` says, with `mapper`, whose
    /// requests go to the clusters `across` selects when it is `Some`; a
    /// watch built wrong is recorded, and reported when the controller runs.
    fn add_trigger<T, M>(
        mut self,
        watch: Watch,
        across: Option<(ClusterSelector, trigger::KeyMapper<T>)>,
        mapper: impl FnOnce(&Owner) -> M,
    ) -> Self
    where
        T: Watchable,
        M: Fn(&ClusterName, &Change<T>) -> Vec<McRequest> + Send + Sync + 'static,
    {
        match Resolved::<T>::from(watch) {
            Ok(watch) => {
                let related = Some(watch.kind());
                self.triggers.push(Arc::new(WatchTrigger {
                    watch,
                    mapper: Arc::new(mapper(&self.owner)),
                    filters: Vec::new(),
                    related,
                    across,
                }));
            }
            Err(problem) => self.problems.push(problem),
        }
        self
    }

    /// Also reconciles the owner of every `Child` (by owner reference, same
    /// cluster) when the child changes.
    pub fn owns<Child: Watchable>(self, watch: impl Into<Watch>) -> Self {
        self.add_trigger(watch.into(), None, |owner| {
            trigger::for_owners::<Child>(
                owner.kind.clone(),
                owner.api_version.clone(),
                owner.namespaced,
            )
        })
    }

    /// Also reconciles the parent of every `Child` that names a `K` as its
    /// parent through [`PARENT_ANNOTATION`](crate::ownership::PARENT_ANNOTATION),
    /// in whichever cluster the child lives (see [`Watch::in_clusters`]):
    /// the parent's request names the parent's own cluster. See
    /// [`ownership`](crate::ownership) for making such children and cleaning
    /// them up.
    ///
    /// Name the clusters the children live in with [`Watch::in_clusters`]:
    /// without it the watch runs in the controller's own clusters only,
    /// while a [`Children`](crate::ownership::Children) given the same
    /// `Watch` reads every cluster.
    pub fn owns_across<Child: Watchable>(self, watch: impl Into<Watch>) -> Self
    where
        K: kube::Resource<DynamicType = ()>,
    {
        self.add_trigger(watch.into(), None, |_| {
            |_: &ClusterName, change: &Change<Child>| {
                crate::ownership::parent::parents_of::<K, Child>(change.object().as_ref())
                    .into_iter()
                    .collect()
            }
        })
    }

    /// Like [`owns`](Self::owns), but watches only the children's metadata.
    pub fn owns_metadata<Child: Watchable>(self, watch: impl Into<Watch>) -> Self {
        self.add_trigger(watch.into(), None, |owner| {
            trigger::for_owners::<PartialObjectMeta<Child>>(
                owner.kind.clone(),
                owner.api_version.clone(),
                owner.namespaced,
            )
        })
    }

    /// Also reconciles whatever `mapper` returns when an `Other` object
    /// changes in a cluster where it is watched (see [`Watch::in_clusters`]).
    /// The requests may name another cluster than the one the change came
    /// from: this is how a change in one cluster makes work in another.
    /// With [`run`](Self::run), a request must name a cluster where the
    /// controller watches `K` (others are dropped with a warning).
    ///
    /// ```no_run
    /// # use k8s_openapi::api::core::v1::{ConfigMap, Secret};
    /// # use kube::runtime::watcher;
    /// # use kube_multicluster::{Controller, Fleet, McRequest};
    /// # fn example(fleet: &Fleet, members: Vec<String>) {
    /// // A Secret in the hub asks for a ConfigMap of the same name in every member.
    /// Controller::<ConfigMap>::new(fleet, watcher::Config::default())
    ///     .watches::<Secret, _>(watcher::Config::default(), move |cluster, secret| {
    ///         let name = secret.metadata.name.clone().unwrap_or_default();
    ///         members.iter()
    ///             .filter(|_| cluster == "hub")
    ///             .map(|m| McRequest::new(m.as_str(), Some("default"), name.clone()))
    ///             .collect::<Vec<_>>()
    ///     });
    /// # }
    /// ```
    pub fn watches<Other, I>(
        self,
        watch: impl Into<Watch>,
        mapper: impl Fn(&ClusterName, &Other) -> I + Send + Sync + 'static,
    ) -> Self
    where
        Other: Watchable,
        I: IntoIterator<Item = McRequest>,
    {
        self.add_trigger(watch.into(), None, |_| {
            move |cluster: &ClusterName, change: &Change<Other>| {
                mapper(cluster, change.object()).into_iter().collect()
            }
        })
    }

    /// Like [`watches`](Self::watches), but watches only `Other`'s metadata.
    pub fn watches_metadata<Other, I>(
        self,
        watch: impl Into<Watch>,
        mapper: impl Fn(&ClusterName, &PartialObjectMeta<Other>) -> I + Send + Sync + 'static,
    ) -> Self
    where
        Other: Watchable,
        I: IntoIterator<Item = McRequest>,
    {
        self.add_trigger(watch.into(), None, |_| {
            move |cluster: &ClusterName, change: &Change<PartialObjectMeta<Other>>| {
                mapper(cluster, change.object()).into_iter().collect()
            }
        })
    }

    /// Also reconciles, in every cluster `to` selects, the objects `mapper`
    /// names when an `Other` object changes in a cluster where it is watched
    /// (see [`Watch::in_clusters`]): a change in one cluster makes work in
    /// all of a set of others. `to` is read when the change is taken in, so
    /// the requests go to the clusters engaged then, and a cluster that
    /// joins later is given the requests that every `Other` object already
    /// watched makes, as soon as it joins. Only clusters where the
    /// controller watches `K` take part (others `to` selects are skipped).
    ///
    /// A hub ConfigMap that every member cluster should hold a copy of:
    ///
    /// ```no_run
    /// # use k8s_openapi::api::core::v1::ConfigMap;
    /// # use kube::runtime::watcher;
    /// # use kube_multicluster::{Controller, Fleet, ObjectKey, controller::{ClusterSelector, Watch}};
    /// # fn example(fleet: &Fleet) -> Controller<ConfigMap> {
    /// let in_hub = Watch::new(watcher::Config::default().labels("copy=everywhere"))
    ///     .in_clusters(ClusterSelector::Local);
    /// Controller::<ConfigMap>::new(fleet, watcher::Config::default())
    ///     .clusters(ClusterSelector::Provided)
    ///     .watches_across::<ConfigMap, _>(in_hub, ClusterSelector::Provided, |_hub, source| {
    ///         [ObjectKey::of(source)]
    ///     })
    /// # }
    /// ```
    pub fn watches_across<Other, I>(
        self,
        watch: impl Into<Watch>,
        to: ClusterSelector,
        mapper: impl Fn(&ClusterName, &Other) -> I + Send + Sync + 'static,
    ) -> Self
    where
        Other: Watchable,
        I: IntoIterator<Item = ObjectKey>,
    {
        let keys: trigger::KeyMapper<Other> =
            Arc::new(move |cluster, object| mapper(cluster, object).into_iter().collect());
        self.add_trigger(watch.into(), Some((to, keys)), |_| {
            |_: &ClusterName, _: &Change<Other>| Vec::new()
        })
    }

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
    /// use kube_multicluster::{Controller, Fleet, controller::{ClusterSelector, Watch}};
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
        let own = self
            .for_trigger
            .iter()
            .map(|own| (own.watched(), &self.clusters));
        let related = self.triggers.iter().map(|trigger| {
            let clusters = trigger.clusters().unwrap_or(&self.clusters);
            (trigger.watched(), clusters)
        });
        permissions::needed(own.chain(related), &self.writes, &self.clusters)
    }

    /// Declares that the reconciler does `verbs` to `W` objects, in the
    /// clusters the controller works in, for [`permissions`](Self::permissions).
    /// The verbs are Kubernetes' ([`rbac::VERBS`](crate::rbac::VERBS)); any other is reported
    /// as [`Error::Invalid`](super::Error::Invalid) when the controller
    /// runs. Rights needed elsewhere (a hub's controller that writes in its
    /// members) are added to the [`Permissions`] by hand
    /// ([`Permissions::grant`]).
    ///
    /// ```
    /// use k8s_openapi::api::core::v1::ConfigMap;
    /// use kube::runtime::watcher;
    /// use kube_multicluster::{Controller, Fleet, rbac::{Rule, Scope}};
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
        let (known, problem) = permissions::verbs_of(kind, verbs);
        self.problems.extend(problem);
        self.writes.push((written, known));
        self
    }
}
