//! The fleet's budget for cached bytes: while its caches hold more than the
//! budget, no watch starts its first list, and a first list that would take
//! the caches past it is dropped, not kept half-way, until room frees up.
//!
//! Each object's bytes are estimated as the length of its `Debug` text (as
//! shaped for the store), counted as it is written, never kept: for the
//! kinds of `k8s-openapi` that text names every field, set or not, much as
//! the object's memory holds them; escaped characters (quotes, newlines)
//! count twice. Only watches under a budget pay for the count.
//!
//! A first list waits for room for what it is expected to take: at first
//! a small floor, and after a list did not fit, twice what it had read
//! when it was dropped (or halfway from that to the whole budget, if
//! less), so that a large list is not made again at each bit of room
//! freed. The room is not reserved: watches that wait are woken together
//! when room frees, and those that find it list.

use std::{
    collections::{BTreeMap, HashMap},
    fmt::{self, Write as _},
    hash::{BuildHasher, Hash, Hasher, RandomState},
    pin::Pin,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    task::{Context, Poll, ready},
};

use futures::{FutureExt, Stream, StreamExt, future::BoxFuture, stream::BoxStream};
use kube::{
    Resource,
    runtime::watcher::{self, Event},
};
use tokio::sync::Notify;

use crate::panic::lock;

/// What tells the world of a watch that waits for room: its source (the
/// cluster and kind) and why, or `None` once it no longer waits.
pub(crate) type Report = Arc<dyn Fn(&str, Option<String>) + Send + Sync>;

/// The room a first list waits for before it is made, at most (and a
/// sixteenth of the budget if less): a list larger than that which then
/// does not fit is dropped and waits for twice what it had read.
const FLOOR: usize = 64 << 10;

/// The bytes the fleet's caches hold, their bound, and the watches that
/// wait for room.
pub(crate) struct Budget {
    limit: usize,
    /// Held by synced stores and by first lists under way.
    used: AtomicUsize,
    freed: Notify,
    /// The watches waiting for room, by their number: their source and the
    /// bytes each needs.
    waiting: Mutex<BTreeMap<u64, (String, usize)>>,
    /// The number of the next watch.
    watches: AtomicUsize,
    report: Report,
    keys: RandomState,
}

impl fmt::Debug for Budget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Budget")
            .field("limit", &self.limit)
            .field("used", &self.used())
            .field("waiting", &lock(&self.waiting).len())
            .finish()
    }
}

impl Budget {
    /// A budget of `limit` bytes, telling `report` of the watches that
    /// wait.
    pub(crate) fn new(limit: usize, report: Report) -> Self {
        Self {
            limit,
            used: AtomicUsize::new(0),
            freed: Notify::new(),
            waiting: Mutex::new(BTreeMap::new()),
            watches: AtomicUsize::new(0),
            report,
            keys: RandomState::new(),
        }
    }

    pub(crate) fn limit(&self) -> usize {
        self.limit
    }

    pub(crate) fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// The watches waiting for room: each one's source and the bytes it
    /// needs, sorted by source.
    pub(crate) fn waiting(&self) -> Vec<(String, usize)> {
        let mut waiting: Vec<_> = lock(&self.waiting).values().cloned().collect();
        waiting.sort();
        waiting
    }

