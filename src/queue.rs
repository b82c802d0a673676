//! The controller's queue of [`McRequest`]s.
//!
//! One queue per controller. It keeps, per key, whether the key waits (ready
//! or delayed), runs, or only remembers its failures, and hands out ready keys
//! round-robin across clusters, first-in first-out within a cluster, so that
//! no cluster and no key can be starved by another.

use std::{
    collections::{HashMap, VecDeque, hash_map::Entry},
    task::{Context, Poll},
    time::Duration,
};

use tokio::time::Instant;
use tokio_util::time::{DelayQueue, delay_queue};

use crate::{Action, ClusterName, McRequest};

/// How a failing key is retried: exponentially, per key.
///
/// The `n`-th consecutive failure of a key delays its next run by
/// `base * 2^(n-1)`, capped at `max`. A success forgets the failures. The
/// default, as client-go's, starts at 5 ms and stops doubling at 1000 s.
///
/// ```
/// use std::time::Duration;
/// use kube_fleet::Backoff;
///
/// let backoff = Backoff::default();
/// assert_eq!(backoff.delay(1), Duration::from_millis(5));
/// assert_eq!(backoff.delay(3), Duration::from_millis(20));
/// assert_eq!(backoff.delay(40), Duration::from_secs(1000));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// Delay after the first failure.
    pub base: Duration,
    /// The longest delay.
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            base: Duration::from_millis(5),
            max: Duration::from_secs(1000),
        }
    }
}

impl Backoff {
    /// The delay after `failures` consecutive failures (at least one).
    pub fn delay(&self, failures: u32) -> Duration {
        let doublings = failures.saturating_sub(1).min(63);
        self.base
            .checked_mul(1u32.checked_shl(doublings).unwrap_or(u32::MAX))
            .map_or(self.max, |delay| delay.min(self.max))
    }
}

/// Requeue delays are clamped to this: tokio's timer wheel panics for delays
/// beyond about two years.
const MAX_DELAY: Duration = Duration::from_secs(365 * 24 * 60 * 60);

#[derive(Debug)]
enum Phase {
    /// Waits in its cluster's ready list.
    Ready,
    /// Waits in the delay queue until `at`.
    Delayed { at: Instant, slot: delay_queue::Key },
    /// A reconcile runs; if `rerun_at` is set, the key was scheduled again
    /// meanwhile and runs once more afterwards, no sooner than that. A purged
    /// key stays here until its cancelled run has ended, so that it never
    /// runs twice at once; its outcome then counts for nothing.
    Running {
        rerun_at: Option<Instant>,
        purged: bool,
    },
    /// Nothing scheduled; kept only to remember failures for the backoff.
    Idle,
}

#[derive(Debug)]
struct KeyState {
    phase: Phase,
    failures: u32,
}

/// The outcome of one reconcile, as the queue sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Success(Action),
    Failure,
    /// The run was cancelled because its cluster left.
    Cancelled,
}

/// Deduplicating, delaying, backing-off, fair queue of requests.
#[derive(Debug)]
pub(crate) struct Queue {
    keys: HashMap<McRequest, KeyState>,
    ready: HashMap<ClusterName, VecDeque<McRequest>>,
    /// How many keys the ready lists hold.
    ready_len: usize,
    /// Clusters with ready keys, in the order they are served.
    turns: VecDeque<ClusterName>,
    delayed: DelayQueue<McRequest>,
    backoff: Backoff,
}

impl Queue {
    pub(crate) fn new(backoff: Backoff) -> Self {
        Self {
            keys: HashMap::new(),
            ready: HashMap::new(),
            ready_len: 0,
            turns: VecDeque::new(),
            delayed: DelayQueue::new(),
            backoff,
        }
    }

    /// Schedules `key` to run now.
    pub(crate) fn push(&mut self, key: McRequest) {
        self.schedule(key, Instant::now());
    }

