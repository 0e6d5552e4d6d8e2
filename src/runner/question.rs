//! One question of a memory: read from the memory, then judged against the source and the
//! reference. Each step is answered by the cache or an identical call where it can be.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use serde_json::{Value, json};

use super::RunState;
use super::calls::obtain;
use super::progress::Usage;
use super::rows::{failure_row, finished, result_row};
use crate::exec::callback::Callback;
use crate::inputs::evidence::EvidenceBasis;
use crate::inputs::records::{Question, Source};
use crate::plan::{Anchor, MemoryJob, QuestionJob, audited, in_panel, keys, unknown};
use crate::protocol::messages::{self, JudgeRequest, JudgeResponse, ReaderRequest, ReaderResponse};
use crate::protocol::{Role, Stage};
use crate::store::ledger::{CallKeys, FailureRow, ResultRow};

pub(super) struct QuestionOutcome {
    pub(super) row: ResultRow,
    /// The cache entries the row rests on.
    pub(super) keys: CallKeys,
    pub(super) failure: Option<FailureRow>,
    pub(super) calls: Vec<(Role, String, Usage)>,
    /// Steps that needed a call: 1 (read) or 2 (read and judge).
    pub(super) jobs: usize,
}

/// One step of a question: which stage, its question, and the call that makes it.
struct Step<'a> {
    stage: Stage,
    question_id: &'a str,
    callback: &'a Callback,
    cache_key: String,
}

impl Step<'_> {
    /// The step's job key, made only when it is written (a re-run writes none).
    fn job_key(&self, job: &MemoryJob) -> String {
        let read = keys::read_job(&job.key, self.question_id);
        match self.stage {
            Stage::Judge => keys::judge_job(&read),
            _ => read,
        }
    }
}

impl QuestionOutcome {
    /// A question's outcome before its read: the row, no call yet.
    fn new(row: ResultRow) -> QuestionOutcome {
        QuestionOutcome {
            row,
            keys: CallKeys::new(),
            failure: None,
            calls: Vec::new(),
            jobs: 1,
        }
    }

    /// Makes a step's call; records its progress, trace line and call, or its failure (in the
    /// result row's reason and a failure row). The response, when there is one.
    async fn step(
        &mut self,
        shared: &RunState,
        job: &MemoryJob,
        step: Step<'_>,
        request: impl Fn() -> Vec<u8>,
    ) -> Option<Value> {
        let started = Instant::now();
        let description = || json!({"job": step.stage.as_str(), "cache_key": step.cache_key});
        let made = obtain(shared, step.callback, &step.cache_key, description, request).await;
        let progress = shared.setup.progress.stage(step.stage.role());
        let ended = made.as_ref().map(|(_, origin)| *origin);
        finished(
            progress,
            job,
            step.stage,
            &|| step.job_key(job),
            &step.cache_key,
            started,
            ended,
        );
        match made {
            Ok((response, _)) => {
                let role = step.stage.role();
                self.keys.insert(role.as_str(), step.cache_key.clone());
                self.calls.push((role, step.cache_key, Usage::of(&response)));
                Some(response)
            }
            Err(failure) => {
                let failure = super::calls::as_recorded(shared, &step.job_key(job), failure);
                self.row.failure = Some(format!("{} {}", step.callback.name, failure.kind));
                let question_id = self.row.question_id.clone();
                self.failure = Some(failure_row(
                    job,
                    step.stage,
                    &step.job_key(job),
                    &step.callback.name,
                    &failure,
                    Some(&question_id),
                ));
                None
            }
        }
    }
}

