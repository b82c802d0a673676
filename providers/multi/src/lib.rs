//! Several cluster providers as one, each under a prefix of its own.
//!
//! A cluster that provider `prefix` calls `name` is engaged in the fleet as
//! `prefix#name`, so that two providers may use the same names without
//! clashing. Providers are added and removed while the fleet runs: adding
//! one engages its clusters as it reports them; removing one disengages every
//! cluster it engaged. A provider whose stream ends leaves its clusters
//! engaged until it is removed.
//!
//! ```no_run
//! # async fn example(east: kube::Client, lab: kube::Client) -> Result<(), kube_multicluster_provider_multi::Error> {
//! use kube_multicluster::{Fleet, provider::ProgrammaticProvider};
//! use kube_multicluster_provider_multi::MultiProvider;
//!
//! let fleet = Fleet::new();
//! let (multi, providers) = MultiProvider::new();
//! tokio::spawn({
//!     let fleet = fleet.clone();
//!     async move { fleet.run(multi).await }
//! });
//! let (prod, prod_clusters) = ProgrammaticProvider::new();
//! let (test, test_clusters) = ProgrammaticProvider::new();
//! providers.add("prod", prod)?;
//! providers.add("test", test)?;
//! prod_clusters.engage("east", east); // engaged as "prod#east"
//! test_clusters.engage("east", lab); // engaged as "test#east"
//! providers.remove("test"); // "test#east" is disengaged
//! # Ok(())
//! # }
//! ```

#![cfg_attr(docsrs, feature(doc_cfg))]

use std::{
    collections::{HashMap, HashSet, VecDeque},
    fmt,
    pin::Pin,
    sync::{Arc, Mutex},
    task::{Context, Poll},
};

use futures::{Stream, StreamExt, stream::BoxStream};
use kube_multicluster::{ClusterName, provider::ClusterEvent};
use tokio::sync::mpsc;
use tokio_stream::StreamMap;

/// What separates a provider's prefix from its cluster's name.
pub const SEPARATOR: char = '#';

/// The prefix and the provider's own name of a cluster named by a
/// [`MultiProvider`], if `name` is one.
///
/// ```
/// assert_eq!(kube_multicluster_provider_multi::split("prod#east"), Some(("prod", "east")));
/// assert_eq!(kube_multicluster_provider_multi::split("east"), None);
/// ```
pub fn split(name: &str) -> Option<(&str, &str)> {
    name.split_once(SEPARATOR)
}

/// Why a provider cannot be added.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    /// The prefix is empty or holds the separator.
    #[error(
        "the provider prefix {0:?} is not usable: it must be non-empty and hold no '{SEPARATOR}'"
    )]
    BadPrefix(String),
    /// Another provider has this prefix.
    #[error("a provider with the prefix {0:?} is there already")]
    Taken(String),
    /// The [`MultiProvider`] is gone.
    #[error("the multi provider is gone")]
    Gone,
}

enum Command {
    Add(String, u64, BoxStream<'static, Option<ClusterEvent>>),
    Remove(String, u64),
}

/// A provider in the map: its prefix and the number its handle gave it, so
/// that a removed provider and one added later under the same prefix are
/// never confused.
type Key = (String, u64);

/// Providers combined into one stream of [`ClusterEvent`]s, for
/// [`Fleet::run`](kube_multicluster::Fleet::run). Providers come and go through
/// its [`MultiHandle`]; the stream ends when every handle is dropped and
/// every provider's stream has ended.
pub struct MultiProvider {
    commands: Option<mpsc::UnboundedReceiver<Command>>,
    /// Each provider's events, then `None` once when its stream ends.
    providers: StreamMap<Key, BoxStream<'static, Option<ClusterEvent>>>,
    /// The clusters each provider has engaged, by their own names.
    engaged: HashMap<Key, HashSet<ClusterName>>,
    /// Events to hand on before any other.
    ready: VecDeque<ClusterEvent>,
}

impl fmt::Debug for MultiProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MultiProvider")
            .field(
                "providers",
                &self.engaged.keys().map(|(p, _)| p).collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

/// Adds providers to and removes them from a [`MultiProvider`]. Cloneable.
#[derive(Clone)]
pub struct MultiHandle {
    commands: mpsc::UnboundedSender<Command>,
    prefixes: Arc<Mutex<Prefixes>>,
}

#[derive(Default)]
struct Prefixes {
    /// The providers in it now, with their numbers.
    live: HashMap<String, u64>,
    next: u64,
}

impl fmt::Debug for MultiHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MultiHandle").finish_non_exhaustive()
    }
}

impl MultiProvider {
    /// A provider with no providers in it yet, and its handle.
    pub fn new() -> (Self, MultiHandle) {
        let (tx, rx) = mpsc::unbounded_channel();
        let provider = Self {
            commands: Some(rx),
            providers: StreamMap::new(),
            engaged: HashMap::new(),
            ready: VecDeque::new(),
        };
        (
            provider,
            MultiHandle {
                commands: tx,
                prefixes: Arc::default(),
            },
        )
    }

