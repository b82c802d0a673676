//! What the provider knows between readings, and one reading.

use std::{
    collections::{BTreeSet, HashMap, HashSet, VecDeque, hash_map::RandomState},
    path::{Path, PathBuf},
    time::Duration,
};

use futures::stream::{self, BoxStream, StreamExt};
use kube::config::Kubeconfig;
use kube_multicluster::{
    ClusterName,
    provider::{
        ClusterEvent, Problems,
        kubeconfig::{self, KubeconfigPolicy},
    },
};
use notify::{EventKind, RecommendedWatcher, RecursiveMode, Watcher, event::AccessKind};
use tokio::sync::mpsc;

use crate::{SEPARATOR, sources};

/// The problem source of the watcher itself.
const WATCH: &str = "file change notices";

pub(crate) struct Options {
    pub(crate) sources: Vec<PathBuf>,
    pub(crate) names: Vec<glob::Pattern>,
    pub(crate) policy: KubeconfigPolicy,
    pub(crate) rescan: Duration,
    pub(crate) debounce: Duration,
}

struct Engaged {
    file: PathBuf,
    fingerprint: u64,
}

pub(crate) struct State {
    options: Options,
    problems: Problems,
    engaged: HashMap<ClusterName, Engaged>,
    ready: VecDeque<ClusterEvent>,
    watcher: Option<RecommendedWatcher>,
    changes: Option<mpsc::UnboundedReceiver<()>>,
    /// The directories that cannot be watched now, as problem sources.
    unwatched: HashSet<String>,
    /// The hash of each file's bytes when last read: a file is acted on
    /// once two readings in a row find it the same, so that one caught
    /// while it is written is not.
    hashes: HashMap<PathBuf, u64>,
    hasher: RandomState,
    /// Whether to read again soon: a file was still changing.
    again: bool,
    read_once: bool,
}

impl State {
    pub(crate) fn new(options: Options, problems: Problems) -> Self {
        Self {
            options,
            problems,
            engaged: HashMap::new(),
            ready: VecDeque::new(),
            watcher: None,
            changes: None,
            unwatched: HashSet::new(),
            hashes: HashMap::new(),
            hasher: RandomState::new(),
            again: false,
            read_once: false,
        }
    }

