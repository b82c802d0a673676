//! Watcher events as objects applied and keys deleted, relists included.

use std::collections::HashSet;

use kube::runtime::watcher;

/// What a change seen on a watch means for a provider: an object applied,
/// or the key of one that is gone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SourceChange<K> {
    /// The object is there now, new or changed.
    Applied(K),
    /// The object of this key is gone: deleted, or missing from a relist.
    Deleted(String),
}

/// The keys of the objects a watch has shown and not deleted, so that the
/// end of a relist tells which went while the watch was down: what a
/// provider that follows a watch of its sources needs to turn
/// [`watcher::Event`]s into [`SourceChange`]s.
///
/// ```
/// use k8s_openapi::api::core::v1::Secret;
/// use kube::{ResourceExt, api::ObjectMeta, runtime::watcher::Event};
/// use kube_multicluster::provider::{Seen, SourceChange};
///
/// let secret = |name: &str| Secret {
///     metadata: ObjectMeta { name: Some(name.into()), ..ObjectMeta::default() },
///     ..Secret::default()
/// };
/// let mut seen = Seen::new();
/// let key = |s: &Secret| s.name_any();
/// seen.changes(Event::Apply(secret("a")), key);
/// seen.changes(Event::Apply(secret("b")), key);
/// // The watch relists, and `a` is no longer there.
/// seen.changes(Event::Init, key);
/// seen.changes(Event::InitApply(secret("b")), key);
/// assert_eq!(seen.changes(Event::InitDone, key), vec![SourceChange::Deleted("a".to_owned())]);
/// assert!(seen.contains("b") && !seen.contains("a"));
/// assert!(seen.listed());
/// ```
#[derive(Debug, Default)]
pub struct Seen {
    keys: HashSet<String>,
    relisting: Option<HashSet<String>>,
    listed: bool,
}

impl Seen {
    /// Nothing seen yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// What `event` changes, each object known by `key`. The objects of a
    /// relist are applied as they come; at its end, the keys it did not
    /// show are deleted.
    pub fn changes<K>(
        &mut self,
        event: watcher::Event<K>,
        key: impl Fn(&K) -> String,
    ) -> Vec<SourceChange<K>> {
        match event {
            watcher::Event::Init => {
                self.relisting = Some(HashSet::new());
                Vec::new()
            }
            watcher::Event::InitApply(object) => {
                let key = key(&object);
                if let Some(relisting) = &mut self.relisting {
                    relisting.insert(key.clone());
                }
                self.keys.insert(key);
                vec![SourceChange::Applied(object)]
            }
            watcher::Event::InitDone => {
                self.listed = true;
                let relisted = self.relisting.take().unwrap_or_default();
                let gone: Vec<String> = self
                    .keys
                    .iter()
                    .filter(|key| !relisted.contains(*key))
                    .cloned()
                    .collect();
                self.keys = relisted;
                gone.into_iter().map(SourceChange::Deleted).collect()
            }
            watcher::Event::Apply(object) => {
                self.keys.insert(key(&object));
                vec![SourceChange::Applied(object)]
            }
            watcher::Event::Delete(object) => {
                let key = key(&object);
                self.keys.remove(&key);
                vec![SourceChange::Deleted(key)]
            }
        }
    }

    /// Whether the watch has listed its objects once: until then, an object
    /// not seen may well be there.
    pub fn listed(&self) -> bool {
        self.listed
    }

    /// Whether the object of `key` is there, as far as the watch has shown.
    pub fn contains(&self, key: &str) -> bool {
        self.keys.contains(key)
    }
}
