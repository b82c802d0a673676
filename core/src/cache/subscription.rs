//! Fan-out from one watch to its subscribers: each subscriber has an inbox
//! of the objects that changed, merged per object until it reads them.

use std::{
    fmt,
    pin::Pin,
    sync::{Arc, Mutex},
    task::{Context, Poll},
};

use futures::{Stream, task::AtomicWaker};
use indexmap::IndexMap;
use kube::{
    Resource, ResourceExt,
    runtime::reflector::{ObjectRef, Store},
};

use super::TypeInfo;

use crate::panic::lock;

/// A change a subscriber hears of.
#[derive(Debug)]
pub enum Change<K> {
    /// The object was listed: when the watch first synced (or when this
    /// subscription began, for an object already cached), or by a relist
    /// after the watch was down, during which it changed.
    Listed(Arc<K>),
    /// The object was created or updated while the watch ran.
    Applied(Arc<K>),
    /// The object was deleted; this is its last known state.
    Deleted(Arc<K>),
}

impl<K> Clone for Change<K> {
    fn clone(&self) -> Self {
        match self {
            Self::Listed(object) => Self::Listed(object.clone()),
            Self::Applied(object) => Self::Applied(object.clone()),
            Self::Deleted(object) => Self::Deleted(object.clone()),
        }
    }
}

impl<K> Change<K> {
    /// The object, whether listed, applied or deleted.
    pub fn object(&self) -> &Arc<K> {
        match self {
            Self::Listed(object) | Self::Applied(object) | Self::Deleted(object) => object,
        }
    }
}

/// What the watch tells each inbox: about one object, or that every object
/// in the store was listed (the first list, or the store a subscriber finds
/// when it joins), which costs nothing per object until it is read.
pub(crate) enum Note<K: Resource> {
    Everything,
    Listed(ObjectRef<K>),
    Applied(ObjectRef<K>),
    Deleted(ObjectRef<K>, Arc<K>),
}

/// An object still present, as the subscriber will be told of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Presence {
    Listed,
    Applied,
}

/// Everything a subscriber has not read about one object: at most one
/// deletion (its last state) and whether the object is there now. The object
/// itself is read from the store when the subscriber gets to it, so an inbox
/// never keeps an old version alive.
pub(super) struct Entry<K> {
    deleted: Option<Arc<K>>,
    present: Option<Presence>,
}

/// What a subscriber has not read: possibly the whole store, and the
/// objects that changed.
pub(super) struct Pending<K: Resource<DynamicType: TypeInfo>> {
    everything: bool,
    pub(super) objects: IndexMap<ObjectRef<K>, Entry<K>>,
}

impl<K: Resource<DynamicType: TypeInfo>> Default for Pending<K> {
    fn default() -> Self {
        Self {
            everything: false,
            objects: IndexMap::new(),
        }
    }
}

/// One subscriber's unread changes, in the order objects first changed.
pub(crate) struct Inbox<K: Resource<DynamicType: TypeInfo>> {
    pub(super) pending: Mutex<Pending<K>>,
    waker: AtomicWaker,
}

impl<K: Resource<DynamicType: TypeInfo>> Inbox<K> {
    pub(crate) fn new() -> Self {
        Self {
            pending: Mutex::default(),
            waker: AtomicWaker::new(),
        }
    }

    /// Merges `notes` into what the subscriber has not read yet.
    pub(crate) fn notify<'a>(&self, notes: impl IntoIterator<Item = &'a Note<K>>)
    where
        K: 'a,
    {
        {
            let mut pending = lock(&self.pending);
            for note in notes {
                match note {
                    Note::Everything => pending.everything = true,
                    Note::Listed(key) => {
                        let entry = entry(&mut pending.objects, key);
                        // A live change not yet read says more than a list.
                        if entry.present != Some(Presence::Applied) {
                            entry.present = Some(Presence::Listed);
                        }
                    }
                    Note::Applied(key) => {
                        entry(&mut pending.objects, key).present = Some(Presence::Applied);
                    }
                    Note::Deleted(key, last) => {
                        let entry = entry(&mut pending.objects, key);
                        entry.deleted = Some(last.clone());
                        entry.present = None;
                    }
                }
            }
        }
        self.waker.wake();
    }
}

/// The store's key for `object`, without the extras a lookup does not need.
pub(super) fn key_of<K: Resource<DynamicType: TypeInfo>>(
    object: &K,
    dyntype: &K::DynamicType,
) -> ObjectRef<K> {
    let key = ObjectRef::new_with(&object.name_any(), dyntype.clone());
    match object.namespace() {
        Some(namespace) => key.within(&namespace),
        None => key,
    }
}

