//! The provider's stream: it lists kind's clusters every interval, fetches
//! the kubeconfigs of the clusters that need it, and turns each answer into
//! [`ClusterEvent`]s as soon as it comes, whatever the other fetches do.

use std::{
    collections::{HashMap, HashSet, VecDeque},
    path::PathBuf,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use futures::{
    FutureExt, Stream, StreamExt,
    future::{AbortHandle, Abortable, Aborted, BoxFuture},
    stream::{BoxStream, FuturesUnordered},
};
use kube_multicluster::provider::{
    BuildError, ClusterEvent, Problems,
    kubeconfig::{self, KubeconfigPolicy},
};
use tokio::time::{Instant, Interval};

use crate::command::{self, CommandError};

/// The source under which a failing `kind get clusters` is reported.
pub(crate) const LIST_SOURCE: &str = "kind get clusters";

/// How many kubeconfigs are fetched at once.
pub(crate) const CONCURRENT_FETCHES: usize = 8;

/// The source under which the kind cluster `name`'s problems are reported,
/// and the origin its kubeconfig errors name.
pub(crate) fn cluster_source(name: &str) -> String {
    format!("kind cluster {name:?}")
}

/// What the provider was configured with.
#[derive(Debug, Clone)]
pub(crate) struct Options {
    pub(crate) executable: PathBuf,
    pub(crate) interval: Duration,
    pub(crate) refresh: Duration,
    pub(crate) prefix: String,
    pub(crate) policy: KubeconfigPolicy,
}

/// The provider's events. The first listing runs when the stream is first
/// polled, and each of the others `options.interval` after the one before
/// it ended. The stream never ends.
pub(crate) fn events(options: Options, problems: Problems) -> BoxStream<'static, ClusterEvent> {
    Poller {
        options: Arc::new(options),
        problems,
        ticks: None,
        listing: None,
        listed: HashSet::new(),
        engaged: HashMap::new(),
        fetching: HashMap::new(),
        fetches: FuturesUnordered::new(),
        waiting: VecDeque::new(),
        ready: VecDeque::new(),
    }
    .boxed()
}

/// A fetch of one cluster's kubeconfig, with the cluster's name; `Aborted`
/// if the cluster went before it ended.
type Fetch = BoxFuture<'static, (String, Result<Verdict, Aborted>)>;

struct Poller {
    options: Arc<Options>,
    problems: Problems,
    /// Made on the first poll, inside the runtime.
    ticks: Option<Interval>,
    /// The `kind get clusters` under way, if one is.
    listing: Option<BoxFuture<'static, Result<String, CommandError>>>,
    /// The clusters the last listing that worked gave.
    listed: HashSet<String>,
    /// The engaged clusters, by kind name.
    engaged: HashMap<String, Engaged>,
    /// The clusters whose kubeconfigs are being fetched: one fetch at a time
    /// for each, however long it takes.
    fetching: HashMap<String, AbortHandle>,
    fetches: FuturesUnordered<Fetch>,
    /// The clusters whose kubeconfigs are due, waiting for a place among the
    /// fetches under way, in the order they were listed.
    waiting: VecDeque<String>,
    /// Events to hand on.
    ready: VecDeque<ClusterEvent>,
}

struct Engaged {
    /// The fingerprint of the kubeconfig the cluster is engaged with.
    fingerprint: u64,
    /// When that kubeconfig was last fetched and found the same, or `None`
    /// if the last fetch failed.
    checked: Option<Instant>,
}

/// What a cluster's kubeconfig, fetched now, means for the cluster.
enum Verdict {
    /// The same as the engaged cluster's: nothing to do.
    Unchanged,
    /// New, or changed: engage the cluster through this client.
    Engage {
        fingerprint: u64,
        client: kube_multicluster::client::ClusterClient,
    },
    /// No kubeconfig to judge (kind failed, or printed no kubeconfig):
    /// perhaps for a moment, so an engaged cluster stays.
    Unavailable(String),
    /// The kubeconfig gives no cluster: an engaged cluster leaves.
    Refused(String),
}

impl Stream for Poller {
    type Item = ClusterEvent;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<ClusterEvent>> {
        let this = &mut *self;
        loop {
            if let Some(event) = this.ready.pop_front() {
                return Poll::Ready(Some(event));
            }
            if let Poll::Ready(Some((name, verdict))) = this.fetches.poll_next_unpin(cx) {
                if let Ok(verdict) = verdict {
                    this.fetched(name, verdict);
                }
                continue;
            }
            if let Some(listing) = this.listing.as_mut() {
                let Poll::Ready(listing) = listing.poll_unpin(cx) else {
                    return Poll::Pending;
                };
                this.listing = None;
                this.listed(listing);
                if let Some(ticks) = this.ticks.as_mut() {
                    ticks.reset();
                }
                continue;
            }
            let interval = this.options.interval;
            let ticks = this
                .ticks
                .get_or_insert_with(|| tokio::time::interval(interval));
            if ticks.poll_tick(cx).is_pending() {
                return Poll::Pending;
            }
            let executable = this.options.executable.clone();
            this.listing =
                Some(async move { command::run(&executable, &["get", "clusters"]).await }.boxed());
        }
    }
}

impl Poller {
    /// Takes in what `kind get clusters` gave: forgets the clusters that are
    /// gone, and fetches the kubeconfigs that are due.
    fn listed(&mut self, listing: Result<String, CommandError>) {
        let stdout = match listing {
            Ok(stdout) => stdout,
            Err(error) => {
                self.problems.report(LIST_SOURCE, error);
                return;
            }
        };
        self.problems.clear(LIST_SOURCE);
        let mut seen = HashSet::new();
        // With no clusters, kind prints a notice on stderr and nothing here.
        let names: Vec<String> = stdout
            .lines()
            .map(str::trim)
            .filter(|name| !name.is_empty() && name.starts_with(&self.options.prefix))
            .filter(|name| seen.insert(*name))
            .map(str::to_owned)
            .collect();
        self.listed = names.iter().cloned().collect();
        self.forget_vanished();
        let now = Instant::now();
        for name in names {
            if self.due(&name, now)
                && !self.fetching.contains_key(&name)
                && !self.waiting.contains(&name)
            {
                self.waiting.push_back(name);
            }
        }
        self.start_fetches();
    }