    fn take(&self, bytes: usize) {
        self.used.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Takes `bytes` if they fit, never going past the budget, not even
    /// for a moment.
    fn take_if_room(&self, bytes: usize) -> bool {
        self.used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                let after = used.checked_add(bytes)?;
                (after <= self.limit).then_some(after)
            })
            .is_ok()
    }

    fn give(&self, bytes: usize) {
        if bytes > 0 {
            self.used.fetch_sub(bytes, Ordering::Relaxed);
            self.freed.notify_waiters();
        }
    }

    /// Whether `need` more bytes fit now.
    fn fits(&self, need: usize) -> bool {
        self.used()
            .checked_add(need)
            .is_some_and(|after| after <= self.limit)
    }

    /// Waits until `need` more bytes fit; never, if they are more than the
    /// whole budget.
    async fn room(self: Arc<Self>, need: usize) {
        if need > self.limit {
            return std::future::pending().await;
        }
        loop {
            let freed = self.freed.notified();
            if self.fits(need) {
                return;
            }
            freed.await;
        }
    }

    /// Watch `watch`, of `source`, waits for `need` bytes; `dropped` if its
    /// list did not fit. Its source is told why, in words that do not
    /// change while it waits.
    fn wait(&self, watch: u64, source: &str, need: usize, dropped: bool) {
        lock(&self.waiting).insert(watch, (source.to_owned(), need));
        let why = if need > self.limit {
            format!(
                "its first list needs at least {need} bytes, more than the whole cache budget of {} bytes: not listed",
                self.limit
            )
        } else if dropped {
            format!(
                "its first list needs at least {need} bytes, more than was left of the cache budget of {} bytes: dropped, and made again once there is room",
                self.limit
            )
        } else {
            format!(
                "the caches hold about as much as the cache budget of {} bytes allows: its first list waits for room",
                self.limit
            )
        };
        (self.report)(source, Some(why));
    }

    /// Watch `watch` no longer waits: its source's problem goes, unless
    /// another watch of the same source still waits.
    fn done_waiting(&self, watch: u64) {
        let mut waiting = lock(&self.waiting);
        let Some((source, _)) = waiting.remove(&watch) else {
            return;
        };
        let still = waiting.values().any(|(other, _)| *other == source);
        drop(waiting);
        if !still {
            (self.report)(&source, None);
        }
    }

    /// `make`'s events, their objects counted against this budget: the
    /// watch's first list waits for room, and is dropped (the watch told
    /// `Init` again, so its half-filled list goes) if it would take the
    /// caches past the budget, then made anew once room frees up. `source`
    /// names the watch where it waits; `queued` is true meanwhile.
    pub(crate) fn bound<K>(
        self: &Arc<Self>,
        source: String,
        queued: Arc<AtomicBool>,
        make: impl Fn() -> BoxStream<'static, watcher::Result<Event<K>>> + Send + 'static,
    ) -> BoxStream<'static, watcher::Result<Event<K>>>
    where
        K: Resource + fmt::Debug + Send + 'static,
    {
        Budgeted {
            watch: self.watches.fetch_add(1, Ordering::Relaxed) as u64,
            need: FLOOR.min(self.limit / 16).max(1),
            budget: self.clone(),
            source,
            queued,
            make: Box::new(make),
            events: None,
            room: None,
            synced: false,
            sizes: HashMap::new(),
            held: 0,
            list: None,
        }
        .boxed()
    }
}

/// A list under way: each object's bytes, by key, and their sum.
#[derive(Default)]
struct Listing {
    sizes: HashMap<u64, usize>,
    bytes: usize,
}

type Make<K> = Box<dyn Fn() -> BoxStream<'static, watcher::Result<Event<K>>> + Send>;

/// A watch's events, its store's bytes held against the budget.
struct Budgeted<K> {
    /// Its number, under which it waits.
    watch: u64,
    /// The room its first list waits for.
    need: usize,
    budget: Arc<Budget>,
    source: String,
    queued: Arc<AtomicBool>,
    make: Make<K>,
    /// `None` before the first list and while waiting for room.
    events: Option<BoxStream<'static, watcher::Result<Event<K>>>>,
    room: Option<BoxFuture<'static, ()>>,
    /// Whether a list of it has completed: its lists after that (once its
    /// watch expired, say) replace what it holds, and are not dropped.
    synced: bool,
    /// The bytes of each object of the store, by key, and their sum, held.
    sizes: HashMap<u64, usize>,
    held: usize,
    /// The list under way, its bytes held too.
    list: Option<Listing>,
}

impl<K> Unpin for Budgeted<K> {}

impl<K> Drop for Budgeted<K> {
    fn drop(&mut self) {
        let listing = self.list.take().map_or(0, |list| list.bytes);
        self.budget.give(self.held + listing);
        self.budget.done_waiting(self.watch);
    }
}