    pub(crate) fn events(self) -> BoxStream<'static, ClusterEvent> {
        stream::unfold(self, |mut state| async move {
            loop {
                if let Some(event) = state.ready.pop_front() {
                    return Some((event, state));
                }
                state.wait().await;
                state.read().await;
            }
        })
        .boxed()
    }

    /// Until a change is noticed (and the burst it starts is over), or the
    /// rescan interval has passed; not at all before the first reading.
    async fn wait(&mut self) {
        if !self.read_once {
            self.read_once = true;
            self.start_watching();
            return;
        }
        if !std::mem::take(&mut self.again) {
            let rescan = tokio::time::sleep(self.options.rescan);
            let Some(changes) = &mut self.changes else {
                return rescan.await;
            };
            tokio::select! {
                noticed = changes.recv() => if noticed.is_none() {
                    self.changes = None;
                    return;
                },
                () = rescan => return,
            }
        }
        // A file still changing, or a change noticed: the burst it starts
        // is read once it is over.
        tokio::time::sleep(self.options.debounce).await;
        if let Some(changes) = &mut self.changes {
            while changes.try_recv().is_ok() {}
        }
    }

    fn start_watching(&mut self) {
        let (tx, rx) = mpsc::unbounded_channel();
        let watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
            match event {
                // Reads (ours among them) change nothing.
                Ok(event)
                    if matches!(event.kind, EventKind::Access(kind)
                        if kind != AccessKind::Close(notify::event::AccessMode::Write)) => {}
                Ok(_) => {
                    let _ = tx.send(());
                }
                // A notice lost: read everything again.
                Err(error) => {
                    tracing::warn!(%error, "a file change notice failed; reading every source again");
                    let _ = tx.send(());
                }
            }
        });
        match watcher {
            Ok(watcher) => {
                self.watcher = Some(watcher);
                self.changes = Some(rx);
            }
            Err(error) => self.problems.report(
                WATCH,
                format!(
                    "files cannot be watched ({error}); they are read every {:?}",
                    self.options.rescan
                ),
            ),
        }
    }

    /// Watches the directory of each source, or the nearest one above it
    /// that exists until it does.
    fn watch_sources(&mut self) {
        let Some(watcher) = &mut self.watcher else {
            return;
        };
        for source in &self.options.sources {
            let (dir, recursive) = sources::watch_target(source);
            let (dir, recursive) = if dir.is_dir() {
                (dir, recursive)
            } else {
                match sources::existing(&dir) {
                    Some(above) => (above, false),
                    None => continue,
                }
            };
            // Again on each reading: a directory removed and made anew needs
            // a new watch, and a watch made again is harmless.
            let mode = if recursive {
                RecursiveMode::Recursive
            } else {
                RecursiveMode::NonRecursive
            };
            let source = dir.display().to_string();
            match watcher.watch(&dir, mode) {
                Ok(()) => {
                    if self.unwatched.remove(&source) {
                        self.problems.clear(&source);
                    }
                }
                Err(error) => {
                    self.problems.report(
                        &source,
                        format!(
                            "cannot be watched for changes ({error}); it is read every {:?}",
                            self.options.rescan
                        ),
                    );
                    self.unwatched.insert(source);
                }
            }
        }
    }

    /// Reads every source, and queues what changed.
    async fn read(&mut self) {
        self.watch_sources();
        let sources = self.options.sources.clone();
        let names = self.options.names.clone();
        let hasher = self.hasher.clone();
        let reading = tokio::task::spawn_blocking(move || {
            let listing = sources::files(&sources, &names);
            let read: Vec<_> = listing
                .files
                .iter()
                .filter_map(|file| Some((sources::read(file, &hasher)?, file.clone())))
                .collect();
            (read, listing)
        })
        .await;
        let Ok((read, listing)) = reading else {
            return;
        };
        let mut current: BTreeSet<String> = BTreeSet::new();
        current.insert(WATCH.to_owned());
        current.extend(self.unwatched.iter().cloned());
        for (source, problem) in listing.problems {
            self.problems.report(&source, problem);
            current.insert(source);
        }
        // Clusters of files that could not be seen stay as they are.
        let unseen = |file: &Path| listing.unseen.iter().any(|path| file.starts_with(path));
        let mut seen = self.clusters_of(unseen);
        self.hashes.retain(|file, _| listing.files.contains(file));
        for ((hash, kubeconfig), file) in read {
            let origin = file.display().to_string();
            current.insert(origin.clone());
            let settled = self.hashes.insert(file.clone(), hash) == Some(hash);
            match kubeconfig {
                Ok(kubeconfig) if settled => {
                    self.problems.clear(&origin);
                    self.file(&file, &origin, &kubeconfig, &mut seen, &mut current)
                        .await;
                    continue;
                }
                // Read again shortly, and act if it is the same then.
                Ok(_) => self.again = true,
                // Half written, say: keep what it gave.
                Err(error) => {
                    if settled {
                        self.problems.report(&origin, &error);
                    } else {
                        self.again = true;
                    }
                }
            }
            // Until then, its clusters and problems stay as they are.
            seen.extend(self.clusters_of(|engaged| engaged == file));
            let prefix = format!("{origin}{SEPARATOR}");
            current.extend(
                self.problems
                    .current()
                    .into_keys()
                    .filter(|source| source.starts_with(&prefix)),
            );
        }
        let gone: Vec<ClusterName> = self
            .engaged
            .keys()
            .filter(|name| !seen.contains(*name))
            .cloned()
            .collect();
        for name in gone {
            self.disengage(name);
        }
        self.problems.retain(|source| current.contains(source));
    }

    /// Engages what is new or changed among the contexts of one file.
    async fn file(
        &mut self,
        file: &Path,
        origin: &str,
        kubeconfig: &Kubeconfig,
        seen: &mut HashSet<ClusterName>,
        current: &mut BTreeSet<String>,
    ) {
        let name_of = |context: &str| ClusterName::new(format!("{origin}{SEPARATOR}{context}"));
        // Contexts whose cluster stands as it is, and those already handled.
        let mut handled: HashSet<String> = HashSet::new();
        for context in &kubeconfig.contexts {
            let name = name_of(&context.name);
            let fingerprint = kubeconfig::fingerprint(kubeconfig, &context.name);
            let same = self
                .engaged
                .get(&name)
                .is_some_and(|engaged| Some(engaged.fingerprint) == fingerprint);
            if same {
                seen.insert(name.clone());
                current.insert(name.to_string());
                handled.insert(context.name.clone());
            }
        }
        if handled.len() == kubeconfig.contexts.len() {
            return;
        }
        let configs = kubeconfig::configs(kubeconfig, origin, &self.options.policy).await;
        for (context, config) in configs {
            // A second context of a name: the first one stands.
            if !handled.insert(context.clone()) {
                continue;
            }
            let name = name_of(&context);
            current.insert(name.to_string());
            let Some(fingerprint) = kubeconfig::fingerprint(kubeconfig, &context) else {
                continue;
            };
            let built = match config {
                Ok(config) => kubeconfig::client(config, origin, &context).await,
                Err(error) => Err(error),
            };
            match built {
                Ok(client) => {
                    seen.insert(name.clone());
                    self.problems.clear(name.as_str());
                    let again = self.engaged.contains_key(&name);
                    tracing::info!(cluster = %name, again, "engaging a cluster from a kubeconfig file");
                    self.engaged.insert(
                        name.clone(),
                        Engaged {
                            file: file.to_owned(),
                            fingerprint,
                        },
                    );
                    self.ready.push_back(ClusterEvent::Engage { name, client });
                }
                // Reported under the context's cluster, whose name holds the
                // file's path: the message says what is wrong.
                Err(error) => self.problems.report(name.as_str(), error.reason()),
            }
        }
    }

    /// The clusters engaged from the files `of` says yes to.
    fn clusters_of(&self, of: impl Fn(&Path) -> bool) -> HashSet<ClusterName> {
        let engaged = self.engaged.iter().filter(|(_, engaged)| of(&engaged.file));
        engaged.map(|(name, _)| name.clone()).collect()
    }

    fn disengage(&mut self, name: ClusterName) {
        if self.engaged.remove(&name).is_some() {
            tracing::info!(cluster = %name, "disengaging a cluster whose kubeconfig context is gone");
            self.ready.push_back(ClusterEvent::Disengage { name });
        }
    }
}