    fn apply(&mut self, command: Command) {
        match command {
            Command::Add(prefix, number, provider) => {
                let key = (prefix, number);
                self.engaged.entry(key.clone()).or_default();
                self.providers.insert(key, provider);
            }
            Command::Remove(prefix, number) => {
                let key = (prefix, number);
                self.providers.remove(&key);
                let engaged = self.engaged.remove(&key).unwrap_or_default();
                self.ready
                    .extend(engaged.into_iter().map(|name| ClusterEvent::Disengage {
                        name: prefixed(&key.0, &name),
                    }));
            }
        }
    }

    /// `event` of the provider `key`, renamed, and remembered; `None` if that
    /// provider is no longer in it.
    fn renamed(&mut self, key: &Key, mut event: ClusterEvent) -> Option<ClusterEvent> {
        let engaged = self.engaged.get_mut(key)?;
        match &mut event {
            ClusterEvent::Engage { name, .. } | ClusterEvent::EngageView { name, .. } => {
                engaged.insert(std::mem::replace(name, prefixed(&key.0, name)));
            }
            ClusterEvent::Disengage { name } => {
                engaged.remove(name);
                *name = prefixed(&key.0, name);
            }
        }
        Some(event)
    }
}

fn prefixed(prefix: &str, name: &ClusterName) -> ClusterName {
    ClusterName::new(format!("{prefix}{SEPARATOR}{name}"))
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

impl Stream for MultiProvider {
    type Item = ClusterEvent;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<ClusterEvent>> {
        let this = &mut *self;
        loop {
            // Commands first, so that a removal is seen before its provider's
            // later events.
            while let Some(commands) = &mut this.commands {
                match commands.poll_recv(cx) {
                    Poll::Ready(Some(command)) => this.apply(command),
                    Poll::Ready(None) => this.commands = None,
                    Poll::Pending => break,
                }
            }
            if let Some(event) = this.ready.pop_front() {
                return Poll::Ready(Some(event));
            }
            match this.providers.poll_next_unpin(cx) {
                Poll::Ready(Some((key, Some(event)))) => {
                    if let Some(event) = this.renamed(&key, event) {
                        return Poll::Ready(Some(event));
                    }
                }
                Poll::Ready(Some((key, None))) => {
                    let engaged = this.engaged.get(&key).map_or(0, HashSet::len);
                    tracing::info!(
                        prefix = %key.0,
                        engaged,
                        "a provider's stream ended; its clusters stay engaged until it is removed"
                    );
                }
                // No provider left: the end, unless more may be added.
                Poll::Ready(None) if this.commands.is_none() => return Poll::Ready(None),
                Poll::Ready(None) | Poll::Pending => return Poll::Pending,
            }
        }
    }
}

impl MultiHandle {
    /// Adds `provider` under `prefix`: each cluster it engages as `name` is
    /// engaged in the fleet as `prefix#name`.
    ///
    /// # Errors
    ///
    /// If `prefix` is empty or holds [`SEPARATOR`], if another provider has
    /// it, or if the [`MultiProvider`] is gone.
    pub fn add<P>(&self, prefix: impl Into<String>, provider: P) -> Result<(), Error>
    where
        P: Stream<Item = ClusterEvent> + Send + 'static,
    {
        let prefix = prefix.into();
        if prefix.is_empty() || prefix.contains(SEPARATOR) {
            return Err(Error::BadPrefix(prefix));
        }
        let mut prefixes = lock(&self.prefixes);
        if self.commands.is_closed() {
            return Err(Error::Gone);
        }
        if prefixes.live.contains_key(&prefix) {
            return Err(Error::Taken(prefix));
        }
        let number = prefixes.next;
        prefixes.next += 1;
        // The lock is held through the send, so that commands reach the
        // provider in the order the prefixes changed.
        let provider = provider
            .map(Some)
            .chain(futures::stream::once(async { None }))
            .boxed();
        self.commands
            .send(Command::Add(prefix.clone(), number, provider))
            .map_err(|_| Error::Gone)?;
        prefixes.live.insert(prefix, number);
        Ok(())
    }

    /// Removes the provider `prefix` and disengages every cluster it
    /// engaged. Returns `false` if there is no such provider or the
    /// [`MultiProvider`] is gone.
    ///
    /// A provider whose stream has ended is still there, its clusters
    /// engaged, until it is removed.
    pub fn remove(&self, prefix: &str) -> bool {
        let mut prefixes = lock(&self.prefixes);
        let Some(&number) = prefixes.live.get(prefix) else {
            return false;
        };
        if self
            .commands
            .send(Command::Remove(prefix.to_owned(), number))
            .is_err()
        {
            prefixes.live.clear();
            return false;
        }
        prefixes.live.remove(prefix);
        true
    }

    /// The prefixes of the providers in it now, sorted; none once the
    /// [`MultiProvider`] is gone.
    pub fn prefixes(&self) -> Vec<String> {
        let prefixes = lock(&self.prefixes);
        if self.commands.is_closed() {
            return Vec::new();
        }
        let mut prefixes: Vec<_> = prefixes.live.keys().cloned().collect();
        prefixes.sort();
        prefixes
    }
}

#[cfg(test)]
mod tests {
    use futures::FutureExt;
    use kube_multicluster::provider::ProgrammaticProvider;

    use super::*;

    fn client() -> kube::Client {
        let config = kube::Config::new("https://127.0.0.1:1".parse().unwrap());
        kube::Client::try_from(config).unwrap()
    }

    /// What the provider hands on now, as `+name` and `-name`.
    fn now(multi: &mut MultiProvider) -> Vec<String> {
        let mut seen = Vec::new();
        while let Some(Some(event)) = multi.next().now_or_never() {
            seen.push(match event {
                ClusterEvent::Engage { name, .. } | ClusterEvent::EngageView { name, .. } => {
                    format!("+{name}")
                }
                ClusterEvent::Disengage { name } => format!("-{name}"),
            });
        }
        seen
    }

    #[tokio::test]
    async fn clusters_are_named_by_prefix_and_removing_a_provider_disengages_them() {
        let (mut multi, handle) = MultiProvider::new();
        let (prod, prod_clusters) = ProgrammaticProvider::new();
        let (test, test_clusters) = ProgrammaticProvider::new();
        handle.add("prod", prod).unwrap();
        handle.add("test", test).unwrap();
        prod_clusters.engage("east", client());
        test_clusters.engage("east", client());
        test_clusters.engage("west", client());
        let mut seen = now(&mut multi);
        seen.sort();
        assert_eq!(seen, ["+prod#east", "+test#east", "+test#west"]);
        test_clusters.disengage("west");
        assert_eq!(now(&mut multi), ["-test#west"]);
        assert!(handle.remove("test"));
        assert_eq!(handle.prefixes(), ["prod"]);
        // The prefix can be used again at once.
        let (again, again_clusters) = ProgrammaticProvider::new();
        handle.add("test", again).unwrap();
        again_clusters.engage("north", client());
        // A cluster reported after the removal is not engaged.
        test_clusters.engage("late", client());
        assert_eq!(now(&mut multi), ["-test#east", "+test#north"]);
    }

    #[tokio::test]
    async fn bad_and_taken_prefixes_are_refused() {
        let (_multi, handle) = MultiProvider::new();
        let (a, _) = ProgrammaticProvider::new();
        let (b, _) = ProgrammaticProvider::new();
        let (c, _) = ProgrammaticProvider::new();
        let (d, _) = ProgrammaticProvider::new();
        assert_eq!(handle.add("", a), Err(Error::BadPrefix(String::new())));
        assert_eq!(handle.add("a#b", b), Err(Error::BadPrefix("a#b".into())));
        handle.add("prod", c).unwrap();
        assert_eq!(handle.add("prod", d), Err(Error::Taken("prod".into())));
        assert!(!handle.remove("nothing"));
    }

    #[tokio::test]
    async fn once_the_provider_is_gone_the_handle_says_so() {
        let (multi, handle) = MultiProvider::new();
        let (a, _) = ProgrammaticProvider::new();
        let (b, _) = ProgrammaticProvider::new();
        handle.add("prod", a).unwrap();
        drop(multi);
        assert!(handle.prefixes().is_empty());
        assert!(!handle.remove("prod"));
        assert_eq!(handle.add("test", b), Err(Error::Gone));
    }

    #[tokio::test]
    async fn a_prefix_removed_and_added_again_at_once_keeps_the_new_provider() {
        let (mut multi, handle) = MultiProvider::new();
        let (old, old_clusters) = ProgrammaticProvider::new();
        handle.add("prod", old).unwrap();
        old_clusters.engage("east", client());
        assert_eq!(now(&mut multi), ["+prod#east"]);
        let (new, new_clusters) = ProgrammaticProvider::new();
        assert!(handle.remove("prod"));
        handle.add("prod", new).unwrap();
        new_clusters.engage("west", client());
        old_clusters.engage("late", client());
        assert_eq!(now(&mut multi), ["-prod#east", "+prod#west"]);
        assert_eq!(handle.prefixes(), ["prod"]);
    }

    #[tokio::test]
    async fn a_provider_whose_stream_ends_keeps_its_clusters_until_removed() {
        let (mut multi, handle) = MultiProvider::new();
        let (prod, prod_clusters) = ProgrammaticProvider::new();
        handle.add("prod", prod).unwrap();
        prod_clusters.engage("east", client());
        drop(prod_clusters);
        assert_eq!(now(&mut multi), ["+prod#east"]);
        assert_eq!(handle.prefixes(), ["prod"]);
        assert!(handle.remove("prod"));
        assert_eq!(now(&mut multi), ["-prod#east"]);
    }

    #[tokio::test]
    async fn the_stream_ends_when_the_handles_and_the_providers_are_gone() {
        let (mut multi, handle) = MultiProvider::new();
        let (prod, prod_clusters) = ProgrammaticProvider::new();
        handle.add("prod", prod).unwrap();
        drop(handle);
        prod_clusters.engage("east", client());
        assert_eq!(now(&mut multi), ["+prod#east"]);
        assert!(
            multi.next().now_or_never().is_none(),
            "a provider still runs"
        );
        drop(prod_clusters);
        assert!(matches!(multi.next().now_or_never(), Some(None)));
    }
}
