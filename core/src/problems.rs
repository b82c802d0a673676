use std::{collections::BTreeMap, fmt, sync::Arc};

use kube::runtime::watcher;
use tokio::sync::watch;

use crate::client::error_chain;

/// What keeps a provider from engaging clusters from its sources now: one
/// message for each source (a file, a Secret, a context) that gives no
/// cluster, by the source's name.
///
/// Providers that read sources they do not control report each problem here
/// as well as in their logs, and clear it once the source is fixed or gone.
/// A program can show them (on a health endpoint, say) or wait on them in a
/// test. Cloneable; the clones share one set.
///
/// ```
/// use kube_multicluster::provider::Problems;
///
/// let problems = Problems::new();
/// problems.report("Secret fleet/east", "no key \"kubeconfig\"");
/// assert_eq!(problems.get("Secret fleet/east").as_deref(), Some("no key \"kubeconfig\""));
/// problems.clear("Secret fleet/east");
/// assert!(problems.current().is_empty());
/// ```
#[derive(Clone)]
pub struct Problems {
    set: Arc<watch::Sender<BTreeMap<String, String>>>,
}

impl Default for Problems {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for Problems {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.set.borrow().iter()).finish()
    }
}

impl Problems {
    /// An empty set.
    pub fn new() -> Self {
        Self {
            set: Arc::new(watch::channel(BTreeMap::new()).0),
        }
    }

    /// Records that `source` gives no cluster, and why. A message that
    /// differs from the one already there is logged as a warning; the same
    /// one again is not, so a provider may report on every pass.
    ///
    /// Every problem has one shape: the source is the key, and the message
    /// says what is wrong with it. A message that starts with the source's
    /// own name (an error that names where it came from, `Secret fleet/east,
    /// key "kubeconfig": not a kubeconfig`) is kept without it.
    ///
    /// ```
    /// use kube_multicluster::provider::Problems;
    ///
    /// let problems = Problems::new();
    /// problems.report("Secret fleet/east", "Secret fleet/east, key \"kubeconfig\": not a kubeconfig");
    /// assert_eq!(
    ///     problems.get("Secret fleet/east").as_deref(),
    ///     Some("key \"kubeconfig\": not a kubeconfig"),
    /// );
    /// ```
    pub fn report(&self, source: impl Into<String>, message: impl fmt::Display) {
        let source = source.into();
        let message = message.to_string();
        let message = match message
            .strip_prefix(source.as_str())
            .and_then(|rest| rest.strip_prefix(": ").or_else(|| rest.strip_prefix(", ")))
        {
            Some(rest) if !rest.is_empty() => rest.to_owned(),
            _ => message,
        };
        self.set.send_if_modified(|set| {
            if set.get(&source) == Some(&message) {
                return false;
            }
            tracing::warn!(source = %source, "{source}: {message}");
            set.insert(source, message);
            true
        });
    }

    /// Forgets the problem of `source`, if there was one.
    pub fn clear(&self, source: &str) {
        self.set.send_if_modified(|set| {
            let cleared = set.remove(source).is_some();
            if cleared {
                tracing::info!(source = %source, "no longer a problem");
            }
            cleared
        });
    }

    /// Records how a watch of `source` fares: its error, if it fails (the
    /// watch is retried with backoff meanwhile), or nothing once it works.
    ///
    /// For the events of kube's watcher, prefer [`watched`](Self::watched):
    /// given `event.as_ref().err()`, this clears the problem at the `Init`
    /// the watcher yields before each list, even one that fails again.
    ///
    /// ```
    /// use kube_multicluster::provider::Problems;
    ///
    /// let problems = Problems::new();
    /// let failed = kube::runtime::watcher::Error::NoResourceVersion;
    /// problems.watch("Secrets in fleet", Some(&failed));
    /// assert!(problems.get("Secrets in fleet").unwrap().starts_with("the watch fails, and is retried"));
    /// problems.watch("Secrets in fleet", None);
    /// assert!(problems.current().is_empty());
    /// ```
    pub fn watch(&self, source: &str, error: Option<&watcher::Error>) {
        match error {
            None => self.clear(source),
            Some(error) => self.report(
                source,
                format!("the watch fails, and is retried: {}", error_chain(error)),
            ),
        }
    }