    /// Schedules `key` to run at `at`, or earlier if it already was.
    ///
    /// A key already waiting keeps the earlier of its two times; a running
    /// key runs once more after the current run ends.
    pub(crate) fn schedule(&mut self, key: McRequest, at: Instant) {
        let at = at.min(Instant::now() + MAX_DELAY);
        match self.keys.entry(key) {
            Entry::Vacant(entry) => {
                let key = entry.key().clone();
                entry.insert(KeyState {
                    phase: Phase::Idle,
                    failures: 0,
                });
                self.enqueue(key, at);
            }
            Entry::Occupied(mut entry) => match &mut entry.get_mut().phase {
                Phase::Ready => {}
                Phase::Running { rerun_at, .. } => {
                    *rerun_at = Some(rerun_at.map_or(at, |t| t.min(at)));
                }
                Phase::Delayed { at: current, slot } => {
                    if at < *current {
                        let slot = *slot;
                        self.delayed.remove(&slot);
                        let key = entry.key().clone();
                        self.enqueue(key, at);
                    }
                }
                Phase::Idle => {
                    let key = entry.key().clone();
                    self.enqueue(key, at);
                }
            },
        }
    }

    /// Puts a key whose state exists into the ready list or the delay queue.
    fn enqueue(&mut self, key: McRequest, at: Instant) {
        let phase = if at <= Instant::now() {
            self.make_ready(key.clone());
            Phase::Ready
        } else {
            let slot = self.delayed.insert_at(key.clone(), at);
            Phase::Delayed { at, slot }
        };
        if let Some(state) = self.keys.get_mut(&key) {
            state.phase = phase;
        }
    }

    fn make_ready(&mut self, key: McRequest) {
        let list = self.ready.entry(key.cluster.clone()).or_default();
        if list.is_empty() {
            self.turns.push_back(key.cluster.clone());
        }
        list.push_back(key);
        self.ready_len += 1;
    }

    /// Whether a key is ready to run now. Moves keys whose delay has passed
    /// into the ready lists, and registers `cx` to be woken when the next
    /// delay passes.
    pub(crate) fn poll_has_ready(&mut self, cx: &mut Context<'_>) -> bool {
        while let Poll::Ready(Some(expired)) = self.delayed.poll_expired(cx) {
            let key = expired.into_inner();
            if let Some(state) = self.keys.get_mut(&key) {
                state.phase = Phase::Ready;
                self.make_ready(key);
            }
        }
        !self.turns.is_empty()
    }

    /// Takes the next ready key, from the cluster whose turn it is, and
    /// marks it running. Call [`poll_has_ready`](Self::poll_has_ready) first.
    pub(crate) fn pop_ready(&mut self) -> Option<McRequest> {
        let cluster = self.turns.pop_front()?;
        let list = self.ready.get_mut(&cluster)?;
        let key = list.pop_front()?;
        self.ready_len -= 1;
        if list.is_empty() {
            self.ready.remove(&cluster);
        } else {
            self.turns.push_back(cluster);
        }
        if let Some(state) = self.keys.get_mut(&key) {
            state.phase = Phase::Running {
                rerun_at: None,
                purged: false,
            };
        }
        Some(key)
    }

    /// Records how a run of `key` ended and schedules its next run: after its
    /// backoff on failure, when the [`Action`] asks on success, and in any
    /// case no later than a change that arrived while it ran.
    pub(crate) fn complete(&mut self, key: &McRequest, outcome: Outcome) {
        let Some(state) = self.keys.get_mut(key) else {
            // Purged while it ran.
            return;
        };
        let Phase::Running { rerun_at, purged } = state.phase else {
            return;
        };
        let now = Instant::now();
        let next = match outcome {
            _ if purged => None,
            Outcome::Cancelled => None,
            Outcome::Success(action) => {
                state.failures = 0;
                action.requeue_after().map(|d| now + d.min(MAX_DELAY))
            }
            Outcome::Failure => {
                state.failures = state.failures.saturating_add(1);
                Some(now + self.backoff.delay(state.failures).min(MAX_DELAY))
            }
        };
        let next = match (next, rerun_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        match next {
            Some(at) => {
                state.phase = Phase::Idle;
                self.enqueue(key.clone(), at);
            }
            None => {
                self.keys.remove(key);
            }
        }
    }

    /// Forgets every key of `cluster` and its failures. A key whose run is
    /// still going stays marked running until that run ends (its outcome then
    /// counts for nothing), so it cannot start a second time meanwhile; if
    /// it is scheduled again before then, it runs once the old run has ended.
    pub(crate) fn purge(&mut self, cluster: &ClusterName) {
        let delayed = &mut self.delayed;
        self.keys.retain(|key, state| {
            if key.cluster != *cluster {
                return true;
            }
            match &mut state.phase {
                Phase::Delayed { slot, .. } => {
                    delayed.remove(slot);
                    false
                }
                Phase::Running { rerun_at, purged } => {
                    *rerun_at = None;
                    *purged = true;
                    state.failures = 0;
                    true
                }
                Phase::Ready | Phase::Idle => false,
            }
        });
        if let Some(list) = self.ready.remove(cluster) {
            self.ready_len -= list.len();
        }
        self.turns.retain(|c| c != cluster);
    }

    /// How many keys wait to run, ready or delayed (not those running).
    pub(crate) fn waiting(&self) -> usize {
        self.ready_len + self.delayed.len()
    }

    /// How many failures `key` has had in a row.
    #[cfg(test)]
    fn failures(&self, key: &McRequest) -> u32 {
        self.keys.get(key).map_or(0, |s| s.failures)
    }
}

#[cfg(test)]
mod tests {
    use std::{future::poll_fn, task::Poll};

