//! `report.html`: one self-contained page beside `report.md`, built from a run folder's stored
//! rows. It holds every section of `report.md` as HTML that reads without JavaScript (the
//! results table richer, the charts inlined; the script only sorts tables), and a drill-down per
//! goal: its questions and references, every memory made for it with the budget's cut marked,
//! and each answer with its verdict.
//!
//! The data is embedded once, as one JSON blob: the report's summary as is, the rows as columns
//! (indices instead of repeated ids), and memory texts once per distinct text and source. A
//! large run's rows and texts are gzip-compressed and base64-encoded, texts in one chunk per
//! source, so the page decompresses a source's memories only when one of its goals is opened.

mod columns;
mod document;

use std::io::Write;
use std::path::Path;

use serde::Serialize;
use serde_json::{Value, json};

use crate::error::Error;
use crate::inputs::records::Source;
use crate::store::ledger::{LedgerRow, MemoryText, ResultRow};
use crate::store::run_folder::{
    DATASET, MEMORIES, MEMORY_TEXTS, REPORT_HTML, REPORT_JSON, RESULTS, RunFolder,
};

use base64::Engine;
use columns::{Index, columns};

/// The page, with `{{title}}`, `{{document}}` and `{{data}}` to fill in.
const PAGE: &str = include_str!("../../../templates/report.html");
/// Names the layout of the embedded data, for the page's script and outside readers.
pub const FORMAT: &str = "gacc.html/1";
/// Data larger than this travels gzip-compressed: a paper-scale run's rows and texts shrink
/// several times, and a small run's page stays readable as plain JSON.
pub(crate) const GZIP_ABOVE: usize = 4 << 20;

/// How the rows and texts are embedded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Packing {
    /// Plain JSON up to `GZIP_ABOVE` bytes, gzip above.
    Auto,
    Json,
    Gzip,
}

/// Writes `report.html` into `folder` from the rows stored there.
pub(crate) fn write(folder: &RunFolder, packing: Packing) -> Result<(), Error> {
    let page = render(folder.path(), packing)?;
    folder.write(REPORT_HTML, page.as_bytes())
}

/// The page for the run in `folder`, from the rows stored there.
pub fn render(folder: &Path, packing: Packing) -> Result<String, Error> {
    let folder = RunFolder::open(folder);
    let report: Value = folder.read_json(REPORT_JSON)?;
    // The two largest files are read side by side.
    let (rows, results) = std::thread::scope(|scope| {
        let results = scope.spawn(|| folder.read_rows::<ResultRow>(RESULTS));
        let rows = (|| {
            let sources: Vec<Source> = folder.read_rows(DATASET)?;
            let ledger: Vec<LedgerRow> = folder.read_rows(MEMORIES)?;
            let texts: Vec<MemoryText> = folder.read_rows(MEMORY_TEXTS)?;
            Ok::<_, Error>((sources, ledger, texts))
        })();
        let results = results.join().unwrap_or_else(|_| {
            Err(Error::Stopped {
                what: format!("the reader of {}", folder.file(RESULTS).display()),
            })
        });
        (rows, results)
    });
    let (sources, ledger, texts) = rows?;
    let rows = Rows {
        sources: &sources,
        ledger: &ledger,
        texts: &texts,
        results: &results?,
    };
    render_rows(folder.path(), &report, rows, packing)
}

/// The rows a page is made of.
#[derive(Clone, Copy)]
pub(crate) struct Rows<'a> {
    pub(crate) sources: &'a [Source],
    pub(crate) ledger: &'a [LedgerRow],
    pub(crate) texts: &'a [MemoryText],
    pub(crate) results: &'a [ResultRow],
}

/// Writes `report.html` into `folder` from rows in memory: the page `write` makes from the
/// same rows once stored (a run writes it without reading its rows back).
pub(crate) fn write_rows(
    folder: &RunFolder,
    report: &Value,
    rows: Rows,
    packing: Packing,
) -> Result<(), Error> {
    write_rows_to(&folder.file(REPORT_HTML), folder, report, rows, packing)
}

/// Writes the page of a run folder's rows to `path`.
pub(crate) fn write_rows_to(
    path: &Path,
    folder: &RunFolder,
    report: &Value,
    rows: Rows,
    packing: Packing,
) -> Result<(), Error> {
    let page = render_rows(folder.path(), report, rows, packing)?;
    crate::files::write(path, page.as_bytes())
}

fn render_rows(folder: &Path, report: &Value, rows: Rows, packing: Packing) -> Result<String, Error> {
    let (index, chunks) = columns(
        folder,
        report,
        rows.sources,
        rows.ledger,
        rows.texts,
        rows.results,
    )?;
    let data = embed(report, &index, &chunks, packing);
    let title = format!(
        "{}: gacc report",
        report["experiment"]["name"].as_str().unwrap_or("run")
    );
    let title = escape_html(&title);
    let document = document::document(report, &charts(folder)).map_err(|message| Error::Io {
        path: folder.join(REPORT_HTML),
        message: format!("cannot render report.md's sections: {message}"),
    })?;
    Ok(fill(
        PAGE,
        title.len() + document.len() + data.len(),
        |name| match name {
            "title" => Some(&title),
            "document" => Some(&document),
            "data" => Some(&data),
            _ => None,
        },
    ))
}

