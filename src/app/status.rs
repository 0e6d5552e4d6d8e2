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
use crate::plan;
use crate::protocol::Role;
use crate::runner;

/// `gacc validate`: a one-paragraph summary of a valid manifest.
pub fn validate(path: &Path, sets: &[String]) -> Result<String, Error> {
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
pub fn dataset_stats(path: &Path) -> Result<(String, dataset::Stats), Error> {
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
pub struct StageStatus {
    pub jobs: usize,
    pub cached: usize,
    /// Jobs that need no call (`L = 0` memories).
    pub skipped: usize,
}

/// `gacc plan`: walks the plan through the cache without calling anything.
pub fn plan_status(path: &Path, sets: &[String]) -> Result<BTreeMap<&'static str, StageStatus>, Error> {
    let prepared = prepare(path, sets)?;
    let cache = cache_for(&prepared.loaded)?;
    let plan = &prepared.plan;
    let mut status: BTreeMap<&'static str, StageStatus> = BTreeMap::new();
    let tokenizer = prepared.tokenizer.as_ref();
    let truncation = prepared.loaded.manifest.truncation;
    for job in &plan.memories {
        let source = &prepared.dataset.sources[job.source];
        let compress = status.entry("compress").or_default();
        compress.jobs += 1;
        status.entry("read").or_default().jobs += job.questions.len();
        status.entry("judge").or_default().jobs += job.questions.len();
        let generation = if job.budget == 0 {
            status.entry("compress").or_default().skipped += 1;
            Some(String::new())
        } else {
            cache
                .get(Role::Compressor.as_str(), &job.cache_key)
                .and_then(|r| r.get("memory").and_then(Value::as_str).map(str::to_owned))
        };
        let Some(generation) = generation else {
            continue;
        };
        if job.budget > 0 {
            status.entry("compress").or_default().cached += 1;
        }
        // The memory as a run measured it, else the generation cut here.
        let measured = cache
            .get(
                "memory",
                &runner::memory_key(job, &plan.tokenizer_identity, truncation),
            )
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
        for question_job in &job.questions {
            let question = &source.goals[question_job.goal].questions[question_job.question];
            let key = plan::reader_key(
                &plan.reader_identity,
                &memory_sha256,
                &sha256(&question.question),
                job.seed,
            );
            let Some(answer) = cache
                .get(Role::Reader.as_str(), &key)
                .and_then(|r| r.get("answer").and_then(Value::as_str).map(str::to_owned))
            else {
                continue;
            };
            status.entry("read").or_default().cached += 1;
            let hashes = &plan.question_sha256[job.source][question_job.goal][question_job.question];
            let inputs = plan::JudgeInputs {
                source_sha256: &plan.source_sha256[job.source],
                question_sha256: &hashes.question,
                reference_sha256: &hashes.reference,
                answer: &answer,
            };
            if cache.contains(
                Role::Judge.as_str(),
                &plan::judge_key(&plan.judge_identity, &inputs, job.seed),
            ) {
                status.entry("judge").or_default().cached += 1;
            }
        }
    }
    Ok(status)
}
