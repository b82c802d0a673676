//! The provider's state: the shards its endpoint slice lists, the bindings
//! each shows, and the logical clusters engaged.

use std::{
    collections::{HashMap, HashSet, VecDeque},
    sync::{Arc, Mutex},
};

use futures::{StreamExt, stream::BoxStream};
use kube::{
    Api, Config, ResourceExt,
    api::DynamicObject,
    runtime::{WatchStreamExt, watcher},
};
use kube_fleet::{
    ClusterName,
    cache::HostCache,
    client::error_chain,
    provider::{ClusterEvent, Problems},
};
use tokio_stream::StreamMap;

use crate::binding::{api_bindings, claims_not_accepted, endpoint_urls, logical_cluster};
use crate::shard::Shard;

/// A watch's events, boxed.
pub(crate) type Events = BoxStream<'static, Result<watcher::Event<DynamicObject>, watcher::Error>>;

/// Where an event comes from: the endpoint slice, or a shard's bindings.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Source {
    Slice,
    Shard(Arc<str>),
}

pub(crate) struct State {
    config: Config,
    slice: String,
    problems: Problems,
    /// The shards' caches, for [`KcpProvider::shards`](crate::KcpProvider::shards).
    published: Arc<Mutex<Vec<HostCache>>>,
    /// The shards followed, by URL.
    shards: HashMap<Arc<str>, Shard>,
    /// The logical clusters engaged, and the shard each was engaged from.
    engaged: HashMap<String, Arc<str>>,
    /// Whether the slice was seen since its watch last listed.
    slice_seen: bool,
    inputs: StreamMap<Source, Events>,
    ready: VecDeque<ClusterEvent>,
}

impl State {
    pub(crate) fn new(
        config: Config,
        slice: String,
        problems: Problems,
        published: Arc<Mutex<Vec<HostCache>>>,
    ) -> Self {
        Self {
            config,
            slice,
            problems,
            published,
            shards: HashMap::new(),
            engaged: HashMap::new(),
            slice_seen: false,
            inputs: StreamMap::new(),
            ready: VecDeque::new(),
        }
    }

