//! The core's modules import downward only, in the order
//! `docs/architecture.md` gives: a module of `core/src/` names nothing from a
//! layer above its own; and the files of one folder import each other in
//! no circle.

#[path = "layering/check.rs"]
mod check;
#[path = "layering/folders.rs"]
mod folders;

use std::path::Path;

#[test]
fn no_module_of_the_core_imports_from_a_layer_above_its_own() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    check::check(
        &root.join("core/src"),
        &root.join("docs/architecture.md"),
        "## Layers",
    );
}

#[test]
fn no_files_of_one_folder_of_the_core_import_each_other_in_a_circle() {
    folders::check_folders(&Path::new(env!("CARGO_MANIFEST_DIR")).join("core/src"));
}

#[test]
fn no_type_of_the_core_is_implemented_from_more_than_two_files() {
    folders::check_impls(&Path::new(env!("CARGO_MANIFEST_DIR")).join("core/src"));
}
