//! Which files the provider's sources hold now, and which directories to
//! watch for them to change.

use std::{
    collections::BTreeSet,
    path::{Component, Path, PathBuf},
};

use kube::config::Kubeconfig;
use kube_fleet::provider::kubeconfig::{self, KubeconfigError};

/// Whether `source` is a glob pattern rather than a path.
pub(crate) fn is_glob(source: &Path) -> bool {
    source.to_str().is_some_and(|s| s.contains(['*', '?', '[']))
}

/// The kubeconfig files the sources hold now, in order, and the problems of
/// sources that could not be searched, by source.
pub(crate) fn files(
    sources: &[PathBuf],
    names: &[glob::Pattern],
) -> (BTreeSet<PathBuf>, Vec<(String, String)>) {
    let mut files = BTreeSet::new();
    let mut problems = Vec::new();
    for source in sources {
        if is_glob(source) {
            let Some(pattern) = source.to_str() else {
                continue;
            };
            match glob::glob(pattern) {
                Ok(paths) => {
                    for path in paths {
                        match path {
                            Ok(path) if path.is_file() => {
                                files.insert(path);
                            }
                            Ok(_) => {}
                            Err(error) => problems.push((
                                error.path().display().to_string(),
                                format!("cannot be searched: {}", error.error()),
                            )),
                        }
                    }
                }
                Err(error) => problems.push((
                    pattern.to_owned(),
                    format!("not a usable glob pattern: {error}"),
                )),
            }
        } else if source.is_dir() {
            match std::fs::read_dir(source) {
                Ok(entries) => {
                    for entry in entries.flatten() {
                        let path = entry.path();
                        let matches = entry
                            .file_name()
                            .to_str()
                            .is_some_and(|name| names.iter().any(|p| p.matches(name)));
                        if matches && path.is_file() {
                            files.insert(path);
                        }
                    }
                }
                Err(error) => problems.push((
                    source.display().to_string(),
                    format!("the directory cannot be read: {error}"),
                )),
            }
        } else if source.exists() {
            files.insert(source.clone());
        }
    }
    (files, problems)
}

/// What reading one file gave: its kubeconfig, or why not; `None` if the
/// file is gone.
pub(crate) fn read(path: &Path) -> Option<Result<Kubeconfig, KubeconfigError>> {
    match kubeconfig::read_file(path) {
        Err(KubeconfigError::Unreadable { .. }) if !path.exists() => None,
        read => Some(read),
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
