//! The bound on initial lists in flight across a fleet: a watch takes a
//! permit before it lists and gives it back once the list is done (or has
//! failed), so that engaging thousands of clusters at once lists them a
//! bounded number at a time, and neither this process's memory nor the API
//! servers see them all at once.

use std::{
    fmt,
    future::Future,
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    task::{Context, Poll, ready},
    time::Duration,
};

use futures::{FutureExt, Stream, StreamExt, future::BoxFuture, stream::BoxStream};
use kube::{
    Resource,
    runtime::watcher::{self, Event},
};
use tokio::{
    sync::{OwnedSemaphorePermit, Semaphore},
    time::Sleep,
};

use super::budget::{Budget, Report};

/// How many watches of a [`Fleet`](crate::Fleet) may be listing at once, and
/// how many list or wait now; from [`FleetStatus::initial_lists`](crate::FleetStatus::initial_lists).
///
/// A watch takes a permit before its first request (for most watches its
/// list, and with it the TLS handshake of a cluster's new connection), and
/// holds it until the list is done or fails, or for 30 seconds at most:
/// a list that takes longer (a cluster that hangs, an API server that
/// keeps answering 503 to a request retried for minutes) goes on without
/// one. It takes one again before each list that follows (after a failed
/// list, or a watch that fell too far behind). A cluster that does not
/// answer holds none while its watch waits to retry. A watch waiting for a
/// permit is reported as syncing, never as failing to sync. Permits are
/// handed out first come, first served: a synced watch that must list
/// again during an engage storm waits behind the storm's lists.
///
/// ```
/// use kube_multicluster::Fleet;
///
/// let fleet = Fleet::with_config(kube_multicluster::FleetConfig { initial_lists: 16, ..kube_multicluster::FleetConfig::default() });
/// let lists = fleet.status().initial_lists;
/// assert_eq!(lists.limit(), 16);
/// assert_eq!(lists.in_flight(), 0);
/// assert_eq!(lists.waiting(), 0);
/// ```
#[derive(Clone)]
pub struct InitialLists {
    inner: Arc<Inner>,
}

struct Inner {
    semaphore: Arc<Semaphore>,
    limit: usize,
    waiting: AtomicUsize,
    /// The bound on the bytes the caches hold, if any.
    budget: Option<Arc<Budget>>,
}

impl fmt::Debug for InitialLists {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InitialLists")
            .field("limit", &self.limit())
            .field("in_flight", &self.in_flight())
            .field("waiting", &self.waiting())
            .field("cache_budget", &self.inner.budget)
            .finish()
    }
}

impl InitialLists {
    /// The bound a [`Fleet`](crate::Fleet) has unless told otherwise.
    pub const DEFAULT: usize = 64;

    /// At most `limit` lists at once (at least one).
    pub(crate) fn new(limit: usize) -> Self {
        Self::with_budget(limit, None)
    }

    /// At most `limit` lists at once, and, given a budget of bytes, no
    /// first list while the caches hold more, each watch that waits for
    /// room told to `report`.
    pub(crate) fn with_budget(limit: usize, budget: Option<(usize, Report)>) -> Self {
        let limit = limit.clamp(1, Semaphore::MAX_PERMITS);
        Self {
            inner: Arc::new(Inner {
                semaphore: Arc::new(Semaphore::new(limit)),
                limit,
                waiting: AtomicUsize::new(0),
                budget: budget.map(|(bytes, report)| Arc::new(Budget::new(bytes, report))),
            }),
        }
    }

    /// No bound: for a cache outside any fleet.
    pub(crate) fn unbounded() -> Self {
        Self::new(Semaphore::MAX_PERMITS)
    }

    /// How many lists may be in flight at once.
    pub fn limit(&self) -> usize {
        self.inner.limit
    }

    /// How many watches list now, holding a permit.
    pub fn in_flight(&self) -> usize {
        self.inner.limit - self.inner.semaphore.available_permits()
    }

    /// How many watches wait for a permit to list.
    pub fn waiting(&self) -> usize {
        self.inner.waiting.load(Ordering::Relaxed)
    }

    /// The budget of bytes the caches may hold before no first list
    /// starts, if any ([`FleetConfig::cache_budget`](crate::FleetConfig::cache_budget)).
    pub fn cache_budget(&self) -> Option<usize> {
        self.inner.budget.as_ref().map(|budget| budget.limit())
    }

