//! `gacc run` (SPEC §6): prepare, run the plan (resuming from the cache), write the run folder
//! (SPEC §5) and its views.

mod folder;
mod record;
mod stopping;

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use serde_json::{Value, json};

use crate::app::confinement::{denial_hints, enforce_holdout};
use crate::app::prepare::{
    Calling, Prepared, cache_for, cache_root, callbacks, engine, models, open_cache_early, prepare_with,
};
use crate::app::terminal::{print_progress, show_progress, summary};
use crate::clock::utc_timestamp;
use crate::error::{Error, Invalid, io, runtime_error};
use crate::exec::sandbox::{self, Protected, Sandboxing};
use crate::files::pretty;
use crate::protocol::Role;
use crate::report;
use crate::report::view::{RunView, write_views};
use crate::runner::{self, Progress};
use crate::store::cache::Cache;
use crate::store::row_sink::RowSink;
use crate::store::run_folder::{REPORT_JSON, RESULTS, RUN, RunFolder};
use crate::store::run_record::{RunRecord, RunStatus};
use crate::trace::TraceEvent;

use folder::{markdown_view, page_key, start_folder, summary_of_report, write_pictures, write_rows};
use record::{LiveRecord, Phases, cache_shown, endpoint_record, resume_command};

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
    /// A cache read beneath the run's own: a pack's (`--from`), or a replayed run's.
    pub layer: Option<Layer>,
    /// The run's label (`--label`), kept in run.json.
    pub label: Option<String>,
    /// The replayed run's record of its callbacks' files (`gacc verify`).
    pub recorded: Option<Arc<crate::inputs::manifest::Recorded>>,
    /// The replayed run's failures, as its report lists them (`gacc verify`): its jobs whose
    /// calls failed then fail so.
    pub replayed_failures: Vec<serde_json::Value>,
}

/// A cache whose entries a run reads beneath its own (new entries go to its own), and which
/// calls the run may still make.
#[derive(Debug, Clone)]
pub enum Layer {
    /// A pack's entries (`gacc run --from`), unpacked once under the cache: any call may be made.
    Pack(PathBuf),
    /// A replayed run's cache (`gacc verify`): no call is made but by the callbacks named, so
    /// what the cache does not hold fails.
    Replay { cache: PathBuf, allowed: Vec<String> },
}

