//! The read-only commands over a manifest: `gacc validate`, `gacc plan` and
//! `gacc dataset stats`. None of them calls a callback.

mod anchors;
mod panel;
mod time;

use std::collections::BTreeMap;
use std::path::Path;

use std::sync::Arc;

use serde_json::Value;

use crate::app::prepare::{Prepared, cache_for, models, prepare};
use crate::error::{Error, Invalid};
use crate::exec::model::ModelLauncher;
use crate::hash::sha256;
use crate::inputs::budget::truncate_to_budget;
use crate::inputs::dataset;
use crate::inputs::manifest::{self, CallbackSpec};
use crate::inputs::records::Source;
use crate::plan::{MemoryJob, QuestionJob, audited};
use crate::protocol::messages::{
    self, CompressorRequest, CompressorResponse, JudgeRequest, ReaderRequest, ReaderResponse, Request,
};
use crate::protocol::{CallbackSet, Role, Stage};
use crate::store::cache::{Cache, Kind};

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

/// The model built-ins of a manifest, as launchers that can render and bound their prompts.
struct Bounder {
    /// Each callback's launcher, where it is a model built-in.
    launchers: CallbackSet<Option<Arc<ModelLauncher>>>,
    /// The most tokens a model reader answers with (an answer not made yet is at most this).
    reader_max_tokens: Option<u64>,
    bounds: BTreeMap<String, CallBounds>,
    /// Requests bounded already: identical requests (a greedy model's seeds) are made once.
    bounded: std::collections::HashSet<String>,
}

impl Bounder {
    fn new(prepared: &Prepared) -> Result<Bounder, Error> {
        let models = models(&prepared.loaded, crate::app::prepare::Keys::Planning)?;
        let estimator: Arc<dyn crate::inputs::tokenizer::Tokenizer> =
            Arc::new(crate::inputs::tokenizer::Cl100k::new());
        let launcher = |spec: &CallbackSpec| -> Option<Arc<ModelLauncher>> {
            let call = spec.model.as_ref()?;
            let endpoint = models.endpoints.get(&call.endpoint)?.clone();
            ModelLauncher::new(endpoint, call.clone(), models.costs.clone(), estimator.clone())
                .ok()
                .map(Arc::new)
        };
        let manifest = &prepared.loaded.manifest;
        let launchers = manifest.callback_set().map(|_, _, spec| launcher(spec));
        let reader_max_tokens = launchers.reader.as_ref().and_then(|reader| {
            let empty = serde_json::Map::new();
            let params = manifest.reader.params.as_object().unwrap_or(&empty);
            let request = ReaderRequest::new("", "", 0, &manifest.reader.params);
            reader
                .prompt(&Request::Reader(request), params)
                .ok()
                .map(|p| p.max_tokens)
        });
        Ok(Bounder {
            launchers,
            reader_max_tokens,
            bounds: BTreeMap::new(),
            bounded: std::collections::HashSet::new(),
        })
    }

    /// Adds one call's bounds, once per distinct request (`identity`); `extra_input` is what
    /// an unknown field may add (cl100k tokens).
    fn add(
        &mut self,
        identity: String,
        launcher: &ModelLauncher,
        request: &Request,
        params: &Value,
        extra_input: u64,
    ) {
        if !self.bounded.insert(identity) {
            return;
        }
        let empty = serde_json::Map::new();
        let Ok(prompt) = launcher.prompt(request, params.as_object().unwrap_or(&empty)) else {
            return;
        };
        let (input, output) = launcher.most_tokens(&prompt);
        let input = input + crate::exec::model::estimate_upper(extra_input);
        let bounds = self.bounds.entry(launcher.endpoint.name.clone()).or_default();
        bounds.calls += 1;
        bounds.input_tokens += input;
        bounds.output_tokens += output;
        if launcher.endpoint.spec.price.is_some() {
            *bounds.cost_usd.get_or_insert(0.0) += launcher.most_cost((input, output));
            bounds.usd_per_million = launcher
                .bound_prices()
                .map(|(input, output)| UsdPerMillion { input, output });
        }
    }
}