    /// The bytes the caches hold now, as the budget counts them (each
    /// object by the length of its `Debug` text), with the first lists
    /// under way; zero without a budget, which counts nothing.
    pub fn cached_bytes(&self) -> usize {
        self.inner.budget.as_ref().map_or(0, |budget| budget.used())
    }

    /// The watches whose first list waits for room in the cache budget,
    /// each by its cluster, kind and selectors, with the bytes it waits
    /// for (more than the budget: it is never made).
    pub fn waiting_for_room(&self) -> Vec<(String, usize)> {
        self.inner
            .budget
            .as_ref()
            .map(|budget| budget.waiting().into_iter().collect())
            .unwrap_or_default()
    }

    /// The events `make` makes for the watch `source` (its cluster, kind
    /// and selectors), counted against the cache budget if there is one:
    /// its first list waits for room, and is made anew if it did not fit
    /// (`queued` is true while it waits). Each list is put under a permit
    /// by [`bound`](Self::bound), inside `make`.
    pub(crate) fn counted<K>(
        &self,
        source: String,
        queued: Arc<AtomicBool>,
        make: impl Fn() -> BoxStream<'static, watcher::Result<Event<K>>> + Send + 'static,
    ) -> BoxStream<'static, watcher::Result<Event<K>>>
    where
        K: Resource + fmt::Debug + Send + 'static,
    {
        match &self.inner.budget {
            Some(budget) => budget.bound(source, queued, make),
            None => make(),
        }
    }

    /// `events` with each of its lists holding one of these permits;
    /// `queued` is true while it waits for one.
    pub(crate) fn bound<T: Send + 'static>(
        &self,
        events: BoxStream<'static, watcher::Result<Event<T>>>,
        queued: Arc<AtomicBool>,
    ) -> BoxStream<'static, watcher::Result<Event<T>>> {
        if self.inner.limit == Semaphore::MAX_PERMITS {
            return events;
        }
        Permitted {
            events,
            lists: self.clone(),
            queued,
            permit: None,
            acquiring: None,
            held: None,
            needs: true,
            listing: false,
            expires: None,
        }
        .boxed()
    }
}

/// How long one list may hold a permit: a list that takes longer (a
/// cluster that hangs, an API server retrying a request for minutes) goes
/// on without one, so that it holds up no other list for longer.
const HOLD: Duration = Duration::from_secs(30);

/// Counts one waiter until dropped: acquired, or given up.
struct Waiting(Arc<Inner>);

impl Drop for Waiting {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A watch's events, each of its lists under a permit.
struct Permitted<T> {
    events: BoxStream<'static, watcher::Result<Event<T>>>,
    lists: InitialLists,
    /// True while it waits for a permit, for the watch's status.
    queued: Arc<AtomicBool>,
    permit: Option<OwnedSemaphorePermit>,
    acquiring: Option<BoxFuture<'static, OwnedSemaphorePermit>>,
    /// The start of a list, passed on once a permit is held: the watch is
    /// not polled for the list's request until then.
    held: Option<watcher::Result<Event<T>>>,
    /// Whether the watch's next request lists: a permit is taken before it
    /// is polled again.
    needs: bool,
    /// Between the start of a list and its end.
    listing: bool,
    /// When the permit held goes back, listed or not.
    expires: Option<Pin<Box<Sleep>>>,
}

impl<T> Permitted<T> {
    /// Asks for a permit, counted as waiting until one is free.
    fn acquire(&mut self) {
        self.queued.store(true, Ordering::Relaxed);
        let inner = self.lists.inner.clone();
        inner.waiting.fetch_add(1, Ordering::Relaxed);
        let waiting = Waiting(inner.clone());
        let acquiring = async move {
            let permit = inner.semaphore.clone().acquire_owned().await;
            drop(waiting);
            permit.expect("the semaphore is never closed")
        };
        self.acquiring = Some(acquiring.boxed());
    }