impl<K: Resource + fmt::Debug> Budgeted<K> {
    fn key(&self, object: &K) -> u64 {
        let meta = object.meta();
        let mut hasher = self.budget.keys.build_hasher();
        meta.namespace.hash(&mut hasher);
        meta.name.hash(&mut hasher);
        hasher.finish()
    }

    /// Waits for room for its first list before it lists; `dropped` if a
    /// list of it did not fit.
    fn wait(&mut self, dropped: bool) {
        self.budget
            .wait(self.watch, &self.source, self.need, dropped);
        // A list larger than the whole budget waits for good: its watch is
        // not said to wait for a turn to list, and shows as not syncing.
        let never = self.need > self.budget.limit;
        self.queued.store(!never, Ordering::Relaxed);
        self.room = Some(self.budget.clone().room(self.need).boxed());
    }

    /// Counts `object`, of the list under way; false if the list no longer
    /// fits and was dropped.
    fn listed(&mut self, object: &K) -> bool {
        let (key, bytes) = (self.key(object), size_of(object));
        let list = self.list.get_or_insert_with(Listing::default);
        if self.synced {
            self.budget.take(bytes);
        } else if !self.budget.take_if_room(bytes) {
            // A first list that does not fit: dropped, all of it, and
            // made again once twice as much room as it took is free.
            let need = list.bytes + bytes;
            self.budget.give(list.bytes);
            // Twice what it read, or halfway from that to the whole
            // budget if less: never the whole budget, which only an empty
            // fleet has, unless it read more than that.
            let limit = self.budget.limit;
            self.need = if need > limit {
                need
            } else {
                let halfway = need + (limit - need) / 2;
                self.need.max(need.saturating_mul(2).min(halfway))
            };
            self.list = None;
            self.events = None;
            tracing::debug!(source = %self.source, need = self.need, limit = self.budget.limit, "a first list does not fit in the cache budget: dropped until room frees up");
            self.wait(true);
            return false;
        }
        let before = list.sizes.insert(key, bytes).unwrap_or(0);
        list.bytes = list.bytes + bytes - before;
        self.budget.give(before);
        true
    }

    /// The list under way replaces the store.
    fn replaced(&mut self) {
        let list = self.list.take().unwrap_or_default();
        self.budget.give(self.held);
        self.held = list.bytes;
        self.sizes = list.sizes;
        self.synced = true;
    }

    fn applied(&mut self, object: &K) {
        let (key, bytes) = (self.key(object), size_of(object));
        let before = self.sizes.insert(key, bytes).unwrap_or(0);
        self.held = self.held + bytes - before;
        // One change by the difference: never more for a moment, and room
        // told freed only when some was.
        if bytes >= before {
            self.budget.take(bytes - before);
        } else {
            self.budget.give(before - bytes);
        }
    }

    fn deleted(&mut self, object: &K) {
        let key = self.key(object);
        if let Some(before) = self.sizes.remove(&key) {
            self.held -= before;
            self.budget.give(before);
        }
    }

    /// The list under way failed: what it held goes.
    fn failed(&mut self) {
        if let Some(list) = self.list.take() {
            self.budget.give(list.bytes);
        }
    }
}