    /// Records how a watch of `source` fares, from each of its events: a
    /// failure is reported; an object, a deletion or the end of a list
    /// clears the problem. An [`Init`](watcher::Event::Init), which the
    /// watcher yields before each list, leaves it as it is, since the list
    /// may fail again: a list that keeps failing stays one problem, logged
    /// once.
    ///
    /// ```
    /// use kube::runtime::watcher::{Error, Event};
    /// use kube_multicluster::provider::Problems;
    ///
    /// let problems = Problems::new();
    /// let source = "Secrets in fleet";
    /// problems.watched::<()>(source, &Err(Error::NoResourceVersion));
    /// problems.watched::<()>(source, &Ok(Event::Init));
    /// assert!(problems.get(source).unwrap().starts_with("the watch fails, and is retried"));
    /// problems.watched::<()>(source, &Err(Error::NoResourceVersion));
    /// problems.watched::<()>(source, &Ok(Event::Init));
    /// problems.watched::<()>(source, &Ok(Event::InitDone));
    /// assert!(problems.current().is_empty());
    /// ```
    pub fn watched<K>(&self, source: &str, event: &Result<watcher::Event<K>, watcher::Error>) {
        match event {
            Err(error) => self.watch(source, Some(error)),
            Ok(watcher::Event::Init) => {}
            Ok(
                watcher::Event::InitApply(_)
                | watcher::Event::InitDone
                | watcher::Event::Apply(_)
                | watcher::Event::Delete(_),
            ) => self.clear(source),
        }
    }

    /// Forgets the problems of every source `keep` says no to.
    pub fn retain(&self, mut keep: impl FnMut(&str) -> bool) {
        self.set.send_if_modified(|set| {
            let before = set.len();
            set.retain(|source, _| keep(source));
            before != set.len()
        });
    }

    /// The problem of `source`, if it has one.
    pub fn get(&self, source: &str) -> Option<String> {
        self.set.borrow().get(source).cloned()
    }

    /// Every problem now, by source.
    pub fn current(&self) -> BTreeMap<String, String> {
        self.set.borrow().clone()
    }

    /// Waits until `ready` holds for the problems, checking now and after
    /// each change, and returns them.
    ///
    /// ```no_run
    /// # async fn example(problems: kube_multicluster::provider::Problems) {
    /// let problems = problems
    ///     .wait_for(|set| set.keys().any(|source| source.contains("east")))
    ///     .await;
    /// # }
    /// ```
    pub async fn wait_for(
        &self,
        mut ready: impl FnMut(&BTreeMap<String, String>) -> bool,
    ) -> BTreeMap<String, String> {
        let mut changes = self.set.subscribe();
        let set = changes
            .wait_for(|set| ready(set))
            .await
            .expect("the sender lives as long as self");
        set.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_waiter_sees_a_problem_reported_later() {
        let problems = Problems::new();
        let waiter = tokio::spawn({
            let problems = problems.clone();
            async move { problems.wait_for(|set| set.contains_key("file a")).await }
        });
        tokio::task::yield_now().await;
        problems.report("file a", "bad");
        let seen = waiter.await.unwrap();
        assert_eq!(seen.get("file a").map(String::as_str), Some("bad"));
        problems.report("file b", "bad too");
        problems.retain(|source| source != "file a");
        assert_eq!(problems.current().keys().collect::<Vec<_>>(), ["file b"]);
    }

    #[test]
    fn a_watch_whose_list_keeps_failing_stays_one_problem() {
        let problems = Problems::new();
        let source = "Secrets in fleet";
        let failed = || Err(watcher::Error::NoResourceVersion);
        problems.watched::<()>(source, &Ok(watcher::Event::Init));
        problems.watched::<()>(source, &failed());
        let mut changes = problems.set.subscribe();
        changes.mark_unchanged();
        for _ in 0..3 {
            problems.watched::<()>(source, &Ok(watcher::Event::Init));
            problems.watched::<()>(source, &failed());
        }
        // Neither cleared at an `Init` nor reported again after it.
        assert!(!changes.has_changed().unwrap());
        assert!(problems.get(source).is_some());
        problems.watched::<()>(source, &Ok(watcher::Event::Init));
        problems.watched(source, &Ok(watcher::Event::InitApply(())));
        assert_eq!(problems.get(source), None);
    }
}
