//! What a replica sees, in the Leases it lists each round, of how the set
//! covers the shards: which have no live owner, which are held by a
//! replica that no longer ranks first, and since when the oldest gap has
//! been open.

use std::collections::{HashMap, HashSet};

use kube_multicluster::ClusterName;
use tokio::time::Instant;

use crate::shard::{Coverage, owner, shard_key};

/// A shard's Lease as a round saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Fenced {
    /// Held by the replica of this identity, its time not run out.
    By(String),
    /// Held by nobody since this instant, when its holder's time ran out.
    RanOut(Instant),
}

/// Since when each shard without a live owner has been without one.
#[derive(Debug, Default)]
pub(super) struct Gaps {
    since: HashMap<u32, Instant>,
}

impl Gaps {
    /// The coverage of the `offered` shards at `now`, given how their
    /// Leases were seen (a shard absent from `fenced` has no Lease, or one
    /// released) and the replicas that rank, `ranked`.
    pub(super) fn measure(
        &mut self,
        offered: &HashMap<u32, HashSet<ClusterName>>,
        fenced: &HashMap<u32, Fenced>,
        ranked: &[String],
        now: Instant,
    ) -> Coverage {
        let mut coverage = Coverage {
            shards: offered.len(),
            measured: Some(now),
            ..Coverage::default()
        };
        let mut since = HashMap::new();
        for (shard, clusters) in offered {
            match fenced.get(shard) {
                Some(Fenced::By(holder)) => {
                    let first = owner(&shard_key(*shard), ranked.iter().map(String::as_str));
                    if first != Some(holder.as_str()) {
                        coverage.misplaced.push(*shard);
                    }
                }
                seen => {
                    let began = match seen {
                        Some(Fenced::RanOut(at)) => (*at).min(now),
                        _ => now,
                    };
                    let began = self.since.get(shard).map_or(began, |s| began.min(*s));
                    since.insert(*shard, began);
                    coverage.unowned.push(*shard);
                    coverage.clusters_unowned += clusters.len();
                }
            }
        }
        coverage.unowned.sort_unstable();
        coverage.misplaced.sort_unstable();
        coverage.unowned_since = since.values().min().copied();
        self.since = since;
        coverage
    }
}

#[cfg(test)]
mod tests {
    use std::{
        collections::{HashMap, HashSet},
        time::Duration,
    };

    use kube_multicluster::ClusterName;
    use tokio::time::Instant;

    use super::{Fenced, Gaps};
    use crate::shard::{owner, shard_key};

    #[test]
    fn gaps_are_counted_with_their_clusters_and_aged_from_their_start() {
        let replicas = vec!["a".to_owned(), "b".to_owned()];
        let first = |shard: u32| {
            owner(&shard_key(shard), replicas.iter().map(String::as_str))
                .unwrap()
                .to_owned()
        };
        let other = |shard: u32| if first(shard) == "a" { "b" } else { "a" }.to_owned();
        let offered: HashMap<u32, HashSet<ClusterName>> = (0..4)
            .map(|s| (s, HashSet::from([ClusterName::new(format!("c{s}"))])))
            .collect();
        let t = Instant::now();
        let fenced = HashMap::from([
            (0, Fenced::By(first(0))),
            (1, Fenced::By(other(1))),
            (2, Fenced::RanOut(t - Duration::from_secs(5))),
        ]);
        let mut gaps = Gaps::default();
        let c = gaps.measure(&offered, &fenced, &replicas, t);
        assert_eq!(
            (c.shards, c.unowned.clone(), c.misplaced.clone()),
            (4, vec![2, 3], vec![1])
        );
        assert_eq!(c.clusters_unowned, 2);
        assert_eq!(c.unowned_since, Some(t - Duration::from_secs(5)));
        assert_eq!(c.unowned_for(), Duration::from_secs(5));
        // Still open a round later: its start is kept; once held, gone.
        let later = t + Duration::from_secs(2);
        let fenced = HashMap::from([(2, Fenced::By(first(2)))]);
        let c = gaps.measure(&offered, &fenced, &replicas, later);
        assert_eq!(c.unowned, vec![0, 1, 3]);
        assert_eq!(c.unowned_since, Some(t));
        let all: HashMap<u32, Fenced> = (0..4).map(|s| (s, Fenced::By(first(s)))).collect();
        let c = gaps.measure(&offered, &all, &replicas, later);
        assert!(c.unowned.is_empty() && c.misplaced.is_empty() && c.unowned_since.is_none());
        assert_eq!(c.unowned_for(), Duration::ZERO);
    }
}