/// The read, the judgement and the audits in order, each with its cache lookup.
pub(super) async fn run_question(
    shared: &Arc<RunState>,
    index: usize,
    position: usize,
    memory: &str,
    memory_sha256: &str,
    (kept, basis): (f64, EvidenceBasis),
) -> QuestionOutcome {
    let setup = &shared.setup;
    let job = &setup.plan.memories[index];
    let question_job = &job.questions[position];
    let source = &setup.dataset.sources[job.source];
    let question = &source.goals[question_job.goal].questions[question_job.question];
    let (reader, judge) = (&setup.callbacks.reader, &setup.callbacks.judge);
    let mut outcome = QuestionOutcome::new(result_row(job, source, question_job, None, None, None));
    (outcome.row.evidence_kept, outcome.row.evidence_basis) = (Some(kept), Some(basis));

    let read = Step {
        stage: Stage::Read,
        question_id: &question.id,
        callback: reader,
        cache_key: setup.plan.read_key(job, question_job, memory_sha256),
    };
    let request = || {
        messages::to_bytes(&ReaderRequest::new(
            memory,
            &question.question,
            job.id.seed,
            &reader.params,
        ))
    };
    let Some(response) = outcome.step(shared, job, read, request).await else {
        return outcome;
    };
    let answer =
        messages::read::<ReaderResponse>(&response).map_or_else(String::new, |r| r.answer.into_owned());
    outcome.row.answer = Some(answer.clone());

    outcome.jobs = 2;
    let judgement = Step {
        stage: Stage::Judge,
        question_id: &question.id,
        callback: judge,
        cache_key: setup.plan.judge_key(job, question_job, &answer),
    };
    let request = || {
        messages::to_bytes(&JudgeRequest::new(
            messages::Judged {
                source: &source.text,
                question: &question.question,
                reference: &question.reference,
                answer: &answer,
            },
            job.id.seed,
            &judge.params,
        ))
    };
    if let Some(response) = outcome.step(shared, job, judgement, request).await
        && let Some(verdict) = messages::read::<JudgeResponse>(&response)
    {
        outcome.row.correct = Some(verdict.correct);
        outcome.row.score = verdict.score;
        outcome.row.rationale = verdict.rationale.map(std::borrow::Cow::into_owned);
        outcome.row.judge_meta = verdict.meta.map(Value::Object);
    }
    let asked = Asked {
        job,
        question_job,
        source,
        question,
    };
    outcome.row.audits = audit(shared, &asked, &answer, &mut outcome.keys).await;
    let read = Read {
        memory,
        memory_sha256,
    };
    // The panel's and the anchors' calls are boxed, and only made when asked for: inline, their
    // futures would grow every question's (385k at paper scale, a cached one allocated whole)
    // by several kilobytes.
    if !setup.plan.panel_shares.is_empty() {
        outcome.row.panel = Box::pin(panel(shared, &asked, &read, &mut outcome.keys)).await;
    }
    for (anchor, memory) in setup.plan.anchors.each(&source.text) {
        let verdict = Box::pin(anchored(shared, &asked, anchor, memory, &mut outcome.keys)).await;
        match anchor {
            Anchor::Floor => outcome.row.floor_correct = verdict,
            Anchor::Ceiling => outcome.row.ceiling_correct = verdict,
        }
    }
    outcome
}

/// A question as the audit judges are asked it.
struct Asked<'a> {
    job: &'a MemoryJob,
    question_job: &'a QuestionJob,
    source: &'a Source,
    question: &'a Question,
}

impl Asked<'_> {
    /// A reader's request for this question from `memory`, with `params`.
    fn read_request(&self, memory: &str, params: &Value) -> Vec<u8> {
        let request = ReaderRequest::new(memory, &self.question.question, self.job.id.seed, params);
        messages::to_bytes(&request)
    }

    /// A judge's request for `answer` to this question, with `params`.
    fn judge_request(&self, answer: &str, params: &Value) -> Vec<u8> {
        let judged = messages::Judged {
            source: &self.source.text,
            question: &self.question.question,
            reference: &self.question.reference,
            answer,
        };
        messages::to_bytes(&JudgeRequest::new(judged, self.job.id.seed, params))
    }
}

/// The scoring judge's verdict on `asked` read by the run's reader from an anchor's memory
/// (SPEC §11): an empty one, or the whole source. Its calls are cached and paced like any and
/// keyed like any read and judgement, so every cell of a (seed, question) shares them, and a
/// ceiling read is the same call as an `identity` read at r = 1. They leave the row's own
/// verdict alone; a call that gives no verdict leaves the anchor's null, warned about.
async fn anchored(
    shared: &RunState,
    asked: &Asked<'_>,
    anchor: Anchor,
    memory: &str,
    calls: &mut CallKeys,
) -> Option<bool> {
    let setup = &shared.setup;
    let (job, question_job, question) = (asked.job, asked.question_job, asked.question);
    let reader = &setup.callbacks.reader;
    let (read_name, judge_name) = anchor.call_names();
    let memory_sha256 = match anchor {
        Anchor::Floor => crate::hash::sha256(""),
        Anchor::Ceiling => setup.plan.source_sha256[job.source].clone(),
    };
    let warn = |callback: &str, failure: &crate::exec::callback::Failure| {
        tracing::warn!(callback = %callback, question = %question.id, anchor = read_name, reason = %failure.kind, "an anchor read gave no verdict");
    };
    let key = setup.plan.read_key(job, question_job, &memory_sha256);
    let request = || asked.read_request(memory, &reader.params);
    let description = || json!({"job": read_name, "cache_key": key});
    let response = match obtain(shared, reader, &key, description, request).await {
        Ok((response, _)) => response,
        Err(failure) => {
            warn(&reader.name, &failure);
            return None;
        }
    };
    calls.insert(read_name, key);
    let answer =
        messages::read::<ReaderResponse>(&response).map_or_else(String::new, |r| r.answer.into_owned());
    judged_again(shared, asked, &answer, judge_name, calls).await
}

