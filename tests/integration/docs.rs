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

/// GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == '-' || *c == ' ' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a Markdown page: its headings outside code blocks.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut fenced = false;
    let mut found = BTreeSet::new();
    for line in text.lines() {
        if line.starts_with("```") {
            fenced = !fenced;
        } else if !fenced && line.starts_with('#') {
            found.insert(slug(line.trim_start_matches('#')));
        }
    }
    found
}

/// The link targets of a Markdown page, outside code blocks: `[text](target)`.
fn links(text: &str) -> Vec<String> {
    let mut fenced = false;
    let mut found = Vec::new();
    for line in text.lines() {
        if line.starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let mut rest = line;
        while let Some(at) = rest.find("](") {
            let tail = &rest[at + 2..];
            let Some(end) = tail.find(')') else { break };
            found.push(tail[..end].to_string());
            rest = &tail[end..];
        }
    }
    found
}

fn pages(folder: &std::path::Path, into: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(folder).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            pages(&path, into);
        } else if path.extension().is_some_and(|e| e == "md") {
            into.push(path);
        }
    }
}

#[test]
fn every_relative_link_of_the_readme_and_the_guide_resolves() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut all = vec![root.join("README.md")];
    pages(&root.join("docs"), &mut all);
    let guide = all
        .iter()
        .filter(|p| p.starts_with(root.join("docs/guide")))
        .count();
    assert!(guide >= 6, "the guide has {guide} pages");
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    assert!(readme.lines().count() <= 400, "README.md is over 400 lines");
    let mut broken = Vec::new();
    let mut checked = 0;
    for page in &all {
        let text = std::fs::read_to_string(page).unwrap();
        for link in links(&text) {
            if link.contains("://") || link.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (file, anchor) = link.split_once('#').unwrap_or((&link, ""));
            let target = if file.is_empty() {
                page.clone()
            } else {
                page.parent().unwrap().join(file)
            };
            let name = format!("{}: {link}", page.strip_prefix(root).unwrap().display());
            if !target.exists() {
                broken.push(format!("{name} (no such file)"));
            } else if !anchor.is_empty()
                && target.extension().is_some_and(|e| e == "md")
                && !anchors(&std::fs::read_to_string(&target).unwrap()).contains(anchor)
            {
                broken.push(format!("{name} (no such heading)"));
            }
        }
    }
    assert!(checked >= 40, "only {checked} links checked");
    assert_eq!(broken, Vec::<String>::new(), "broken links");
}