    fn release(&mut self) {
        self.permit = None;
        self.expires = None;
    }
}

/// Whether `error` ends the watch's view of the cluster: the next request
/// lists anew.
fn relists(error: &watcher::Error) -> bool {
    matches!(error, watcher::Error::WatchError(status) if status.code == 410)
}

// Nothing in it is pinned: the held event is moved, never polled.
impl<T> Unpin for Permitted<T> {}

impl<T> Stream for Permitted<T> {
    type Item = watcher::Result<Event<T>>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        loop {
            if let Some(acquiring) = &mut this.acquiring {
                this.permit = Some(ready!(acquiring.poll_unpin(cx)));
                this.acquiring = None;
                this.queued.store(false, Ordering::Relaxed);
                this.expires = Some(Box::pin(tokio::time::sleep(HOLD)));
                if let Some(held) = this.held.take() {
                    return Poll::Ready(Some(held));
                }
            }
            // The first request, and the first after a list failed or the
            // watch fell too far behind, lists (or, streamed, opens the
            // watch that carries the list): not made before a permit is
            // held.
            if this.needs && this.permit.is_none() {
                this.needs = false;
                this.acquire();
                continue;
            }
            this.needs = false;
            if let Some(expires) = &mut this.expires
                && expires.as_mut().poll(cx).is_ready()
            {
                tracing::debug!("a list held its permit for {HOLD:?}: it goes on without one");
                this.release();
            }
            let next = ready!(this.events.poll_next_unpin(cx));
            match &next {
                Some(Ok(Event::Init)) => {
                    this.listing = true;
                    // A paged list that follows: its request is made when
                    // the watch is polled next, so the start waits for a
                    // permit.
                    if this.permit.is_none() {
                        this.held = next;
                        this.acquire();
                        continue;
                    }
                }
                Some(Ok(Event::InitDone)) => {
                    this.listing = false;
                    this.release();
                }
                // Failed: the watch waits to retry holding none, and takes
                // one again before it lists.
                Some(Err(error)) => {
                    this.needs = this.listing || relists(error);
                    this.listing = false;
                    this.release();
                }
                None => this.release(),
                _ => {}
            }
            return Poll::Ready(next);
        }
    }
}

#[cfg(test)]
mod tests {
    use futures::{channel::mpsc, stream};

    use super::*;

    type Sender = mpsc::UnboundedSender<watcher::Result<Event<u32>>>;

    fn watch(lists: &InitialLists) -> (Sender, BoxStream<'static, watcher::Result<Event<u32>>>) {
        let (tx, rx) = mpsc::unbounded();
        (tx, lists.bound(rx.boxed(), Arc::default()))
    }

    fn ready<T>(stream: &mut BoxStream<'static, T>) -> Option<Option<T>> {
        stream.next().now_or_never()
    }

    #[tokio::test]
    async fn lists_wait_for_a_permit_and_give_it_back_when_done_or_failed() {
        let lists = InitialLists::new(1);
        let (a_tx, mut a) = watch(&lists);
        let (b_tx, mut b) = watch(&lists);
        for tx in [&a_tx, &b_tx] {
            tx.unbounded_send(Ok(Event::Init)).unwrap();
            tx.unbounded_send(Ok(Event::InitApply(1))).unwrap();
        }
        // A takes the one permit; B waits, its watch not polled.
        assert!(matches!(ready(&mut a), Some(Some(Ok(Event::Init)))));
        assert!(ready(&mut b).is_none());
        assert_eq!((lists.in_flight(), lists.waiting()), (1, 1));
        assert!(matches!(ready(&mut a), Some(Some(Ok(Event::InitApply(1))))));
        // A fails: the permit goes to B.
        a_tx.unbounded_send(Err(watcher::Error::NoResourceVersion))
            .unwrap();
        assert!(matches!(ready(&mut a), Some(Some(Err(_)))));
        assert!(matches!(ready(&mut b), Some(Some(Ok(Event::Init)))));
        assert_eq!((lists.in_flight(), lists.waiting()), (1, 0));
        // A lists again: it waits for B's list to be done.
        a_tx.unbounded_send(Ok(Event::Init)).unwrap();
        assert!(ready(&mut a).is_none());
        assert_eq!(lists.waiting(), 1);
        assert!(matches!(ready(&mut b), Some(Some(Ok(Event::InitApply(1))))));
        b_tx.unbounded_send(Ok(Event::InitDone)).unwrap();
        assert!(matches!(ready(&mut b), Some(Some(Ok(Event::InitDone)))));
        assert!(matches!(ready(&mut a), Some(Some(Ok(Event::Init)))));
        // B watches on without a permit; A's ends with its stream.
        b_tx.unbounded_send(Ok(Event::Apply(2))).unwrap();
        assert!(matches!(ready(&mut b), Some(Some(Ok(Event::Apply(2))))));
        drop(a_tx);
        assert!(matches!(ready(&mut a), Some(None)));
        assert_eq!((lists.in_flight(), lists.waiting()), (0, 0));
    }

