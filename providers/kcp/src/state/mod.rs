//! The provider's state: the shards its endpoint slice lists, the bindings
//! each shows, and the logical clusters engaged.
//!
//! One file on purpose: `State` is one state machine over three sources
//! (the endpoint slice, each shard's bindings, each shard's logical cluster
//! paths), and every handler writes the same maps, which `settle` reads to
//! decide what is engaged. Split by source, three files would write one
//! state. What stands apart does: reading kcp's objects (`binding`), a
//! shard's connection (`shard`), and the tests (`tests.rs`).

use std::{
    collections::{HashMap, HashSet, VecDeque},
    sync::{Arc, Mutex},
    time::Duration,
};

use futures::{FutureExt, StreamExt, stream::BoxStream};
use kube::{
    Api, Config, ResourceExt,
    api::{DynamicObject, ListParams},
    runtime::watcher,
};
use kube_multicluster::{
    ClusterName,
    cache::HostCache,
    client::error_chain,
    provider::{ClusterEvent, Problems, SourceChange},
};
use tokio_stream::StreamMap;

use crate::binding::{
    PATH_ANNOTATION, api_bindings, claims_not_accepted, endpoint_slices, endpoint_urls,
    logical_cluster, logical_clusters,
};
use crate::shard::Shard;

/// How often what failed is looked at again: a shard whose watch failed is
/// asked whether it answers (its watch resumes without a word), a slice
/// whose watch failed is read, and a shard no client could be made for is
/// tried again.
pub(crate) const RECHECK: Duration = Duration::from_secs(10);

/// A watch's events, boxed.
pub(crate) type Events = BoxStream<'static, Result<watcher::Event<DynamicObject>, watcher::Error>>;

/// What comes in: a watch's event, the clock, or an answer to a question
/// asked because a watch failed.
enum Input {
    Watch(Result<watcher::Event<DynamicObject>, watcher::Error>),
    Tick,
    /// A shard answered, asked after this many failures of the shards'
    /// watches.
    Answered(u64),
    /// The slice as read: there or not.
    Read(Option<DynamicObject>),
}

/// Where an input comes from: the endpoint slice, a shard's bindings, or
/// the clock.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Source {
    Slice,
    Shard(Arc<str>),
    /// A shard's LogicalClusters, for their paths.
    Paths(Arc<str>),
    Recheck,
    /// A shard whose watch failed, asked whether it answers.
    Probe(Arc<str>),
    /// The slice, read because its watch failed.
    SliceProbe,
}

pub(crate) struct State {
    config: Config,
    slice: String,
    /// A client of the workspace that holds the slice.
    workspace: kube::Client,
    problems: Problems,
    /// The shards' caches, for [`Shards`](crate::Shards).
    published: Arc<Mutex<Vec<HostCache>>>,
    /// The URLs the slice lists now.
    listed: Vec<String>,
    /// The shards followed, by URL.
    shards: HashMap<Arc<str>, Shard>,
    /// The logical clusters engaged: the shard each was engaged from, and
    /// its name in the fleet.
    engaged: HashMap<String, (Arc<str>, ClusterName)>,
    /// The logical cluster engaged under each name.
    named: HashMap<ClusterName, String>,
    /// Whether clusters are named by their workspace's path.
    by_path: bool,
    /// Whether the slice was seen since its watch last listed.
    slice_seen: bool,
    /// Whether the slice's watch has failed since it last told anything.
    slice_failing: bool,
    /// The shards' watches (of bindings, of paths) that have failed since
    /// they last told anything: when (a count of failures) and why.
    failing: HashMap<Source, (u64, String)>,
    /// Failures of the shards' watches so far.
    failures: u64,
    inputs: StreamMap<Source, BoxStream<'static, Input>>,
    ready: VecDeque<ClusterEvent>,
    /// The watch of a shard's bindings (a fake one in tests).
    watch_bindings: fn(&Shard) -> Events,
    /// The watch of a shard's LogicalClusters (a fake one in tests).
    watch_paths: fn(&Shard) -> Events,
}

