//! The stand-in resource of a kind named by group and kind alone, whose
//! version each cluster's discovery decides (see `discovery`).

use kube::core::{ApiResource, discovery::Scope};

/// The stand-in version of a kind whose version discovery decides.
pub(crate) const ANY_VERSION: &str = "*";

/// The stand-in's plural: not a real one (which each cluster's discovery
/// gives), but the scope the watch was given, to check against discovery.
const NAMESPACED: &str = "*namespaced";
const CLUSTER_WIDE: &str = "*cluster";

/// The stand-in resource for `kind` in `group`, at whatever version each
/// cluster prefers, with objects in namespaces or not as `scope` says.
pub(crate) fn any_version(group: &str, kind: &str, scope: &Scope) -> ApiResource {
    ApiResource {
        group: group.to_owned(),
        version: ANY_VERSION.to_owned(),
        api_version: if group.is_empty() {
            ANY_VERSION.to_owned()
        } else {
            format!("{group}/{ANY_VERSION}")
        },
        kind: kind.to_owned(),
        plural: match scope {
            Scope::Namespaced => NAMESPACED,
            Scope::Cluster => CLUSTER_WIDE,
        }
        .to_owned(),
    }
}

/// What a stand-in asks discovery to find: group, kind, and whether its
/// objects live in namespaces. `None` for a real resource.
pub(crate) fn to_discover(resource: &ApiResource) -> Option<(&str, &str, bool)> {
    (resource.version == ANY_VERSION).then_some((
        resource.group.as_str(),
        resource.kind.as_str(),
        resource.plural != CLUSTER_WIDE,
    ))
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
