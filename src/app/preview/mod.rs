//! The read-only commands over a manifest: `gacc validate`, `gacc plan` and
//! `gacc dataset stats`. None of them calls a callback.

mod bounding;
mod time;

use std::collections::BTreeMap;
use std::path::Path;

use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::app::prepare::{cache_for, prepare};
use crate::error::{Error, Invalid, runtime_error};
use crate::inputs::dataset;
use crate::inputs::manifest;
use crate::protocol::Stage;
use crate::runner::{Progress, Setup};

/// `gacc validate`: a one-paragraph summary of a valid manifest.
pub(super) fn validate(path: &Path, sets: &[String]) -> Result<String, Error> {
    let prepared = prepare(path, sets)?;
    let dataset = &prepared.dataset;
    let memories = &prepared.plan.memories;
    // A budget ladder makes the memories of every budget of a source, goal and seed in one call.
    let ladders: std::collections::HashSet<&str> =
        memories.iter().filter_map(|m| m.ladder.as_deref()).collect();
    let calls = match ladders.len() {
        0 => String::new(),
        n => {
            let single = memories
                .iter()
                .filter(|m| m.ladder.is_none() && m.budget > 0)
                .count();
            format!(" (from {} compressor calls: {n} of them ladders)", n + single)
        }
    };
    Ok(format!(
        "{}: valid: {} sources, {} goals, {} questions; {} memories{calls}, {} questions to read and judge",
        path.display(),
        dataset.sources.len(),
        dataset.goals().count(),
        dataset.question_count(),
        memories.len(),
        prepared.plan.question_jobs(),
    ))
}

/// `gacc dataset stats`: a dataset given directly, or the one a manifest names.
pub(super) fn dataset_stats(path: &Path) -> Result<(String, crate::inputs::dataset_stats::Stats), Error> {
    let is_manifest = path.extension().is_some_and(|e| e == "toml");
    let dataset = if is_manifest {
        let (loaded, _) = manifest::load(path, &[])?;
        dataset::load(&loaded).map_err(Invalid)?
    } else {
        dataset::load_path(path).map_err(Invalid)?
    };
    let stats = crate::inputs::dataset_stats::stats(
        &dataset,
        &crate::inputs::tokenizer::Cl100k::new(),
        crate::builtin::text::is_cjk,
    )
    .map_err(|message| Invalid::one(manifest::shown(path), message))?;
    Ok((manifest::shown(path), stats))
}

/// Jobs per stage and how many the cache already answers.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub(super) struct StageStatus {
    pub jobs: usize,
    pub cached: usize,
    /// Jobs that need no call (`L = 0` memories).
    pub skipped: usize,
    /// With a budget ladder (SPEC §14), the calls its jobs not cached need: one per ladder,
    /// however many budgets it serves (absent without a ladder).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub calls: Option<usize>,
}

/// Per stage, its jobs and how many the cache answers.
pub(super) type Stages = BTreeMap<&'static str, StageStatus>;

/// Upper bounds of the model calls the cache does not answer, for one endpoint.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub(super) struct CallBounds {
    pub calls: usize,
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// None when the endpoint has no `price`.
    pub cost_usd: Option<f64>,
    /// The USD per million input and output tokens the cost is counted at (input at the
    /// prompt-cache write price where the API bills one): `cost_usd` is input × the first plus
    /// output × the second, over a million.
    pub usd_per_million: Option<UsdPerMillion>,
    /// How long the calls need at the endpoint's pace, in seconds, when it is known.
    pub seconds: Option<f64>,
    /// What the time rests on: `rpm/tpm`, `the last run (RUN)`, or why it is unknown.
    pub time_from: String,
}

/// Prices in USD per million tokens.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub(super) struct UsdPerMillion {
    pub input: f64,
    pub output: f64,
}

/// `gacc plan`'s figures: jobs per stage, the uncached calls' bounds per endpoint, and the
/// goals each cell scores. A dry run of the runner (`bounding`): the plan walked through a
/// read-only cache, every call it would make bounded instead of made.
pub(super) fn plan_status(path: &Path, sets: &[String]) -> Result<Preview, Error> {
    let prepared = super::prepare::prepare_without_keys(path, sets)?;
    for (reruns, change) in super::prepare::changed_scripts(&prepared.loaded) {
        eprintln!("{}: {change}", if reruns { "note" } else { "warning" });
    }
    let book = Arc::new(bounding::Book::default());
    let progress = Arc::new(Progress::default());
    let manifest = &prepared.loaded.manifest;
    let setup = Setup {
        plan: prepared.plan.clone(),
        dataset: prepared.dataset.clone(),
        callbacks: bounding::callbacks(&prepared, &book)?,
        cache: cache_for(&prepared.loaded)?.read_only(),
        tokenizer: prepared.tokenizer.clone(),
        truncation: manifest.truncation,
        concurrency: manifest.run.concurrency,
        progress: progress.clone(),
        fail_fast: false,
        memories: None,
        jobs_in_flight: None,
        rows: None,
        offline: None,
        replayed_failures: Default::default(),
        batches: None,
        keep_rows: false,
    };
    let laddered = prepared.plan.memories.iter().any(|job| job.ladder.is_some());
    let runtime = crate::parallel::runtime(None).map_err(runtime_error)?;
    // As `gacc run` does: the loop is a task among its jobs.
    crate::parallel::joined(runtime.block_on(runtime.spawn(crate::runner::execute(setup))));
    let status = Stage::ALL
        .into_iter()
        .map(|stage| {
            let counted = progress.stage(stage.role());
            let count = |n: &std::sync::atomic::AtomicUsize| n.load(Ordering::Relaxed);
            let (cached, shared, skipped) = (
                count(&counted.cached),
                count(&counted.shared),
                count(&counted.skipped),
            );
            let status = StageStatus {
                jobs: count(&counted.total),
                cached,
                skipped,
                // A ladder's other budgets share its call: what is left is one call each.
                calls: (laddered && stage == Stage::Compress)
                    .then(|| count(&counted.done).saturating_sub(cached + shared + skipped)),
            };
            (stage.as_str(), status)
        })
        .collect();
    let mut bounds = book.bounds();
    let runs = prepared.loaded.project.join("runs").join(&manifest.name);
    for (name, bound) in &mut bounds {
        if let Some(spec) = manifest.models.get(name) {
            time::estimate_time(bound, name, spec, &runs);
        }
    }
    Ok(Preview {
        stages: status,
        bounds,
        goals: prepared.dataset.goals().count(),
        runs,
    })
}

/// What `gacc plan` found: jobs per stage, the uncached calls' bounds per endpoint, the goals
/// each cell scores, and where this experiment's runs are.
pub(super) struct Preview {
    pub stages: Stages,
    pub bounds: BTreeMap<String, CallBounds>,
    pub goals: usize,
    pub runs: std::path::PathBuf,
}
