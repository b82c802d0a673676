//! The webhook server's modules import downward only, in the order
//! `docs/architecture.md` gives; and the files of one folder import each
//! other in no circle.

#[path = "../../tests/layering/check.rs"]
mod check;
#[path = "../../tests/layering/folders.rs"]
mod folders;

use std::path::Path;

#[test]
fn no_module_of_the_webhook_server_imports_from_a_layer_above_its_own() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    check::check(
        &root.join("src"),
        &root.join("../docs/architecture.md"),
        "## The webhook server's layers",
    );
}

#[test]
fn no_files_of_one_folder_of_the_webhook_server_import_each_other_in_a_circle() {
    folders::check_folders(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
}

#[test]
fn no_type_of_the_webhook_server_is_implemented_from_more_than_two_files() {
    folders::check_impls(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
}
