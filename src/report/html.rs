//! `report.html`: one self-contained page beside `report.md`, built from a run folder's stored
//! rows. It shows the summary table (sortable), the charts, the failures, and a drill-down per
//! goal: its questions and references, every memory made for it with the budget's cut marked,
//! and each answer with its verdict.
//!
//! The data is embedded once, as one JSON blob: the report's summary as is, the rows as columns
//! (indices instead of repeated ids), and memory texts once per distinct text and source. A
//! large run's rows and texts are gzip-compressed and base64-encoded, texts in one chunk per
//! source, so the page decompresses a source's memories only when one of its goals is opened.

use std::collections::HashMap;
use std::io::Write;
use std::path::Path;

use base64::Engine;
use serde::Serialize;
use serde_json::{Value, json};

use crate::error::Error;
use crate::inputs::records::Source;
use crate::protocol::CellId;
use crate::store::ledger::{LedgerRow, MemoryText, ResultRow};
use crate::store::run_folder::{
    DATASET, MEMORIES, MEMORY_TEXTS, REPORT_HTML, REPORT_JSON, RESULTS, RunFolder,
};

/// The page, with `{{title}}`, `{{charts}}` and `{{data}}` to fill in.
const PAGE: &str = include_str!("../../templates/report.html");
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
    let (title, charts) = (escape_html(&title), charts(folder));
    Ok(fill(
        PAGE,
        title.len() + charts.len() + data.len(),
        |name| match name {
            "title" => Some(&title),
            "charts" => Some(&charts),
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

/// The rows as columns. Goals are numbered in dataset order and their questions follow one
/// another, so goal `g` owns questions `question_start[g]..question_start[g + 1]`; results are
/// ordered by goal, then memory, then question, so goal `g` owns results
/// `result_start[g]..result_start[g + 1]`, and a memory's results are consecutive.
#[derive(Debug, Default, Serialize)]
struct Index {
    sources: Vec<String>,
    goals: Goals,
    questions: Questions,
    memories: Memories,
    results: Results,
    /// Each distinct answer once; results refer to it by index.
    answers: Vec<String>,
}

#[derive(Debug, Default, Serialize)]
struct Goals {
    id: Vec<String>,
    text: Vec<String>,
    source: Vec<usize>,
    question_start: Vec<usize>,
    result_start: Vec<usize>,
}

#[derive(Debug, Default, Serialize)]
struct Questions {
    id: Vec<String>,
    text: Vec<String>,
    reference: Vec<String>,
}

/// One entry per ledger row. `goal` and `shown` are goal indices, -1 for none; `text` indexes
/// the memory's source's chunk of texts.
#[derive(Debug, Default, Serialize)]
struct Memories {
    cell: Vec<usize>,
    seed: Vec<u64>,
    source: Vec<usize>,
    goal: Vec<i64>,
    shown: Vec<i64>,
    source_tokens: Vec<usize>,
    budget: Vec<usize>,
    generated: Vec<usize>,
    retained: Vec<usize>,
    memory_tokens: Vec<usize>,
    /// 1 truncated, 2 a multi-byte character split by the cut, 4 over budget.
    flags: Vec<u8>,
    text: Vec<usize>,
}

/// One entry per question answered. `memory` is -1 when no memory was made (its compress job
/// failed); `verdict` is 1 right, 0 wrong, -1 unscored. `unscored` holds, by result index, the
/// cell, seed and failure of each result that has a failure.
#[derive(Debug, Default, Serialize)]
struct Results {
    memory: Vec<i64>,
    question: Vec<usize>,
    answer: Vec<i64>,
    verdict: Vec<i8>,
    score: std::collections::BTreeMap<usize, f64>,
    unscored: std::collections::BTreeMap<usize, (usize, u64, String)>,
}

fn columns(
    folder: &Path,
    report: &Value,
    sources: &[Source],
    ledger: &[LedgerRow],
    texts: &[MemoryText],
    results: &[ResultRow],
) -> Result<(Index, Vec<Vec<String>>), Error> {
    let mut columns = Columns {
        folder,
        index: Index::default(),
        cells: HashMap::new(),
        source_of: HashMap::new(),
        goal_of: HashMap::new(),
        question_of: HashMap::new(),
        memory_of: HashMap::new(),
    };
    columns.cells(report)?;
    columns.sources(sources);
    let chunks = columns.memories(ledger, texts, sources.len())?;
    columns.results(results)?;
    Ok((columns.index, chunks))
}

/// The index being built, and where each id went in it.
struct Columns<'a> {
    folder: &'a Path,
    index: Index,
    cells: HashMap<String, usize>,
    source_of: HashMap<&'a str, usize>,
    goal_of: HashMap<&'a str, usize>,
    question_of: HashMap<&'a str, usize>,
    memory_of: HashMap<&'a str, usize>,
}

impl<'a> Columns<'a> {
    fn inconsistent(&self, file: &str, message: String) -> Error {
        Error::Io {
            path: self.folder.join(file),
            message,
        }
    }

    /// Each cell of report.json by its name.
    fn cells(&mut self, report: &Value) -> Result<(), Error> {
        for (number, cell) in report["cells"].as_array().into_iter().flatten().enumerate() {
            let id: CellId = serde_json::from_value(cell.clone()).map_err(|error| {
                self.inconsistent(
                    REPORT_JSON,
                    format!("cells[{number}] lacks a compressor, condition, ratio or budget: {error}"),
                )
            })?;
            self.cells.insert(id.to_string(), number);
        }
        Ok(())
    }

    /// Sources, goals and questions, numbered in dataset order.
    fn sources(&mut self, sources: &'a [Source]) {
        let index = &mut self.index;
        for (s, source) in sources.iter().enumerate() {
            self.source_of.insert(source.id.as_str(), s);
            index.sources.push(source.id.clone());
            for goal in &source.goals {
                self.goal_of.insert(goal.id.as_str(), index.goals.id.len());
                index.goals.id.push(goal.id.clone());
                index.goals.text.push(goal.text.clone());
                index.goals.source.push(s);
                index.goals.question_start.push(index.questions.id.len());
                for question in &goal.questions {
                    self.question_of
                        .insert(question.id.as_str(), index.questions.id.len());
                    index.questions.id.push(question.id.clone());
                    index.questions.text.push(question.question.clone());
                    index.questions.reference.push(question.reference.clone());
                }
            }
        }
        index.goals.question_start.push(index.questions.id.len());
    }

    fn goal_number(&self, id: &Option<String>, what: &str) -> Result<i64, Error> {
        match id {
            None => Ok(-1),
            Some(id) => {
                self.goal_of.get(id.as_str()).map(|&g| g as i64).ok_or_else(|| {
                    self.inconsistent(MEMORIES, format!("{what} `{id}` is not in dataset.jsonl"))
                })
            }
        }
    }

    /// One column entry per ledger row; each source's distinct memory texts, once each.
    fn memories(
        &mut self,
        ledger: &'a [LedgerRow],
        texts: &'a [MemoryText],
        sources: usize,
    ) -> Result<Vec<Vec<String>>, Error> {
        let text_of: HashMap<&str, &str> = texts.iter().map(|t| (t.sha256.as_str(), &*t.memory)).collect();
        let mut chunks: Vec<Vec<String>> = vec![Vec::new(); sources];
        let mut chunk_slot: HashMap<(usize, &str), usize> = HashMap::new();
        for (number, row) in ledger.iter().enumerate() {
            let id = &row.memory_id;
            let key = id.cell.to_string();
            let cell = *self.cells.get(&key).ok_or_else(|| {
                self.inconsistent(
                    MEMORIES,
                    format!("line {}: no cell in report.json for {key}", number + 1),
                )
            })?;
            let source = *self.source_of.get(id.source_id.as_str()).ok_or_else(|| {
                self.inconsistent(
                    MEMORIES,
                    format!(
                        "line {}: source `{}` is not in dataset.jsonl",
                        number + 1,
                        id.source_id
                    ),
                )
            })?;
            let text = *text_of.get(row.memory_sha256.as_str()).ok_or_else(|| {
                self.inconsistent(
                    MEMORY_TEXTS,
                    format!(
                        "no text for memory {} (memories.jsonl line {})",
                        row.memory_sha256,
                        number + 1
                    ),
                )
            })?;
            let slot = *chunk_slot
                .entry((source, row.memory_sha256.as_str()))
                .or_insert_with(|| {
                    chunks[source].push(text.to_owned());
                    chunks[source].len() - 1
                });
            let (goal, shown) = (
                self.goal_number(&id.goal_id, "goal")?,
                self.goal_number(&id.shown_goal_id, "shown goal")?,
            );
            let memories = &mut self.index.memories;
            memories.cell.push(cell);
            memories.seed.push(id.seed);
            memories.source.push(source);
            memories.goal.push(goal);
            memories.shown.push(shown);
            memories.source_tokens.push(row.source_tokens);
            memories.budget.push(row.budget);
            memories.generated.push(row.generated_tokens);
            memories.retained.push(row.retained_tokens);
            memories.memory_tokens.push(row.memory_tokens);
            memories.flags.push(
                u8::from(row.truncated) | u8::from(row.utf8_split) << 1 | u8::from(row.budget_violation) << 2,
            );
            memories.text.push(slot);
            self.memory_of.insert(row.key.as_str(), number);
        }
        Ok(chunks)
    }

    /// The results, ordered (goal, memory, question) so that each goal's are one run of rows.
    fn results(&mut self, results: &'a [ResultRow]) -> Result<(), Error> {
        let mut order = Vec::with_capacity(results.len());
        for (number, row) in results.iter().enumerate() {
            let place = |what: &str, id: &str| {
                self.inconsistent(
                    RESULTS,
                    format!("line {}: {what} `{id}` is not in dataset.jsonl", number + 1),
                )
            };
            let goal = *self
                .goal_of
                .get(row.goal_id.as_str())
                .ok_or_else(|| place("goal", &row.goal_id))?;
            let question = *self
                .question_of
                .get(row.question_id.as_str())
                .ok_or_else(|| place("question", &row.question_id))?;
            let memory = self
                .memory_of
                .get(row.memory_key.as_str())
                .map_or(usize::MAX, |&m| m);
            order.push((goal, memory, question, number));
        }
        order.sort_unstable();
        let index = &mut self.index;
        let mut answers = HashMap::new();
        let mut next_goal = 0;
        for (position, &(goal, memory, question, number)) in order.iter().enumerate() {
            while next_goal <= goal {
                index.goals.result_start.push(position);
                next_goal += 1;
            }
            let row = &results[number];
            let out = &mut index.results;
            out.memory
                .push(if memory == usize::MAX { -1 } else { memory as i64 });
            out.question.push(question);
            out.answer.push(match &row.answer {
                None => -1,
                Some(answer) => *answers.entry(answer.as_str()).or_insert_with(|| {
                    index.answers.push(answer.clone());
                    index.answers.len() as i64 - 1
                }),
            });
            out.verdict.push(match row.correct {
                Some(true) => 1,
                Some(false) => 0,
                None => -1,
            });
            if let Some(score) = row.score {
                out.score.insert(position, score);
            }
            if memory == usize::MAX || row.failure.is_some() {
                let cell = self
                    .cells
                    .get(&row.cell().to_string())
                    .copied()
                    .unwrap_or(usize::MAX);
                let failure = row
                    .failure
                    .clone()
                    .unwrap_or_else(|| "no memory was made".to_owned());
                out.unscored.insert(position, (cell, row.seed, failure));
            }
        }
        while next_goal <= index.goals.id.len() {
            index.goals.result_start.push(order.len());
            next_goal += 1;
        }
        Ok(())
    }
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
        let start = svg.find("<svg").unwrap_or(0);
        // Inline SVG needs no namespace, and without it the page names no URL at all.
        let svg = svg[start..].replacen(" xmlns=\"http://www.w3.org/2000/svg\"", "", 1);
        out.push_str(&format!(
            "<figure><figcaption>{}</figcaption>{}</figure>\n",
            escape_html(title),
            svg.replace("<script", "&lt;script")
        ));
    }
    out
}

fn escape_html(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}
