//! Whether a crate's modules import downward only, in the order of a table
//! of layers in `docs/architecture.md`: shared by the core's and the
//! manager's layering tests.

use std::{collections::BTreeMap, path::Path};

/// The layer of each module (a top-level module, or a deeper path where
/// one part sits lower than the rest), as the architecture's table says.
fn layers(doc: &Path, section: &str) -> BTreeMap<String, u32> {
    let doc = std::fs::read_to_string(doc).unwrap();
    let mut layers = BTreeMap::new();
    // The table of the section headed `section`, up to the next heading.
    let lines = doc
        .lines()
        .skip_while(|line| line.trim() != section)
        .skip(1)
        .take_while(|line| !line.starts_with('#'));
    for line in lines {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let (Some(layer), Some(modules)) = (cells.get(1), cells.get(2)) else {
            continue;
        };
        let Ok(layer) = layer.parse::<u32>() else {
            continue;
        };
        for module in modules.split('`').skip(1).step_by(2) {
            layers.insert(module.to_owned(), layer);
        }
    }
    assert!(layers.len() > 3, "no layer table under {section}");
    layers
}

/// The module each name `lib.rs` re-exports comes from.
fn reexports(lib: &str) -> BTreeMap<String, String> {
    let mut names = BTreeMap::new();
    for statement in lib.split(';') {
        let Some(rest) = statement.trim().strip_prefix("pub use ") else {
            continue;
        };
        let Some((module, items)) = rest.split_once("::") else {
            continue;
        };
        for item in items.split([',', '{', '}']) {
            let name = item.trim().rsplit("::").next().unwrap_or_default();
            if !name.is_empty() {
                names.insert(name.to_owned(), module.trim().to_owned());
            }
        }
    }
    names
}

/// The code of a file without comments and without its unit tests.
pub(crate) fn code(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod tests {") {
        Some(at) => &text[..at],
        None => text,
    };
    text.lines()
        .filter(|line| !line.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every path a file names from the crate: `crate::a::b` inline, and each
/// path of a `use crate::{...}` group, as `a::b` (or a re-exported name).
fn crate_paths(code: &str) -> Vec<String> {
    let mut paths = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        rest = &rest[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // A group: split its top-level items, expanding nested groups
            // by their first segment (enough to place them).
            let mut depth = 0;
            let mut item = String::new();
            for ch in group.chars() {
                match ch {
                    '{' => {
                        depth += 1;
                        item.push(ch);
                    }
                    '}' if depth == 0 => break,
                    '}' => {
                        depth -= 1;
                        item.push(ch);
                    }
                    ',' if depth == 0 => paths.push(std::mem::take(&mut item)),
                    _ => item.push(ch),
                }
            }
            paths.push(item);
        } else {
            let end = rest
                .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                .unwrap_or(rest.len());
            paths.push(rest[..end].to_owned());
        }
    }
    paths
        .into_iter()
        .map(|p| p.split_whitespace().collect::<String>())
        .filter(|p| !p.is_empty())
        .collect()
}

/// The module of `path` of the table (its longest prefix there).
fn module_of<'a>(path: &str, layers: &'a BTreeMap<String, u32>) -> Option<(&'a String, u32)> {
    layers
        .iter()
        .filter(|(module, _)| path == module.as_str() || path.starts_with(&format!("{module}::")))
        .max_by_key(|(module, _)| module.len())
        .map(|(module, layer)| (module, *layer))
}

fn files(dir: &Path, found: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files(&path, found);
        } else if path.extension().is_some_and(|e| e == "rs") {
            found.push(path);
        }
    }
}

/// Fails, naming each, when a module of the crate in `src` names anything
/// from a layer above its own in the table under the heading `section` of
/// `doc` (through `use crate::` or an inline `crate::` path), names anything
/// through what `lib.rs` re-exports rather than from the module that
/// defines it, when two modules of one layer import each other in a circle,
/// or when the table does not place a module.
pub(crate) fn check(src: &Path, doc: &Path, section: &str) {
    let layers = layers(doc, section);
    let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap();
    let reexported = reexports(&lib);
    let mut found = Vec::new();
    files(src, &mut found);
    let mut upward = Vec::new();
    let mut through_lib = Vec::new();
    let mut unplaced = Vec::new();
    // Imports between modules of one layer, which must form no circle.
    let mut beside: BTreeMap<String, std::collections::BTreeSet<String>> = BTreeMap::new();
    for file in &found {
        let relative = file.strip_prefix(src).unwrap().with_extension("");
        let own: String = relative
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .filter(|c| c != "mod")
            .collect::<Vec<_>>()
            .join("::");
        if own == "lib" {
            continue;
        }
        let Some((own_module, own_layer)) = module_of(&own, &layers) else {
            unplaced.push(own);
            continue;
        };
        let text = std::fs::read_to_string(file).unwrap();
        for path in crate_paths(&code(&text)) {
            let first = path.split("::").next().unwrap_or_default();
            let path = match reexported.get(first) {
                Some(module) if module_of(&path, &layers).is_none() => {
                    through_lib.push(format!("{own} names {first} through lib.rs, not {module}"));
                    module.clone()
                }
                _ => path,
            };
            match module_of(&path, &layers) {
                Some((module, layer)) if layer > own_layer => upward.push(format!(
                    "{own} (layer {own_layer}) names {path} of {module} (layer {layer})"
                )),
                Some((module, layer)) if layer == own_layer && module != own_module => {
                    beside
                        .entry(own_module.clone())
                        .or_default()
                        .insert(module.clone());
                }
                _ => {}
            }
        }
    }
    assert!(
        unplaced.is_empty(),
        "modules docs/architecture.md does not place: {unplaced:?}"
    );
    upward.sort();
    upward.dedup();
    assert!(upward.is_empty(), "upward imports:\n{}", upward.join("\n"));
    // `lib.rs` is the public face: inside the crate, a name comes from the
    // module that defines it.
    through_lib.sort();
    through_lib.dedup();
    assert!(
        through_lib.is_empty(),
        "imports through lib.rs:\n{}",
        through_lib.join("\n")
    );
    // A circle within a layer: some module reaches itself.
    for start in beside.keys() {
        let mut seen = std::collections::BTreeSet::new();
        let mut next: Vec<&String> = beside[start].iter().collect();
        while let Some(module) = next.pop() {
            assert!(module != start, "{start} imports itself through {seen:?}");
            if seen.insert(module.clone())
                && let Some(more) = beside.get(module)
            {
                next.extend(more);
            }
        }
    }
}
