//! A finalizer for a reconciler's own objects, with kube-runtime's
//! semantics, answering the fleet's [`Action`] and taking [`BoxError`]s.
//!
//! [`finalizer`] (or [`ObjectRequest::finalize`] from a reconcile) makes
//! sure that cleanup runs before an object goes:
//!
//! - an object that lacks the finalizer and is not being deleted is given
//!   it, and nothing else happens in this run (the write changes the object,
//!   so it is reconciled again, now with the finalizer);
//! - an object that has it and is not being deleted is handed to the
//!   reconciler as [`Event::Apply`];
//! - an object being deleted that has it is handed over as
//!   [`Event::Cleanup`]; once cleanup succeeds the finalizer is removed, and
//!   the API server deletes the object when no other finalizer holds it;
//! - an object being deleted without it is left alone.
//!
//! The finalizer is added and removed by JSON patches that test its place
//! first, so a concurrent change of the object's finalizers makes the write
//! fail (and the key retry) rather than drop someone else's finalizer.
//! Errors from the reconciler come back unchanged, so a
//! [`TerminalError`](crate::TerminalError) stays terminal.
//!
//! ```no_run
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use kube_multicluster::{Action, ObjectRequest, finalizer::Event};
//! use tower::BoxError;
//!
//! async fn reconcile(request: ObjectRequest<ConfigMap>) -> Result<Action, BoxError> {
//!     request
//!         .finalize("example.com/cleanup", |event| async move {
//!             match event {
//!                 Event::Apply(config_map) => { /* create what it describes */ }
//!                 Event::Cleanup(config_map) => { /* delete what it made, wherever it is */ }
//!             }
//!             Ok(Action::await_change())
//!         })
//!         .await
//! }
//! # drop(tower::service_fn(reconcile));
//! ```

use std::{fmt::Debug, future::Future, sync::Arc};

use json_patch::{AddOperation, PatchOperation, RemoveOperation, TestOperation};
use kube::{
    Api, Resource, ResourceExt,
    api::{Patch, PatchParams},
};
use serde::{Serialize, de::DeserializeOwned};
use tower::BoxError;

use crate::{action::Action, object_request::ObjectRequest};

/// What the reconciler is asked to do with the object.
#[derive(Debug)]
pub enum Event<K> {
    /// The object exists and carries the finalizer: make the world match it.
    Apply(Arc<K>),
    /// The object is being deleted (or, with
    /// [`finalize_if`](crate::ObjectRequest::finalize_if), is no longer the
    /// reconciler's): undo what it made. The finalizer is
    /// removed once this succeeds; on an error it stays, and the cleanup
    /// is retried.
    Cleanup(Arc<K>),
}

/// Adding or removing the finalizer failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The finalizer could not be added.
    #[error("adding finalizer {finalizer} to {object}: {source}")]
    Add {
        /// The finalizer.
        finalizer: String,
        /// The object, as `kind namespace/name`.
        object: String,
        /// The API server's error.
        source: kube::Error,
    },
    /// The finalizer could not be removed after cleanup.
    #[error("removing finalizer {finalizer} from {object} after cleanup: {source}")]
    Remove {
        /// The finalizer.
        finalizer: String,
        /// The object, as `kind namespace/name`.
        object: String,
        /// The API server's error.
        source: kube::Error,
    },
    /// The object has no name, so no write can reach it.
    #[error("{0} has no name")]
    Unnamed(String),
}

/// Runs `reconcile` under the finalizer `name` on `object`, written through
/// `api`: see the [module docs](self).
pub async fn finalizer<K, F, Fut>(
    api: &Api<K>,
    name: &str,
    object: Arc<K>,
    reconcile: F,
) -> Result<Action, BoxError>
where
    K: Resource + Clone + DeserializeOwned + Serialize + Debug,
    K::DynamicType: Default,
    F: FnOnce(Event<K>) -> Fut,
    Fut: Future<Output = Result<Action, BoxError>>,
{
    run(api, name, object, true, reconcile).await
}