/// A watch of `api`, retried with backoff (which a list that keeps failing
/// does not reset).
fn watch(api: Api<DynamicObject>, config: watcher::Config) -> Events {
    kube_multicluster::provider::backoff(watcher(api, config)).boxed()
}

/// One input from `asked` if it answers within [`RECHECK`], or none.
fn answer<T, E>(
    asked: impl Future<Output = Result<T, E>> + Send + 'static,
    input: impl FnOnce(T) -> Input + Send + 'static,
) -> BoxStream<'static, Input> {
    let answer = async move {
        let answered = tokio::time::timeout(RECHECK, asked).await;
        futures::stream::iter(answered.ok().and_then(Result::ok).map(input))
    };
    answer.flatten_stream().boxed()
}

impl State {
    pub(crate) fn new(
        config: Config,
        slice: String,
        workspace: kube::Client,
        problems: Problems,
        published: Arc<Mutex<Vec<HostCache>>>,
    ) -> Self {
        Self {
            config,
            slice,
            workspace,
            problems,
            published,
            listed: Vec::new(),
            shards: HashMap::new(),
            engaged: HashMap::new(),
            named: HashMap::new(),
            by_path: false,
            slice_seen: false,
            slice_failing: false,
            failing: HashMap::new(),
            failures: 0,
            inputs: StreamMap::new(),
            ready: VecDeque::new(),
            watch_bindings: |shard| watch(shard.all(&api_bindings()), Default::default()),
            watch_paths: |shard| watch(shard.all(&logical_clusters()), Default::default()),
        }
    }

    /// Clusters named by their workspace's path.
    pub(crate) fn by_path(mut self) -> Self {
        self.by_path = true;
        self
    }

