//! The webhook server's modules import downward only, in the order
//! `docs/architecture.md` gives.

#[path = "../../tests/layering/check.rs"]
mod check;

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