/// The template with each `{{name}}` replaced in one pass, so no inserted text is read as a
/// placeholder.
/// `extra` is how much the values add (the page is sized once).
fn fill<'a>(template: &str, extra: usize, value: impl Fn(&str) -> Option<&'a String>) -> String {
    let mut out = String::with_capacity(template.len() + extra);
    let mut rest = template;
    while let Some(start) = rest.find("{{") {
        let Some(length) = rest[start..].find("}}") else {
            break;
        };
        match value(&rest[start + 2..start + length]) {
            Some(text) => {
                out.push_str(&rest[..start]);
                out.push_str(text);
            }
            None => out.push_str(&rest[..start + length + 2]),
        }
        rest = &rest[start + length + 2..];
    }
    out.push_str(rest);
    out
}

/// A value's JSON, written into a buffer of `estimate` bytes (more if it needs them).
fn sized(value: &impl Serialize, estimate: usize) -> String {
    let mut bytes = Vec::with_capacity(estimate);
    let _ = serde_json::to_writer(&mut bytes, value);
    String::from_utf8(bytes).unwrap_or_default()
}

/// The data blob's JSON, safe inside a `<script>` element.
fn embed(report: &Value, index: &Index, chunks: &[Vec<String>], packing: Packing) -> String {
    // Written into buffers sized up front: a paper-scale index is tens of megabytes, and a
    // buffer that doubles as it goes copies it over and over.
    let results = index.results.memory.len();
    let answers: usize = index.answers.iter().map(|a| a.len() + 3).sum();
    let index = sized(index, 4096 + results * 48 + answers);
    let chunks: Vec<String> = chunks
        .iter()
        .map(|chunk| sized(chunk, 64 + chunk.iter().map(|t| t.len() + 8).sum::<usize>()))
        .collect();
    let size = index.len() + chunks.iter().map(String::len).sum::<usize>();
    let gzip = match packing {
        Packing::Auto => size > GZIP_ABOVE,
        Packing::Json => false,
        Packing::Gzip => true,
    };
    let mut summary = json!({
        "experiment": report["experiment"],
        "tokenizer": report["tokenizer"],
        "dataset": report["dataset"],
        "complete": report["complete"],
        "cells": report["cells"],
        "integrity": report["integrity"],
        "holdout": report["holdout"],
        "calls": report["calls"],
        "failures": report["failures"],
        "cancelled": report["cancelled"],
    });
    if let Some(audit) = report.get("judge_audit") {
        summary["judge_audit"] = audit.clone();
    }
    let mut out = String::with_capacity(if gzip { size / 3 } else { size + 4096 });
    out.push_str(&format!(
        "{{\"format\":\"{FORMAT}\",\"packing\":\"{}\",\"report\":{summary},\"index\":",
        if gzip { "gzip" } else { "json" }
    ));
    let pack = |text: &str| -> String {
        if gzip {
            format!(
                "\"{}\"",
                base64::engine::general_purpose::STANDARD.encode(gzipped(text.as_bytes()))
            )
        } else {
            text.to_owned()
        }
    };
    // The index first, then the chunks, each packed on whichever core is free.
    let parts: Vec<&str> = std::iter::once(index.as_str())
        .chain(chunks.iter().map(String::as_str))
        .collect();
    let packed = crate::parallel::map_in_parallel(&parts, |text| pack(text));
    out.push_str(&packed[0]);
    out.push_str(",\"texts\":[");
    for (number, chunk) in packed[1..].iter().enumerate() {
        if number > 0 {
            out.push(',');
        }
        out.push_str(chunk);
    }
    out.push_str("]}");
    // `<` occurs in JSON only inside strings, where `\u003c` means the same: no `</script>` or
    // `<!--` in any memory, answer or id can end the element early.
    out.replace('<', "\\u003c")
}

fn gzipped(bytes: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    // Writing to a Vec cannot fail.
    let _ = encoder.write_all(bytes);
    encoder.finish().unwrap_or_default()
}

/// The charts of the folder inlined as `<figure>`s; a missing one is left out.
fn charts(folder: &Path) -> String {
    let mut out = String::new();
    for (file, title) in crate::report::charts::CHARTS {
        let Ok(svg) = std::fs::read_to_string(folder.join(file)) else {
            continue;
        };
        out.push_str(&figure(title, &svg));
    }
    out
}

/// A chart's SVG inlined in a page as a `<figure>` under `title`.
pub(crate) fn figure(title: &str, svg: &str) -> String {
    let start = svg.find("<svg").unwrap_or(0);
    // Inline SVG needs no namespace, and without it the page names no URL at all.
    let svg = svg[start..].replacen(" xmlns=\"http://www.w3.org/2000/svg\"", "", 1);
    format!(
        "<figure><figcaption>{}</figcaption>{}</figure>\n",
        escape_html(title),
        svg.replace("<script", "&lt;script")
    )
}

/// `text` safe in HTML text and in a quoted attribute (either quote): gacc's one HTML escape,
/// for report.html and `gacc view`'s pages.
pub(crate) fn escape_html(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}
