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
//! # async fn example(east: kube::Client, lab: kube::Client) -> Result<(), kube_fleet_provider_multi::MultiError> {
//! use kube_fleet::{Fleet, provider::ProgrammaticProvider};
//! use kube_fleet_provider_multi::MultiProvider;
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
//! prod_clusters.add("east", east); // engaged as "prod#east"
//! test_clusters.add("east", lab); // engaged as "test#east"
//! providers.remove("test"); // "test#east" is disengaged
//! # Ok(())
//! # }
//! ```

use std::{
    collections::{HashMap, HashSet, VecDeque},
    fmt,
    pin::Pin,
    sync::{Arc, Mutex},
    task::{Context, Poll},
};

use futures::{Stream, StreamExt, stream::BoxStream};
use kube_fleet::{ClusterName, provider::ClusterEvent};
use tokio::sync::mpsc;
use tokio_stream::StreamMap;

/// What separates a provider's prefix from its cluster's name.
pub const SEPARATOR: char = '#';

/// The prefix and the provider's own name of a cluster named by a
/// [`MultiProvider`], if `name` is one.
///
/// ```
/// assert_eq!(kube_fleet_provider_multi::split("prod#east"), Some(("prod", "east")));
/// assert_eq!(kube_fleet_provider_multi::split("east"), None);
/// ```
pub fn split(name: &str) -> Option<(&str, &str)> {
    name.split_once(SEPARATOR)
}

/// Why a provider cannot be added.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum MultiError {
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
    Add(String, BoxStream<'static, ClusterEvent>),
    Remove(String),
}

/// Providers combined into one stream of [`ClusterEvent`]s, for
/// [`Fleet::run`](kube_fleet::Fleet::run). Providers come and go through
/// its [`MultiHandle`]; the stream ends when every handle is dropped and
/// every provider's stream has ended.
pub struct MultiProvider {
    commands: Option<mpsc::UnboundedReceiver<Command>>,
    providers: StreamMap<String, BoxStream<'static, ClusterEvent>>,
    /// The clusters each provider has engaged, by their own names.
    engaged: HashMap<String, HashSet<ClusterName>>,
    /// Events to hand on before any other.
    ready: VecDeque<ClusterEvent>,
}

impl fmt::Debug for MultiProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MultiProvider")
            .field("providers", &self.engaged.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

/// Adds providers to and removes them from a [`MultiProvider`]. Cloneable.
#[derive(Clone)]
pub struct MultiHandle {
    commands: mpsc::UnboundedSender<Command>,
    prefixes: Arc<Mutex<HashSet<String>>>,
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
        let prefixes = Arc::new(Mutex::new(HashSet::new()));
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
                prefixes,
            },
        )
    }

    fn apply(&mut self, command: Command) {
        match command {
            Command::Add(prefix, provider) => {
                self.engaged.entry(prefix.clone()).or_default();
                self.providers.insert(prefix, provider);
            }
            Command::Remove(prefix) => {
                self.providers.remove(&prefix);
                let engaged = self.engaged.remove(&prefix).unwrap_or_default();
                self.ready
                    .extend(engaged.into_iter().map(|name| ClusterEvent::Disengage {
                        name: prefixed(&prefix, &name),
                    }));
            }
        }
    }

    /// `event` of the provider `prefix`, renamed, and remembered.
    fn renamed(&mut self, prefix: &str, event: ClusterEvent) -> ClusterEvent {
        let engaged = self.engaged.entry(prefix.to_owned()).or_default();
        match event {
            ClusterEvent::Engage { name, client } => {
                let renamed = prefixed(prefix, &name);
                engaged.insert(name);
                ClusterEvent::Engage {
                    name: renamed,
                    client,
                }
            }
            ClusterEvent::Disengage { name } => {
                let renamed = prefixed(prefix, &name);
                engaged.remove(&name);
                ClusterEvent::Disengage { name: renamed }
            }
        }
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
            Poll::Ready(Some((prefix, event))) => {
                let event = this.renamed(&prefix, event);
                Poll::Ready(Some(event))
            }
            // No provider left: the end, unless more may be added.
            Poll::Ready(None) if this.commands.is_none() => Poll::Ready(None),
            Poll::Ready(None) | Poll::Pending => Poll::Pending,
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
    pub fn add<P>(&self, prefix: impl Into<String>, provider: P) -> Result<(), MultiError>
    where
        P: Stream<Item = ClusterEvent> + Send + 'static,
    {
        let prefix = prefix.into();
        if prefix.is_empty() || prefix.contains(SEPARATOR) {
            return Err(MultiError::BadPrefix(prefix));
        }
        let mut prefixes = lock(&self.prefixes);
        if prefixes.contains(&prefix) {
            return Err(MultiError::Taken(prefix));
        }
        self.commands
            .send(Command::Add(prefix.clone(), provider.boxed()))
            .map_err(|_| MultiError::Gone)?;
        prefixes.insert(prefix);
        Ok(())
    }

    /// Removes the provider `prefix` and disengages every cluster it
    /// engaged. Returns `false` if there is no such provider.
    pub fn remove(&self, prefix: &str) -> bool {
        // Free at once: an `add` of the same prefix now comes after the
        // removal.
        if !lock(&self.prefixes).remove(prefix) {
            return false;
        }
        self.commands
            .send(Command::Remove(prefix.to_owned()))
            .is_ok()
    }

    /// The prefixes of the providers in it now.
    pub fn prefixes(&self) -> Vec<String> {
        let mut prefixes: Vec<_> = lock(&self.prefixes).iter().cloned().collect();
        prefixes.sort();
        prefixes
    }
}

