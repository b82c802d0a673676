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
//! The parent's finalizer does not wait for clusters that are down: what
//! [`Children::delete`] skips there, [`Children::sweep`] and
//! [`Children::release`] delete later, when the parent's reconcile runs
//! again, which the children's watch, [`Children::sweeps`] and a cluster
//! engaged again make sure of. The book's chapter on cross-cluster mapping
//! and ownership (`docs/cross-cluster.md`) says when each applies, what a
//! released parent changes, and what it costs; for all of it, the
//! controller must [`owns_across`](crate::Controller::owns_across) the
//! children with the [`Watch`](crate::controller::Watch) its [`Children`]
//! read, and its reconcile call [`Children::sweep`] when the request's
//! object is gone and [`Children::release`] when it is unwanted:
//!
//! ```no_run
//! use std::time::Duration;
//!
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use kube::{Api, ResourceExt, api::{Patch, PatchParams}, runtime::watcher};
//! use kube_multicluster::{
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
mod cleanup;
pub(crate) mod parent;

pub use crate::client::OwnerReferenceAcross;
pub use children::Children;
pub use cleanup::Deleted;
pub use parent::{PARENT_ANNOTATION, PARENT_UID_LABEL, ParentRef, ParentRefError};
