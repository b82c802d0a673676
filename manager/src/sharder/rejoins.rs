//! Hysteresis on membership: a replica counted gone without leaving (its
//! Lease ran out) that comes back is ranked for shards again only once it
//! has stayed for a while, so that a replica whose renews are late, then on
//! time, does not pull its shards back and forth.
//!
//! Only the others hold a replica back: a replica always ranks itself. Its
//! own view of a lapse cannot match theirs (they may not have seen it, may
//! have forgotten its Lease, may have just started, or may have lapsed
//! too), and where it held itself back while they ranked it, its shards
//! would go unrun. Ranking itself while they hold it back costs little: it
//! takes only shards no one holds, and waits for theirs until they hand
//! them over (after an outage all shared, one may so run more than its
//! share until the wait ends: one more move per shard, at most).

use std::{
    collections::{HashMap, HashSet},
    time::Duration,
};

use tokio::time::Instant;

/// Which other live replicas rank for shards: all but those back from a
/// lapse for less than [`after`](Self::after).
#[derive(Debug)]
pub(crate) struct Rejoins {
    /// How long a replica back from a lapse waits before it ranks again.
    after: Duration,
    /// Other replicas, by identity, seen run out: `None` while they still
    /// are, then since when they are back.
    lapsed: HashMap<String, Option<Instant>>,
}

impl Rejoins {
    /// Rejoins of replicas that each wait `after` once back.
    pub(crate) fn new(after: Duration) -> Self {
        Self {
            after,
            lapsed: HashMap::new(),
        }
    }

    /// Takes in another replica's Lease as listed at `now`: `live` if its
    /// time has not run out.
    pub(super) fn saw(&mut self, identity: &str, live: bool, now: Instant) {
        let after = self.after;
        match (live, self.lapsed.get_mut(identity)) {
            (false, Some(state)) => *state = None,
            (false, None) => {
                self.lapsed.insert(identity.to_owned(), None);
            }
            (true, Some(state @ None)) => *state = Some(now),
            (true, Some(Some(since))) if waited(after, *since, now) => {
                self.lapsed.remove(identity);
            }
            (true, _) => {}
        }
    }

    /// Forgets the replicas whose Leases are gone: one that left, or was
    /// forgotten, starts afresh when it comes back.
    pub(super) fn keep_only(&mut self, listed: &HashSet<String>) {
        self.lapsed.retain(|identity, _| listed.contains(identity));
    }

    /// Whether another replica, live at `now`, ranks for shards.
    pub(super) fn ranks(&self, identity: &str, now: Instant) -> bool {
        match self.lapsed.get(identity) {
            None => true,
            Some(None) => false,
            Some(Some(since)) => waited(self.after, *since, now),
        }
    }
}

/// Whether a replica back `since` has waited `after` at `now`.
fn waited(after: Duration, since: Instant, now: Instant) -> bool {
    now.saturating_duration_since(since) >= after
}

#[cfg(test)]
mod tests {
    use std::{collections::HashSet, time::Duration};

    use tokio::time::Instant;

    use super::Rejoins;

    fn rejoins() -> Rejoins {
        Rejoins::new(Duration::from_secs(30))
    }

    #[test]
    fn a_replica_back_from_a_lapse_ranks_only_once_it_has_stayed() {
        let mut r = rejoins();
        let t = Instant::now();
        r.saw("a", true, t);
        assert!(r.ranks("a", t), "never lapsed");
        r.saw("a", false, t + Duration::from_secs(1));
        assert!(!r.ranks("a", t + Duration::from_secs(1)));
        r.saw("a", true, t + Duration::from_secs(2));
        assert!(!r.ranks("a", t + Duration::from_secs(20)));
        // Late again: the wait starts over.
        r.saw("a", false, t + Duration::from_secs(21));
        r.saw("a", true, t + Duration::from_secs(22));
        assert!(!r.ranks("a", t + Duration::from_secs(40)));
        assert!(r.ranks("a", t + Duration::from_secs(52)));
        r.saw("a", true, t + Duration::from_secs(53));
        assert!(r.lapsed.is_empty(), "forgotten once it ranks");
    }

    #[test]
    fn a_replica_that_left_starts_afresh() {
        let mut r = rejoins();
        let t = Instant::now();
        r.saw("a", false, t);
        r.keep_only(&HashSet::new());
        r.saw("a", true, t + Duration::from_secs(1));
        assert!(r.ranks("a", t + Duration::from_secs(1)));
    }

    #[test]
    fn a_wait_as_long_as_time_itself_never_overflows() {
        let mut r = Rejoins::new(Duration::MAX);
        let t = Instant::now();
        r.saw("a", false, t);
        r.saw("a", true, t);
        assert!(!r.ranks("a", t + Duration::from_secs(3600)));
    }
}
