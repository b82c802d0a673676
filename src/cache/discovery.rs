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
    core::ApiResource,
    error::DiscoveryError,
    runtime::watcher::{self, Event},
};

use super::{TypeInfo, sealed::Sealed};

/// The stand-in version of a kind whose version discovery decides.
pub(crate) const ANY_VERSION: &str = "*";

/// The stand-in resource for `kind` in `group`, at whatever version each
/// cluster prefers.
pub(crate) fn any_version(group: &str, kind: &str) -> ApiResource {
    ApiResource {
        group: group.to_owned(),
        version: ANY_VERSION.to_owned(),
        api_version: if group.is_empty() {
            ANY_VERSION.to_owned()
        } else {
            format!("{group}/{ANY_VERSION}")
        },
        kind: kind.to_owned(),
        plural: String::new(),
    }
}

/// The group of a stand-in API version of any version (`group/*`, or `*`
/// for the core group); `None` for a real one.
pub(crate) fn group_of_any_version(api_version: &str) -> Option<String> {
    if api_version == ANY_VERSION {
        return Some(String::new());
    }
    api_version
        .strip_suffix(ANY_VERSION)
        .and_then(|group| group.strip_suffix('/'))
        .map(str::to_owned)
}

/// The resource `cluster` serves for `kind` in `group`, at its preferred
/// version.
async fn resolve(client: &Client, group: &str, kind: &str) -> kube::Result<ApiResource> {
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
    api_group
        .recommended_kind(kind)
        .map(|(resource, _)| resource)
        .ok_or_else(|| missing("the group does not serve it"))
}

/// Events of the kind in `group`, at the version the cluster prefers, from
/// the watch `watch` makes once the resource is known.
pub(crate) fn discovered<T, F>(
    client: Client,
    group: String,
    kind: String,
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
        (State::Resolving, client, group, kind, watch),
        |(state, client, group, kind, watch)| async move {
            match state {
                State::Resolving => match resolve(&client, &group, &kind).await {
                    Ok(resource) => {
                        let Some(dyntype) = <T::DynamicType as Sealed>::resolved(resource) else {
                            // Only dynamic types are discovered.
                            return None;
                        };
                        tracing::debug!(%kind, %group, ?dyntype, "discovered");
                        let mut events = watch(&dyntype);
                        let first = events.next().await?;
                        Some((first, (State::Watching(events), client, group, kind, watch)))
                    }
                    Err(error) => Some((
                        Err(watcher::Error::InitialListFailed(error)),
                        (State::Resolving, client, group, kind, watch),
                    )),
                },
                State::Watching(mut events) => {
                    let next = events.next().await?;
                    Some((next, (State::Watching(events), client, group, kind, watch)))
                }
            }
        },
    )
    .boxed()
}