impl<K: Resource + fmt::Debug> Stream for Budgeted<K> {
    type Item = watcher::Result<Event<K>>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        loop {
            if let Some(room) = &mut this.room {
                ready!(room.poll_unpin(cx));
                this.room = None;
                this.queued.store(false, Ordering::Relaxed);
                this.budget.done_waiting(this.watch);
                this.events = Some((this.make)());
            }
            let Some(events) = &mut this.events else {
                // Its first list starts only with room for what it is
                // expected to take.
                if this.budget.fits(this.need) {
                    this.events = Some((this.make)());
                } else {
                    this.wait(false);
                }
                continue;
            };
            let next = ready!(events.poll_next_unpin(cx));
            match &next {
                Some(Ok(Event::Init)) => {
                    this.failed();
                    this.list = Some(Listing::default());
                    // A first list made again (after a failure) waits for
                    // room too: told Init, the watch holds nothing of it.
                    if !this.synced && !this.budget.fits(this.need) {
                        this.list = None;
                        this.events = None;
                        this.wait(false);
                        return Poll::Ready(next);
                    }
                }
                Some(Ok(Event::InitApply(object))) => {
                    if !this.listed(object) {
                        // The store's half-filled list goes with this.
                        return Poll::Ready(Some(Ok(Event::Init)));
                    }
                }
                Some(Ok(Event::InitDone)) => this.replaced(),
                Some(Ok(Event::Apply(object))) => this.applied(object),
                Some(Ok(Event::Delete(object))) => this.deleted(object),
                // An error may end the list or not (a streaming list goes
                // on after some): what it read stays counted until the
                // next list starts, or the stream ends.
                Some(Err(_)) => {}
                None => this.failed(),
            }
            return Poll::Ready(next);
        }
    }
}

/// The bytes of `object`, estimated as the length of its `Debug` text.
pub(crate) fn size_of<K: fmt::Debug>(object: &K) -> usize {
    struct Count(usize);
    impl fmt::Write for Count {
        fn write_str(&mut self, s: &str) -> fmt::Result {
            self.0 += s.len();
            Ok(())
        }
    }
    let mut count = Count(0);
    let _ = write!(count, "{object:?}");
    count.0
}

#[cfg(test)]
mod tests {
    use futures::channel::mpsc;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::ObjectMeta;

    use super::*;

    type Sender = mpsc::UnboundedSender<watcher::Result<Event<ConfigMap>>>;

