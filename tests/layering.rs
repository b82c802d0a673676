//! The core's modules import downward only, in the order
//! `docs/architecture.md` gives: a module of `core/src/` names nothing from a
//! layer above its own.

#[path = "layering/check.rs"]
mod check;

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
