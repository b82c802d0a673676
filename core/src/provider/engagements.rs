//! Which clusters a provider has engaged, from what, and the clients being
//! built for them.

use std::{
    collections::{HashMap, VecDeque},
    fmt,
    future::Future,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use futures::{
    FutureExt, StreamExt, TryFutureExt,
    future::{BoxFuture, poll_fn},
    stream::{self, BoxStream, FuturesUnordered},
};
use tokio_util::time::DelayQueue;

use super::{ClusterEvent, Problems, build_error::BuildError};
use crate::{client::ClusterClient, cluster_name::ClusterName};

type Build = Arc<dyn Fn() -> BoxFuture<'static, Result<ClusterClient, BuildError>> + Send + Sync>;

/// The clusters a provider wants engaged, each from a version of its source
/// (a hash of what its client is built from), turned into [`ClusterEvent`]s.
///
/// A provider tells it what each source now asks for with
/// [`want`](Self::want) and [`unwant`](Self::unwant), and takes the events
/// from [`next`](Self::next). It builds clients concurrently, so a source
/// whose credential plugin hangs holds up no other; a cluster engaged from
/// an older version stays engaged until the new version's client is built,
/// then is engaged again with it (a version that gives no client disengages
/// it). A version that is refused is not built again until it changes; one
/// that gives no client now is built again after the retry interval. Each
/// failure is reported to [`Problems`] under the source's name, and cleared
/// when the cluster is engaged or no longer wanted.
///
/// Only the version wanted when a build completes is ever engaged: a build
/// overtaken by a newer version, by [`unwant`](Self::unwant) or by
/// [`hold`](Self::hold) is dropped when it completes, whatever was engaged
/// before. A source that stops giving credentials (a Secret whose key was
/// removed, which is how an operator revokes them) calls `hold`, so a
/// rotation still being built when the key went is never engaged.
///
/// ```
/// use std::time::Duration;
/// use kube_multicluster::provider::{
///     ClusterEvent, Engagements, Problems,
///     kubeconfig::{self, KubeconfigPolicy},
/// };
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let problems = Problems::new();
/// let mut engagements = Engagements::new(problems.clone(), Duration::from_secs(30));
/// let config = kube::Config::new("https://east.example.com:6443".parse()?);
/// let client = kube::Client::try_from(config)?;
///
/// // Version 1 of the source builds; version 2 is not a kubeconfig.
/// engagements.want("east", "Secret fleet/east", 1, move || {
///     let client = client.clone();
///     async move { Ok(client) }
/// });
/// assert!(matches!(engagements.next().await, ClusterEvent::Engage { .. }));
/// engagements.want("east", "Secret fleet/east", 2, || async {
///     let policy = KubeconfigPolicy::default();
///     kubeconfig::bytes_client(b"not: [a kubeconfig", "Secret fleet/east", &policy).await
/// });
/// assert!(matches!(engagements.next().await, ClusterEvent::Disengage { .. }));
/// assert!(problems.get("Secret fleet/east").is_some());
///
/// // Gone: its problem goes with it.
/// engagements.unwant("east");
/// assert!(problems.current().is_empty());
/// # Ok(())
/// # }
/// ```
pub struct Engagements {
    problems: Problems,
    retry: Duration,
    entries: HashMap<ClusterName, Entry>,
    builds: FuturesUnordered<BoxFuture<'static, Built>>,
    retries: DelayQueue<(ClusterName, u64)>,
    ready: VecDeque<ClusterEvent>,
    generations: u64,
}

struct Entry {
    source: String,
    hash: u64,
    generation: u64,
    /// Builds this version again while it is waiting; dropped once it is
    /// engaged, so no credential outlives its use.
    build: Option<Build>,
    /// The version the fleet holds this cluster from now, if it does (this
    /// version or an earlier one).
    engaged: Option<u64>,
    state: State,
    /// Why this version gave no client, while it is refused or waiting.
    problem: Option<String>,
}

#[derive(Debug, PartialEq, Eq)]
enum State {
    Building,
    Engaged,
    Refused,
    Waiting,
}

struct Built {
    name: ClusterName,
    generation: u64,
    result: Result<ClusterClient, BuildError>,
}

impl fmt::Debug for Engagements {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut entries: Vec<_> = self
            .entries
            .iter()
            .map(|(name, entry)| (name.as_ref(), &entry.state))
            .collect();
        entries.sort_by_key(|(name, _)| *name);
        f.debug_struct("Engagements")
            .field("retry", &self.retry)
            .field("entries", &entries)
            .finish_non_exhaustive()
    }
}