#[cfg(test)]
mod tests {
    use futures::FutureExt;
    use kube_fleet::provider::ProgrammaticProvider;

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
                ClusterEvent::Engage { name, .. } => format!("+{name}"),
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
        prod_clusters.add("east", client());
        test_clusters.add("east", client());
        test_clusters.add("west", client());
        let mut seen = now(&mut multi);
        seen.sort();
        assert_eq!(seen, ["+prod#east", "+test#east", "+test#west"]);
        test_clusters.remove("west");
        assert_eq!(now(&mut multi), ["-test#west"]);
        assert!(handle.remove("test"));
        assert_eq!(handle.prefixes(), ["prod"]);
        // The prefix can be used again at once.
        let (again, again_clusters) = ProgrammaticProvider::new();
        handle.add("test", again).unwrap();
        again_clusters.add("north", client());
        // A cluster reported after the removal is not engaged.
        test_clusters.add("late", client());
        assert_eq!(now(&mut multi), ["-test#east", "+test#north"]);
    }

    #[tokio::test]
    async fn bad_and_taken_prefixes_are_refused() {
        let (_multi, handle) = MultiProvider::new();
        let (a, _) = ProgrammaticProvider::new();
        let (b, _) = ProgrammaticProvider::new();
        let (c, _) = ProgrammaticProvider::new();
        let (d, _) = ProgrammaticProvider::new();
        assert_eq!(handle.add("", a), Err(MultiError::BadPrefix(String::new())));
        assert_eq!(
            handle.add("a#b", b),
            Err(MultiError::BadPrefix("a#b".into()))
        );
        handle.add("prod", c).unwrap();
        assert_eq!(handle.add("prod", d), Err(MultiError::Taken("prod".into())));
        assert!(!handle.remove("nothing"));
    }

    #[tokio::test]
    async fn the_stream_ends_when_the_handles_and_the_providers_are_gone() {
        let (mut multi, handle) = MultiProvider::new();
        let (prod, prod_clusters) = ProgrammaticProvider::new();
        handle.add("prod", prod).unwrap();
        drop(handle);
        prod_clusters.add("east", client());
        assert_eq!(now(&mut multi), ["+prod#east"]);
        assert!(
            multi.next().now_or_never().is_none(),
            "a provider still runs"
        );
        drop(prod_clusters);
        assert!(matches!(multi.next().now_or_never(), Some(None)));
    }
}
