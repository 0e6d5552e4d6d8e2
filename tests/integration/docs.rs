//! The reference in `docs/` and the contracts gacc prints agree: every key of `gacc schema
//! manifest` is in docs/manifest.md, every field of `gacc schema report` (and of its cells) in
//! docs/run-folder.md, and the README links the reference.

use crate::common;

use std::collections::BTreeSet;

use common::Scratch;
use serde_json::Value;

/// Every property name in `schema`, at any depth, through `$ref`s.
fn names(schema: &Value) -> BTreeSet<String> {
    let definitions = schema.get("$defs").cloned().unwrap_or(Value::Null);
    let mut found = BTreeSet::new();
    let mut seen = BTreeSet::new();
    let mut stack = vec![schema.clone()];
    while let Some(node) = stack.pop() {
        match node {
            Value::Object(map) => {
                if let Some(Value::String(reference)) = map.get("$ref") {
                    let name = reference.rsplit('/').next().unwrap_or_default().to_owned();
                    if seen.insert(name.clone())
                        && let Some(definition) = definitions.get(&name)
                    {
                        stack.push(definition.clone());
                    }
                }
                if let Some(Value::Object(properties)) = map.get("properties") {
                    found.extend(properties.keys().cloned());
                }
                stack.extend(map.into_iter().filter(|(k, _)| k != "$defs").map(|(_, v)| v));
            }
            Value::Array(items) => stack.extend(items),
            _ => {}
        }
    }
    found
}

fn missing(names: &BTreeSet<String>, page: &str) -> Vec<String> {
    let text = std::fs::read_to_string(format!("{}/docs/{page}", env!("CARGO_MANIFEST_DIR"))).unwrap();
    names
        .iter()
        // As a key (`name`, `name = …`) or a table (`[name]`, `[a.name]`).
        .filter(|name| {
            ![
                format!("`{name}`"),
                format!("{name} ="),
                format!("[{name}"),
                format!(".{name}]"),
            ]
            .iter()
            .any(|form| text.contains(form.as_str()))
        })
        .cloned()
        .collect()
}

#[test]
fn every_manifest_key_and_report_field_is_in_the_reference() {
    let scratch = Scratch::empty();
    let manifest = scratch.json(["schema", "manifest"]);
    let keys = names(&manifest);
    assert!(
        keys.contains("max_inflight") && keys.contains("calls_per_task"),
        "{keys:?}"
    );
    assert_eq!(
        missing(&keys, "manifest.md"),
        Vec::<String>::new(),
        "undocumented manifest keys"
    );
    let report = scratch.json(["schema", "report"]);
    let fields = names(&report);
    assert!(
        fields.contains("micro_ci95") && fields.contains("stderr_tail"),
        "{fields:?}"
    );
    assert_eq!(
        missing(&fields, "run-folder.md"),
        Vec::<String>::new(),
        "undocumented report fields"
    );
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    for page in [
        "docs/README.md",
        "docs/manifest.md",
        "docs/protocol.md",
        "docs/cache.md",
        "docs/run-folder.md",
    ] {
        assert!(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join(page)
                .is_file(),
            "{page}"
        );
    }
    assert!(
        readme.contains("(docs/README.md)"),
        "the README links the reference"
    );
}