    #[tokio::test]
    async fn a_watch_dropped_while_waiting_is_no_longer_counted() {
        let lists = InitialLists::new(1);
        let mut first = lists.bound(
            stream::pending::<watcher::Result<Event<u32>>>().boxed(),
            Arc::default(),
        );
        assert!(ready(&mut first).is_none());
        let queued = Arc::new(AtomicBool::new(false));
        let mut second = lists.bound(
            stream::pending::<watcher::Result<Event<u32>>>().boxed(),
            queued.clone(),
        );
        assert!(ready(&mut second).is_none());
        assert_eq!((lists.in_flight(), lists.waiting()), (1, 1));
        assert!(queued.load(Ordering::Relaxed));
        drop(second);
        assert_eq!(lists.waiting(), 0);
        drop(first);
        assert_eq!(lists.in_flight(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_list_that_hangs_gives_its_permit_back_after_the_hold() {
        let lists = InitialLists::new(1);
        let (a_tx, mut a) = watch(&lists);
        let (b_tx, mut b) = watch(&lists);
        a_tx.unbounded_send(Ok(Event::Init)).unwrap();
        b_tx.unbounded_send(Ok(Event::Init)).unwrap();
        assert!(matches!(ready(&mut a), Some(Some(Ok(Event::Init)))));
        assert!(ready(&mut b).is_none());
        // A's list hangs: once the hold is over, B lists; A's list goes on.
        let b_next = tokio::spawn(async move { (b.next().await.is_some(), b) });
        let a_next = tokio::spawn(async move { (a.next().await, a) });
        tokio::time::sleep(HOLD + Duration::from_secs(1)).await;
        let (listed, _b) = b_next.await.unwrap();
        assert!(listed);
        assert_eq!((lists.in_flight(), lists.waiting()), (1, 0));
        a_tx.unbounded_send(Ok(Event::InitDone)).unwrap();
        let (done, _a) = a_next.await.unwrap();
        assert!(matches!(done, Some(Ok(Event::InitDone))));
        assert_eq!(lists.in_flight(), 1, "B's permit only");
    }

    #[tokio::test]
    async fn a_watch_that_falls_behind_takes_a_permit_before_it_lists_again() {
        let lists = InitialLists::new(1);
        let (a_tx, mut a) = watch(&lists);
        a_tx.unbounded_send(Ok(Event::Init)).unwrap();
        a_tx.unbounded_send(Ok(Event::InitDone)).unwrap();
        assert!(matches!(ready(&mut a), Some(Some(Ok(Event::Init)))));
        assert!(matches!(ready(&mut a), Some(Some(Ok(Event::InitDone)))));
        assert_eq!(lists.in_flight(), 0);
        // Another watch lists now.
        let (b_tx, mut b) = watch(&lists);
        b_tx.unbounded_send(Ok(Event::Init)).unwrap();
        assert!(matches!(ready(&mut b), Some(Some(Ok(Event::Init)))));
        // A's watch is refused as too old (410): before it is polled for
        // its next request (a streamed list's opens the watch), it waits.
        let gone = kube::core::Status::failure("too old", "Expired").with_code(410);
        a_tx.unbounded_send(Err(watcher::Error::WatchError(gone.boxed())))
            .unwrap();
        a_tx.unbounded_send(Ok(Event::Init)).unwrap();
        assert!(matches!(ready(&mut a), Some(Some(Err(_)))));
        assert!(ready(&mut a).is_none());
        assert_eq!(lists.waiting(), 1);
        // Other failures while watching re-watch without a permit.
        b_tx.unbounded_send(Ok(Event::InitDone)).unwrap();
        assert!(matches!(ready(&mut b), Some(Some(Ok(Event::InitDone)))));
        assert!(matches!(ready(&mut a), Some(Some(Ok(Event::Init)))));
        b_tx.unbounded_send(Err(watcher::Error::NoResourceVersion))
            .unwrap();
        b_tx.unbounded_send(Ok(Event::Apply(3))).unwrap();
        assert!(matches!(ready(&mut b), Some(Some(Err(_)))));
        assert!(matches!(ready(&mut b), Some(Some(Ok(Event::Apply(3))))));
    }
}
