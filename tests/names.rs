//! Every name the library writes into a cluster takes the one prefix, and no
//! name the crates had before they were renamed is left anywhere but the
//! CHANGELOG's migration table.

use std::path::Path;

use kube_multicluster::{METRIC_PREFIX, PREFIX, envtest, gather, ownership, webhook};

#[test]
fn every_name_written_into_a_cluster_takes_the_one_prefix() {
    assert_eq!(PREFIX, "kube-multicluster.dev");
    assert_eq!(METRIC_PREFIX, "kube_multicluster");
    for name in [
        ownership::PARENT_ANNOTATION,
        ownership::PARENT_UID_LABEL,
        webhook::SERVER_LABEL,
        envtest::FIELD_MANAGER,
        gather::FIELD_MANAGER,
    ] {
        assert!(name.starts_with(&format!("{PREFIX}/")), "{name}");
    }
}

/// The old names, in lower case, put together here so that this file does
/// not hold them; a text is searched in lower case too.
fn old_names() -> Vec<String> {
    vec![["kube", "-fleet"].concat(), ["kube", "_fleet"].concat()]
}

#[test]
fn no_old_name_is_left_outside_the_changelog_migration_table() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let old = old_names();
    let mut found = Vec::new();
    let mut files = Vec::new();
    walk(root, &mut files);
    assert!(
        files.len() > 100,
        "only {} files under {}",
        files.len(),
        root.display()
    );
    for file in files {
        let relative = file.strip_prefix(root).unwrap();
        let path = relative.to_string_lossy().to_lowercase();
        if old.iter().any(|name| path.contains(name.as_str())) {
            found.push(format!("{}: the file's path", relative.display()));
        }
        let Ok(text) = std::fs::read_to_string(&file) else {
            continue; // not text
        };
        let table = if relative == Path::new("CHANGELOG.md") {
            migration_table(&text)
        } else {
            0..0
        };
        for (number, line) in text.lines().enumerate() {
            if table.contains(&number) {
                continue;
            }
            let line_lower = line.to_lowercase();
            if old.iter().any(|name| line_lower.contains(name.as_str())) {
                found.push(format!("{}:{}: {line}", relative.display(), number + 1));
            }
        }
    }
    assert!(found.is_empty(), "old names left:\n{}", found.join("\n"));
}

/// The lines of the CHANGELOG's migration table: between its two markers.
fn migration_table(changelog: &str) -> std::ops::Range<usize> {
    let line_of = |marker: &str| {
        changelog
            .lines()
            .position(|line| line.trim() == marker)
            .unwrap_or_else(|| panic!("CHANGELOG.md has no line {marker}"))
    };
    let start = line_of("<!-- migration table: old names -->");
    let end = line_of("<!-- end of migration table -->");
    assert!(
        start < end,
        "the migration table's markers are out of order"
    );
    start..end
}

/// Every file under `dir` but build output and Git's own.
fn walk(dir: &Path, files: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy();
        if path.is_dir() {
            if name != "target" && name != ".git" {
                walk(&path, files);
            }
        } else {
            files.push(path);
        }
    }
}