/// `gacc plan`: walks the plan through the cache without calling anything.
/// `gacc plan`'s figures: jobs per stage, the uncached calls' bounds per endpoint, and the
/// goals each cell scores.
pub(super) fn plan_status(
    path: &Path,
    sets: &[String],
) -> Result<(Stages, BTreeMap<String, CallBounds>, usize), Error> {
    let prepared = super::prepare::prepare_without_keys(path, sets)?;
    for (reruns, change) in super::prepare::changed_scripts(&prepared.loaded) {
        eprintln!("{}: {change}", if reruns { "note" } else { "warning" });
    }
    let cache = cache_for(&prepared.loaded)?;
    let mut walk = Walk {
        prepared: &prepared,
        cache: &cache,
        bounder: Bounder::new(&prepared)?,
        status: Stage::ALL
            .into_iter()
            .map(|stage| (stage.as_str(), StageStatus::default()))
            .collect(),
    };
    for job in &prepared.plan.memories {
        walk.count(Stage::Compress, |s| s.jobs += 1);
        walk.count(Stage::Read, |s| s.jobs += job.questions.len());
        walk.count(Stage::Judge, |s| s.jobs += job.questions.len());
        walk.memory(job);
        walk.anchors(job);
    }
    let Walk { status, bounder, .. } = walk;
    let manifest = &prepared.loaded.manifest;
    let mut bounds = bounder.bounds;
    for (name, bound) in &mut bounds {
        if let Some(spec) = manifest.models.get(name) {
            let runs = prepared.loaded.project.join("runs").join(&manifest.name);
            time::estimate_time(bound, name, spec, &runs);
        }
    }
    Ok((status, bounds, prepared.dataset.goals().count()))
}

/// The plan walked through the cache: each stage's counts, and the bounds of the calls the
/// cache does not answer.
struct Walk<'a> {
    prepared: &'a Prepared,
    cache: &'a Cache,
    bounder: Bounder,
    status: Stages,
}

