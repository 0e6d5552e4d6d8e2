//! What a run writes to its folder besides its rows: what it starts from (the resolved manifest,
//! the dataset, the plan), the report built while the memory texts are written, and its views.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use serde_json::{Value, json};

use crate::app::prepare::Prepared;
use crate::error::{Error, Invalid};
use crate::files::{json_lines, write_json_lines_hashed};
use crate::hash::sha256;
use crate::report;
use crate::report::html::{Packing, Rows};
use crate::report::view::{Charts, Html, Markdown, RunView, write_views};
use crate::runner;
use crate::store::ledger::MemoryText;
use crate::store::row_sink::Written;
use crate::store::run_folder::{DATASET, MANIFEST, MEMORY_TEXTS, PLAN, RunFolder, TRACE};
use crate::trace::TraceEvent;

use super::RunOptions;

/// The plan's file, written while the jobs run.
pub(super) type PlanWriter = std::thread::JoinHandle<Result<String, Error>>;

/// Makes the run's folder and opens its trace, and writes what the run starts from: the
/// resolved manifest, the dataset (its digest returned) and, on a thread of its own while the
/// jobs run (it is large at scale), the plan.
pub(super) fn start_folder(
    runs: &Path,
    started_at: SystemTime,
    prepared: &Prepared,
    options: &RunOptions,
) -> Result<(RunFolder, String, PlanWriter), Error> {
    // An earlier run killed on this machine still says it is running: say it stopped.
    for stopped in crate::store::run_record::settle_orphans(runs) {
        crate::trace::notice(&format!(
            "{} stopped without finishing (its process is gone): its record now says so",
            stopped.display()
        ));
    }
    let folder = RunFolder::create(runs, started_at, &prepared.resolved_sha256)?;
    let _ = crate::trace::open(&folder.file(TRACE));
    crate::trace::record(&TraceEvent::RunStarted {
        manifest: options.manifest.to_string_lossy(),
        folder: folder.path().to_string_lossy(),
    });
    folder.write(MANIFEST, resolved_manifest(prepared).as_bytes())?;
    let dataset_digest = write_json_lines_hashed(&folder.file(DATASET), &prepared.dataset.sources)?;
    let plan_writer = {
        let (plan, dataset) = (prepared.plan.clone(), prepared.dataset.clone());
        let folder = folder.clone();
        std::thread::spawn(move || folder.write_shared_gzip(PLAN, |out| plan.write_json(&dataset, out)))
    };
    Ok((folder, dataset_digest, plan_writer))
}

/// The page's key: it is made from the report and the rows, so the same files make the same
/// page.
pub(super) fn page_key(report_text: &str, digests: &[String; 3], dataset: &str) -> String {
    let [results, texts, ledger] = digests;
    sha256(format!(
        "gacc {}\nreport {}\nresults {results}\nmemories {ledger}\ntexts {texts}\ndataset {dataset}\n",
        env!("CARGO_PKG_VERSION"),
        sha256(report_text),
    ))
}

/// The `--json` summary's view of the report: each cell's figures, integrity, and whether
/// the tokenizer was verified.
pub(super) fn summary_of_report(report: &report::Report) -> Value {
    let cells: Vec<Value> = report
        .cells
        .iter()
        .map(|cell| {
            // Its id as report.json names it: `ratio`, or `budget_tokens` for a token budget.
            let mut summary = serde_json::to_value(&cell.id).unwrap_or_else(|_| json!({}));
            summary["complete"] = json!(cell.complete);
            summary["micro"] = json!(cell.micro);
            summary["macro"] = json!(cell.macro_);
            summary
        })
        .collect();
    json!({
        "cells": cells,
        "integrity": report.integrity,
        "identity_verified": report.tokenizer.identity_verified,
    })
}

/// The charts and report.html, the page made from the rows still in memory: the page
/// `gacc report` makes from the rows just written.
pub(super) fn write_pictures(
    folder: &RunFolder,
    report: &Value,
    prepared: &Prepared,
    outcome: &runner::Outcome,
    texts: &[MemoryText],
    page_key: &str,
) -> Result<(), Error> {
    let rows = Rows {
        sources: &prepared.dataset.sources,
        ledger: &outcome.ledger,
        texts,
        results: &outcome.results,
    };
    let pictures = RunView {
        report,
        run: &Value::Null,
        rows: Some(rows),
        page_key: Some(page_key),
    };
    write_views(folder, &pictures, &[&Charts, &Html(Packing::Auto)])
}

