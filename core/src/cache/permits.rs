//! The bound on initial lists in flight across a fleet: a watch takes a
//! permit before it lists and gives it back once the list is done (or has
//! failed), so that engaging thousands of clusters at once lists them a
//! bounded number at a time, and neither this process's memory nor the API
//! servers see them all at once.

use std::{
    fmt,
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    task::{Context, Poll, ready},
};

use futures::{FutureExt, Stream, StreamExt, future::BoxFuture, stream::BoxStream};
use kube::runtime::watcher::{self, Event};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// How many watches of a [`Fleet`](crate::Fleet) may be listing at once, and
/// how many list or wait now; from [`Fleet::initial_lists`](crate::Fleet::initial_lists).
///
/// A watch takes a permit before its first request, so the TLS handshake of
/// a cluster's new connection and its first list both wait their turn; it
/// holds the permit until its list is done or fails, and takes one again
/// before each list that follows (after a watch expired, say). A cluster
/// that does not answer holds none while its watch waits to retry, so it
/// holds up no other cluster for long.
///
/// ```
/// use kube_fleet::Fleet;
///
/// let fleet = Fleet::new().with_initial_lists(16);
/// let lists = fleet.initial_lists();
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
}

impl fmt::Debug for InitialLists {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InitialLists")
            .field("limit", &self.limit())
            .field("in_flight", &self.in_flight())
            .field("waiting", &self.waiting())
            .finish()
    }
}

impl InitialLists {
    /// The bound a [`Fleet`](crate::Fleet) has unless told otherwise.
    pub const DEFAULT: usize = 64;

    /// At most `limit` lists at once (at least one).
    pub(crate) fn new(limit: usize) -> Self {
        let limit = limit.clamp(1, Semaphore::MAX_PERMITS);
        Self {
            inner: Arc::new(Inner {
                semaphore: Arc::new(Semaphore::new(limit)),
                limit,
                waiting: AtomicUsize::new(0),
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

    /// A permit, once one is free; counted as waiting until then.
    fn acquire(&self) -> BoxFuture<'static, OwnedSemaphorePermit> {
        let inner = self.inner.clone();
        inner.waiting.fetch_add(1, Ordering::Relaxed);
        let waiting = Waiting(inner.clone());
        async move {
            let permit = inner.semaphore.clone().acquire_owned().await;
            drop(waiting);
            permit.expect("the semaphore is never closed")
        }
        .boxed()
    }

    /// `events` with each of its lists holding one of these permits.
    pub(crate) fn bound<T: Send + 'static>(
        &self,
        events: BoxStream<'static, watcher::Result<Event<T>>>,
    ) -> BoxStream<'static, watcher::Result<Event<T>>> {
        if self.inner.limit == Semaphore::MAX_PERMITS {
            return events;
        }
        Permitted {
            events,
            lists: self.clone(),
            permit: None,
            acquiring: None,
            held: None,
            started: false,
        }
        .boxed()
    }
}

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
    permit: Option<OwnedSemaphorePermit>,
    acquiring: Option<BoxFuture<'static, OwnedSemaphorePermit>>,
    /// The start of a list, passed on once a permit is held: the watch is
    /// not polled for the list's request until then.
    held: Option<watcher::Result<Event<T>>>,
    started: bool,
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
                if let Some(held) = this.held.take() {
                    return Poll::Ready(Some(held));
                }
            }
            // The first request of a watch is its list (or, streamed, the
            // watch that carries it): not made before a permit is held.
            if !this.started {
                this.started = true;
                this.acquiring = Some(this.lists.acquire());
                continue;
            }
            let next = ready!(this.events.poll_next_unpin(cx));
            match &next {
                // A list that follows: its request is made when the watch
                // is polled next, so the start waits for a permit.
                Some(Ok(Event::Init)) if this.permit.is_none() => {
                    this.held = Some(next.expect("matched"));
                    this.acquiring = Some(this.lists.acquire());
                    continue;
                }
                // Listed, or failed: the watch waits to retry holding none.
                Some(Ok(Event::InitDone)) | Some(Err(_)) | None => this.permit = None,
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
        (tx, lists.bound(rx.boxed()))
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
        let mut first = lists.bound(stream::pending::<watcher::Result<Event<u32>>>().boxed());
        assert!(ready(&mut first).is_none());
        let mut second = lists.bound(stream::pending::<watcher::Result<Event<u32>>>().boxed());
        assert!(ready(&mut second).is_none());
        assert_eq!((lists.in_flight(), lists.waiting()), (1, 1));
        drop(second);
        assert_eq!(lists.waiting(), 0);
        drop(first);
        assert_eq!(lists.in_flight(), 0);
    }
}