fn entry<'p, K: Resource<DynamicType: TypeInfo>>(
    pending: &'p mut IndexMap<ObjectRef<K>, Entry<K>>,
    key: &ObjectRef<K>,
) -> &'p mut Entry<K> {
    pending.entry(key.clone()).or_insert(Entry {
        deleted: None,
        present: None,
    })
}

/// A stream of the changes of one [`SharedWatch`](super::SharedWatch), from
/// [`SharedWatch::subscribe`](super::SharedWatch::subscribe).
///
/// Changes to one object are merged until the subscriber reads them: it
/// reads the object as it is in the store at that moment, and a deletion
/// once, with the object's last state. Memory is thus bounded by the number
/// of objects, however slowly the subscriber reads. The subscription keeps
/// its watch running; it never ends by itself.
pub struct Subscription<K: Resource<DynamicType: TypeInfo> + 'static> {
    inbox: Arc<Inbox<K>>,
    store: Store<K>,
    /// The objects the store held when the subscriber got to a list of
    /// everything (pointers to them, not copies); each is read again from
    /// the store when told.
    listed: std::vec::IntoIter<Arc<K>>,
    batch: indexmap::map::IntoIter<ObjectRef<K>, Entry<K>>,
    /// The object's present state, told right after its deletion.
    next: Option<Change<K>>,
    dyntype: K::DynamicType,
    /// The watch, kept running while anyone subscribes.
    _watch: Arc<dyn std::any::Any + Send + Sync>,
}

impl<K: Resource<DynamicType: TypeInfo> + Clone + 'static> Subscription<K> {
    /// Of the watch `watch` of `K` objects described by `dyntype`.
    pub(crate) fn new(
        watch: Arc<dyn std::any::Any + Send + Sync>,
        dyntype: K::DynamicType,
        store: Store<K>,
        inbox: Arc<Inbox<K>>,
    ) -> Self {
        Self {
            inbox,
            store,
            listed: Vec::new().into_iter(),
            batch: IndexMap::new().into_iter(),
            next: None,
            dyntype,
            _watch: watch,
        }
    }

    fn present(&self, key: &ObjectRef<K>, presence: Option<Presence>) -> Option<Change<K>> {
        let object = self.store.get(key)?;
        match presence? {
            Presence::Listed => Some(Change::Listed(object)),
            Presence::Applied => Some(Change::Applied(object)),
        }
    }
}

impl<K: Resource<DynamicType: TypeInfo>> fmt::Debug for Subscription<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Subscription")
            .field("kind", &K::kind(&self.dyntype))
            .field(
                "unread",
                &(self.batch.len() + lock(&self.inbox.pending).objects.len()),
            )
            .finish_non_exhaustive()
    }
}

impl<K: Resource<DynamicType: TypeInfo> + Clone + 'static> Stream for Subscription<K> {
    type Item = Change<K>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Change<K>>> {
        let this = self.get_mut();
        loop {
            if let Some(change) = this.next.take() {
                return Poll::Ready(Some(change));
            }
            if let Some(listed) = this.listed.next() {
                // Told as it is now, and once: not if it has gone since, nor
                // if a change to it waits in the inbox (that tells it).
                let key = key_of(listed.as_ref(), &this.dyntype);
                if lock(&this.inbox.pending).objects.contains_key(&key) {
                    continue;
                }
                match this.store.get(&key) {
                    Some(object) => return Poll::Ready(Some(Change::Listed(object))),
                    None => continue,
                }
            }
            if let Some((key, entry)) = this.batch.next() {
                let present = this.present(&key, entry.present);
                match (entry.deleted, present) {
                    (Some(last), present) => {
                        this.next = present;
                        return Poll::Ready(Some(Change::Deleted(last)));
                    }
                    (None, Some(present)) => return Poll::Ready(Some(present)),
                    // Gone from the store since: its deletion is on its way.
                    (None, None) => continue,
                }
            }
            // Register before looking, so a change that lands in between wakes us.
            this.inbox.waker.register(cx.waker());
            let pending = std::mem::take(&mut *lock(&this.inbox.pending));
            if !pending.everything && pending.objects.is_empty() {
                return Poll::Pending;
            }
            if pending.everything {
                let mut listed = this.store.state();
                if !pending.objects.is_empty() {
                    // Those are told by their own entry, as they are now.
                    let dyntype = &this.dyntype;
                    listed.retain(|object| {
                        !pending
                            .objects
                            .contains_key(&key_of(object.as_ref(), dyntype))
                    });
                }
                this.listed = listed.into_iter();
            }
            this.batch = pending.objects.into_iter();
        }
    }
}