impl Engagements {
    /// None yet; failures go to `problems`, and a version that gave no
    /// client now is built again after `retry` (taken as at least 100 ms
    /// and at most a day).
    pub fn new(problems: Problems, retry: Duration) -> Self {
        Self {
            problems,
            retry: retry.clamp(Duration::from_millis(100), Duration::from_secs(86_400)),
            entries: HashMap::new(),
            builds: FuturesUnordered::new(),
            retries: DelayQueue::new(),
            ready: VecDeque::new(),
            generations: 0,
        }
    }

    /// The cluster `name` should be engaged from the version `hash` of its
    /// source (named `source` in problems and logs), with the client
    /// `build` gives. If that version is already engaged, being built,
    /// refused or waiting to be built again, nothing is built, and its
    /// state is reported again (its problem, or none if it is engaged);
    /// otherwise it is built now, and `build` is kept to build it again if
    /// it gives no client now.
    pub fn want<F, C>(
        &mut self,
        name: impl Into<ClusterName>,
        source: impl Into<String>,
        hash: u64,
        build: impl Fn() -> F + Send + Sync + 'static,
    ) where
        F: Future<Output = Result<C, BuildError>> + Send + 'static,
        C: Into<ClusterClient> + 'static,
    {
        let name = name.into();
        if let Some(entry) = self.entries.get(&name)
            && entry.hash == hash
        {
            // The same version again: its problem, if any, is told again
            // (the provider may have reported another meanwhile).
            match (&entry.state, &entry.problem) {
                (State::Engaged, _) => self.problems.clear(&entry.source),
                (State::Refused | State::Waiting, Some(problem)) => {
                    self.problems.report(&entry.source, problem)
                }
                _ => {}
            }
            return;
        }
        self.generations += 1;
        let generation = self.generations;
        let engaged = self.entries.get(&name).and_then(|e| e.engaged);
        let source = source.into();
        // Back to the version engaged now, while another was being built or
        // was held: that one is dropped, this one stays; any other is built.
        let back = engaged == Some(hash);
        if back {
            self.problems.clear(&source);
        }
        let build: Build = Arc::new(move || build().map_ok(Into::into).boxed());
        self.entries.insert(
            name.clone(),
            Entry {
                source,
                hash,
                generation,
                build: (!back).then(|| build.clone()),
                engaged,
                state: if back {
                    State::Engaged
                } else {
                    State::Building
                },
                problem: None,
            },
        );
        if !back {
            self.start(name, generation, &build);
        }
    }

    /// The source of `name` gives no version now (its key is gone, or
    /// empty), but leaves a cluster engaged from it as it was: that cluster
    /// stays engaged, from the version it was engaged from, and a version
    /// being built or waiting to be built again is dropped, never to be
    /// engaged. A cluster not engaged is no longer wanted, as with
    /// [`unwant`](Self::unwant). The source's problem is left to the
    /// provider, which reports why (its report replaces any other), so a
    /// source held again and again is not told anew each time.
    ///
    /// Wanting the engaged version again later builds nothing; any other
    /// version is built as usual.
    ///
    /// ```
    /// use std::time::Duration;
    /// use kube_multicluster::provider::{ClusterEvent, Engagements, Problems};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let mut engagements = Engagements::new(Problems::new(), Duration::from_secs(30));
    /// let config = kube::Config::new("https://east.example.com:6443".parse()?);
    /// let client = kube::Client::try_from(config)?;
    /// let first = client.clone();
    /// engagements.want("east", "Secret fleet/east", 1, move || {
    ///     let client = first.clone();
    ///     async move { Ok(client) }
    /// });
    /// assert!(matches!(engagements.next().await, ClusterEvent::Engage { .. }));
    ///
    /// // A rotation whose credential plugin is slow, then the key is removed.
    /// engagements.want("east", "Secret fleet/east", 2, move || {
    ///     let client = client.clone();
    ///     async move {
    ///         tokio::time::sleep(Duration::from_secs(5)).await;
    ///         Ok(client)
    ///     }
    /// });
    /// engagements.hold("east");
    /// // The rotation is never engaged; version 1 stays.
    /// let next = tokio::time::timeout(Duration::from_secs(60), engagements.next()).await;
    /// assert!(next.is_err());
    /// assert!(engagements.is_engaged("east"));
    /// # Ok(())
    /// # }
    /// ```
    pub fn hold(&mut self, name: &str) {
        let Some(entry) = self.entries.get_mut(name) else {
            return;
        };
        let Some(engaged) = entry.engaged else {
            // Nothing engaged to keep, and nothing to disengage.
            self.entries.remove(name);
            return;
        };
        if entry.state != State::Engaged || entry.hash != engaged {
            tracing::info!(cluster = %name, source = %entry.source, "a version being built is dropped: its source gives no client now; the cluster stays as it was engaged");
        }
        self.generations += 1;
        entry.generation = self.generations;
        entry.hash = engaged;
        entry.build = None;
        entry.state = State::Engaged;
        entry.problem = None;
    }