impl Walk<'_> {
    fn count(&mut self, stage: Stage, update: impl FnOnce(&mut StageStatus)) {
        if let Some(entry) = self.status.get_mut(stage.as_str()) {
            update(entry);
        }
    }

    /// A memory job: its compressor call, then its questions' reads and judgements as far as
    /// the cache knows them.
    fn memory(&mut self, job: &MemoryJob) {
        let (plan, dataset) = (&self.prepared.plan, &self.prepared.dataset);
        let manifest = &self.prepared.loaded.manifest;
        let truncation = manifest.truncation;
        let goal = job
            .shown_goal
            .map(|(s, g)| dataset.sources[s].goals[g].text.as_str());
        let generation = if job.budget == 0 {
            self.count(Stage::Compress, |s| s.skipped += 1);
            Some(String::new())
        } else {
            let answer = cached(self.cache, Role::Compressor, &job.cache_key);
            let memory =
                answer.and_then(|r| messages::read::<CompressorResponse>(&r).map(|r| r.memory.into_owned()));
            if memory.is_some() {
                self.count(Stage::Compress, |s| s.cached += 1);
            }
            memory
        };
        let source = &dataset.sources[job.source];
        let name = &job.id.cell.compressor;
        if let (None, Some(launcher)) = (
            &generation,
            self.bounder.launchers.compressors.get(name).cloned().flatten(),
        ) {
            let params = &manifest.compressors[name].params;
            let request = Request::Compressor(CompressorRequest::new(
                &source.text,
                goal,
                job.budget,
                job.id.seed,
                params,
            ));
            self.bounder
                .add(job.cache_key.clone(), &launcher, &request, params, 0);
        }
        let Some(generation) = generation else {
            // Nothing of its questions is known: each is read and judged, its memory at
            // most L tokens, its answer at most the reader's max_tokens (else L). Jobs
            // whose compressor calls are one request read one memory.
            let memory = plan.memory_key(job, truncation);
            for question in &job.questions {
                self.bound_question(source, job, question, Pending::Unknown(&memory), None);
                self.bound_panel(source, job, question, None);
            }
            return;
        };
        // The memory as a run measured it, else the generation cut here.
        let measured = self
            .cache
            .get(Kind::Memory, &plan.memory_key(job, truncation))
            .and_then(|entry| {
                entry
                    .get("memory_sha256")
                    .and_then(Value::as_str)
                    .map(str::to_owned)
            });
        let tokenizer = self.prepared.tokenizer.as_ref();
        let memory_sha256 = match measured {
            Some(sha256) => sha256,
            None => match truncate_to_budget(tokenizer, &generation, job.budget, truncation) {
                Ok(cut) => sha256(&cut.memory),
                Err(_) => return,
            },
        };
        self.questions(source, job, &memory_sha256);
    }

    /// The questions of a memory the cache holds: their reads, then their judgements.
    fn questions(&mut self, source: &Source, job: &MemoryJob, memory_sha256: &str) {
        let plan = &self.prepared.plan;
        for question in &job.questions {
            self.bound_panel(source, job, question, Some(memory_sha256));
            let read_key = plan.read_key(job, question, memory_sha256);
            let read = cached(self.cache, Role::Reader, &read_key);
            let Some(answer) =
                read.and_then(|r| messages::read::<ReaderResponse>(&r).map(|r| r.answer.into_owned()))
            else {
                self.bound_question(source, job, question, Pending::Read(&read_key), None);
                continue;
            };
            self.count(Stage::Read, |s| s.cached += 1);
            let judge_key = plan.judge_key(job, question, &answer);
            if cached(self.cache, Role::Judge, &judge_key).is_some() {
                self.count(Stage::Judge, |s| s.cached += 1);
            } else {
                let pending = Pending::Answered(&judge_key);
                self.bound_question(source, job, question, pending, Some(&answer));
            }
            self.bound_audits(source, job, question, Answer::Known(&answer));
        }
    }

    /// Bounds a question's reader call (unless it is answered) and its judge call (with its answer
    /// when known), each once per distinct request.
    fn bound_question(
        &mut self,
        source: &Source,
        job: &MemoryJob,
        question: &QuestionJob,
        pending: Pending,
        answer: Option<&str>,
    ) {
        let (plan, manifest) = (&self.prepared.plan, &self.prepared.loaded.manifest);
        let bounder = &mut self.bounder;
        let asked = &source.goals[question.goal].questions[question.question];
        let seed = job.id.seed;
        // A read not made yet is named by its memory, question and seed term; its judgement by
        // that and the judge's seed term.
        let read = match pending {
            Pending::Unknown(memory) => format!(
                "{memory}/{}/{}/{}",
                question.goal,
                question.question,
                plan.callbacks.reader.seed.key_term(seed)
            ),
            Pending::Read(key) | Pending::Answered(key) => key.to_owned(),
        };
        let reader = bounder.launchers.reader.clone();
        if let (false, Some(reader)) = (matches!(pending, Pending::Answered(_)), &reader) {
            let request = Request::Reader(ReaderRequest::new(
                "",
                &asked.question,
                seed,
                &manifest.reader.params,
            ));
            bounder.add(
                read.clone(),
                reader,
                &request,
                &manifest.reader.params,
                job.budget as u64,
            );
        }
        if let Some(judge) = bounder.launchers.judge.clone() {
            // An unknown answer: at most the model reader's max_tokens, else the memory's L.
            let (unknown, identity) = match pending {
                Pending::Answered(key) => (0, key.to_owned()),
                _ => (
                    bounder.reader_max_tokens.unwrap_or(job.budget as u64),
                    format!("{read}/judge/{}", plan.callbacks.judge.seed.key_term(seed)),
                ),
            };
            let request = Request::Judge(JudgeRequest::new(
                messages::Judged {
                    source: &source.text,
                    question: &asked.question,
                    reference: &asked.reference,
                    answer: answer.unwrap_or(""),
                },
                seed,
                &manifest.judge.params,
            ));
            bounder.add(identity, &judge, &request, &manifest.judge.params, unknown);
        }
        if !matches!(pending, Pending::Answered(_)) {
            self.bound_audits(source, job, question, Answer::Unknown(&read));
        }
    }

    /// Bounds the audit judges' calls of a question (SPEC §10): with its answer known, those
    /// whose sample holds it and that the cache does not answer; with it unknown, every model
    /// audit judge's, at most (its sample is known only once the answer is).
    fn bound_audits(&mut self, source: &Source, job: &MemoryJob, question: &QuestionJob, answer: Answer) {
        let (plan, manifest) = (&self.prepared.plan, &self.prepared.loaded.manifest);
        let asked = &source.goals[question.goal].questions[question.question];
        let seed = job.id.seed;
        let longest = self.bounder.reader_max_tokens.unwrap_or(job.budget as u64);
        for (name, share) in &plan.audit_shares {
            let (Some(audit), Some(Some(launcher))) = (
                plan.callbacks.audit(name),
                self.bounder.launchers.audit(name).cloned(),
            ) else {
                continue;
            };
            let (identity, unknown, text) = match answer {
                Answer::Known(text) => {
                    let key = plan.audit_key(audit, job, question, text);
                    let judged = cached(self.cache, Role::Judge, &key).is_some();
                    if judged || !audited(seed, &asked.id, text, *share) {
                        continue;
                    }
                    (key, 0, text)
                }
                Answer::Unknown(read) => {
                    let identity = format!("{read}/audit/{name}/{}", audit.seed.key_term(seed));
                    (identity, longest, "")
                }
            };
            let Some(params) = manifest.judges.get(name).map(|spec| &spec.params) else {
                continue;
            };
            let request = Request::Judge(JudgeRequest::new(
                messages::Judged {
                    source: &source.text,
                    question: &asked.question,
                    reference: &asked.reference,
                    answer: text,
                },
                seed,
                params,
            ));
            self.bounder.add(identity, &launcher, &request, params, unknown);
        }
    }
}

/// A question's answer as `gacc plan` knows it: its text, or the name of the read that makes it.
#[derive(Clone, Copy)]
enum Answer<'a> {
    Known(&'a str),
    Unknown(&'a str),
}

/// A call's cached response.
fn cached(cache: &Cache, role: Role, key: &str) -> Option<Value> {
    cache.get(role.into(), key)
}

/// What is known of a question's calls that the cache does not answer.
#[derive(Clone, Copy)]
enum Pending<'a> {
    /// Its memory is not made: the memory's key names the read.
    Unknown(&'a str),
    /// The read's key.
    Read(&'a str),
    /// Read already: the judge call's key.
    Answered(&'a str),
}
