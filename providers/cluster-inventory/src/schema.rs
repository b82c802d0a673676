//! Schemas for the fields kept as JSON.

use schemars::{Schema, SchemaGenerator, json_schema};

/// Any JSON object, kept whole by the API server.
pub(crate) fn any_object(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
    })
}
