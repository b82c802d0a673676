//! The provider's stream: each poll lists kind's clusters, fetches their
//! kubeconfigs, and turns what changed into [`ClusterEvent`]s.

use std::{
    collections::{HashMap, HashSet, VecDeque},
    path::PathBuf,
    time::Duration,
};

use futures::{StreamExt, stream::BoxStream};
use kube_fleet::{
    client,
    provider::{
        ClusterEvent, Problems,
        kubeconfig::{self, KubeconfigError, KubeconfigPolicy},
    },
};
use tokio::time::{Interval, MissedTickBehavior};

use crate::command;

/// The source under which a failing `kind get clusters` is reported.
pub(crate) const LIST_SOURCE: &str = "kind get clusters";

/// How many kubeconfigs are fetched at once.
const CONCURRENT_FETCHES: usize = 4;

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
    pub(crate) prefix: String,
    pub(crate) policy: KubeconfigPolicy,
}

/// The provider's events: polls run as the stream is polled, the first at
/// once, then one every `options.interval`. The stream never ends.
pub(crate) fn events(options: Options, problems: Problems) -> BoxStream<'static, ClusterEvent> {
    let poller = Poller {
        options,
        problems,
        ticks: None,
        engaged: HashMap::new(),
        ready: VecDeque::new(),
    };
    futures::stream::unfold(poller, |mut poller| async move {
        let event = poller.next_event().await;
        Some((event, poller))
    })
    .boxed()
}

struct Poller {
    options: Options,
    problems: Problems,
    /// Made on the first poll, inside the runtime.
    ticks: Option<Interval>,
    /// The engaged clusters, by kind name, with their kubeconfigs' fingerprints.
    engaged: HashMap<String, u64>,
    /// Events to hand on before the next poll.
    ready: VecDeque<ClusterEvent>,
}

/// What a cluster's kubeconfig, fetched now, means for the cluster.
enum Verdict {
    /// The same as the engaged cluster's: nothing to do.
    Unchanged,
    /// New, or changed: engage the cluster through this client.
    Engage {
        fingerprint: u64,
        client: kube::Client,
    },
    /// No kubeconfig to judge (kind failed, or printed no kubeconfig):
    /// perhaps for a moment, so an engaged cluster stays.
    Unavailable(String),
    /// The kubeconfig gives no cluster: an engaged cluster leaves.
    Refused(String),
}

impl Poller {
    async fn next_event(&mut self) -> ClusterEvent {
        loop {
            if let Some(event) = self.ready.pop_front() {
                return event;
            }
            let interval = self.options.interval;
            self.ticks
                .get_or_insert_with(|| {
                    let mut ticks = tokio::time::interval(interval);
                    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
                    ticks
                })
                .tick()
                .await;
            self.poll().await;
        }
    }

    /// One pass: list, forget the clusters that are gone, judge the
    /// kubeconfigs of the others, and queue the events.
    async fn poll(&mut self) {
        let Some(listed) = self.list().await else {
            return;
        };
        self.forget_vanished(&listed);
        let judging: Vec<_> = listed
            .iter()
            .map(|name| judge(&self.options, name, self.engaged.get(name).copied()))
            .collect();
        let verdicts: Vec<Verdict> = futures::stream::iter(judging)
            .buffered(CONCURRENT_FETCHES)
            .collect()
            .await;
        for (name, verdict) in listed.into_iter().zip(verdicts) {
            self.apply(name, verdict);
        }
    }

    /// The names `kind get clusters` gives that have the prefix, in its
    /// order, or `None` (and a problem) if it fails.
    async fn list(&self) -> Option<Vec<String>> {
        let stdout = match command::run(&self.options.executable, &["get", "clusters"]).await {
            Ok(stdout) => stdout,
            Err(error) => {
                self.problems.report(LIST_SOURCE, error);
                return None;
            }
        };
        self.problems.clear(LIST_SOURCE);
        let mut seen = HashSet::new();
        // With no clusters, kind prints a notice on stderr and nothing here.
        let names = stdout
            .lines()
            .map(str::trim)
            .filter(|name| !name.is_empty() && name.starts_with(&self.options.prefix))
            .filter(|name| seen.insert(*name))
            .map(str::to_owned)
            .collect();
        Some(names)
    }

    /// Disengages the clusters no longer listed and forgets their problems.
    fn forget_vanished(&mut self, listed: &[String]) {
        let listed: HashSet<&str> = listed.iter().map(String::as_str).collect();
        let mut gone: Vec<String> = self
            .engaged
            .keys()
            .filter(|name| !listed.contains(name.as_str()))
            .cloned()
            .collect();
        gone.sort();
        for name in gone {
            self.engaged.remove(&name);
            tracing::info!(cluster = %name, "disengaging a kind cluster that is gone");
            self.ready
                .push_back(ClusterEvent::Disengage { name: name.into() });
        }
        let sources: HashSet<String> = listed.iter().map(|name| cluster_source(name)).collect();
        self.problems
            .retain(|source| source == LIST_SOURCE || sources.contains(source));
    }

    fn apply(&mut self, name: String, verdict: Verdict) {
        let source = cluster_source(&name);
        match verdict {
            Verdict::Unchanged => self.problems.clear(&source),
            Verdict::Engage {
                fingerprint,
                client,
            } => {
                self.problems.clear(&source);
                let again = self.engaged.insert(name.clone(), fingerprint).is_some();
                tracing::info!(cluster = %name, again, "engaging a kind cluster");
                self.ready.push_back(ClusterEvent::Engage {
                    name: name.into(),
                    client,
                });
            }
            Verdict::Unavailable(problem) => self.problems.report(source, problem),
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
async fn judge(options: &Options, name: &str, engaged: Option<u64>) -> Verdict {
    let origin = cluster_source(name);
    let args = ["get", "kubeconfig", "--name", name];
    let yaml = match command::run(&options.executable, &args).await {
        Ok(yaml) => yaml,
        Err(error) => return Verdict::Unavailable(format!("{origin}: {error}")),
    };
    let mut kubeconfig = match kubeconfig::parse(&yaml, &origin) {
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
    // The other contexts are never used: they are not loaded either.
    kubeconfig.contexts.retain(|c| c.name == context);
    let config = kubeconfig::configs(&kubeconfig, &origin, &options.policy)
        .await
        .into_iter()
        .find_map(|(named, config)| (named == context).then_some(config));
    let built = match config {
        Some(config) => config.and_then(|config| {
            client::client(config).map_err(|error| KubeconfigError::Invalid {
                origin: origin.clone(),
                context: context.clone(),
                reason: format!("no client: {error}"),
            })
        }),
        None => return Verdict::Refused(format!("{origin}: no context {context:?}")),
    };
    match built {
        Ok(client) => Verdict::Engage {
            fingerprint,
            client,
        },
        Err(error) => Verdict::Refused(error.to_string()),
    }
}