/// `report.md`'s view: the template of `--templates`, else `templates/report.md.j2` in the
/// current folder if there is one, else the built-in one.
pub(super) fn markdown_view(options: &RunOptions) -> Result<Markdown, Error> {
    let template_path = options
        .templates
        .clone()
        .or_else(|| Some(PathBuf::from("templates")).filter(|p| p.join("report.md.j2").is_file()))
        .map(|folder| folder.join("report.md.j2"));
    let (template, template_name) = report::load_template(template_path.as_deref())
        .map_err(|message| Invalid::one("--templates", message))?;
    Ok(Markdown {
        template,
        template_name,
    })
}

/// Writes the memory texts and digests the ledger for the page (each on a thread of its own)
/// while the report is built, and waits for the plan file (the ledger and the results were
/// written as they folded, `rows`); the report, the memory texts, and the digests `page_key`
/// takes: the results', the memory texts', the ledger's.
pub(super) fn write_rows(
    prepared: &Prepared,
    folder: &RunFolder,
    outcome: &runner::Outcome,
    recount: report::Recount,
    plan_writer: PlanWriter,
    (rows, memo): (Written, report::pairs::Memo),
) -> Result<(report::Report, Vec<MemoryText>, [String; 3]), Error> {
    let manifest = &prepared.loaded.manifest;
    let inputs = report::Inputs {
        name: &manifest.name,
        description: manifest.description.as_deref(),
        manifest_sha256: &prepared.experiment_sha256,
        seeds: &manifest.seeds,
        ratios: &manifest.ratios,
        budgets: &manifest.budgets,
        conditions: &manifest.conditions,
        callbacks: prepared.plan.callback_identities(),
        dataset: &prepared.dataset,
        tokenizer: prepared.tokenizer.as_ref(),
        // The endpoints' accounts are of the calls the scores rest on: audit judges' are not.
        model_callbacks: manifest
            .callbacks()
            .into_iter()
            .filter(|(key, ..)| !key.starts_with("judges.") && !key.starts_with("readers."))
            .filter_map(|(key, role, spec)| {
                let call = spec.model.as_ref()?;
                Some((
                    role,
                    key,
                    call.endpoint.clone(),
                    call.spec.api.as_str().to_owned(),
                    call.spec.model.clone(),
                ))
            })
            .collect(),
        audits: prepared.plan.audit_shares.clone(),
        anchors: prepared.plan.anchors,
        targets: manifest.targets(),
        panel: prepared.plan.panel_shares.clone(),
        labels: prepared.labels.as_deref(),
        reader_price: (manifest.callbacks().into_iter())
            .find(|(key, ..)| key == "reader")
            .and_then(|(_, _, spec)| spec.model.as_ref()?.spec.billed_price())
            .map(|price| price.input / 1e6),
        memo,
    };
    let stopped = |name: &str| Error::Stopped {
        what: format!("the writer of {}", folder.file(name).display()),
    };
    let texts = crate::store::ledger::memory_texts(&outcome.ledger);
    let (written, report) = std::thread::scope(|scope| {
        let texts = scope.spawn(|| folder.write_shared_gzip(MEMORY_TEXTS, |out| json_lines(out, &texts)));
        let ledger = scope.spawn(|| crate::store::ledger::page_digest(&outcome.ledger));
        let report = report::build(&inputs, outcome, recount);
        let written = (
            plan_writer.join().unwrap_or_else(|_| Err(stopped(PLAN))),
            texts.join().unwrap_or_else(|_| Err(stopped(MEMORY_TEXTS))),
            ledger.join().unwrap_or_default(),
        );
        (written, report)
    });
    let (plan, texts_digest, ledger_digest) = written;
    plan?;
    Ok((report, texts, [rows.results_sha256, texts_digest?, ledger_digest]))
}

pub(super) fn resolved_manifest(prepared: &Prepared) -> String {
    format!(
        "# The manifest as run: {} with every override applied.\n# Relative paths are relative to that file's folder.\n{}",
        prepared.loaded.path.display(),
        prepared.resolved
    )
}
