//! Watches of a kind named by group and kind alone, whose version each
//! cluster's discovery decides.
//!
//! The watch is started with a stand-in `ApiResource` (version `*`), under
//! which its store keys objects in every cluster alike. Its stream first asks
//! the cluster which version of the kind it prefers, then watches that
//! version. While the cluster does not serve the kind, the stream reports an
//! error (the watch shows it as failing) and asks again after the watch's
//! backoff.

use futures::{StreamExt, stream::BoxStream};
use kube::{
    Client,
    core::{ApiResource, discovery::Scope},
    error::DiscoveryError,
    runtime::watcher::{self, Event},
};

use super::{Sealed, TypeInfo};

/// The resource `cluster` serves for `kind` in `group`: at the most stable
/// version that has it (the group's preferred version when several do).
async fn resolve(
    client: &Client,
    group: &str,
    kind: &str,
    namespaced: bool,
) -> kube::Result<ApiResource> {
    let missing = |why: &str| {
        kube::Error::Discovery(DiscoveryError::MissingKind(format!(
            "{kind} in API group {group:?} ({why})"
        )))
    };
    let api_group = match kube::discovery::oneshot::group(client, group).await {
        Ok(api_group) => api_group,
        Err(kube::Error::Discovery(DiscoveryError::MissingApiGroup(_))) => {
            return Err(missing("the cluster serves no such group"));
        }
        Err(error) => return Err(error),
    };
    let (resource, capabilities) = api_group
        .recommended_kind(kind)
        .or_else(|| {
            api_group
                .resources_by_stability()
                .into_iter()
                .find(|(resource, _)| resource.kind == kind)
        })
        .ok_or_else(|| missing("the group does not serve it"))?;
    let served_namespaced = capabilities.scope == Scope::Namespaced;
    if served_namespaced != namespaced {
        let (served, given) = match served_namespaced {
            true => ("namespaced", "Scope::Cluster"),
            false => ("cluster-scoped", "Scope::Namespaced"),
        };
        return Err(missing(&format!(
            "it is {served} here, but the watch was given {given}"
        )));
    }
    Ok(resource)
}

/// Why a watch of `kind` at `api_version` failed, as its status tells it:
/// a resource the cluster does not serve says so in those words, where the
/// API server's plain-text 404 reads as an error that could not be parsed.
pub(super) fn failure_reason(error: &watcher::Error, kind: &str, api_version: &str) -> String {
    if not_served(error) {
        // A group's kind may come from a CRD; a core kind has no CRD to
        // install (a wrong path in the server's URL looks the same).
        let why = if api_version.contains('/') {
            "no such resource at this version: a CRD not installed, say, or an API group or \
             version this cluster does not serve"
        } else {
            "is the server's URL right?"
        };
        format!("{kind} ({api_version}) is not served by this cluster ({why})")
    } else {
        crate::client::error_chain(error)
    }
}

/// Whether `error` says the resource being watched is not served (any
/// more): its CRD was deleted, or no longer serves that version.
fn not_served(error: &watcher::Error) -> bool {
    matches!(
        error,
        watcher::Error::InitialListFailed(kube::Error::Api(status))
            | watcher::Error::WatchStartFailed(kube::Error::Api(status))
            | watcher::Error::WatchFailed(kube::Error::Api(status))
            if status.code == 404
    )
}

/// Events of the kind in `group`, at the version the cluster serves, from
/// the watch `watch` makes once the resource is known. When that version
/// stops being served, discovery runs again; the new watch lists anew, and
/// the store's keys stay the same, so objects carry over.
pub(crate) fn discovered<T, F>(
    client: Client,
    wanted: (String, String, bool),
    watch: F,
) -> BoxStream<'static, watcher::Result<Event<T>>>
where
    T: kube::Resource<DynamicType: TypeInfo> + Send + 'static,
    F: Fn(&T::DynamicType) -> BoxStream<'static, watcher::Result<Event<T>>> + Send + 'static,
{
    enum State<T> {
        Resolving,
        Watching(BoxStream<'static, watcher::Result<Event<T>>>),
    }
    futures::stream::unfold(
        (State::Resolving, client, wanted, watch),
        |(state, client, wanted, watch)| async move {
            let (group, kind, namespaced) = (&wanted.0, &wanted.1, wanted.2);
            let mut events = match state {
                State::Watching(events) => events,
                State::Resolving => match resolve(&client, group, kind, namespaced).await {
                    Ok(resource) => {
                        let dyntype = <T::DynamicType as Sealed>::resolved(resource)?;
                        tracing::debug!(%kind, %group, ?dyntype, "discovered");
                        watch(&dyntype)
                    }
                    Err(error) => {
                        let error = watcher::Error::InitialListFailed(error);
                        return Some((Err(error), (State::Resolving, client, wanted, watch)));
                    }
                },
            };
            let next = events.next().await?;
            let state = match &next {
                Err(error) if not_served(error) => State::Resolving,
                _ => State::Watching(events),
            };
            Some((next, (state, client, wanted, watch)))
        },
    )
    .boxed()
}
