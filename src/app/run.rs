//! `gacc run` (SPEC §6): prepare, run the plan (resuming from the cache), write the run folder
//! (SPEC §5) and its views.

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use serde_json::{Value, json};

use crate::app::confinement::{denial_hints, enforce_holdout};
use crate::app::prepare::{
    Prepared, cache_for, cache_root, callbacks, engine, models, open_cache_early, prepare,
};
use crate::app::terminal::{print_progress, show_progress, summary};
use crate::clock::utc_timestamp;
use crate::error::Invalid;
use crate::error::{Error, io, runtime_error};
use crate::exec::sandbox::{self, Protected, Sandboxing};
use crate::files::{json_lines, pretty, write_json_lines_hashed};
use crate::hash::sha256;
use crate::protocol::Role;
use crate::report;
use crate::report::html::{Packing, Rows};
use crate::report::view::{Charts, Html, Markdown, RunView, write_views};
use crate::runner::{self, Progress};
use crate::store::cache::Cache;
use crate::store::ledger::MemoryText;
use crate::store::row_sink::{RowSink, Written};
use crate::store::run_folder::{
    DATASET, MANIFEST, MEMORY_TEXTS, PLAN, REPORT_JSON, RESULTS, RUN, RunFolder, TRACE,
};
use crate::store::run_record::{EndpointRecord, RunRecord, RunStatus};
use crate::trace::TraceEvent;

/// How a run is asked for on the command line.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    pub manifest: PathBuf,
    pub sets: Vec<String>,
    /// Where run folders go instead of `runs/`.
    pub out: Option<PathBuf>,
    /// A folder whose `report.md.j2` replaces the default template.
    pub templates: Option<PathBuf>,
    pub quiet: bool,
    /// Stop starting calls after the first failure.
    pub fail_fast: bool,
    /// Refuse to run a compressor or reader outside its sandbox.
    pub require_sandbox: bool,
    /// Print the final summary as JSON on stdout.
    pub json: bool,
}

/// What a finished run left behind.
#[derive(Debug)]
pub(crate) struct Finished {
    pub(crate) folder: PathBuf,
    pub(crate) failures: usize,
    /// Jobs not run because `--fail-fast` stopped the run.
    pub(crate) cancelled: usize,
    pub(crate) summary: String,
    /// The same summary as one JSON object (`gacc run --json`).
    pub(crate) summary_json: Value,
    /// Why the run stopped before its plan was done.
    pub(crate) stop: Option<runner::Stop>,
    /// Whether every view (charts, report.html, report.md) was written.
    pub(crate) views: Result<(), Error>,
}

/// What each model endpoint did in this run: HTTP requests, retries, 429s, its last limit.
fn endpoint_record(models: &super::prepare::Models) -> BTreeMap<String, EndpointRecord> {
    models
        .endpoints
        .iter()
        .map(|(name, endpoint)| {
            let live = endpoint.live();
            let per_minute = |rate: Option<f64>| rate.map(|r| (r * 60.0 * 10.0).round() / 10.0);
            let sustained = endpoint.pacer.sustained().unwrap_or_default();
            let record = EndpointRecord {
                requests: endpoint.requests.load(std::sync::atomic::Ordering::Relaxed),
                retries: endpoint.retries.load(std::sync::atomic::Ordering::Relaxed),
                rate_limited: live.rate_limited,
                final_limit: live.limit,
                peak_in_flight: live.peak,
                // The pace the endpoint ended on (learned, announced or set), and what it
                // sustained: `gacc plan` estimates the next run's time from it.
                pace_rpm: per_minute(live.pace.requests),
                pace_tpm: per_minute(live.pace.tokens),
                sustained_rpm: per_minute(sustained.requests),
                sustained_tpm: per_minute(sustained.tokens),
                batches: endpoint.batches().map(|b| b.done),
            };
            (name.clone(), record)
        })
        .collect()
}

/// Where a cache keeps the records of its provider batches.
pub(crate) const BATCHES: &str = "batches";

