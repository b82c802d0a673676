//! A provider placed over another: of the clusters the inner provider
//! offers, it engages those that placement decisions in a hub name, and
//! follows the decisions as they change.
//!
//! A placement decision is any resource whose `status.decisions[]` lists
//! clusters by `clusterName`: Open Cluster Management's `PlacementDecision`
//! ([`Decisions::placement`]), or any kind of that shape (the shape Argo
//! CD's `clusterDecisionResource` generator reads) through
//! [`Decisions::new`]. The inner provider still says how each cluster is
//! reached; the decisions say which of them the fleet holds.
//!
//! # What it does
//!
//! - It remembers the inner provider's last event for each cluster, and
//!   engages a cluster once both hold: a decision names it and the inner
//!   provider offers it, in whichever order they come.
//! - A cluster no decision names any more (its decision changed, was
//!   deleted or was given a deletion timestamp) is disengaged after a grace
//!   of 2 seconds ([`PlacementProvider::grace`]), unless a decision names
//!   it again meanwhile: Open Cluster Management splits a placement's
//!   decisions into `PlacementDecision`s of 100 clusters, ordered by name,
//!   and a cluster moving from one to the next leaves one before the other
//!   names it. Named again after its grace, it is engaged again with the
//!   inner provider's last engagement of it.
//! - The inner provider's engage and disengage of a named cluster pass
//!   through: an engage replaces the cluster, a disengage removes it, and
//!   it is not engaged again until the inner provider offers it again.
//! - A decision's `clusterName` is the inner provider's name for the
//!   cluster unless [`Decisions::cluster_names`] maps it (onto a
//!   [multi provider](https://docs.rs/kube-multicluster-provider-multi)'s
//!   `prefix#name`, say).
//!
//! # Problems
//!
//! Each under its source in [`PlacementProvider::problems`], logged once,
//! and none touching another cluster:
//!
//! - `PlacementDecision namespace/name, cluster "east"` (the decision's
//!   kind, then its cluster as it names it): the decision names a cluster
//!   the inner provider does not offer (yet). It clears when the inner
//!   provider offers the cluster, which is then engaged, or when the
//!   decision stops naming it.
//! - `PlacementDecision namespace/name`: the decision is malformed
//!   (`status.decisions` is not a list, an entry has no `clusterName`, or
//!   one that is not a string or is empty); the clusters it names well
//!   still count, and so do other decisions.
//! - `PlacementDecisions (cluster.open-cluster-management.io/v1beta1) in
//!   fleet labelled ...`: the watch of the decisions fails. It is retried
//!   with kube's default backoff (800 ms, doubling up to 30 s), and the
//!   clusters engaged stay as they are meanwhile. The problem clears, and
//!   the backoff starts over, only once a list brings something back (an
//!   object, or the end of the list); a list that keeps failing stays a
//!   problem and is retried less and less often.
//!
//! A decision's problems are filed under its kind and `namespace/name`
//! alone: two sources that read the same object share them.
//!
//! The hub's client needs `get`, `list` and `watch` on the decisions'
//! resource (`placementdecisions.cluster.open-cluster-management.io`), in
//! their namespace.
//!
//! ```no_run
//! use kube_multicluster::{ClusterName, Fleet};
//! use kube_multicluster::provider::ProgrammaticProvider;
//! use kube_multicluster_provider_placement::{Decisions, PlacementProvider};
//!
//! # async fn example(hub: kube::Client, east: kube::Client, west: kube::Client) {
//! let (inner, clusters) = ProgrammaticProvider::new();
//! clusters.engage("east", east);
//! clusters.engage("west", west);
//! // The clusters the Placement `web` in `fleet` selects, of those two.
//! let provider = PlacementProvider::new(hub, Decisions::placement("fleet", "web"), inner);
//! let problems = provider.problems();
//! let fleet = Fleet::new();
//! tokio::spawn({
//!     let fleet = fleet.clone();
//!     async move { fleet.run(provider).await }
//! });
//! # let _ = problems;
//! # }
//! ```

#![cfg_attr(docsrs, feature(doc_cfg))]

mod decisions;
mod state;

use std::{
    fmt,
    pin::{Pin, pin},
    task::{Context, Poll},
    time::Duration,
};

pub use decisions::{Decisions, PLACEMENT_LABEL, placement_decision};
use futures::{
    Stream, StreamExt,
    future::{self, Either},
    stream,
    stream::BoxStream,
};
use kube::runtime::watcher;
use kube_multicluster::provider::{self, ClusterEvent, Problems};

/// The clusters of an inner provider that placement decisions in a hub
/// name: a stream of [`ClusterEvent`]s for
/// [`Fleet::run`](kube_multicluster::Fleet::run). See the [crate docs](crate).
///
/// The stream never ends, not even when the inner provider's does (its
/// clusters then stay as it last told, engaged as the decisions say).
/// Nothing runs before it is polled.
pub struct PlacementProvider {
    hub: kube::Client,
    decisions: Vec<Decisions>,
    inner: Option<BoxStream<'static, ClusterEvent>>,
    grace: Duration,
    problems: Problems,
    stream: Option<BoxStream<'static, ClusterEvent>>,
}