    fn config_map(name: &str, bytes: usize) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                namespace: Some("default".to_owned()),
                ..ObjectMeta::default()
            },
            data: Some([("key".to_owned(), "x".repeat(bytes))].into()),
            ..ConfigMap::default()
        }
    }

    fn budget(limit: usize) -> (Arc<Budget>, Arc<Mutex<BTreeMap<String, String>>>) {
        let told = Arc::new(Mutex::new(BTreeMap::new()));
        let report: Report = {
            let told = told.clone();
            Arc::new(move |source: &str, why: Option<String>| {
                let mut told = lock(&told);
                match why {
                    Some(why) => told.insert(source.to_owned(), why),
                    None => told.remove(source),
                };
            })
        };
        (Arc::new(Budget::new(limit, report)), told)
    }

    /// A watch under `budget` whose every list is a new channel, handed
    /// out through the returned receiver of senders.
    fn watch(
        budget: &Arc<Budget>,
        source: &str,
    ) -> (
        BoxStream<'static, watcher::Result<Event<ConfigMap>>>,
        std::sync::mpsc::Receiver<Sender>,
    ) {
        let (senders, lists) = std::sync::mpsc::channel();
        let events = budget.bound(source.to_owned(), Arc::default(), move || {
            let (tx, rx) = mpsc::unbounded();
            senders.send(tx).unwrap();
            rx.boxed()
        });
        (events, lists)
    }

    fn ready<T>(stream: &mut BoxStream<'static, T>) -> Option<Option<T>> {
        stream.next().now_or_never()
    }

    fn list(tx: &Sender, objects: &[ConfigMap]) {
        tx.unbounded_send(Ok(Event::Init)).unwrap();
        for object in objects {
            tx.unbounded_send(Ok(Event::InitApply(object.clone())))
                .unwrap();
        }
        tx.unbounded_send(Ok(Event::InitDone)).unwrap();
    }

    fn drain(stream: &mut BoxStream<'static, watcher::Result<Event<ConfigMap>>>) -> Vec<String> {
        let mut seen = Vec::new();
        while let Some(Some(event)) = ready(stream) {
            seen.push(match event {
                Ok(Event::Init) => "init".to_owned(),
                Ok(Event::InitApply(cm)) => cm.metadata.name.unwrap_or_default(),
                Ok(Event::InitDone) => "done".to_owned(),
                Ok(Event::Apply(cm)) => format!("+{}", cm.metadata.name.unwrap_or_default()),
                Ok(Event::Delete(cm)) => format!("-{}", cm.metadata.name.unwrap_or_default()),
                Err(_) => "error".to_owned(),
            });
        }
        seen
    }

    #[test]
    fn sizes_grow_with_the_data() {
        let small = size_of(&config_map("a", 10));
        let large = size_of(&config_map("a", 2010));
        assert_eq!(large - small, 2000);
    }

    #[tokio::test]
    async fn stores_hold_their_bytes_and_give_them_back() {
        let one = size_of(&config_map("a", 100));
        let (budget, _) = budget(10 * one);
        let (mut a, lists) = watch(&budget, "a");
        assert!(ready(&mut a).is_none());
        let tx = lists.try_recv().unwrap();
        list(&tx, &[config_map("a", 100), config_map("b", 100)]);
        assert_eq!(drain(&mut a), ["init", "a", "b", "done"]);
        assert_eq!(budget.used(), 2 * one);
        // Changed bigger, then deleted.
        tx.unbounded_send(Ok(Event::Apply(config_map("a", 200))))
            .unwrap();
        tx.unbounded_send(Ok(Event::Delete(config_map("b", 100))))
            .unwrap();
        assert_eq!(drain(&mut a), ["+a", "-b"]);
        assert_eq!(budget.used(), one + 100);
        drop(a);
        assert_eq!(budget.used(), 0);
    }

    #[tokio::test]
    async fn a_first_list_that_does_not_fit_is_dropped_and_made_again_once_room_frees_up() {
        let one = size_of(&config_map("a", 100));
        let (budget, told) = budget(3 * one);
        let (mut a, a_lists) = watch(&budget, "cluster \"a\": v1 ConfigMap");
        assert!(ready(&mut a).is_none());
        list(
            &a_lists.try_recv().unwrap(),
            &[config_map("a", 100), config_map("b", 100)],
        );
        assert_eq!(drain(&mut a).len(), 4);
        // B's list of two does not fit in the one object's room left: its
        // first object is passed on, the second drops the list (the
        // watch is told Init again, which empties what it buffered).
        let (mut b, b_lists) = watch(&budget, "cluster \"b\": v1 ConfigMap");
        assert!(ready(&mut b).is_none());
        let first = b_lists.try_recv().unwrap();
        list(&first, &[config_map("c", 100), config_map("d", 100)]);
        assert_eq!(drain(&mut b), ["init", "c", "init"]);
        assert_eq!(budget.used(), 2 * one, "B's half list is not held");
        let why = lock(&told)["cluster \"b\": v1 ConfigMap"].clone();
        assert!(why.contains("dropped, and made again"), "{why}");
        assert_eq!(budget.waiting().len(), 1);
        assert_eq!(budget.waiting()[0].0, "cluster \"b\": v1 ConfigMap");
        // A goes: B lists again, and fits.
        drop(a);
        assert!(ready(&mut b).is_none());
        let again = b_lists.try_recv().expect("listed again");
        assert!(first.is_closed(), "the dropped list's request ended");
        list(&again, &[config_map("c", 100), config_map("d", 100)]);
        assert_eq!(drain(&mut b), ["init", "c", "d", "done"]);
        assert_eq!(budget.used(), 2 * one);
        assert!(lock(&told).is_empty() && budget.waiting().is_empty());
    }

    #[tokio::test]
    async fn no_first_list_starts_while_the_caches_hold_more_than_the_budget() {
        let one = size_of(&config_map("a", 100));
        let (budget, told) = budget(one);
        let (mut a, a_lists) = watch(&budget, "a");
        assert!(ready(&mut a).is_none());
        let tx = a_lists.try_recv().unwrap();
        list(&tx, &[config_map("a", 100)]);
        drain(&mut a);
        // A synced store may grow past the budget: it is not dropped.
        tx.unbounded_send(Ok(Event::Apply(config_map("b", 100))))
            .unwrap();
        drain(&mut a);
        assert_eq!(budget.used(), 2 * one);
        let (mut b, b_lists) = watch(&budget, "b");
        assert!(ready(&mut b).is_none());
        assert!(b_lists.try_recv().is_err(), "no list made");
        assert!(lock(&told)["b"].contains("waits for room"));
        tx.unbounded_send(Ok(Event::Delete(config_map("b", 100))))
            .unwrap();
        tx.unbounded_send(Ok(Event::Delete(config_map("a", 100))))
            .unwrap();
        drain(&mut a);
        assert!(ready(&mut b).is_none());
        assert!(b_lists.try_recv().is_ok(), "listed once room freed up");
    }

    #[tokio::test]
    async fn a_list_larger_than_the_whole_budget_is_told_so() {
        let one = size_of(&config_map("a", 100));
        let (budget, told) = budget(one);
        let (mut a, lists) = watch(&budget, "a");
        assert!(ready(&mut a).is_none());
        list(
            &lists.try_recv().unwrap(),
            &[config_map("a", 100), config_map("b", 100)],
        );
        assert_eq!(drain(&mut a), ["init", "a", "init"]);
        assert!(lock(&told)["a"].contains("more than the whole cache budget"));
        assert_eq!(budget.used(), 0);
    }

    #[tokio::test]
    async fn two_watches_of_one_source_each_keep_their_wait_told() {
        let one = size_of(&config_map("a", 100));
        let (budget, told) = budget(one);
        // Both need more than the whole budget.
        let (mut a, a_lists) = watch(&budget, "same");
        let (mut b, b_lists) = watch(&budget, "same");
        for (stream, lists) in [(&mut a, &a_lists), (&mut b, &b_lists)] {
            assert!(ready(stream).is_none());
            list(
                &lists.try_recv().unwrap(),
                &[config_map("a", 100), config_map("b", 100)],
            );
            drain(stream);
        }
        assert_eq!(budget.waiting().len(), 2);
        drop(a);
        assert_eq!(budget.waiting().len(), 1);
        assert!(
            lock(&told).contains_key("same"),
            "still told while one waits"
        );
        drop(b);
        assert!(lock(&told).is_empty() && budget.waiting().is_empty());
    }

    #[tokio::test]
    async fn an_error_in_a_list_keeps_what_it_read_counted_until_the_next_list() {
        let one = size_of(&config_map("a", 100));
        let (budget, _) = budget(10 * one);
        let (mut a, lists) = watch(&budget, "a");
        assert!(ready(&mut a).is_none());
        let tx = lists.try_recv().unwrap();
        tx.unbounded_send(Ok(Event::Init)).unwrap();
        tx.unbounded_send(Ok(Event::InitApply(config_map("a", 100))))
            .unwrap();
        tx.unbounded_send(Err(watcher::Error::NoResourceVersion))
            .unwrap();
        tx.unbounded_send(Ok(Event::InitApply(config_map("b", 100))))
            .unwrap();
        tx.unbounded_send(Ok(Event::InitDone)).unwrap();
        assert_eq!(drain(&mut a), ["init", "a", "error", "b", "done"]);
        assert_eq!(budget.used(), 2 * one);
        // A list that starts again gives back what the last one read.
        list(&tx, &[config_map("c", 100)]);
        drain(&mut a);
        assert_eq!(budget.used(), one);
    }

    #[tokio::test]
    async fn no_first_list_is_made_without_room_for_what_it_is_expected_to_take() {
        let one = size_of(&config_map("a", 100));
        let (budget, told) = budget(32 * one);
        let (mut a, a_lists) = watch(&budget, "a");
        assert!(ready(&mut a).is_none());
        let objects: Vec<ConfigMap> = (0..31).map(|i| config_map(&format!("o{i}"), 100)).collect();
        list(&a_lists.try_recv().unwrap(), &objects);
        drain(&mut a);
        // Room for one object, less than a sixteenth of the budget: B
        // waits without a list made.
        let (mut b, b_lists) = watch(&budget, "b");
        assert!(ready(&mut b).is_none());
        assert!(b_lists.try_recv().is_err(), "no list made");
        assert!(lock(&told)["b"].contains("waits for room"));
    }
}