/// `gacc run`: plan, run (resuming from the cache), write the run folder, report.
// Its phases read in the order a run goes through them, each ended by `phases.end`; each
// phase's work is a function of its own, and what is left is the hand-over between them, kept
// in one place so a run's order reads top to bottom (hence its length).
pub(crate) fn run(options: &RunOptions) -> Result<Finished, Error> {
    let started_at = SystemTime::now();
    let started = Instant::now();
    let mut phases = Phases::default();
    let opening = open_cache_early(&options.manifest, &options.sets);
    let prepared = prepare(&options.manifest, &options.sets)?;
    for warning in crate::inputs::manifest::warnings(&prepared.loaded) {
        eprintln!("warning: {warning}");
    }
    if !options.quiet {
        for change in super::prepare::changed_scripts(&prepared.loaded) {
            eprintln!("note: {change}");
        }
    }
    phases.end("prepare (manifest, dataset, tokenizer check, plan)");
    let opened = open(&prepared, opening, options)?;
    let (models, recount) = (opened.models, opened.recount);
    let markdown = markdown_view(options)?;

    let (folder, dataset_digest, plan_writer) = start_folder(&opened.runs, started_at, &prepared, options)?;
    let progress = Arc::new(Progress {
        endpoints: models.endpoints.values().cloned().collect(),
        ..Progress::default()
    });
    let setup = runner::Setup {
        plan: prepared.plan.clone(),
        dataset: prepared.dataset.clone(),
        callbacks: opened.callbacks,
        cache: opened.cache,
        tokenizer: prepared.tokenizer.clone(),
        truncation: prepared.loaded.manifest.truncation,
        concurrency: prepared.loaded.manifest.run.concurrency,
        progress: progress.clone(),
        fail_fast: options.fail_fast,
        memories: recount.feed(),
        jobs_in_flight: jobs_in_flight(&prepared, &models),
        rows: Some(RowSink::create(&folder)?),
    };
    phases.end("write manifest, dataset and plan");
    let in_flight = RunRecord {
        started: utc_timestamp(started_at, true),
        manifest: options.manifest.display().to_string(),
        cache: cache_shown(&prepared),
        ..RunRecord::here()
    };
    let mut outcome = execute(setup, &progress, options, (&folder, in_flight))?;
    // The ledger and the results were written as they folded.
    let rows = outcome.written.take().unwrap_or_else(|| {
        Err(Error::Stopped {
            what: format!("the writer of {}", folder.file(RESULTS).display()),
        })
    })?;
    opened.engine.finish();
    phases.end("execute jobs");

    let (mut report, texts, digests) = write_rows(&prepared, &folder, &outcome, recount, plan_writer, rows)?;
    let unmatched = unmatched_labels(&prepared, &outcome);
    let hints = denial_hints(
        &report.failures,
        &opened.confinements,
        &opened.sandboxing,
        &prepared,
    );
    report.holdout = opened.holdout;
    phases.end("write ledger and results, build report (with the recount)");
    let report_json = serde_json::to_value(&report).unwrap_or(Value::Null);
    let report_text = pretty(&report);
    folder.write(REPORT_JSON, report_text.as_bytes())?;
    let page_key = page_key(&report_text, &digests, &outcome.ledger, &dataset_digest);
    let views = write_pictures(&folder, &report_json, &prepared, &outcome, &texts, &page_key);
    let (this_run, paid, failures, cancelled, stop) = (
        outcome.this_run.clone(),
        outcome.paid.clone(),
        outcome.failures.len(),
        outcome.cancelled,
        outcome.stop.clone(),
    );
    // The run's rows are no longer needed: they are freed on a thread of their own, not
    // waited for (a process that ends frees them faster).
    std::thread::spawn(move || drop((outcome, texts)));
    phases.end("draw charts and write report.html");
    let record = RunRecord {
        started: utc_timestamp(started_at, true),
        seconds: started.elapsed().as_secs_f64(),
        manifest: options.manifest.display().to_string(),
        cache: cache_shown(&prepared),
        progress: None,
        calls: serde_json::to_value(&this_run).unwrap_or_default(),
        paid: serde_json::to_value(&paid).unwrap_or_default(),
        failures,
        stopped: stop.as_ref().map(ToString::to_string),
        endpoints: endpoint_record(&models),
        phases: phases.seconds,
        landlock_abi: opened.abi,
        scripts: super::prepare::scripts(&prepared.loaded),
        ..RunRecord::here()
    };
    folder.write(RUN, pretty(&record).as_bytes())?;
    let run_record = serde_json::to_value(&record).unwrap_or_default();
    let document = RunView {
        report: &report_json,
        run: &run_record,
        rows: None,
        page_key: None,
    };
    let views = views.and(write_views(&folder, &document, &[&markdown]));
    folder.forget_unshared();
    folder.point_latest();
    crate::trace::record(&TraceEvent::RunFinished {
        folder: folder.path().to_string_lossy(),
        failures: failures as u64,
    });
    crate::trace::close();
    let mut summary_json = summary_of_report(&report);
    summary_json["folder"] = json!(folder.path());
    summary_json["failures"] = json!(failures);
    summary_json["cancelled"] = json!(cancelled);
    summary_json["seconds"] = json!(started.elapsed().as_secs_f64());
    summary_json["calls"] = json!(this_run);
    // Labels that match no answer are the labels' error; the run's work is all written.
    if !unmatched.is_empty() {
        eprintln!(
            "{}",
            summary(&report, &this_run, &paid, &hints, started.elapsed())
        );
        return Err(Invalid(unmatched).into());
    }
    Ok(Finished {
        summary: summary(&report, &this_run, &paid, &hints, started.elapsed()),
        summary_json,
        failures,
        cancelled,
        stop,
        folder: folder.path().to_path_buf(),
        views,
    })
}

