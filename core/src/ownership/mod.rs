//! Owners in one cluster of objects in others, which Kubernetes' owner
//! references cannot express (they name an object of the same cluster).
//!
//! A child made for a parent in another cluster carries the parent's
//! reference as an annotation, [`PARENT_ANNOTATION`] (its cluster, API
//! version, kind, namespace, name and UID, as JSON), and the parent's UID as
//! a label, [`PARENT_UID_LABEL`], to select the children of one parent by.
//! [`ParentRef::adopt`] sets both. Then:
//!
//! - [`Controller::owns_across`](crate::Controller::owns_across) reconciles
//!   the parent whenever one of its children changes or goes, in whichever
//!   cluster it lives;
//! - [`Children::of`] finds a parent's children in every cluster, from the
//!   clusters' caches;
//! - [`Children::delete`], called from the parent's finalizer cleanup,
//!   deletes them in every engaged cluster;
//! - [`Children::sweep`] deletes the children of a parent that is gone, or
//!   was made again under the same name (another UID).
//!
//! # Clusters that are down when a parent goes
//!
//! The parent's finalizer does not wait for them. [`Children::delete`]
//! deletes in every engaged cluster whose API server answers within its
//! timeout, and reports the others as skipped (not read yet, its watch not
//! synced, or no answer: a connection error, the timeout, or a gateway's
//! 502 to 504) rather than failing. A server that answers with an error
//! (forbidden, a server error) fails the cleanup, which is then retried.
//! The parent's deletion is recorded where it cannot be lost: each child
//! carries its parent's UID, and a parent that no longer exists under that
//! UID proves the child an orphan. A skipped child is deleted by
//! [`Children::sweep`] in the parent's reconcile, which runs again for it:
//!
//! - when its cluster is engaged again (by its provider, or after a restart)
//!   or is served for the first time: the controller is told of every child
//!   there, and each wakes its parent;
//! - while its cluster stays engaged: [`Children::sweeps`] asks for the
//!   parent again until the cluster's watch has synced and holds no child
//!   naming it (wire it with `reconcile_on`, and call `sweep` on every run
//!   of the parent's reconcile that finds it gone, and `release` on every
//!   run that finds it unwanted, so that each request does the work).
//!
//! A parent that is *released* rather than deleted
//! ([`ObjectRequest::finalize_if`](crate::ObjectRequest::finalize_if) with
//! `wanted` false) still exists, so its
//! UID proves nothing: for it, [`Children::delete`] fails while a cluster
//! whose store holds its children gives no answer, and the finalizer stays
//! until that cluster was reached. Once the finalizer is gone,
//! [`Children::release`], called on every run that finds the parent
//! unwanted, deletes the children that show up later (in a cluster whose
//! children were not known yet, or made a moment before the release).
//!
//! The same holds for a child that reaches its cluster's store after the
//! cleanup read the stores (made a moment before the parent went): it wakes
//! its parent, whose sweep deletes it (or, for a released parent, its
//! [`Children::release`]). Both need the controller to
//! [`owns_across`](crate::Controller::owns_across) the children with the
//! [`Watch`](crate::controller::Watch) the [`Children`] read, and its reconcile to call
//! [`Children::sweep`] when the request's object is gone and
//! [`Children::release`] when it is unwanted.
//!
//! A child whose parent's cluster is not engaged is left alone until it is:
//! nothing can tell whether its parent still exists.
//!
//! The controller is told of a member's children once it serves that
//! member: once every one of its watches there has synced. In a member
//! where another of its watches cannot sync, children are noticed only
//! through [`Children::sweeps`], whose record is in memory; keep the
//! children's watch the controller's only one in the members, or every
//! watch there syncable.
//!
//! ```no_run
//! use std::time::Duration;
//!
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use kube::{Api, ResourceExt, api::{Patch, PatchParams}, runtime::watcher};
//! use kube_fleet::{
//!     Action, Controller, Fleet, ObjectRequest,
//!     controller::{ClusterSelector, Watch},
//!     finalizer::Event,
//!     ownership::{Children, ParentRef},
//! };
//! use tower::BoxError;
//!
//! # async fn example(fleet: Fleet) -> Result<(), BoxError> {
//! // Parents: ConfigMaps labelled `copy=yes` in the local cluster (watched
//! // without a selector, so that one whose label goes is seen and released).
//! // Children: their copies in the members, labelled `copy-of-hub=yes`.
//! let copies = Watch::new(watcher::Config::default().labels("copy-of-hub=yes")).in_clusters(ClusterSelector::Provided);
//! let children = Children::<ConfigMap>::new(&fleet, copies.clone());
//! let controller = Controller::<ConfigMap>::new(&fleet, Watch::new(watcher::Config::default()))
//!     .clusters(ClusterSelector::Local)
//!     .owns_across::<ConfigMap>(copies) // a copy changed or deleted wakes its parent
//!     .reconcile_on(children.sweeps(Duration::from_secs(30))); // members that were down
//! let reconcile = move |request: ObjectRequest<ConfigMap>| {
//!     let (children, fleet) = (children.clone(), fleet.clone());
//!     async move {
//!         if request.object.is_none() {
//!             children.sweep(&request).await?; // the parent is gone: its orphans go too
//!             return Ok(Action::await_change());
//!         }
//!         let wanted = request.object.as_ref().is_some_and(|p| p.labels().get("copy").is_some_and(|v| v == "yes"));
//!         if !wanted && !request.object.as_ref().is_some_and(|p| p.finalizers().iter().any(|f| f == "example.com/copies")) {
//!             children.release(&request).await?; // released: copies that show up later go too
//!         }
//!         request
//!             .finalize_if(wanted, "example.com/copies", |event| async {
//!                 match event {
//!                     Event::Apply(parent) => {
//!                         children.sweep(&request).await?; // copies of an earlier parent of this name
//!                         let parent_ref = ParentRef::of(request.cluster.name(), parent.as_ref())?;
//!                         for member in fleet.clusters().iter().filter(|c| !c.name().is_local()) {
//!                             let mut copy = ConfigMap { data: parent.data.clone(), ..Default::default() };
//!                             copy.metadata.name = parent.metadata.name.clone();
//!                             copy.labels_mut().insert("copy-of-hub".into(), "yes".into());
//!                             parent_ref.adopt(&mut copy);
//!                             Api::<ConfigMap>::namespaced(member.client(), "default")
//!                                 .patch(copy.metadata.name.as_deref().unwrap(), &PatchParams::apply("copier").force(), &Patch::Apply(&copy))
//!                                 .await?;
//!                         }
//!                     }
//!                     Event::Cleanup(_) => {
//!                         children.delete(&request, Duration::from_secs(10)).await?;
//!                     }
//!                 }
//!                 Ok(Action::await_change())
//!             })
//!             .await
//!     }
//! };
//! controller.run(tower::service_fn(reconcile)).await?;
//! # Ok(())
//! # }
//! ```

mod children;
pub(crate) mod parent;

pub use children::{Children, Deleted};
pub use parent::{PARENT_ANNOTATION, PARENT_UID_LABEL, ParentRef, ParentRefError};
