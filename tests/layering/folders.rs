//! Whether the files of a folder of a crate import each other in a circle,
//! following what the folder's `mod.rs` re-exports to the file that
//! defines it, and whether a type is given methods from more than two
//! files: shared by the crates' layering tests. What `mod.rs` defines
//! itself is the folder's own (a type whose parts its files implement), not
//! a part of it.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

use super::check::code;

/// The first segment of each path written right after a prefix: one name,
/// or each item of a `{...}` group.
fn firsts(rest: &str) -> Vec<String> {
    let name = |s: &str| -> String {
        s.trim()
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    let Some(group) = rest.strip_prefix('{') else {
        return vec![name(rest)];
    };
    let (mut depth, mut item, mut found) = (0, String::new(), Vec::new());
    for ch in group.chars() {
        match ch {
            '{' => depth += 1,
            '}' if depth == 0 => break,
            '}' => depth -= 1,
            ',' if depth == 0 => found.push(name(&std::mem::take(&mut item))),
            _ if depth == 0 => item.push(ch),
            _ => {}
        }
    }
    found.push(name(&item));
    found.into_iter().filter(|n| !n.is_empty()).collect()
}

/// The names of the folder's module that `code`, `depth` folders below it,
/// names: through `super::` written `depth` times, or `crate::<module>::`.
fn named(code: &str, depth: usize, module: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut from = 0;
    while let Some(at) = code[from..].find("super::") {
        let start = from + at;
        let (mut chain, mut end) = (0, start);
        while code[end..].starts_with("super::") {
            chain += 1;
            end += "super::".len();
        }
        if chain == depth && !code[..start].ends_with("::") {
            names.extend(firsts(&code[end..]));
        }
        from = end;
    }
    let prefix = format!("crate::{module}::");
    let mut rest = code;
    while let Some(at) = rest.find(&prefix) {
        rest = &rest[at + prefix.len()..];
        names.extend(firsts(rest));
    }
    // `crate::{a::b::X, ...}` groups: the items under the folder's path.
    let path = format!("{module}::");
    let mut rest = code;
    while let Some(at) = rest.find("crate::{") {
        rest = &rest[at + "crate::{".len()..];
        let (mut depth, mut end) = (0, rest.len());
        for (i, ch) in rest.char_indices() {
            match ch {
                '{' => depth += 1,
                '}' if depth == 0 => {
                    end = i;
                    break;
                }
                '}' => depth -= 1,
                _ => {}
            }
        }
        let group: String = rest[..end].split_whitespace().collect();
        names.extend(within(&group, &path));
    }
    names
}

/// The first segment after `path` of each item of a flattened `use` group
/// (`a::{b::X, c}` is `a::b::X` and `a::c`).
fn within(group: &str, path: &str) -> Vec<String> {
    let mut found = Vec::new();
    let (mut depth, mut item) = (0, String::new());
    let mut items = Vec::new();
    for ch in group.chars() {
        match ch {
            '{' => {
                depth += 1;
                item.push(ch);
            }
            '}' => {
                depth -= 1;
                item.push(ch);
            }
            ',' if depth == 0 => items.push(std::mem::take(&mut item)),
            _ => item.push(ch),
        }
    }
    items.push(item);
    for item in items {
        if let Some(rest) = item.strip_prefix(path) {
            found.extend(firsts(rest));
        } else if let Some((head, inner)) = item.split_once("::{") {
            // `a::{...}`: look inside with `a::` taken off the path.
            let head = format!("{head}::");
            if let Some(deeper) = path.strip_prefix(&head) {
                let inner = inner.strip_suffix('}').unwrap_or(inner);
                found.extend(within(inner, deeper));
            } else if head == path {
                found.extend(firsts(&format!("{{{inner}")));
            }
        }
    }
    found
}

fn rust_files(dir: &Path, depth: usize, found: &mut Vec<(PathBuf, usize)>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, depth + 1, found);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let own = path.file_name().is_some_and(|n| n == "mod.rs");
            found.push((path, if own { depth } else { depth + 1 }));
        }
    }
}