    /// The cluster `name` should not be engaged (its source is gone, or
    /// says it is not ready): it is disengaged if it was engaged, a build
    /// under way is forgotten, and its source's problem is cleared.
    pub fn unwant(&mut self, name: &str) {
        if let Some(entry) = self.entries.remove(name) {
            self.problems.clear(&entry.source);
            if entry.engaged.is_some() {
                tracing::info!(cluster = %name, source = %entry.source, "disengaging a cluster");
                self.ready.push_back(ClusterEvent::Disengage {
                    name: ClusterName::new(name),
                });
            }
        }
    }

    /// Whether the fleet holds the cluster `name` now, from any version.
    pub fn is_engaged(&self, name: &str) -> bool {
        self.entries.get(name).is_some_and(|e| e.engaged.is_some())
    }

    /// Whether the cluster `name` is wanted (engaged, being built, refused
    /// or waiting to be built again).
    pub fn is_wanted(&self, name: &str) -> bool {
        self.entries.contains_key(name)
    }

    /// The names of the clusters wanted, in no order.
    pub fn wanted(&self) -> impl Iterator<Item = &ClusterName> {
        self.entries.keys()
    }

    /// The next event for the fleet. Pending while there is none; builds
    /// and retries make progress only while this is polled.
    pub async fn next(&mut self) -> ClusterEvent {
        poll_fn(|cx| self.poll_event(cx)).await
    }

    fn poll_event(&mut self, cx: &mut Context<'_>) -> Poll<ClusterEvent> {
        loop {
            if let Some(event) = self.ready.pop_front() {
                return Poll::Ready(event);
            }
            if let Poll::Ready(Some(built)) = self.builds.poll_next_unpin(cx) {
                self.built(built);
                continue;
            }
            if let Poll::Ready(Some(expired)) = self.retries.poll_expired(cx) {
                let (name, generation) = expired.into_inner();
                if let Some(entry) = self.entries.get_mut(&name)
                    && entry.generation == generation
                    && entry.state == State::Waiting
                {
                    entry.state = State::Building;
                    if let Some(build) = entry.build.clone() {
                        self.start(name, generation, &build);
                    }
                }
                continue;
            }
            return Poll::Pending;
        }
    }

    fn start(&mut self, name: ClusterName, generation: u64, build: &Build) {
        let build = build();
        self.builds.push(
            async move {
                Built {
                    name,
                    generation,
                    result: build.await,
                }
            }
            .boxed(),
        );
    }

    fn built(&mut self, built: Built) {
        let Some(entry) = self.entries.get_mut(&built.name) else {
            return;
        };
        if entry.generation != built.generation {
            // An older version's, or a source that left meanwhile.
            return;
        }
        let name = built.name;
        match built.result {
            Ok(client) => {
                self.problems.clear(&entry.source);
                tracing::info!(cluster = %name, source = %entry.source, again = entry.engaged.is_some(), "engaging a cluster");
                entry.engaged = Some(entry.hash);
                entry.build = None;
                entry.state = State::Engaged;
                self.ready.push_back(ClusterEvent::Engage { name, client });
                return;
            }
            Err(BuildError::Refused(problem)) => {
                self.problems.report(&entry.source, &problem);
                entry.state = State::Refused;
                entry.problem = Some(problem);
            }
            Err(BuildError::Unavailable(problem)) => {
                let retry = self.retry;
                let problem = format!("{problem} (tried again every {retry:?})");
                self.problems.report(&entry.source, &problem);
                entry.state = State::Waiting;
                entry.problem = Some(problem);
                self.retries.insert((name.clone(), entry.generation), retry);
            }
        }
        if entry.engaged.take().is_some() {
            tracing::info!(cluster = %name, source = %entry.source, "disengaging a cluster: its source gives no client now");
            self.ready.push_back(ClusterEvent::Disengage { name });
        }
    }
}