    /// The cluster events, from the slice's watch and the shards' watches
    /// of bindings.
    pub(crate) fn events(mut self, slices: Events) -> BoxStream<'static, ClusterEvent> {
        self.inputs.insert(Source::Slice, slices);
        futures::stream::unfold(self, |mut state| async move {
            loop {
                if let Some(event) = state.ready.pop_front() {
                    return Some((event, state));
                }
                // The slice's watch never ends, so neither do the inputs.
                let (source, event) = state.inputs.next().await?;
                match source {
                    Source::Slice => state.slice_event(event),
                    Source::Shard(url) => state.shard_event(&url, event),
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
        match event {
            watcher::Event::Init => self.slice_seen = false,
            watcher::Event::InitApply(slice) | watcher::Event::Apply(slice) => {
                self.slice_seen = true;
                let urls = endpoint_urls(&slice);
                if urls.is_empty() {
                    self.problems.report(
                        self.slice_source(),
                        "lists no endpoint: no workspace binds the export yet, or no shard serves it",
                    );
                } else {
                    self.problems.clear(&self.slice_source());
                }
                self.follow(&urls);
            }
            watcher::Event::InitDone => {
                if !self.slice_seen {
                    self.problems.report(
                        self.slice_source(),
                        "not found in the workspace the provider's config reaches (kcp makes one named after each APIExport)",
                    );
                    self.follow(&[]);
                }
            }
            watcher::Event::Delete(_) => {
                self.problems.report(
                    self.slice_source(),
                    "deleted: its logical clusters are disengaged",
                );
                self.follow(&[]);
            }
        }
    }

    /// Follows the shards at `urls`, and no others.
    fn follow(&mut self, urls: &[String]) {
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
        for url in urls {
            if !self.shards.contains_key(url.as_str()) {
                self.add_shard(url);
            }
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
                self.problems.report(shard_source(url), error);
                return;
            }
        };
        tracing::info!(shard = url, slice = %self.slice, "following a shard of the export's virtual workspace");
        let api = Api::<DynamicObject>::all_with(shard.host.client(), &api_bindings());
        let bindings = watcher(api, watcher::Config::default())
            .default_backoff()
            .boxed();
        let url: Arc<str> = url.into();
        self.inputs.insert(Source::Shard(url.clone()), bindings);
        self.shards.insert(url, shard);
    }

    fn drop_shard(&mut self, url: &Arc<str>) {
        tracing::info!(shard = %url, slice = %self.slice, "no longer following a shard");
        self.inputs.remove(&Source::Shard(url.clone()));
        let Some(shard) = self.shards.remove(url) else {
            return;
        };
        self.problems.clear(&shard_source(url));
        for (cluster, names) in shard.bindings {
            for name in names {
                self.problems.clear(&binding_source(&name, &cluster));
            }
            self.disengage(&cluster, url);
        }
    }

    fn shard_event(
        &mut self,
        url: &Arc<str>,
        event: Result<watcher::Event<DynamicObject>, watcher::Error>,
    ) {
        let event = match event {
            Ok(event) => {
                self.problems.clear(&shard_source(url));
                event
            }
            Err(error) => {
                self.problems.report(
                    shard_source(url),
                    format!(
                        "the watch of APIBindings fails, and is retried (its logical clusters stay engaged): {}",
                        error_chain(&error)
                    ),
                );
                return;
            }
        };
        let Some(shard) = self.shards.get_mut(url) else {
            return;
        };
        match event {
            watcher::Event::Init => shard.relisted = Some(HashMap::new()),
            watcher::Event::InitApply(binding) => {
                if let (Some(relisted), Some(cluster)) =
                    (shard.relisted.as_mut(), logical_cluster(&binding))
                {
                    relisted
                        .entry(cluster.to_owned())
                        .or_default()
                        .insert(binding.name_any());
                }
                self.apply(url, &binding);
            }
            watcher::Event::Apply(binding) => self.apply(url, &binding),
            watcher::Event::InitDone => {
                let relisted = shard.relisted.take().unwrap_or_default();
                let gone: Vec<(String, String)> = shard
                    .bindings
                    .iter()
                    .flat_map(|(cluster, names)| {
                        let kept = relisted.get(cluster);
                        names
                            .iter()
                            .filter(move |name| !kept.is_some_and(|kept| kept.contains(*name)))
                            .map(move |name| (cluster.clone(), name.clone()))
                    })
                    .collect();
                for (cluster, name) in gone {
                    self.remove(url, &cluster, &name);
                }
            }
            watcher::Event::Delete(binding) => {
                if let Some(cluster) = logical_cluster(&binding) {
                    self.remove(url, cluster, &binding.name_any());
                }
            }
        }
    }

    /// A binding of the export seen in a logical cluster of the shard.
    fn apply(&mut self, url: &Arc<str>, binding: &DynamicObject) {
        let Some(cluster) = logical_cluster(binding) else {
            tracing::debug!(shard = %url, binding = %binding.name_any(), "an APIBinding without its logical cluster");
            return;
        };
        let name = binding.name_any();
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
        if !self.engaged.contains_key(cluster) {
            tracing::info!(cluster, shard = %url, "engaging a logical cluster that binds the export");
            self.engaged.insert(cluster.to_owned(), url.clone());
            self.ready.push_back(ClusterEvent::EngageView {
                name: ClusterName::new(cluster),
                view: shard.view(cluster),
            });
        }
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
            self.disengage(cluster, url);
        }
    }

    /// Disengages `cluster` if `url`'s shard engaged it.
    fn disengage(&mut self, cluster: &str, url: &Arc<str>) {
        if self.engaged.get(cluster) == Some(url) {
            tracing::info!(cluster, shard = %url, "disengaging a logical cluster: it no longer binds the export");
            self.engaged.remove(cluster);
            self.ready.push_back(ClusterEvent::Disengage {
                name: ClusterName::new(cluster),
            });
        }
    }
}

fn shard_source(url: &str) -> String {
    format!("kcp shard {url}")
}

fn binding_source(name: &str, cluster: &str) -> String {
    format!("APIBinding {name} in {cluster}")
}