/// The circles among the parts of the folder `dir` (module `module`) and,
/// recursively, of its subfolders: each part (a file, or a subfolder whole)
/// imports another when it names it, or a name `mod.rs` re-exports from it.
fn circles_in(dir: &Path, module: &str, circles: &mut Vec<String>) {
    let root = code(&std::fs::read_to_string(dir.join("mod.rs")).unwrap_or_default());
    let mut parts: BTreeMap<String, Vec<(PathBuf, usize)>> = BTreeMap::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let stem = path.file_stem().unwrap().to_string_lossy().into_owned();
        if path.is_dir() && path.join("mod.rs").exists() {
            circles_in(&path, &format!("{module}::{stem}"), circles);
            let mut files = Vec::new();
            // A subfolder's `mod.rs` names this folder as `super::`, its
            // other files as `super::super::`.
            rust_files(&path, 1, &mut files);
            parts.insert(stem, files);
        } else if path.extension().is_some_and(|e| e == "rs") && stem != "mod" {
            parts.insert(stem, vec![(path, 1)]);
        }
    }
    // What `mod.rs` re-exports, by the part that defines it.
    let mut reexported = BTreeMap::new();
    for statement in root.split(';') {
        let statement = statement.trim();
        let Some(at) = statement.find("use ") else {
            continue;
        };
        let path = &statement[at + "use ".len()..];
        let Some((part, items)) = path.split_once("::") else {
            continue;
        };
        if parts.contains_key(part) {
            for item in items.split([',', '{', '}']) {
                let name = item.trim().rsplit("::").next().unwrap_or_default();
                let name = name.rsplit(" as ").next().unwrap_or_default().trim();
                if !name.is_empty() {
                    reexported.insert(name.to_owned(), part.to_owned());
                }
            }
        }
    }
    let mut edges: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
    for (part, files) in &parts {
        for (file, depth) in files {
            let code = code(&std::fs::read_to_string(file).unwrap());
            for name in named(&code, *depth, module) {
                let target = if parts.contains_key(&name) {
                    Some(name)
                } else {
                    reexported.get(&name).cloned()
                };
                if let Some(target) = target.filter(|t| t != part) {
                    edges.entry(part).or_default().insert(target);
                }
            }
        }
    }
    // Each part that reaches itself, with the path it takes.
    let mut told = BTreeSet::new();
    for start in edges.keys() {
        let mut stack = vec![(start.to_string(), vec![start.to_string()])];
        let mut seen = BTreeSet::new();
        while let Some((at, path)) = stack.pop() {
            for next in edges.get(at.as_str()).into_iter().flatten() {
                if next == start {
                    let mut circle = path.clone();
                    circle.sort();
                    if told.insert(circle) {
                        circles.push(format!("{module}: {} -> {start}", path.join(" -> ")));
                    }
                } else if seen.insert(next.clone()) {
                    let mut longer = path.clone();
                    longer.push(next.clone());
                    stack.push((next.clone(), longer));
                }
            }
        }
    }
}

/// Fails, naming each, when the files of a folder under `src` import each
/// other in a circle (a subfolder counts as one part of its parent).
pub(crate) fn check_folders(src: &Path) {
    let mut circles = Vec::new();
    for entry in std::fs::read_dir(src).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() && path.join("mod.rs").exists() {
            let module = path.file_name().unwrap().to_string_lossy().into_owned();
            circles_in(&path, &module, &mut circles);
        }
    }
    assert!(
        circles.is_empty(),
        "files of one folder import each other in a circle (move what both need \
         into a part of its own, below both):\n{}",
        circles.join("\n")
    );
}

/// Fails, naming each, when a type of the crate in `src` is given methods
/// (an inherent `impl`) in more than two files: its state then has no one
/// owner. Types of one name in different modules count together, so give
/// such types distinct names.
pub(crate) fn check_impls(src: &Path) {
    let mut files = Vec::new();
    rust_files(src, 0, &mut files);
    let mut by_type: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (file, _) in &files {
        let code = code(&std::fs::read_to_string(file).unwrap());
        // Each `impl` at the start of a line, its header up to its `{`
        // (over several lines if it wraps).
        let headers = code
            .match_indices("impl")
            .filter(|(at, _)| *at == 0 || code[..*at].ends_with('\n'))
            .map(|(at, _)| code[at..].split('{').next().unwrap_or_default().to_owned());
        for header in headers {
            let header = header.split_whitespace().collect::<Vec<_>>().join(" ");
            let header = header.as_str();
            if header.contains(" for ") {
                continue;
            }
            // `impl<...> Name<...>`: the name after the generics.
            let mut depth = 0;
            let mut after = String::new();
            for ch in header["impl".len()..].chars() {
                match ch {
                    '<' => depth += 1,
                    '>' => depth -= 1,
                    _ if depth == 0 => after.push(ch),
                    _ => {}
                }
            }
            let name: String = after
                .trim()
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                let shown = file.strip_prefix(src).unwrap_or(file).display().to_string();
                by_type.entry(name).or_default().insert(shown);
            }
        }
    }
    let spread: Vec<String> = by_type
        .iter()
        .filter(|(_, files)| files.len() > 2)
        .map(|(name, files)| {
            format!(
                "{name}: {}",
                files.iter().cloned().collect::<Vec<_>>().join(", ")
            )
        })
        .collect();
    assert!(
        spread.is_empty(),
        "types implemented from more than two files (split them into parts that \
         own their own state):\n{}",
        spread.join("\n")
    );
}