/// The events of a provider's `state`, which holds its [`Engagements`]
/// (reached through `engagements`) and changes with what two streams say
/// (the watches of its sources, say): each item of `first` and `second` is
/// handed, with the state, to the function paired with it, and each event
/// of the engagements is yielded. The events never end, even if a stream
/// does. A provider with one source passes `stream::empty()` as the other.
pub fn drive<S: Send + 'static, A: Send + 'static, B: Send + 'static>(
    state: S,
    engagements: fn(&mut S) -> &mut Engagements,
    (first, on_first): (BoxStream<'static, A>, fn(&mut S, A)),
    (second, on_second): (BoxStream<'static, B>, fn(&mut S, B)),
) -> BoxStream<'static, ClusterEvent> {
    stream::unfold((state, first, second), move |(mut state, mut first, mut second)| async move {
        loop {
            tokio::select! {
                event = engagements(&mut state).next() => return Some((event, (state, first, second))),
                Some(item) = first.next() => on_first(&mut state, item),
                Some(item) = second.next() => on_second(&mut state, item),
            }
        }
    })
    .boxed()
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    fn client() -> kube::Client {
        let config = kube::Config::new("https://a.example.com".parse().unwrap());
        kube::Client::try_from(config).unwrap()
    }

    fn name(event: &ClusterEvent) -> (&'static str, String) {
        match event {
            ClusterEvent::Engage { name, .. } => ("engage", name.to_string()),
            ClusterEvent::EngageView { name, .. } => ("view", name.to_string()),
            ClusterEvent::Disengage { name } => ("disengage", name.to_string()),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_hung_build_holds_up_no_other() {
        let mut engagements = Engagements::new(Problems::new(), Duration::from_secs(30));
        engagements.want(
            "slow",
            "slow",
            1,
            futures::future::pending::<Result<ClusterClient, BuildError>>,
        );
        engagements.want("quick", "quick", 1, || async { Ok(client()) });
        let event = engagements.next().await;
        assert_eq!(name(&event), ("engage", "quick".to_owned()));
        assert!(!engagements.is_engaged("slow"));
        assert!(engagements.is_wanted("slow"));
    }

    #[tokio::test(start_paused = true)]
    async fn unavailable_is_tried_again_after_the_interval_and_refused_is_not() {
        let problems = Problems::new();
        let mut engagements = Engagements::new(problems.clone(), Duration::from_secs(30));
        let tries = Arc::new(AtomicUsize::new(0));
        let counted = tries.clone();
        engagements.want("flaky", "Secret a/flaky", 1, move || {
            let n = counted.fetch_add(1, Ordering::SeqCst);
            async move {
                if n < 2 {
                    Err(BuildError::Unavailable("the plugin failed".into()))
                } else {
                    Ok(client())
                }
            }
        });
        let refused = Arc::new(AtomicUsize::new(0));
        let counted = refused.clone();
        engagements.want("bad", "Secret a/bad", 1, move || {
            counted.fetch_add(1, Ordering::SeqCst);
            async { Err::<ClusterClient, _>(BuildError::Refused("not a kubeconfig".into())) }
        });
        let began = tokio::time::Instant::now();
        let event = engagements.next().await;
        assert_eq!(name(&event), ("engage", "flaky".to_owned()));
        assert_eq!(tries.load(Ordering::SeqCst), 3);
        assert_eq!(began.elapsed(), Duration::from_secs(60));
        assert_eq!(refused.load(Ordering::SeqCst), 1);
        assert_eq!(problems.get("Secret a/flaky"), None);
        assert_eq!(
            problems.get("Secret a/bad").as_deref(),
            Some("not a kubeconfig")
        );
        // The same version again is not built again.
        engagements.want("bad", "Secret a/bad", 1, || async { Ok(client()) });
        assert!(
            tokio::time::timeout(Duration::from_secs(600), engagements.next())
                .await
                .is_err()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_build_overtaken_by_a_newer_version_or_a_departure_is_dropped() {
        let mut engagements = Engagements::new(Problems::new(), Duration::from_secs(30));
        engagements.want("a", "a", 1, || async {
            tokio::time::sleep(Duration::from_secs(5)).await;
            Err::<ClusterClient, _>(BuildError::Refused("old".into()))
        });
        engagements.want("a", "a", 2, || async { Ok(client()) });
        assert_eq!(name(&engagements.next().await), ("engage", "a".to_owned()));
        engagements.want("b", "b", 1, || async {
            tokio::time::sleep(Duration::from_secs(5)).await;
            Ok(client())
        });
        engagements.unwant("b");
        // Neither the old build of a nor the build of b gives an event.
        assert!(
            tokio::time::timeout(Duration::from_secs(60), engagements.next())
                .await
                .is_err()
        );
        assert!(engagements.is_engaged("a"));
        assert!(!engagements.is_wanted("b"));
        engagements.unwant("a");
        assert_eq!(
            name(&engagements.next().await),
            ("disengage", "a".to_owned())
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_engaged_cluster_stays_until_its_new_version_is_built() {
        let mut engagements = Engagements::new(Problems::new(), Duration::from_secs(30));
        engagements.want("a", "a", 1, || async { Ok(client()) });
        assert_eq!(name(&engagements.next().await), ("engage", "a".to_owned()));
        engagements.want("a", "a", 2, || async {
            tokio::time::sleep(Duration::from_secs(5)).await;
            Err::<ClusterClient, _>(BuildError::Unavailable("no".into()))
        });
        assert!(engagements.is_engaged("a"));
        assert_eq!(
            name(&engagements.next().await),
            ("disengage", "a".to_owned())
        );
        assert!(!engagements.is_engaged("a"));
        assert!(engagements.is_wanted("a"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_build_held_before_it_completes_is_never_engaged() {
        let problems = Problems::new();
        let mut engagements = Engagements::new(problems.clone(), Duration::from_secs(30));
        engagements.want("a", "Secret a/a", 1, || async { Ok(client()) });
        assert_eq!(name(&engagements.next().await), ("engage", "a".to_owned()));
        let slow = || async {
            tokio::time::sleep(Duration::from_secs(5)).await;
            Ok(client())
        };
        // A rotation being built when the key goes.
        engagements.want("a", "Secret a/a", 2, slow);
        engagements.hold("a");
        problems.report("Secret a/a", "has no key");
        assert!(
            tokio::time::timeout(Duration::from_secs(60), engagements.next())
                .await
                .is_err(),
            "the held rotation was engaged"
        );
        assert!(engagements.is_engaged("a"));
        assert_eq!(problems.get("Secret a/a").as_deref(), Some("has no key"));
        // The engaged version back: nothing to build, nothing to engage.
        engagements.want("a", "Secret a/a", 1, || {
            panic!("the engaged version was built again");
            #[allow(unreachable_code)]
            futures::future::pending::<Result<ClusterClient, BuildError>>()
        });
        assert!(
            tokio::time::timeout(Duration::from_secs(60), engagements.next())
                .await
                .is_err()
        );
        assert_eq!(problems.get("Secret a/a"), None);
        // The rotation back: built and engaged.
        engagements.want("a", "Secret a/a", 2, slow);
        assert_eq!(name(&engagements.next().await), ("engage", "a".to_owned()));
        // A held version waiting to be built again is dropped too.
        engagements.want("a", "Secret a/a", 3, || async {
            Err::<ClusterClient, _>(BuildError::Unavailable("the plugin failed".into()))
        });
        assert_eq!(
            name(&engagements.next().await),
            ("disengage", "a".to_owned())
        );
        engagements.hold("a");
        assert!(!engagements.is_wanted("a"));
        assert!(
            tokio::time::timeout(Duration::from_secs(600), engagements.next())
                .await
                .is_err()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_held_cluster_never_engaged_is_no_longer_wanted() {
        let mut engagements = Engagements::new(Problems::new(), Duration::from_secs(30));
        engagements.want("a", "a", 1, || async {
            tokio::time::sleep(Duration::from_secs(5)).await;
            Ok(client())
        });
        engagements.hold("a");
        assert!(!engagements.is_wanted("a"));
        assert!(
            tokio::time::timeout(Duration::from_secs(60), engagements.next())
                .await
                .is_err()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_same_version_again_tells_its_state_again() {
        let problems = Problems::new();
        let mut engagements = Engagements::new(problems.clone(), Duration::from_secs(30));
        engagements.want("bad", "Secret a/bad", 1, || async {
            Err::<ClusterClient, _>(BuildError::Refused("not a kubeconfig".into()))
        });
        let _ = tokio::time::timeout(Duration::from_secs(1), engagements.next()).await;
        // The provider reports something else meanwhile (its key went
        // missing), then the same version comes back.
        problems.report("Secret a/bad", "no key");
        engagements.want("bad", "Secret a/bad", 1, || async { Ok(client()) });
        assert_eq!(
            problems.get("Secret a/bad").as_deref(),
            Some("not a kubeconfig")
        );
        engagements.want("good", "Secret a/good", 1, || async { Ok(client()) });
        assert_eq!(
            name(&engagements.next().await),
            ("engage", "good".to_owned())
        );
        problems.report("Secret a/good", "no key");
        engagements.want("good", "Secret a/good", 1, || async { Ok(client()) });
        assert_eq!(problems.get("Secret a/good"), None);
    }
}