    /// Whether the cluster `name`'s kubeconfig is to be fetched now: if it
    /// is not engaged, if its last fetch failed, or if it has not been
    /// fetched for `options.refresh`.
    fn due(&self, name: &str, now: Instant) -> bool {
        match self.engaged.get(name) {
            Some(Engaged {
                checked: Some(checked),
                ..
            }) => now.duration_since(*checked) >= self.options.refresh,
            _ => true,
        }
    }

    /// Disengages the clusters no longer listed, stops their fetches and
    /// forgets their problems.
    fn forget_vanished(&mut self) {
        let mut gone: Vec<String> = self
            .engaged
            .keys()
            .filter(|name| !self.listed.contains(*name))
            .cloned()
            .collect();
        gone.sort();
        for name in gone {
            self.engaged.remove(&name);
            tracing::info!(cluster = %name, "disengaging a kind cluster that is gone");
            self.ready
                .push_back(ClusterEvent::Disengage { name: name.into() });
        }
        // Dropping a fetch kills its `kind`.
        self.fetching.retain(|name, fetch| {
            let listed = self.listed.contains(name);
            if !listed {
                fetch.abort();
            }
            listed
        });
        self.waiting.retain(|name| self.listed.contains(name));
        let sources: HashSet<String> = self.listed.iter().map(|n| cluster_source(n)).collect();
        self.problems
            .retain(|source| source == LIST_SOURCE || sources.contains(source));
    }

    /// Starts the waiting fetches that there is room for.
    fn start_fetches(&mut self) {
        while self.fetching.len() < CONCURRENT_FETCHES {
            let Some(name) = self.waiting.pop_front() else {
                return;
            };
            let engaged = self.engaged.get(&name).map(|e| e.fingerprint);
            let (abort, registration) = AbortHandle::new_pair();
            let judged = Abortable::new(
                judge(self.options.clone(), name.clone(), engaged),
                registration,
            );
            self.fetching.insert(name.clone(), abort);
            self.fetches
                .push(async move { (name, judged.await) }.boxed());
        }
    }

    /// Acts on the verdict of a fetch that ended.
    fn fetched(&mut self, name: String, verdict: Verdict) {
        self.fetching.remove(&name);
        self.start_fetches();
        // A cluster that went had its fetch stopped; this is a safeguard.
        if !self.listed.contains(&name) {
            return;
        }
        let source = cluster_source(&name);
        match verdict {
            Verdict::Unchanged => {
                self.problems.clear(&source);
                if let Some(engaged) = self.engaged.get_mut(&name) {
                    engaged.checked = Some(Instant::now());
                }
            }
            Verdict::Engage {
                fingerprint,
                client,
            } => {
                self.problems.clear(&source);
                let engaged = Engaged {
                    fingerprint,
                    checked: Some(Instant::now()),
                };
                let again = self.engaged.insert(name.clone(), engaged).is_some();
                tracing::info!(cluster = %name, again, "engaging a kind cluster");
                self.ready.push_back(ClusterEvent::Engage {
                    name: name.into(),
                    client,
                });
            }
            Verdict::Unavailable(problem) => {
                self.problems.report(source, problem);
                if let Some(engaged) = self.engaged.get_mut(&name) {
                    engaged.checked = None;
                }
            }
            Verdict::Refused(problem) => {
                self.problems.report(source, problem);
                if self.engaged.remove(&name).is_some() {
                    tracing::info!(cluster = %name, "disengaging a kind cluster whose kubeconfig is refused");
                    self.ready
                        .push_back(ClusterEvent::Disengage { name: name.into() });
                }
            }
        }
    }
}

/// Fetches the kind cluster `name`'s kubeconfig and judges it against the
/// policy and the fingerprint of the kubeconfig it is `engaged` with.
async fn judge(options: Arc<Options>, name: String, engaged: Option<u64>) -> Verdict {
    let origin = cluster_source(&name);
    let args = ["get", "kubeconfig", "--name", &name];
    let yaml = match command::run(&options.executable, &args).await {
        Ok(yaml) => yaml,
        Err(error) => return Verdict::Unavailable(format!("{origin}: {error}")),
    };
    let kubeconfig = match kubeconfig::parse(&yaml, &origin) {
        Ok(kubeconfig) => kubeconfig,
        Err(error) => return Verdict::Unavailable(error.to_string()),
    };
    let context = match kubeconfig::current_context(&kubeconfig, &origin) {
        Ok(context) => context,
        Err(error) => return Verdict::Refused(error.to_string()),
    };
    let Some(fingerprint) = kubeconfig::fingerprint(&kubeconfig, &context) else {
        return Verdict::Refused(format!("{origin}: no context {context:?}"));
    };
    if engaged == Some(fingerprint) {
        return Verdict::Unchanged;
    }
    // The current context alone is checked and loaded. An allowed credential
    // plugin runs off the runtime's threads and with a deadline; its error
    // quotes neither the plugin's command line nor what it printed.
    match kubeconfig::current_client(&kubeconfig, &origin, &options.policy).await {
        Ok(client) => Verdict::Engage {
            fingerprint,
            client,
        },
        Err(BuildError::Refused(problem) | BuildError::Unavailable(problem)) => {
            Verdict::Refused(problem)
        }
    }
}
