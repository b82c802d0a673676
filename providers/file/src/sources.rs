//! Which files the provider's sources hold now, and which directories to
//! watch for them to change.

use std::{
    collections::{BTreeSet, hash_map::RandomState},
    hash::BuildHasher,
    io::ErrorKind,
    path::{Component, Path, PathBuf},
};

use kube::config::Kubeconfig;
use kube_multicluster::provider::kubeconfig::{self, KubeconfigError};

/// Whether `source` is a glob pattern rather than a path.
pub(crate) fn is_glob(source: &Path) -> bool {
    source.to_str().is_some_and(|s| s.contains(['*', '?', '[']))
}

/// What the sources hold now.
#[derive(Default)]
pub(crate) struct Listing {
    /// The kubeconfig files found, in order.
    pub(crate) files: BTreeSet<PathBuf>,
    /// The problems of sources that could not be searched, by source.
    pub(crate) problems: Vec<(String, String)>,
    /// Where files may be that could not be seen: the clusters of files at
    /// or below these paths stay as they are.
    pub(crate) unseen: Vec<PathBuf>,
}

impl Listing {
    /// `path` cannot be looked at, searched or read, as `what` says: the
    /// clusters of the files at or below it stay as they are.
    fn failed(&mut self, path: &Path, what: String) {
        self.problems.push((path.display().to_string(), what));
        self.unseen.push(path.to_owned());
    }

    /// Takes in `path` if it is a file.
    fn file(&mut self, path: PathBuf) {
        match std::fs::metadata(&path) {
            Ok(meta) if meta.is_file() => {
                self.files.insert(path);
            }
            Err(error) if !absent(&error) => {
                self.failed(&path, format!("cannot be looked at: {error}"));
            }
            _ => {}
        }
    }
}

/// The kubeconfig files the sources hold now.
pub(crate) fn files(sources: &[PathBuf], names: &[glob::Pattern]) -> Listing {
    let mut listing = Listing::default();
    for source in sources {
        if is_glob(source) {
            let Some(pattern) = source.to_str() else {
                continue;
            };
            // The glob walk passes over what it cannot look at, its base
            // among them: look first.
            let (base, _) = watch_target(source);
            if let Err(error) = std::fs::metadata(&base)
                && !absent(&error)
            {
                listing.failed(&base, format!("cannot be looked at: {error}"));
                continue;
            }
            match glob::glob(pattern) {
                Ok(paths) => paths.for_each(|path| match path {
                    Ok(path) => listing.file(path),
                    Err(error) => {
                        let what = format!("cannot be searched: {}", error.error());
                        listing.failed(error.path(), what);
                    }
                }),
                Err(error) => listing.problems.push((
                    pattern.to_owned(),
                    format!("not a usable glob pattern: {error}"),
                )),
            }
            continue;
        }
        match std::fs::metadata(source) {
            Ok(meta) if meta.is_dir() => directory(source, names, &mut listing),
            Ok(_) => {
                listing.files.insert(source.clone());
            }
            // Not there (yet): nothing to read, and nothing to report.
            Err(error) if absent(&error) => {}
            Err(error) => listing.failed(source, format!("cannot be looked at: {error}")),
        }
    }
    listing
}

/// The kubeconfig files of the directory `dir`.
fn directory(dir: &Path, names: &[glob::Pattern], listing: &mut Listing) {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(error) => {
            listing.failed(dir, format!("the directory cannot be read: {error}"));
            return;
        }
    };
    for entry in entries {
        let entry = match entry {
            Ok(entry) => entry,
            Err(error) => {
                listing.failed(dir, format!("the directory cannot be read whole: {error}"));
                continue;
            }
        };
        let named = entry
            .file_name()
            .to_str()
            .is_some_and(|name| names.iter().any(|p| p.matches(name)));
        if named {
            listing.file(entry.path());
        }
    }
}

/// Whether `error` says there is nothing at the path, rather than that it
/// cannot be looked at.
fn absent(error: &std::io::Error) -> bool {
    matches!(error.kind(), ErrorKind::NotFound | ErrorKind::NotADirectory)
}

/// What reading one file gave: a hash of its bytes, and its kubeconfig or
/// why not; `None` if the file is gone.
pub(crate) fn read(
    path: &Path,
    hasher: &RandomState,
) -> Option<(u64, Result<Kubeconfig, KubeconfigError>)> {
    let unreadable = |reason: String| KubeconfigError::Unreadable {
        origin: path.display().to_string(),
        reason,
    };
    match std::fs::read(path) {
        Err(error) if absent(&error) => None,
        Err(error) => Some((0, Err(unreadable(error.to_string())))),
        Ok(bytes) => {
            let hash = hasher.hash_one(&bytes);
            let parsed = match std::str::from_utf8(&bytes) {
                Ok(text) => kubeconfig::parse_file(text, path),
                Err(_) => Err(unreadable("it is not UTF-8 text".to_owned())),
            };
            Some((hash, parsed))
        }
    }
}

/// A directory to watch for a source to change, and whether to watch below
/// it too.
pub(crate) fn watch_target(source: &Path) -> (PathBuf, bool) {
    if is_glob(source) {
        // The part before the first component with a wildcard; below it
        // too if a wildcard is in a directory's name.
        let mut base = PathBuf::new();
        let mut components = source.components().peekable();
        while let Some(component) = components.next() {
            let wild = matches!(component, Component::Normal(name) if is_glob(Path::new(name)));
            if wild {
                let recursive = components.peek().is_some();
                return (dir_or_here(base), recursive);
            }
            base.push(component);
        }
        (dir_or_here(base), false)
    } else if source.is_dir() {
        (source.to_owned(), false)
    } else {
        // The directory the file is in, which sees the file created,
        // replaced by a rename, or deleted.
        (
            dir_or_here(source.parent().map(Path::to_owned).unwrap_or_default()),
            false,
        )
    }
}

fn dir_or_here(path: PathBuf) -> PathBuf {
    if path.as_os_str().is_empty() {
        PathBuf::from(".")
    } else {
        path
    }
}

/// The nearest directory at or above `path` that exists.
pub(crate) fn existing(path: &Path) -> Option<PathBuf> {
    path.ancestors()
        .find(|p| !p.as_os_str().is_empty() && p.is_dir())
        .map(Path::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_are_watched_from_their_literal_base() {
        assert_eq!(
            watch_target(Path::new("/etc/fleet/*.kubeconfig")),
            (PathBuf::from("/etc/fleet"), false)
        );
        assert_eq!(
            watch_target(Path::new("/etc/*/kubeconfig.yaml")),
            (PathBuf::from("/etc"), true)
        );
        assert_eq!(
            watch_target(Path::new("*.yaml")),
            (PathBuf::from("."), false)
        );
        assert_eq!(
            watch_target(Path::new("/nowhere/a.kubeconfig")),
            (PathBuf::from("/nowhere"), false)
        );
        assert_eq!(
            watch_target(Path::new("config")),
            (PathBuf::from("."), false)
        );
    }
}