    use super::*;

    fn key(cluster: &str, name: &str) -> McRequest {
        McRequest::new(cluster, Some("default"), name)
    }

    /// The next key to run, waiting (in paused time) as long as it takes.
    async fn next(queue: &mut Queue) -> McRequest {
        poll_fn(|cx| {
            if queue.poll_has_ready(cx) {
                Poll::Ready(queue.pop_ready().expect("a ready key"))
            } else {
                Poll::Pending
            }
        })
        .await
    }

    /// The key ready right now, if any.
    fn ready_now(queue: &mut Queue) -> Option<McRequest> {
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        if queue.poll_has_ready(&mut cx) {
            queue.pop_ready()
        } else {
            None
        }
    }

    fn success() -> Outcome {
        Outcome::Success(Action::await_change())
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_already_queued_is_queued_once() {
        let mut queue = Queue::new(Backoff::default());
        queue.push(key("a", "x"));
        queue.push(key("a", "x"));
        queue.schedule(key("a", "x"), Instant::now() + Duration::from_secs(5));
        assert_eq!(queue.waiting(), 1);
        assert_eq!(ready_now(&mut queue), Some(key("a", "x")));
        assert_eq!(ready_now(&mut queue), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_running_key_is_not_handed_out_again_but_reruns_once_after() {
        let mut queue = Queue::new(Backoff::default());
        queue.push(key("a", "x"));
        let running = ready_now(&mut queue).unwrap();
        // Changes arrive while it runs: not handed out in parallel.
        queue.push(key("a", "x"));
        queue.push(key("a", "x"));
        assert_eq!(ready_now(&mut queue), None);
        queue.complete(&running, success());
        // Exactly one more run.
        assert_eq!(ready_now(&mut queue), Some(key("a", "x")));
        queue.complete(&key("a", "x"), success());
        assert_eq!(ready_now(&mut queue), None);
        assert_eq!(queue.waiting(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn requeue_after_runs_the_key_again_after_the_delay() {
        let mut queue = Queue::new(Backoff::default());
        queue.push(key("a", "x"));
        let k = ready_now(&mut queue).unwrap();
        let done = Instant::now();
        queue.complete(
            &k,
            Outcome::Success(Action::requeue(Duration::from_secs(30))),
        );
        assert_eq!(ready_now(&mut queue), None);
        assert_eq!(next(&mut queue).await, k);
        assert_eq!(done.elapsed(), Duration::from_secs(30));
    }

    #[tokio::test(start_paused = true)]
    async fn a_change_runs_a_delayed_key_sooner() {
        let mut queue = Queue::new(Backoff::default());
        queue.schedule(key("a", "x"), Instant::now() + Duration::from_secs(60));
        assert_eq!(ready_now(&mut queue), None);
        queue.push(key("a", "x"));
        assert_eq!(ready_now(&mut queue), Some(key("a", "x")));
        queue.complete(&key("a", "x"), success());
        // The old delay is gone with it.
        tokio::time::advance(Duration::from_secs(61)).await;
        assert_eq!(ready_now(&mut queue), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failing_key_backs_off_exponentially_and_success_resets_it() {
        let backoff = Backoff::default();
        let mut queue = Queue::new(backoff);
        queue.push(key("a", "x"));
        let mut delays = Vec::new();
        let mut k = ready_now(&mut queue).unwrap();
        for _ in 0..5 {
            queue.complete(&k, Outcome::Failure);
            let failed = Instant::now();
            k = next(&mut queue).await;
            delays.push(failed.elapsed());
        }
        let ms = Duration::from_millis;
        assert_eq!(delays, [ms(5), ms(10), ms(20), ms(40), ms(80)]);
        assert_eq!(queue.failures(&k), 5);

        queue.complete(&k, success());
        assert_eq!(queue.failures(&k), 0);
        queue.push(k.clone());
        let k = ready_now(&mut queue).unwrap();
        queue.complete(&k, Outcome::Failure);
        let failed = Instant::now();
        next(&mut queue).await;
        assert_eq!(
            failed.elapsed(),
            ms(5),
            "backoff starts over after a success"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn backoff_is_per_key() {
        let mut queue = Queue::new(Backoff::default());
        queue.push(key("a", "bad"));
        let bad = ready_now(&mut queue).unwrap();
        for _ in 0..10 {
            queue.complete(&bad, Outcome::Failure);
            next(&mut queue).await;
        }
        queue.push(key("a", "good"));
        let good = ready_now(&mut queue).unwrap();
        queue.complete(&good, Outcome::Failure);
        let failed = Instant::now();
        assert_eq!(next(&mut queue).await, good);
        assert_eq!(failed.elapsed(), Duration::from_millis(5));
        assert_eq!(queue.failures(&bad), 10);
    }

    #[tokio::test(start_paused = true)]
    async fn a_busy_cluster_cannot_starve_another() {
        let mut queue = Queue::new(Backoff::default());
        for i in 0..100_000 {
            queue.push(key("busy", &format!("obj-{i}")));
        }
        queue.push(key("quiet", "only"));
        let first_two = [
            ready_now(&mut queue).unwrap(),
            ready_now(&mut queue).unwrap(),
        ];
        assert!(
            first_two.contains(&key("quiet", "only")),
            "the quiet cluster's key runs within one turn: {first_two:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn keys_within_a_cluster_run_first_in_first_out() {
        // Keys queued early (an initial list) are not overtaken by later events.
        let mut queue = Queue::new(Backoff::default());
        for i in 0..1000 {
            queue.push(key("a", &format!("initial-{i}")));
        }
        let first = ready_now(&mut queue).unwrap();
        queue.push(key("a", "fresh-event"));
        queue.complete(&first, success());
        let mut order = Vec::new();
        while let Some(k) = ready_now(&mut queue) {
            order.push(k.name.clone());
            queue.complete(&k, success());
        }
        assert_eq!(order.len(), 1000);
        assert_eq!(order.last().map(String::as_str), Some("fresh-event"));
    }

    #[tokio::test(start_paused = true)]
    async fn turns_alternate_between_clusters() {
        let mut queue = Queue::new(Backoff::default());
        for name in ["1", "2", "3"] {
            queue.push(key("a", name));
            queue.push(key("b", name));
        }
        let clusters: Vec<String> = std::iter::from_fn(|| ready_now(&mut queue))
            .map(|k| k.cluster.to_string())
            .collect();
        assert_eq!(clusters, ["a", "b", "a", "b", "a", "b"]);
    }

    #[tokio::test(start_paused = true)]
    async fn purging_a_cluster_forgets_its_waiting_running_and_delayed_keys() {
        let mut queue = Queue::new(Backoff::default());
        queue.push(key("gone", "ready"));
        queue.push(key("gone", "running"));
        queue.schedule(
            key("gone", "later"),
            Instant::now() + Duration::from_secs(10),
        );
        queue.push(key("stays", "x"));
        // Serve "gone" first, then take its second key too.
        let mut running = None;
        while running.is_none() {
            let k = ready_now(&mut queue).unwrap();
            if k.cluster == "gone" && k.name == "running" {
                running = Some(k);
            } else if k.cluster == "gone" {
                queue.push(k.clone());
                queue.complete(&k, success());
            } else {
                queue.complete(&k, success());
                queue.push(k);
            }
        }
        queue.purge(&"gone".into());
        // A run that was cancelled or finishes late schedules nothing.
        queue.complete(&running.unwrap(), Outcome::Failure);
        tokio::time::advance(Duration::from_secs(20)).await;
        let mut left = Vec::new();
        while let Some(k) = ready_now(&mut queue) {
            queue.complete(&k, success());
            left.push(k);
        }
        assert_eq!(left, [key("stays", "x")]);
        assert_eq!(queue.waiting(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn huge_requeue_delays_are_clamped_instead_of_panicking() {
        let mut queue = Queue::new(Backoff::default());
        queue.push(key("a", "x"));
        let k = ready_now(&mut queue).unwrap();
        queue.complete(
            &k,
            Outcome::Success(Action::requeue(Duration::from_secs(u64::MAX / 4))),
        );
        queue.schedule(
            key("a", "y"),
            Instant::now() + Duration::from_secs(100 * 365 * 86400),
        );
        assert_eq!(queue.waiting(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_purged_key_still_running_cannot_start_again_until_that_run_ends() {
        let mut queue = Queue::new(Backoff::default());
        queue.push(key("gone", "x"));
        let running = ready_now(&mut queue).unwrap();
        queue.purge(&"gone".into());
        // The cluster comes back and the key is pushed while the old run
        // has not yet noticed its cancellation.
        queue.push(key("gone", "x"));
        assert_eq!(ready_now(&mut queue), None);
        queue.complete(&running, Outcome::Cancelled);
        assert_eq!(ready_now(&mut queue), Some(key("gone", "x")));
    }

    #[tokio::test(start_paused = true)]
    async fn an_unbounded_backoff_is_clamped_instead_of_panicking() {
        let mut queue = Queue::new(Backoff {
            base: Duration::from_secs(1),
            max: Duration::MAX,
        });
        queue.push(key("a", "x"));
        let k = ready_now(&mut queue).unwrap();
        for _ in 0..80 {
            queue.complete(&k, Outcome::Failure);
            assert_eq!(queue.waiting(), 1);
            // Run it again at once, as a change would.
            queue.push(k.clone());
            assert_eq!(ready_now(&mut queue), Some(k.clone()));
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_waiting_count_follows_every_change() {
        let mut queue = Queue::new(Backoff::default());
        let counted = |queue: &Queue| {
            queue
                .keys
                .values()
                .filter(|s| matches!(s.phase, Phase::Ready | Phase::Delayed { .. }))
                .count()
        };
        queue.push(key("a", "1"));
        queue.push(key("b", "2"));
        queue.schedule(key("a", "3"), Instant::now() + Duration::from_secs(5));
        assert_eq!((queue.waiting(), counted(&queue)), (3, 3));
        queue.push(key("a", "3"));
        assert_eq!((queue.waiting(), counted(&queue)), (3, 3));
        let k = ready_now(&mut queue).unwrap();
        assert_eq!((queue.waiting(), counted(&queue)), (2, 2));
        queue.complete(&k, Outcome::Failure);
        assert_eq!((queue.waiting(), counted(&queue)), (3, 3));
        queue.purge(&"a".into());
        assert_eq!((queue.waiting(), counted(&queue)), (1, 1));
        tokio::time::advance(Duration::from_secs(10)).await;
        assert!(ready_now(&mut queue).is_some());
        assert_eq!((queue.waiting(), counted(&queue)), (0, 0));
    }

    #[test]
    fn backoff_doubles_and_caps() {
        let backoff = Backoff {
            base: Duration::from_millis(5),
            max: Duration::from_secs(1000),
        };
        assert_eq!(backoff.delay(0), Duration::from_millis(5));
        assert_eq!(backoff.delay(2), Duration::from_millis(10));
        assert_eq!(
            backoff.delay(18),
            Duration::from_millis(5 << 17).min(backoff.max)
        );
        assert_eq!(backoff.delay(u32::MAX), Duration::from_secs(1000));
    }
}
