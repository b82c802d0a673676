//! What the docs show, users copy: no example or doc limits a controller's
//! concurrency with tower's `ConcurrencyLimit`, which cannot see clusters
//! and lets one hung cluster hold every slot. `controller::Config` does it
//! per cluster, in the queue.

use std::path::{Path, PathBuf};

/// The code a reader sees: Rust files' doc comments, and Markdown's code
/// blocks (with the line each starts on).
fn shown_code(path: &Path) -> Vec<(usize, String)> {
    let text = std::fs::read_to_string(path).unwrap();
    let markdown = path.extension().is_some_and(|e| e == "md");
    let example = path.components().any(|c| c.as_os_str() == "examples");
    let mut in_block = false;
    let mut shown = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        let code = if markdown {
            if trimmed.starts_with("```") {
                in_block = !in_block;
                continue;
            }
            in_block
        } else {
            example || trimmed.starts_with("//!") || trimmed.starts_with("///")
        };
        if code {
            shown.push((n + 1, line.to_owned()));
        }
    }
    shown
}

fn files(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            if !matches!(name.as_str(), "target" | "tests" | "benches" | ".git") {
                files(&path, found);
            }
        } else if name.ends_with(".rs") || name.ends_with(".md") {
            found.push(path);
        }
    }
}

#[test]
fn no_example_or_doc_limits_a_controller_with_tower_concurrency_limit() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut found = Vec::new();
    files(root, &mut found);
    assert!(
        found.iter().any(|p| p.ends_with("src/controller/mod.rs")),
        "the sources were not found"
    );
    let mut offending = Vec::new();
    for path in &found {
        for (line, code) in shown_code(path) {
            if code.contains("concurrency_limit(") || code.contains("ConcurrencyLimitLayer") {
                offending.push(format!("{}:{line}: {}", path.display(), code.trim()));
            }
        }
    }
    assert!(
        offending.is_empty(),
        "use controller::Config::concurrency instead:\n{}",
        offending.join("\n")
    );
}