/// [`finalizer`], writing through `api` (of `K`, or of its objects as
/// dynamic ones); an object that is not `wanted` is treated as one being
/// deleted.
async fn run<A, K, F, Fut>(
    api: &Api<A>,
    name: &str,
    object: Arc<K>,
    wanted: bool,
    reconcile: F,
) -> Result<Action, BoxError>
where
    A: Clone + DeserializeOwned + Debug,
    K: Resource,
    K::DynamicType: Default,
    F: FnOnce(Event<K>) -> Fut,
    Fut: Future<Output = Result<Action, BoxError>>,
{
    let patch = |object_name: String, patch: json_patch::Patch| async move {
        api.patch::<()>(&object_name, &PatchParams::default(), &Patch::Json(patch))
            .await
            .map(drop)
    };
    let described = kind_and_name(object.as_ref());
    let Some(object_name) = object.meta().name.clone() else {
        return Err(Error::Unnamed(described).into());
    };
    let deleting = object.meta().deletion_timestamp.is_some() || !wanted;
    let place = object.finalizers().iter().position(|f| f == name);
    match (deleting, place) {
        (false, Some(_)) => reconcile(Event::Apply(object)).await,
        (true, Some(at)) => {
            let action = reconcile(Event::Cleanup(object)).await?;
            let path = format!("/metadata/finalizers/{at}");
            let test = PatchOperation::Test(TestOperation {
                path: path.parse().expect("a JSON pointer"),
                value: name.into(),
            });
            let remove = PatchOperation::Remove(RemoveOperation {
                path: path.parse().expect("a JSON pointer"),
            });
            let removed = patch(object_name, json_patch::Patch(vec![test, remove])).await;
            // Gone already: a run before this one removed the finalizer.
            let removed = match removed {
                Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
                other => other,
            };
            removed.map_err(|source| Error::Remove {
                finalizer: name.to_owned(),
                object: described,
                source,
            })?;
            Ok(action)
        }
        (false, None) => {
            // The list as it was seen (none at all), or the write fails.
            let (seen, add, value) = match object.finalizers() {
                [] => (
                    serde_json::Value::Null,
                    "/metadata/finalizers",
                    vec![name].into(),
                ),
                seen => (seen.to_vec().into(), "/metadata/finalizers/-", name.into()),
            };
            let operations = vec![
                PatchOperation::Test(TestOperation {
                    path: "/metadata/finalizers".parse().expect("a JSON pointer"),
                    value: seen,
                }),
                PatchOperation::Add(AddOperation {
                    path: add.parse().expect("a JSON pointer"),
                    value,
                }),
            ];
            patch(object_name, json_patch::Patch(operations))
                .await
                .map_err(|source| Error::Add {
                    finalizer: name.to_owned(),
                    object: described,
                    source,
                })?;
            // The write changes the object: it is reconciled again.
            Ok(Action::await_change())
        }
        (true, None) => Ok(Action::await_change()),
    }
}

fn kind_and_name<K: Resource>(object: &K) -> String
where
    K::DynamicType: Default,
{
    let kind = K::kind(&K::DynamicType::default()).into_owned();
    match object.namespace() {
        Some(namespace) => format!("{kind} {namespace}/{}", object.name_any()),
        None => format!("{kind} {}", object.name_any()),
    }
}

impl<K> ObjectRequest<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Serialize + Debug,
{
    /// Runs `reconcile` on the request's object under the finalizer `name`,
    /// written through the request's cluster: see [`finalizer`]. With no
    /// object (deleted, or no longer matched by the watch) it does nothing.
    ///
    /// A watch with a label or field selector tells an object that stops
    /// matching as deleted, so its reconcile has no object, and a finalizer
    /// it carries stays: the object can then never be deleted. Watch such
    /// objects without the selector, and say which are the reconciler's
    /// with [`finalize_if`](Self::finalize_if).
    pub async fn finalize<F, Fut>(&self, name: &str, reconcile: F) -> Result<Action, BoxError>
    where
        F: FnOnce(Event<K>) -> Fut,
        Fut: Future<Output = Result<Action, BoxError>>,
    {
        self.finalize_if(true, name, reconcile).await
    }

    /// [`finalize`](Self::finalize) for an object that is the reconciler's
    /// only while `wanted` (it carries a label, say): while it is, as
    /// `finalize`; once it is not, an object that carries the finalizer is
    /// cleaned up ([`Event::Cleanup`]) and the finalizer removed, as if it
    /// were being deleted, and one that does not carry it is left alone.
    ///
    /// ```no_run
    /// use k8s_openapi::api::core::v1::ConfigMap;
    /// use kube::ResourceExt;
    /// use kube_multicluster::{Action, ObjectRequest, finalizer::Event};
    /// use tower::BoxError;
    ///
    /// async fn reconcile(request: ObjectRequest<ConfigMap>) -> Result<Action, BoxError> {
    ///     let wanted = request.object.as_ref().is_some_and(|cm| cm.labels().contains_key("copy"));
    ///     request
    ///         .finalize_if(wanted, "example.com/copies", |event| async move {
    ///             match event {
    ///                 Event::Apply(_) => { /* make the copies */ }
    ///                 Event::Cleanup(_) => { /* delete them: deleted, or no longer labelled */ }
    ///             }
    ///             Ok(Action::await_change())
    ///         })
    ///         .await
    /// }
    /// # drop(tower::service_fn(reconcile));
    /// ```
    pub async fn finalize_if<F, Fut>(
        &self,
        wanted: bool,
        name: &str,
        reconcile: F,
    ) -> Result<Action, BoxError>
    where
        F: FnOnce(Event<K>) -> Fut,
        Fut: Future<Output = Result<Action, BoxError>>,
    {
        let Some(object) = self.object.clone() else {
            return Ok(Action::await_change());
        };
        let api = self.cluster.api_for::<K>(self.request.namespace.as_deref());
        run(&api, name, object, wanted, reconcile).await
    }
}