/// The labels (`[audit] labels`) that match no answer of the run.
fn unmatched_labels(prepared: &Prepared, outcome: &runner::Outcome) -> Vec<crate::error::Problem> {
    let answers =
        (outcome.results.iter()).filter_map(|row| Some((row.question_id.as_str(), row.answer.as_deref()?)));
    (prepared.labels.as_ref()).map_or_else(Vec::new, |labels| labels.unmatched(answers))
}

/// The plan's file, written while the jobs run.
type PlanWriter = std::thread::JoinHandle<Result<String, Error>>;

/// Makes the run's folder and opens its trace, and writes what the run starts from: the
/// resolved manifest, the dataset (its digest returned) and, on a thread of its own while the
/// jobs run (it is large at scale), the plan.
fn start_folder(
    runs: &Path,
    started_at: SystemTime,
    prepared: &Prepared,
    options: &RunOptions,
) -> Result<(RunFolder, String, PlanWriter), Error> {
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
fn page_key(
    report_text: &str,
    digests: &[String; 2],
    ledger: &[crate::store::ledger::LedgerRow],
    dataset: &str,
) -> String {
    sha256(format!(
        "gacc {}\nreport {}\nresults {}\nmemories {}\ntexts {}\ndataset {dataset}\n",
        env!("CARGO_PKG_VERSION"),
        sha256(report_text),
        digests[0],
        crate::store::ledger::page_digest(ledger),
        digests[1],
    ))
}

/// The cache the early reader opened when it is the run's, else the run's opened now.
fn take_cache(opening: super::prepare::EarlyCache, root: &Path, prepared: &Prepared) -> Result<Cache, Error> {
    match opening {
        Some((early, reading)) if early == root => reading
            .join()
            .unwrap_or_else(|_| Err(std::io::Error::other("the cache reader stopped unexpectedly")))
            .map_err(super::prepare::cache_error(&prepared.loaded, root)),
        _ => cache_for(&prepared.loaded),
    }
}

/// What a run opens before it writes anything: where its folder goes, the sandbox, the
/// executor, the model endpoints, the callbacks and how each is confined, the cache and the
/// recount reading it.
struct Opened {
    runs: PathBuf,
    abi: i32,
    sandboxing: Sandboxing,
    engine: Arc<dyn crate::exec::engine::Engine>,
    models: super::prepare::Models,
    callbacks: runner::Callbacks,
    confinements: super::prepare::Confinements,
    holdout: BTreeMap<Role, sandbox::HoldoutEnforcement>,
    cache: Cache,
    recount: report::Recount,
}

fn open(
    prepared: &Prepared,
    opening: super::prepare::EarlyCache,
    options: &RunOptions,
) -> Result<Opened, Error> {
    let runs = options
        .out
        .clone()
        .unwrap_or_else(|| prepared.loaded.project.join("runs"))
        .join(&prepared.loaded.manifest.name);
    // The project's marker, where a run from another folder finds its cache and runs (even
    // when `[run] cache` puts the cache elsewhere).
    let marker = prepared
        .loaded
        .project
        .join(crate::inputs::manifest::PROJECT_MARKER);
    std::fs::create_dir_all(&marker).map_err(io(&marker))?;
    sandbox::protect_self();
    let abi = sandbox::kernel_abi();
    let protected = Protected::of(&prepared.loaded, &cache_root(&prepared.loaded), Some(&runs));
    let sandboxing = Sandboxing::new(abi, protected).map_err(io(&std::env::temp_dir()))?;
    let engine = engine(&prepared.loaded)?;
    let models = models(&prepared.loaded, false)?;
    let (callbacks, confinements) = callbacks(&prepared.loaded, &sandboxing, &engine, &models)?;
    let holdout = enforce_holdout(&confinements, options.require_sandbox)?;
    let root = cache_root(&prepared.loaded);
    let cache = take_cache(opening, &root, prepared)?;
    let recount = report::Recount::start(prepared.tokenizer.clone(), &prepared.dataset, cache.clone());
    // Batch endpoints record their batches beside the cache, and take up those left open.
    for endpoint in models.endpoints.values() {
        endpoint.use_batches(root.join(BATCHES), cache.clone());
    }
    Ok(Opened {
        runs,
        abi,
        sandboxing,
        engine,
        models,
        callbacks,
        confinements,
        holdout,
        cache,
        recount,
    })
}

/// A batch endpoint gathers every call that is ready: then every memory job is in flight at
/// once (each waits, holding little, for its batch). Else the scheduler's own window, widened
/// to the most calls in flight a model endpoint allows, so that a model compressor (one call
/// per memory job) can fill a server that batches hundreds of sequences.
fn jobs_in_flight(prepared: &Prepared, models: &super::prepare::Models) -> Option<usize> {
    let endpoints = models.endpoints.values();
    if endpoints.clone().any(|e| e.spec.batch.spec().is_some()) {
        return Some(prepared.plan.memories.len().max(1));
    }
    let widest = endpoints.map(|e| e.spec.max_concurrency).max()?;
    let window = crate::runner::default_window(prepared.loaded.manifest.run.concurrency);
    Some(window.max(widest))
}

/// The `--json` summary's view of the report: each cell's figures, integrity, and whether
/// the tokenizer was verified.
fn summary_of_report(report: &report::Report) -> Value {
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
fn write_pictures(
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

/// The cache's place as the manifest wrote it, for `run.json`.
fn cache_shown(prepared: &Prepared) -> String {
    match &prepared.loaded.manifest.run.cache {
        Some(path) => path.display().to_string(),
        None => ".gacc/cache".into(),
    }
}

/// `report.md`'s view: the template of `--templates`, else `templates/report.md.j2` in the
/// current folder if there is one, else the built-in one.
fn markdown_view(options: &RunOptions) -> Result<Markdown, Error> {
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

/// Runs the plan with the progress line on the terminal; Ctrl-C ends every call in flight
/// (finished ones are cached) and is `Error::Interrupted`.
fn execute(
    setup: runner::Setup,
    progress: &Arc<Progress>,
    options: &RunOptions,
    (folder, in_flight): (&RunFolder, RunRecord),
) -> Result<runner::Outcome, Error> {
    let runtime = crate::parallel::runtime(None).map_err(runtime_error)?;
    let live = LiveRecord {
        folder: folder.clone(),
        record: in_flight,
        progress: progress.clone(),
    };
    let outcome = runtime.block_on(async {
        let display = show_progress(progress.clone(), options.quiet);
        let following = tokio::spawn(live.clone().follow());
        let outcome = tokio::select! {
            outcome = runner::execute(setup) => Some(outcome),
            _ = tokio::signal::ctrl_c() => None,
        };
        display.abort();
        following.abort();
        outcome
    });
    // Calls still running in the background (none once the plan is done) are not waited for.
    runtime.shutdown_background();
    let Some(outcome) = outcome else {
        crate::exec::shutdown();
        let open = crate::exec::model::batch::open_batches();
        if open > 0 {
            let manifest = crate::inputs::manifest::shown(&options.manifest);
            eprintln!(
                "{open} provider batch(es) still run: they are submitted and paid for, so gacc leaves them; \
                 `gacc run {manifest}` again collects their results, `gacc batches cancel {manifest}` cancels them"
            );
        }
        runner::trace_stages(progress);
        live.write(RunStatus::Interrupted);
        crate::trace::record(&TraceEvent::RunInterrupted {
            folder: folder.path().to_string_lossy(),
        });
        crate::trace::close();
        return Err(Error::Interrupted {
            resume: resume_command(options),
        });
    };
    if !options.quiet {
        print_progress(progress, std::io::stderr().is_terminal(), true);
    }
    Ok(outcome)
}

/// Writes the memory texts (on a thread of its own) while the report is built, and waits for
/// the plan file (the ledger and the results were written as they folded, `rows`); the report,
/// the memory texts, and the SHA-256 of the results and of the memory texts.
fn write_rows(
    prepared: &Prepared,
    folder: &RunFolder,
    outcome: &runner::Outcome,
    recount: report::Recount,
    plan_writer: PlanWriter,
    rows: Written,
) -> Result<(report::Report, Vec<MemoryText>, [String; 2]), Error> {
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
            .filter(|(key, ..)| !key.starts_with("judges."))
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
        labels: prepared.labels.as_deref(),
    };
    let stopped = |name: &str| Error::Stopped {
        what: format!("the writer of {}", folder.file(name).display()),
    };
    let texts = crate::store::ledger::memory_texts(&outcome.ledger);
    let (written, report) = std::thread::scope(|scope| {
        let texts = scope.spawn(|| folder.write_shared_gzip(MEMORY_TEXTS, |out| json_lines(out, &texts)));
        let report = report::build(&inputs, outcome, recount);
        let written = (
            plan_writer.join().unwrap_or_else(|_| Err(stopped(PLAN))),
            texts.join().unwrap_or_else(|_| Err(stopped(MEMORY_TEXTS))),
        );
        (written, report)
    });
    let (plan, texts_digest) = written;
    plan?;
    Ok((report, texts, [rows.results_sha256, texts_digest?]))
}

/// `run.json` while a run is in flight: its record so far, with its progress.
#[derive(Clone)]
struct LiveRecord {
    folder: RunFolder,
    record: RunRecord,
    progress: Arc<Progress>,
}

impl LiveRecord {
    /// Writes `run.json` now and then every `LIVE_EVERY` until aborted.
    async fn follow(self) {
        loop {
            self.write(RunStatus::Running);
            tokio::time::sleep(LIVE_EVERY).await;
        }
    }

    /// Writes `run.json` with the progress so far (whole: a reader never sees half of one).
    fn write(&self, status: RunStatus) {
        let record = RunRecord {
            progress: Some(self.progress.live(status)),
            seconds: self.progress.started.elapsed().as_secs_f64(),
            ..self.record.clone()
        };
        if let Err(error) = self.folder.write(RUN, pretty(&record).as_bytes()) {
            tracing::warn!(%error, "could not write the run's progress");
        }
    }
}

/// How often `run.json` shows a run in flight anew.
const LIVE_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// Where a run's time went, phase by phase, for `run.json`.
struct Phases {
    last: Instant,
    seconds: Vec<(String, f64)>,
}

impl Default for Phases {
    fn default() -> Self {
        Phases {
            last: Instant::now(),
            seconds: Vec::new(),
        }
    }
}

impl Phases {
    fn end(&mut self, name: &str) {
        let now = Instant::now();
        self.seconds
            .push((name.to_owned(), (now - self.last).as_secs_f64()));
        crate::trace::record(&TraceEvent::PhaseFinished {
            phase: std::borrow::Cow::Borrowed(name),
            seconds: (now - self.last).as_secs_f64(),
        });
        self.last = now;
    }
}

/// The command line that runs the same experiment again.
fn resume_command(options: &RunOptions) -> String {
    let mut words = vec![
        "gacc".to_owned(),
        "run".to_owned(),
        options.manifest.display().to_string(),
    ];
    for set in &options.sets {
        words.push("--set".into());
        words.push(format!("'{set}'"));
    }
    if let Some(out) = &options.out {
        words.push(format!("--out {}", out.display()));
    }
    words.join(" ")
}

fn resolved_manifest(prepared: &Prepared) -> String {
    format!(
        "# The manifest as run: {} with every override applied.\n# Relative paths are relative to that file's folder.\n{}",
        prepared.loaded.path.display(),
        prepared.resolved
    )
}