    /// The cluster events, from the slice's watch, the shards' watches of
    /// bindings, and a look again at what failed every [`RECHECK`].
    pub(crate) fn events(self) -> BoxStream<'static, ClusterEvent> {
        let api = Api::<DynamicObject>::all_with(self.workspace.clone(), &endpoint_slices());
        let config = watcher::Config::default().fields(&format!("metadata.name={}", self.slice));
        self.events_from(watch(api, config))
    }

    /// The cluster events, from the slice's events `slices`.
    fn events_from(mut self, slices: Events) -> BoxStream<'static, ClusterEvent> {
        self.inputs
            .insert(Source::Slice, slices.map(Input::Watch).boxed());
        let ticks = futures::stream::unfold((), |()| async {
            tokio::time::sleep(RECHECK).await;
            Some((Input::Tick, ()))
        });
        self.inputs.insert(Source::Recheck, ticks.boxed());
        futures::stream::unfold(self, |mut state| async move {
            loop {
                if let Some(event) = state.ready.pop_front() {
                    return Some((event, state));
                }
                // The slice's watch and the clock never end, so neither do
                // the inputs.
                let (source, input) = state.inputs.next().await?;
                match (source, input) {
                    (Source::Slice, Input::Watch(event)) => state.slice_event(event),
                    (Source::Shard(url), Input::Watch(event)) => state.shard_event(&url, event),
                    (Source::Paths(url), Input::Watch(event)) => state.paths_event(&url, event),
                    (_, Input::Tick) => state.recheck(),
                    // It answered: the failures before it was asked are
                    // over, not those since.
                    (Source::Probe(url), Input::Answered(asked)) => {
                        for source in [Source::Shard(url.clone()), Source::Paths(url)] {
                            if state
                                .failing
                                .get(&source)
                                .is_some_and(|(at, _)| *at <= asked)
                            {
                                state.shard_heard(&source);
                            }
                        }
                    }
                    // Only while the watch has told nothing newer.
                    (Source::SliceProbe, Input::Read(slice)) if state.slice_failing => {
                        state.slice_is(slice.as_ref());
                    }
                    _ => {}
                }
            }
        })
        .boxed()
    }

    fn slice_source(&self) -> String {
        format!("APIExportEndpointSlice {}", self.slice)
    }

    fn slice_event(&mut self, event: Result<watcher::Event<DynamicObject>, watcher::Error>) {
        let event = match event {
            Ok(event) => event,
            Err(error) => {
                self.slice_failing = true;
                self.problems.report(
                    self.slice_source(),
                    format!(
                        "the watch of the endpoint slice fails, and is retried (the shards followed stay): {}",
                        error_chain(&error)
                    ),
                );
                return;
            }
        };
        if !matches!(event, watcher::Event::Init) {
            // The watch tells again: a read of the slice under way is older.
            self.inputs.remove(&Source::SliceProbe);
        }
        match event {
            // Also before each retry of a failing list: it tells nothing.
            watcher::Event::Init => self.slice_seen = false,
            watcher::Event::InitApply(slice) | watcher::Event::Apply(slice) => {
                self.slice_seen = true;
                self.slice_is(Some(&slice));
            }
            watcher::Event::InitDone => {
                if !self.slice_seen {
                    self.slice_is(None);
                } else {
                    self.slice_heard();
                }
            }
            watcher::Event::Delete(_) => {
                self.slice_heard();
                self.problems.report(
                    self.slice_source(),
                    "deleted: its logical clusters are disengaged",
                );
                self.follow(Vec::new());
            }
        }
    }

    /// The slice's watch told something: it no longer fails.
    fn slice_heard(&mut self) {
        if std::mem::take(&mut self.slice_failing) {
            self.problems.clear(&self.slice_source());
        }
    }

    /// The slice is `slice` now, or not there.
    fn slice_is(&mut self, slice: Option<&DynamicObject>) {
        self.slice_failing = false;
        let Some(slice) = slice else {
            self.problems.report(
                self.slice_source(),
                "not found in the workspace the provider's config reaches (kcp makes one named after each APIExport)",
            );
            self.follow(Vec::new());
            return;
        };
        let urls = endpoint_urls(slice);
        if urls.is_empty() {
            self.problems.report(
                self.slice_source(),
                "lists no endpoint: no workspace binds the export yet, or no shard serves it",
            );
        } else {
            self.problems.clear(&self.slice_source());
        }
        self.follow(urls);
    }

    /// Follows the shards at `urls`, and no others.
    fn follow(&mut self, urls: Vec<String>) {
        let gone: Vec<Arc<str>> = self
            .shards
            .keys()
            .filter(|url| !urls.iter().any(|u| u.as_str() == &***url))
            .cloned()
            .collect();
        for url in gone {
            self.drop_shard(&url);
        }
        // Shards that could not be followed, and are no longer listed.
        let listed: HashSet<String> = urls.iter().map(|url| shard_source(url)).collect();
        self.problems
            .retain(|source| !source.starts_with("kcp shard ") || listed.contains(source));
        self.listed = urls;
        self.add_missing();
    }

    /// Follows the shards listed that are not followed yet.
    fn add_missing(&mut self) {
        let missing: Vec<String> = self
            .listed
            .iter()
            .filter(|url| !self.shards.contains_key(url.as_str()))
            .cloned()
            .collect();
        for url in missing {
            self.add_shard(&url);
        }
        *self.published.lock().unwrap_or_else(|e| e.into_inner()) = self
            .shards
            .values()
            .map(|shard| shard.host.clone())
            .collect();
    }

    fn add_shard(&mut self, url: &str) {
        let shard = match Shard::new(url, &self.config) {
            Ok(shard) => shard,
            Err(error) => {
                self.problems.report(
                    shard_source(url),
                    format!("not followed, tried again every {RECHECK:?}: {error}"),
                );
                return;
            }
        };
        self.problems.clear(&shard_source(url));
        tracing::info!(shard = url, slice = %self.slice, "following a shard of the export's virtual workspace");
        let bindings = (self.watch_bindings)(&shard);
        let url: Arc<str> = url.into();
        if self.by_path {
            let paths = (self.watch_paths)(&shard).map(Input::Watch).boxed();
            self.inputs.insert(Source::Paths(url.clone()), paths);
        }
        self.inputs.insert(
            Source::Shard(url.clone()),
            bindings.map(Input::Watch).boxed(),
        );
        self.shards.insert(url, shard);
    }

    fn drop_shard(&mut self, url: &Arc<str>) {
        tracing::info!(shard = %url, slice = %self.slice, "no longer following a shard");
        for source in [
            Source::Shard(url.clone()),
            Source::Paths(url.clone()),
            Source::Probe(url.clone()),
        ] {
            self.inputs.remove(&source);
            self.failing.remove(&source);
        }
        let Some(shard) = self.shards.remove(url) else {
            return;
        };
        self.problems.clear(&shard_source(url));
        for (cluster, names) in shard.bindings {
            for name in names {
                self.problems.clear(&binding_source(&name, &cluster));
            }
            self.settle(&cluster);
        }
        for cluster in shard.paths.keys() {
            self.settle(cluster);
        }
    }

    /// Looks again at what failed: shards whose watch failed are asked
    /// whether they answer, the slice is read if its watch failed, and
    /// shards listed but not followed are tried again. The questions run
    /// beside the watches, each bounded by [`RECHECK`].
    fn recheck(&mut self) {
        let failing: HashSet<Arc<str>> = self
            .failing
            .keys()
            .filter_map(|source| match source {
                Source::Shard(url) | Source::Paths(url) => Some(url.clone()),
                _ => None,
            })
            .collect();
        for url in failing {
            let probe = Source::Probe(url.clone());
            let Some(shard) = self.shards.get(&url) else {
                continue;
            };
            if self.inputs.contains_key(&probe) {
                continue;
            }
            let bindings = shard.all(&api_bindings());
            let paths = self.by_path.then(|| shard.all(&logical_clusters()));
            let asked = async move {
                let one = ListParams::default().limit(1);
                bindings.list(&one).await?;
                if let Some(paths) = paths {
                    paths.list(&one).await?;
                }
                Ok::<_, kube::Error>(())
            };
            // The answer names the failures it was asked after.
            let since = self.failures;
            self.inputs
                .insert(probe, answer(asked, move |()| Input::Answered(since)));
        }
        if self.slice_failing && !self.inputs.contains_key(&Source::SliceProbe) {
            let api = Api::<DynamicObject>::all_with(self.workspace.clone(), &endpoint_slices());
            let name = self.slice.clone();
            let read = async move { api.get_opt(&name).await };
            self.inputs
                .insert(Source::SliceProbe, answer(read, Input::Read));
        }
        self.add_missing();
    }

    /// The event `source`, a watch of a shard's `what`, told; `None` if it
    /// failed, which is reported. Anything but an `Init` (which also comes
    /// before each retry of a failing list) shows it works again.
    fn told(
        &mut self,
        source: Source,
        what: &str,
        event: Result<watcher::Event<DynamicObject>, watcher::Error>,
    ) -> Option<watcher::Event<DynamicObject>> {
        match event {
            Ok(event) => {
                if !matches!(event, watcher::Event::Init) {
                    self.shard_heard(&source);
                }
                Some(event)
            }
            Err(error) => {
                self.shard_failed(source, what, &error);
                None
            }
        }
    }

    /// `source`, a watch of a shard, failed with `error`.
    fn shard_failed(&mut self, source: Source, what: &str, error: &watcher::Error) {
        let (Source::Shard(url) | Source::Paths(url)) = &source else {
            return;
        };
        let message = format!(
            "the watch of {what} fails, and is retried (its logical clusters stay engaged): {}",
            error_chain(error)
        );
        self.problems.report(shard_source(url), &message);
        self.failures += 1;
        self.failing.insert(source, (self.failures, message));
    }

    /// `source`, a watch of a shard, told something: it no longer fails.
    fn shard_heard(&mut self, source: &Source) {
        let (Source::Shard(url) | Source::Paths(url)) = source else {
            return;
        };
        if self.failing.remove(source).is_none() {
            return;
        }
        // The shard's other watch may still fail: it is what is reported.
        let other = [Source::Shard(url.clone()), Source::Paths(url.clone())]
            .into_iter()
            .find_map(|other| self.failing.get(&other).map(|(_, message)| message.clone()));
        match other {
            Some(message) => self.problems.report(shard_source(url), message),
            None => self.problems.clear(&shard_source(url)),
        }
    }

    fn shard_event(
        &mut self,
        url: &Arc<str>,
        event: Result<watcher::Event<DynamicObject>, watcher::Error>,
    ) {
        let Some(event) = self.told(Source::Shard(url.clone()), "APIBindings", event) else {
            return;
        };
        let Some(shard) = self.shards.get_mut(url) else {
            return;
        };
        let key = |binding: &DynamicObject| {
            let cluster = logical_cluster(binding).unwrap_or_default();
            format!("{cluster}/{}", binding.name_any())
        };
        for change in shard.binding_watch.changes(event, key) {
            match change {
                SourceChange::Applied(binding) => self.apply(url, &binding),
                SourceChange::Deleted(key) => {
                    // A binding's name holds no `/`.
                    let (cluster, name) = key.rsplit_once('/').unwrap_or_default();
                    self.remove(url, cluster, name);
                }
            }
        }
    }

    /// A binding of the export seen in a logical cluster of the shard.
    fn apply(&mut self, url: &Arc<str>, binding: &DynamicObject) {
        let name = binding.name_any();
        let Some(cluster) = logical_cluster(binding) else {
            tracing::warn!(shard = %url, binding = %name, "an APIBinding without its kcp.io/cluster annotation: no logical cluster to engage");
            return;
        };
        if binding.metadata.deletion_timestamp.is_some() {
            // Going, with its workspace or alone.
            self.remove(url, cluster, &name);
            return;
        }
        let Some(shard) = self.shards.get_mut(url) else {
            return;
        };
        shard
            .bindings
            .entry(cluster.to_owned())
            .or_default()
            .insert(name.clone());
        let missing = claims_not_accepted(binding);
        let source = binding_source(&name, cluster);
        if missing.is_empty() {
            self.problems.clear(&source);
        } else {
            self.problems.report(
                source,
                format!(
                    "does not accept the export's permission claims on {}: they are not served in {cluster}",
                    missing.join(", ")
                ),
            );
        }
        self.settle(cluster);
    }

    /// The binding `name` of `cluster` is gone from the shard.
    fn remove(&mut self, url: &Arc<str>, cluster: &str, name: &str) {
        self.problems.clear(&binding_source(name, cluster));
        let Some(shard) = self.shards.get_mut(url) else {
            return;
        };
        let Some(names) = shard.bindings.get_mut(cluster) else {
            return;
        };
        names.remove(name);
        if names.is_empty() {
            shard.bindings.remove(cluster);
        }
        self.settle(cluster);
    }

    /// A shard's LogicalClusters changed: their paths, when clusters are
    /// named by them.
    fn paths_event(
        &mut self,
        url: &Arc<str>,
        event: Result<watcher::Event<DynamicObject>, watcher::Error>,
    ) {
        let what = "LogicalClusters (their paths)";
        let Some(event) = self.told(Source::Paths(url.clone()), what, event) else {
            return;
        };
        let Some(shard) = self.shards.get_mut(url) else {
            return;
        };
        let relisted = matches!(event, watcher::Event::InitDone);
        let key = |object: &DynamicObject| logical_cluster(object).unwrap_or_default().to_owned();
        let mut changed: Vec<String> = Vec::new();
        for change in shard.path_watch.changes(event, key) {
            let (cluster, path) = match change {
                SourceChange::Applied(object) => {
                    let path = object.annotations().get(PATH_ANNOTATION);
                    (key(&object), path.filter(|path| !path.is_empty()).cloned())
                }
                SourceChange::Deleted(cluster) => (cluster, None),
            };
            if let Some(path) = path.filter(|_| !cluster.is_empty()) {
                shard.paths.insert(cluster.clone(), path);
            } else if shard.paths.remove(&cluster).is_none() {
                // Gone, or its path taken away or made empty, and it named
                // nothing before either.
                continue;
            }
            changed.push(cluster);
        }
        if relisted {
            // Those bound whose path is still not known are told.
            changed.extend(shard.bindings.keys().cloned());
        }
        for cluster in changed {
            self.settle(&cluster);
        }
    }

    /// Engages `cluster` if a shard followed has a binding of it (and,
    /// named by path, knows its path) and it is not engaged so, from the
    /// first such shard; disengages it if none has.
    fn settle(&mut self, cluster: &str) {
        let mut from: Vec<&Arc<str>> = self
            .shards
            .iter()
            .filter(|(_, shard)| shard.bindings.contains_key(cluster))
            .map(|(url, _)| url)
            .collect();
        from.sort();
        let named = |url: &Arc<str>| -> Option<ClusterName> {
            if !self.by_path {
                return Some(ClusterName::new(cluster));
            }
            self.shards[url]
                .paths
                .get(cluster)
                .map(|path| ClusterName::new(path.as_str()))
        };
        let wanted = from
            .iter()
            .find_map(|url| named(url).map(|name| ((*url).clone(), name)));
        let path_source = format!("logical cluster {cluster}");
        // A name another logical cluster is engaged under is not taken from it.
        let taken = wanted.as_ref().and_then(|(_, name)| {
            self.named
                .get(name)
                .filter(|owner| owner.as_str() != cluster)
                .map(|owner| (name.clone(), owner.clone()))
        });
        let wanted = if taken.is_some() { None } else { wanted };
        let unnamed = self.by_path
            && wanted.is_none()
            && taken.is_none()
            && from.iter().any(|url| self.shards[*url].path_watch.listed());
        if let Some((name, owner)) = &taken {
            self.problems.report(
                path_source,
                format!(
                    "its workspace's path {name} is the name logical cluster {owner} is engaged under: not engaged while that one is"
                ),
            );
        } else if unnamed {
            self.problems.report(
                path_source,
                "binds the export, but its workspace's path is not known: the export must claim logicalclusters of core.kcp.io and its binding accept the claim",
            );
        } else {
            self.problems.clear(&path_source);
        }
        let now = self.engaged.get(cluster).cloned();
        if now == wanted
            || now.as_ref().is_some_and(|(url, name)| {
                wanted.as_ref().is_some_and(|(_, wanted)| wanted == name) && from.contains(&url)
            })
        {
            return;
        }
        if let Some((_, name)) = &now
            && wanted.as_ref().is_none_or(|(_, wanted)| wanted != name)
        {
            tracing::info!(cluster, name = %name, "disengaging a logical cluster: it no longer binds the export, or no longer under this name");
            self.engaged.remove(cluster);
            self.named.remove(name);
            self.ready
                .push_back(ClusterEvent::Disengage { name: name.clone() });
            // Another logical cluster may have waited for the name.
            let waiting: Vec<String> = self
                .shards
                .values()
                .flat_map(|shard| shard.paths.iter())
                .filter(|(other, path)| other.as_str() != cluster && path.as_str() == name.as_str())
                .map(|(other, _)| other.clone())
                .collect();
            for other in waiting {
                self.settle(&other);
            }
        }
        let Some((url, name)) = wanted else {
            return;
        };
        let view = match self.shards[&url].view(cluster) {
            Ok(view) => view,
            Err(error) => {
                tracing::warn!(cluster, shard = %url, %error, "a logical cluster that cannot be engaged");
                return;
            }
        };
        tracing::info!(cluster, name = %name, shard = %url, "engaging a logical cluster that binds the export");
        self.engaged.insert(cluster.to_owned(), (url, name.clone()));
        self.named.insert(name.clone(), cluster.to_owned());
        self.ready
            .push_back(ClusterEvent::EngageView { name, view });
    }
}

fn shard_source(url: &str) -> String {
    format!("kcp shard {url}")
}

fn binding_source(name: &str, cluster: &str) -> String {
    format!("APIBinding {name} in {cluster}")
}

#[cfg(test)]
mod tests;