/// The scoring judge's verdict on another answer to `asked` than the row's own (an anchor's, a
/// panel reader's): a judge call keyed like any, named `name` in `calls`; None, warned about,
/// when it gives none.
async fn judged_again(
    shared: &RunState,
    asked: &Asked<'_>,
    answer: &str,
    name: impl Into<std::borrow::Cow<'static, str>>,
    calls: &mut CallKeys,
) -> Option<bool> {
    let setup = &shared.setup;
    let (job, question_job, question) = (asked.job, asked.question_job, asked.question);
    let judge = &setup.callbacks.judge;
    let name = name.into();
    let key = setup.plan.judge_key(job, question_job, answer);
    let request = || asked.judge_request(answer, &judge.params);
    let description = || json!({"job": name.as_ref(), "cache_key": key});
    match obtain(shared, judge, &key, description, request).await {
        Ok((response, _)) => {
            calls.insert(name, key);
            messages::read::<JudgeResponse>(&response).map(|v| v.correct)
        }
        Err(failure) => {
            tracing::warn!(callback = %judge.name, question = %question.id, call = %name, reason = %failure.kind, "an answer got no verdict");
            None
        }
    }
}

/// A memory as a reader gets it, with its hash.
struct Read<'a> {
    memory: &'a str,
    memory_sha256: &'a str,
}

/// The scoring judge's verdicts on the panel readers' answers from this memory (SPEC §11), for
/// each panel reader whose sample holds the (memory, question) pair: reader and judge calls of
/// their own, cached and paced like any, named in `calls` (`readers.NAME`, `readers.NAME.judge`),
/// which leave the row's own verdict alone. A call that gives no verdict is null, warned about.
async fn panel(
    shared: &RunState,
    asked: &Asked<'_>,
    read: &Read<'_>,
    calls: &mut CallKeys,
) -> BTreeMap<String, Option<bool>> {
    let setup = &shared.setup;
    let (job, question_job, question) = (asked.job, asked.question_job, asked.question);
    let mut verdicts = BTreeMap::new();
    for (name, share) in &setup.plan.panel_shares {
        let (Some(planned), Some(reader)) = (
            setup.plan.callbacks.panel_reader(name),
            setup.callbacks.panel_reader(name),
        ) else {
            continue;
        };
        // A memory not known yet (`gacc plan`) is in every sample: its calls are bounded at most.
        if !in_panel(job.id.seed, &question.id, read.memory_sha256, *share) && !unknown::is(read.memory) {
            continue;
        }
        let warn = |callback: &str, failure: &crate::exec::callback::Failure| {
            tracing::warn!(callback = %callback, question = %question.id, reader = %name, reason = %failure.kind, "a panel reader's answer got no verdict");
        };
        let key = setup
            .plan
            .panel_read_key(planned, job, question_job, read.memory_sha256);
        let request = || asked.read_request(read.memory, &reader.params);
        let description = || json!({"job": "panel", "reader": name, "cache_key": key});
        let answer = match obtain(shared, reader, &key, description, request).await {
            Ok((response, _)) => {
                calls.insert(format!("readers.{name}"), key);
                messages::read::<ReaderResponse>(&response)
                    .map_or_else(String::new, |r| r.answer.into_owned())
            }
            Err(failure) => {
                warn(&reader.name, &failure);
                verdicts.insert(name.clone(), None);
                continue;
            }
        };
        let verdict = judged_again(shared, asked, &answer, format!("readers.{name}.judge"), calls).await;
        verdicts.insert(name.clone(), verdict);
    }
    verdicts
}

/// The verdicts of the audit judges whose sample holds this answer (SPEC §10): judge calls of
/// their own, cached and paced like any, which leave the row's own verdict alone. A call that
/// gives no verdict is an abstention (null), warned about in the trace. Each call answered is
/// named in `calls`.
async fn audit(
    shared: &RunState,
    asked: &Asked<'_>,
    answer: &str,
    calls: &mut CallKeys,
) -> BTreeMap<String, Option<bool>> {
    let setup = &shared.setup;
    let (job, question) = (asked.job, asked.question);
    let mut verdicts = BTreeMap::new();
    for (name, share) in &setup.plan.audit_shares {
        let (Some(planned), Some(callback)) = (setup.plan.callbacks.audit(name), setup.callbacks.audit(name))
        else {
            continue;
        };
        // An answer not known yet (`gacc plan`) is in every sample: its calls are bounded at most.
        if !audited(job.id.seed, &question.id, answer, *share) && !unknown::is(answer) {
            continue;
        }
        let key = setup.plan.audit_key(planned, job, asked.question_job, answer);
        let request = || asked.judge_request(answer, &callback.params);
        let description = || json!({"job": "audit", "judge": name, "cache_key": key});
        let verdict = match obtain(shared, callback, &key, description, request).await {
            Ok((response, origin)) => {
                calls.insert(callback.name.clone(), key);
                let progress = &setup.progress;
                progress.audited.fetch_add(1, Ordering::Relaxed);
                if origin != super::calls::Origin::Called {
                    progress.audited_cached.fetch_add(1, Ordering::Relaxed);
                }
                messages::read::<JudgeResponse>(&response).map(|v| v.correct)
            }
            Err(failure) => {
                tracing::warn!(callback = %callback.name, question = %question.id, reason = %failure.kind, "an audit judge gave no verdict");
                None
            }
        };
        verdicts.insert(name.clone(), verdict);
    }
    verdicts
}