impl fmt::Debug for PlacementProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PlacementProvider")
            .field("decisions", &self.decisions)
            .field("grace", &self.grace)
            .field("problems", &self.problems)
            .finish_non_exhaustive()
    }
}

/// What moves the provider on: an event of the inner provider (`None` once
/// its stream ends), of the watch of one source of decisions, or the end
/// of a grace.
#[expect(
    clippy::large_enum_variant,
    reason = "one input at a time, moved straight into the state: boxing would only allocate"
)]
enum Input {
    Inner(Option<ClusterEvent>),
    Decisions(usize, DecisionEvent),
    Deadline,
}

type DecisionEvent = Result<watcher::Event<kube::api::DynamicObject>, watcher::Error>;

impl PlacementProvider {
    /// The grace of a cluster no decision names any more, unless
    /// [`grace`](Self::grace) sets another.
    pub const DEFAULT_GRACE: Duration = Duration::from_secs(2);

    /// Engages the clusters of `inner` that `decisions`, read from the hub
    /// `hub` reaches, name.
    pub fn new<P>(hub: kube::Client, decisions: Decisions, inner: P) -> Self
    where
        P: Stream<Item = ClusterEvent> + Send + 'static,
    {
        Self {
            hub,
            decisions: vec![decisions],
            inner: Some(inner.boxed()),
            grace: Self::DEFAULT_GRACE,
            problems: Problems::new(),
            stream: None,
        }
    }

    /// Reads `decisions` too: a cluster is engaged while a decision of
    /// any of the sources names it.
    ///
    /// ```no_run
    /// # fn example(hub: kube::Client, inner: kube_multicluster::provider::ProgrammaticProvider) {
    /// use kube_multicluster_provider_placement::{Decisions, PlacementProvider};
    ///
    /// let provider = PlacementProvider::new(hub, Decisions::placement("fleet", "web"), inner)
    ///     .decisions(Decisions::placement("fleet", "canary"));
    /// # }
    /// ```
    #[must_use]
    pub fn decisions(mut self, decisions: Decisions) -> Self {
        self.decisions.push(decisions);
        self
    }

    /// How long a cluster no decision names any more stays engaged before
    /// it is disengaged: if a decision names it again meanwhile, it stays.
    /// Open Cluster Management splits a placement's decisions into
    /// `PlacementDecision`s of 100 clusters, ordered by name, and a cluster
    /// moving from one to the next leaves the one before the other names
    /// it; without a grace its caches would be torn down and listed again.
    /// [`Self::DEFAULT_GRACE`] unless set; [`Duration::ZERO`] disengages at
    /// once. The inner provider's disengage passes at once whatever it is.
    ///
    /// ```no_run
    /// # fn example(hub: kube::Client, inner: kube_multicluster::provider::ProgrammaticProvider) {
    /// use std::time::Duration;
    /// use kube_multicluster_provider_placement::{Decisions, PlacementProvider};
    ///
    /// let provider = PlacementProvider::new(hub, Decisions::placement("fleet", "web"), inner)
    ///     .grace(Duration::from_secs(10));
    /// # }
    /// ```
    #[must_use]
    pub fn grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// What keeps named clusters from being engaged now, and failing
    /// watches, by source (see the [crate docs](crate#problems)). Shared
    /// with the provider: it stays current while the provider runs.
    pub fn problems(&self) -> Problems {
        self.problems.clone()
    }

    fn start(&mut self) -> BoxStream<'static, ClusterEvent> {
        let inner = self
            .inner
            .take()
            .expect("an inner provider until first polled")
            .map(Some)
            .chain(stream::iter([None]))
            .map(Input::Inner);
        let watches =
            stream::select_all(self.decisions.iter().enumerate().map(|(index, decisions)| {
                provider::backoff(watcher(
                    decisions.api(self.hub.clone()),
                    decisions.watcher_config(),
                ))
                .map(move |event| Input::Decisions(index, event))
                .boxed()
            }));
        let state = state::State::new(self.decisions.clone(), self.problems.clone(), self.grace);
        let inputs = stream::select(inner, watches);
        stream::unfold((state, inputs), |(mut state, mut inputs)| async move {
            loop {
                if let Some(event) = state.next_event() {
                    return Some((event, (state, inputs)));
                }
                let input = match state.deadline() {
                    None => inputs.next().await?,
                    Some(deadline) => {
                        let grace = pin!(tokio::time::sleep_until(deadline));
                        match future::select(inputs.next(), grace).await {
                            Either::Left((input, _)) => input?,
                            Either::Right(((), _)) => Input::Deadline,
                        }
                    }
                };
                match input {
                    Input::Inner(Some(event)) => state.on_inner(event),
                    Input::Inner(None) => tracing::info!(
                        "the inner provider's stream ended; its clusters stay as it last told"
                    ),
                    Input::Decisions(index, event) => state.on_decisions(index, event),
                    Input::Deadline => state.on_deadline(tokio::time::Instant::now()),
                }
            }
        })
        .boxed()
    }
}

impl Stream for PlacementProvider {
    type Item = ClusterEvent;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<ClusterEvent>> {
        let this = &mut *self;
        if this.stream.is_none() {
            this.stream = Some(this.start());
        }
        this.stream
            .as_mut()
            .expect("started above")
            .poll_next_unpin(cx)
    }
}
