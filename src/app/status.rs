//! The read-only commands over a manifest: `gacc validate`, `gacc plan` and
//! `gacc dataset stats`. None of them calls a callback.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;

use crate::app::prepare::{cache_for, prepare};
use crate::error::{Error, Invalid};
use crate::hash::sha256;
use crate::inputs::budget::truncate_to_budget;
use crate::inputs::dataset;
use crate::inputs::manifest;
use crate::protocol::{Role, Stage};

/// `gacc validate`: a one-paragraph summary of a valid manifest.
pub(super) fn validate(path: &Path, sets: &[String]) -> Result<String, Error> {
    let prepared = prepare(path, sets)?;
    let dataset = &prepared.dataset;
    Ok(format!(
        "{}: valid: {} sources, {} goals, {} questions; {} memories, {} questions to read and judge",
        path.display(),
        dataset.sources.len(),
        dataset.goals().count(),
        dataset.question_count(),
        prepared.plan.memories.len(),
        prepared.plan.question_jobs(),
    ))
}

/// `gacc dataset stats`: a dataset given directly, or the one a manifest names.
pub(super) fn dataset_stats(path: &Path) -> Result<(String, dataset::Stats), Error> {
    let is_manifest = path.extension().is_some_and(|e| e == "toml");
    let dataset = if is_manifest {
        let (loaded, _) = manifest::load(path, &[])?;
        dataset::load(&loaded).map_err(Invalid)?
    } else {
        dataset::load_path(path).map_err(Invalid)?
    };
    let stats = dataset::stats(&dataset, &crate::inputs::tokenizer::Cl100k::new())
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
}

/// `gacc plan`: walks the plan through the cache without calling anything.
pub(super) fn plan_status(
    path: &Path,
    sets: &[String],
) -> Result<BTreeMap<&'static str, StageStatus>, Error> {
    let prepared = prepare(path, sets)?;
    let cache = cache_for(&prepared.loaded)?;
    let plan = &prepared.plan;
    let mut status: BTreeMap<&'static str, StageStatus> = Stage::ALL
        .into_iter()
        .map(|stage| (stage.as_str(), StageStatus::default()))
        .collect();
    let mut count = |stage: Stage, update: &dyn Fn(&mut StageStatus)| {
        if let Some(entry) = status.get_mut(stage.as_str()) {
            update(entry);
        }
    };
    let tokenizer = prepared.tokenizer.as_ref();
    let truncation = prepared.loaded.manifest.truncation;
    for job in &plan.memories {
        count(Stage::Compress, &|s| s.jobs += 1);
        count(Stage::Read, &|s| s.jobs += job.questions.len());
        count(Stage::Judge, &|s| s.jobs += job.questions.len());
        let generation = if job.budget == 0 {
            count(Stage::Compress, &|s| s.skipped += 1);
            Some(String::new())
        } else {
            let answer = cache.get(Role::Compressor.as_str(), &job.cache_key);
            let memory = answer.and_then(|r| r.get("memory").and_then(Value::as_str).map(str::to_owned));
            if memory.is_some() {
                count(Stage::Compress, &|s| s.cached += 1);
            }
            memory
        };
        let Some(generation) = generation else {
            continue;
        };
        // The memory as a run measured it, else the generation cut here.
        let measured = cache
            .get("memory", &plan.memory_key(job, truncation))
            .and_then(|entry| {
                entry
                    .get("memory_sha256")
                    .and_then(Value::as_str)
                    .map(str::to_owned)
            });
        let memory_sha256 = match measured {
            Some(sha256) => sha256,
            None => match truncate_to_budget(tokenizer, &generation, job.budget, truncation) {
                Ok(cut) => sha256(&cut.memory),
                Err(_) => continue,
            },
        };
        for question in &job.questions {
            let read = cache.get(
                Role::Reader.as_str(),
                &plan.read_key(job, question, &memory_sha256),
            );
            let Some(answer) = read.and_then(|r| r.get("answer").and_then(Value::as_str).map(str::to_owned))
            else {
                continue;
            };
            count(Stage::Read, &|s| s.cached += 1);
            if cache.contains(Role::Judge.as_str(), &plan.judge_key(job, question, &answer)) {
                count(Stage::Judge, &|s| s.cached += 1);
            }
        }
    }
    Ok(status)
}
