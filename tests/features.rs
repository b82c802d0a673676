//! The features of `kube-multicluster` are documented in two places that must
//! not drift: the `## ` comments in `[features]` of its `Cargo.toml`, from
//! which `document-features` writes the crate docs' list, and the README's
//! table.

use std::{collections::BTreeSet, path::Path};

#[test]
fn every_feature_has_a_doc_comment_for_the_crate_docs() {
    // document-features lists only the features with a `## ` comment above
    // them, and leaves the others out without a word.
    let undocumented: Vec<String> = cargo_features()
        .into_iter()
        .filter(|feature| !feature.documented)
        .map(|feature| feature.name)
        .collect();
    assert!(
        undocumented.is_empty(),
        "Cargo.toml: features without a `## ` comment above them: {undocumented:?}"
    );
}

#[test]
fn the_readme_table_names_every_feature_and_no_other() {
    let cargo: BTreeSet<String> = cargo_features()
        .into_iter()
        .map(|feature| feature.name)
        .collect();
    let readme = readme_features();
    let listed: BTreeSet<String> = readme.iter().cloned().collect();
    assert_eq!(
        listed.len(),
        readme.len(),
        "README.md names a feature twice"
    );
    let missing: Vec<&String> = cargo.difference(&listed).collect();
    let unknown: Vec<&String> = listed.difference(&cargo).collect();
    assert!(
        missing.is_empty() && unknown.is_empty(),
        "README.md's feature table is missing {missing:?} and names {unknown:?}, which \
         Cargo.toml does not have"
    );
}

#[derive(Debug)]
struct Feature {
    name: String,
    /// Whether the line above it is a `## ` comment.
    documented: bool,
}

/// The keys of `[features]` in this crate's `Cargo.toml`.
fn cargo_features() -> Vec<Feature> {
    let manifest = read("Cargo.toml");
    let mut features = Vec::new();
    let mut table = "";
    let mut above = "";
    for line in manifest.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('[') && trimmed.ends_with(']') && !trimmed.contains('"') {
            table = trimmed;
        } else if table == "[features]"
            // Not a comment, nor a line of a value written over several.
            && line.starts_with(|c: char| c.is_ascii_alphanumeric())
        {
            let (name, _) = line
                .split_once('=')
                .unwrap_or_else(|| panic!("Cargo.toml: a feature without `=`: {line}"));
            features.push(Feature {
                name: name.trim().trim_matches('"').to_owned(),
                documented: above.starts_with("## "),
            });
        }
        above = line;
    }
    assert!(features.len() > 10, "Cargo.toml: only {features:?}");
    features
}

/// The first cells of the table under the README's "### Features".
fn readme_features() -> Vec<String> {
    let readme = read("README.md");
    let section = readme
        .split_once("\n### Features\n")
        .expect("README.md has no `### Features` heading")
        .1;
    let features: Vec<String> = section
        .lines()
        .take_while(|line| !line.starts_with('#'))
        .filter_map(|line| line.strip_prefix("| `"))
        .map(|row| {
            let (name, _) = row
                .split_once('`')
                .unwrap_or_else(|| panic!("README.md: a feature row without its closing `: {row}"));
            name.to_owned()
        })
        .collect();
    assert!(
        !features.is_empty(),
        "README.md: no table rows under `### Features`"
    );
    features
}

fn read(file: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(file);
    std::fs::read_to_string(&path).unwrap_or_else(|error| panic!("{}: {error}", path.display()))
}
