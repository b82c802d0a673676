//! Which clusters of the fleet a controller, or one of its watches, works in.

use std::{fmt, sync::Arc};

use crate::cluster_name::ClusterName;

/// Which clusters of the fleet a controller works in.
#[derive(Clone)]
pub enum ClusterSelector {
    /// Only the local cluster ([`ClusterName::local`]).
    Local,
    /// Every cluster except the local one: the providers' clusters.
    Provided,
    /// Every cluster.
    All,
    /// The clusters whose names pass the filter.
    Matching(Arc<dyn Fn(&ClusterName) -> bool + Send + Sync>),
}

impl ClusterSelector {
    /// The clusters whose names pass `filter`.
    ///
    /// ```
    /// let members = kube_multicluster::controller::ClusterSelector::matching(|name| name.as_str().starts_with("member-"));
    /// assert!(members.selects(&"member-a".into()));
    /// assert!(!members.selects(&"hub".into()));
    /// ```
    pub fn matching(filter: impl Fn(&ClusterName) -> bool + Send + Sync + 'static) -> Self {
        Self::Matching(Arc::new(filter))
    }

    /// Whether the cluster `name` is one of these.
    pub fn selects(&self, name: &ClusterName) -> bool {
        match self {
            Self::Local => name.is_local(),
            Self::Provided => !name.is_local(),
            Self::All => true,
            Self::Matching(filter) => filter(name),
        }
    }
}

impl fmt::Debug for ClusterSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Local => f.write_str("Local"),
            Self::Provided => f.write_str("Provided"),
            Self::All => f.write_str("All"),
            Self::Matching(_) => f.write_str("Matching(..)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ClusterSelector;
    use crate::cluster_name::ClusterName;

    #[test]
    fn cluster_selections_pick_the_local_the_provided_all_or_matching_clusters() {
        let (local, east) = (ClusterName::local(), ClusterName::new("east"));
        assert!(ClusterSelector::Local.selects(&local) && !ClusterSelector::Local.selects(&east));
        assert!(
            !ClusterSelector::Provided.selects(&local) && ClusterSelector::Provided.selects(&east)
        );
        assert!(ClusterSelector::All.selects(&local) && ClusterSelector::All.selects(&east));
        let only_east = ClusterSelector::matching(|name| name == "east");
        assert!(only_east.selects(&east) && !only_east.selects(&local));
    }
}
