//! Hysteresis on membership: a replica counted gone without leaving (its
//! Lease ran out) that comes back is ranked for shards again only once it
//! has stayed for a while, so that a replica whose renews are late, then on
//! time, does not pull its shards back and forth.

use std::{
    collections::{HashMap, HashSet},
    time::Duration,
};

use tokio::time::Instant;

use crate::timing::Timings;

/// Which live replicas rank for shards: all but those back from a lapse
/// for less than [`after`](Self::after).
#[derive(Debug)]
pub(crate) struct Rejoins {
    /// How long a replica back from a lapse waits before it ranks again.
    after: Duration,
    /// A gap between two of this replica's own renews longer than this was
    /// surely seen as a lapse by every live replica that lists the Leases
    /// on time: its Lease's duration, and two of their rounds.
    surely_seen: Duration,
    /// Other replicas, by identity, seen run out: `None` while they still
    /// are, then since when they are back.
    lapsed: HashMap<String, Option<Instant>>,
    /// When this replica's own last renew that went through began.
    renewed: Option<Instant>,
    /// Since when this replica is back from a lapse every other saw.
    back: Option<Instant>,
}

impl Rejoins {
    /// Rejoins of replicas holding Leases by `timings`, each waiting
    /// `after` once back.
    pub(crate) fn new(timings: Timings, after: Duration) -> Self {
        let round = timings.retry_period.mul_f64(1.2) + timings.request_timeout();
        Self {
            after,
            surely_seen: timings.lease_duration + round * 2,
            lapsed: HashMap::new(),
            renewed: None,
            back: None,
        }
    }

    /// Takes in another replica's Lease as listed at `now`: `live` if its
    /// time has not run out.
    pub(super) fn saw(&mut self, identity: &str, live: bool, now: Instant) {
        match (live, self.lapsed.get_mut(identity)) {
            (false, Some(state)) => *state = None,
            (false, None) => {
                self.lapsed.insert(identity.to_owned(), None);
            }
            (true, Some(state @ None)) => *state = Some(now),
            (true, Some(Some(since))) if now >= *since + self.after => {
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
            Some(Some(since)) => now >= *since + self.after,
        }
    }

    /// This replica's own Lease was renewed by a write that began at
    /// `start`. After a gap every other replica must have seen as a lapse,
    /// it waits as they make it wait; after a shorter one it ranks at once:
    /// some may not rank it yet and keep its shards meanwhile, but none is
    /// left unrun, as it would be if this replica waited where the others
    /// did not.
    pub(super) fn renewed(&mut self, start: Instant) {
        if let Some(before) = self.renewed
            && start.saturating_duration_since(before) > self.surely_seen
        {
            tracing::info!(
                gap = ?start.saturating_duration_since(before),
                wait = ?self.after,
                "this replica's Lease ran out and is renewed again: it ranks for shards once it has stayed"
            );
            self.back = Some(start);
        }
        self.renewed = Some(start);
    }

    /// Whether this replica ranks for shards at `now`.
    pub(super) fn i_rank(&self, now: Instant) -> bool {
        self.back.is_none_or(|since| now >= since + self.after)
    }
}

#[cfg(test)]
mod tests {
    use std::{collections::HashSet, time::Duration};

    use tokio::time::Instant;

    use super::Rejoins;
    use crate::timing::Timings;

    fn rejoins() -> Rejoins {
        Rejoins::new(Timings::default(), Duration::from_secs(30))
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
    fn this_replica_waits_only_after_a_gap_every_other_saw() {
        let mut r = rejoins();
        let t = Instant::now();
        r.renewed(t);
        // 15 s lease, two rounds of 2.4 s + 5 s: about 29.8 s.
        r.renewed(t + Duration::from_secs(20));
        assert!(
            r.i_rank(t + Duration::from_secs(20)),
            "a gap some may not have seen"
        );
        r.renewed(t + Duration::from_secs(60));
        assert!(!r.i_rank(t + Duration::from_secs(61)));
        assert!(r.i_rank(t + Duration::from_secs(90)));
    }
}