/// What a finished run left behind.
#[derive(Debug)]
pub(crate) struct Finished {
    pub(crate) folder: PathBuf,
    pub(crate) failures: usize,
    /// Of those, failures that running again repeats (a greedy judge's reply without a
    /// verdict).
    pub(crate) repeating: usize,
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

/// Where a cache keeps the records of its provider batches.
pub(crate) const BATCHES: &str = "batches";

/// `gacc run`: plan, run (resuming from the cache), write the run folder, report. Its phases
/// read in the order a run goes through them, each ended by `phases.end` (as run.json's
/// `phases` name them); each phase's work is a function of its own.
pub(crate) fn run(options: &RunOptions) -> Result<Finished, Error> {
    let started_at = SystemTime::now();
    let started = Instant::now();
    let mut phases = Phases::default();
    let opening = open_cache_early(&options.manifest, &options.sets);
    // A replay that may not call (`gacc verify`) needs no endpoint's key.
    let calling = match (&options.recorded, &options.layer) {
        (Some(recorded), Some(Layer::Replay { allowed, .. })) => Calling::Replay { recorded, allowed },
        (_, None) => Calling::Everything,
        // Keys are checked where a call needs one (`Keys`).
        _ => Calling::WithoutKeys,
    };
    let prepared = prepare_with(&options.manifest, &options.sets, calling)?;
    for warning in crate::inputs::manifest::warnings(&prepared.loaded) {
        eprintln!("warning: {warning}");
    }
    for (reruns, change) in super::prepare::changed_scripts(&prepared.loaded) {
        match reruns {
            true if !options.quiet => eprintln!("note: {change}"),
            true => {}
            // A pinned callback whose files changed serves answers its code may no longer give.
            false => eprintln!("warning: {change}"),
        }
    }
    phases.end("prepare (manifest, dataset, tokenizer check, plan)");
    let opened = open(&prepared, opening, options)?;
    let (models, recount) = (opened.models, opened.recount);
    let markdown = markdown_view(options)?;

    let (folder, dataset_digest, plan_writer) = start_folder(&opened.runs, started_at, &prepared, options)?;
    // A full or read-only place fails now, before anything is paid for, not at the first
    // answer that cannot be kept.
    crate::files::probe_writable(&opened.cache.root().join("segments"))?;
    crate::files::probe_writable(folder.path())?;
    let progress = Arc::new(Progress {
        endpoints: models.endpoints.values().cloned().collect(),
        costs: Some(models.costs.clone()),
        ..Progress::default()
    });
    let read = Arc::new(stopping::Read::default());
    let stop = prepared.loaded.manifest.run.stop.as_ref();
    let batches = stop.map(|spec| stopping::batches(&prepared, spec, options.quiet, &read));
    let setup = runner::Setup {
        keep_rows: true,
        batches,
        plan: prepared.plan.clone(),
        dataset: prepared.dataset.clone(),
        callbacks: opened.callbacks,
        cache: opened.cache,
        tokenizer: prepared.tokenizer.clone(),
        truncation: prepared.loaded.manifest.truncation,
        concurrency: prepared.loaded.manifest.run.concurrency,
        progress: progress.clone(),
        fail_fast: options.fail_fast,
        offline: match &options.layer {
            Some(Layer::Replay { allowed, .. }) => Some(allowed.clone()),
            _ => None,
        },
        replayed_failures: (options.replayed_failures.iter())
            .filter_map(|row| serde_json::from_value::<crate::store::ledger::FailureRow>(row.clone()).ok())
            .map(|row| (row.job.clone(), row))
            .collect(),
        memories: recount.feed(),
        jobs_in_flight: jobs_in_flight(&prepared, &models),
        rows: Some(RowSink::create(&folder)?),
    };
    phases.end("write manifest, dataset and plan");
    let in_flight = RunRecord {
        label: options.label.clone(),
        started: utc_timestamp(started_at, true),
        manifest: options.manifest.display().to_string(),
        cache: cache_shown(&prepared),
        ..RunRecord::here()
    };
    let damaged_before = setup.cache.damaged();
    let cache = setup.cache.clone();
    let mut outcome = execute(setup, &progress, options, (&folder, in_flight))?;
    // A lost write is said at once, whatever else the full disk then refuses.
    if let Some(stop @ runner::Stop::LostWrite { lost, .. }) = &outcome.stop {
        let made: usize = outcome.this_run.values().map(|c| c.made).sum();
        eprintln!(
            "{stop}.\nThis run made {made} call(s): {} kept in the cache, {lost} not.",
            made.saturating_sub(*lost)
        );
    }
    let damaged = cache.damaged().max(damaged_before);
    // The ledger and the results were written as they folded.
    let rows = outcome.written.take().unwrap_or_else(|| {
        Err(Error::Stopped {
            what: format!("the writer of {}", folder.file(RESULTS).display()),
        })
    })?;
    opened.engine.finish();
    phases.end("execute jobs");

    // A replay (`gacc verify`) makes every pair test again rather than read the run's own.
    let replay = matches!(options.layer, Some(Layer::Replay { .. }));
    let memo = report::pairs::Memo::of((!replay).then_some(&cache));
    let (mut report, texts, digests) =
        write_rows(&prepared, &folder, &outcome, recount, plan_writer, (rows, memo))?;
    let unmatched = unmatched_labels(&prepared, &outcome);
    let hints = denial_hints(
        &report.failures,
        &opened.confinements,
        &opened.sandboxing,
        &prepared,
    );
    report.holdout = opened.holdout;
    if let Some(runner::Stop::Early(why)) = &outcome.stop {
        report.stopped_early = Some(stopping::stopped_early(&prepared, &outcome, &read, why));
    }
    phases.end("write ledger and results, build report (with the recount)");
    let report_json = serde_json::to_value(&report).unwrap_or(Value::Null);
    let report_text = pretty(&report);
    folder.write(REPORT_JSON, report_text.as_bytes())?;
    let page_key = page_key(&report_text, &digests, &dataset_digest);
    let views = write_pictures(&folder, &report_json, &prepared, &outcome, &texts, &page_key);
    let repeating = (outcome.failures.iter())
        .filter(|f| f.reason.contains(crate::exec::model::verdict::SAME_AGAIN))
        .count();
    let compression = record::compression(&report, &outcome);
    let (this_run, audit, paid, failures, cancelled, stop) = (
        outcome.this_run.clone(),
        outcome.audit_calls.clone(),
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
        calls: run_calls(&this_run, &audit),
        paid: paid.clone(),
        compression,
        failures,
        stopped: stop.as_ref().map(ToString::to_string),
        endpoints: endpoint_record(&models),
        phases: phases.seconds,
        landlock_abi: opened.abi,
        scripts: super::prepare::scripts(&prepared.loaded),
        templates: super::prepare::templates(&prepared.loaded),
        label: options.label.clone(),
        cache_damaged: damaged,
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
    summary_json["calls"] = serde_json::to_value(run_calls(&this_run, &audit)).unwrap_or_default();
    summary_json["cache_damaged"] = json!(damaged);
    // Labels that match no answer are the labels' error; the run's work is all written.
    if !unmatched.is_empty() {
        eprintln!(
            "{}",
            summary(&report, (&this_run, &audit), &paid, &hints, started.elapsed())
        );
        return Err(Invalid(unmatched).into());
    }
    let mut said = summary(&report, (&this_run, &audit), &paid, &hints, started.elapsed());
    if damaged > 0 {
        said.push_str(&format!(
            "\n  cache: {damaged} entr{} failed {} checksum (a damaged disk or a bad copy): not used, and made again where this run needed {}",
            if damaged == 1 { "y" } else { "ies" },
            if damaged == 1 { "its" } else { "their" },
            if damaged == 1 { "it" } else { "them" }
        ));
    }
    Ok(Finished {
        summary: said,
        summary_json,
        failures,
        repeating,
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

/// The cache the early reader opened when it is the run's, else the run's opened now.
/// With a layer, the run's cache over its entries (a pack's unpacked once under the cache).
fn take_cache(
    opening: super::prepare::EarlyCache,
    root: &Path,
    prepared: &Prepared,
    layer: Option<&Layer>,
) -> Result<Cache, Error> {
    let beneath = match layer {
        Some(Layer::Pack(pack)) => Some(crate::store::pack::layer_for(pack, root)?),
        Some(Layer::Replay { cache, .. }) => Some(cache.clone()),
        None => None,
    };
    if let Some(beneath) = beneath {
        return Cache::layered(root, &[beneath]).map_err(super::prepare::cache_error(&prepared.loaded, root));
    }
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
    let keys = match &options.layer {
        Some(Layer::Replay { .. }) => super::prepare::Keys::Planning,
        Some(Layer::Pack(_)) => super::prepare::Keys::IfSet,
        None => super::prepare::Keys::Required,
    };
    let models = models(&prepared.loaded, keys)?;
    let (callbacks, confinements) = callbacks(&prepared.loaded, &sandboxing, &engine, &models)?;
    let holdout = enforce_holdout(&confinements, options.require_sandbox)?;
    let root = cache_root(&prepared.loaded);
    let cache = take_cache(opening, &root, prepared, options.layer.as_ref())?;
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

/// Runs the plan with the progress line on the terminal; Ctrl-C or SIGTERM ends every call in
/// flight (finished ones are cached) and is `Error::Interrupted`.
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
        // A scheduler's preemption (SIGTERM) ends the run as Ctrl-C does: calls in flight and
        // their workers are ended, what finished is kept, and the resume is said.
        let outcome = crate::parallel::until_interrupted(runner::execute(setup)).await;
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

/// This run's calls per role, and the audit's (audit judges and panel readers) under `audit`
/// where it made or found any.
fn run_calls(
    this_run: &BTreeMap<crate::protocol::Role, runner::CallCounts>,
    audit: &runner::CallCounts,
) -> crate::store::usage::RunCalls {
    crate::store::usage::RunCalls {
        roles: this_run.clone(),
        audit: audit.clone(),
    }
}
