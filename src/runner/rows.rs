//! The rows a job leaves: its result row, its failure row, and its trace line (when it called).

use std::borrow::Cow;
use std::time::Instant;

use std::sync::atomic::Ordering;

use super::calls::{Origin, note_done};
use super::progress::StageProgress;
use crate::exec::callback::Failure;
use crate::inputs::records::Source;
use crate::plan::{MemoryJob, QuestionJob};
use crate::protocol::Stage;
use crate::store::ledger::{FailureRow, ResultRow};
use crate::trace::TraceEvent;

pub(super) fn result_row(
    job: &MemoryJob,
    source: &Source,
    question: &QuestionJob,
    answer: Option<String>,
    correct: Option<bool>,
    failure: Option<String>,
) -> ResultRow {
    let goal = &source.goals[question.goal];
    let redacted = answer.as_deref().is_some_and(crate::secrets::was_redacted);
    ResultRow {
        seed: job.id.seed,
        compressor: job.id.cell.compressor.clone(),
        condition: job.id.cell.condition,
        ratio: job.id.cell.rule.ratio(),
        budget_tokens: job.id.cell.rule.budget_tokens(),
        source_id: job.id.source_id.clone(),
        goal_id: goal.id.clone(),
        question_id: goal.questions[question.question].id.clone(),
        memory_key: job.key.clone(),
        answer,
        correct,
        score: None,
        failure,
        redacted,
        rationale: None,
        judge_meta: None,
        audits: Default::default(),
        evidence_kept: None,
        evidence_basis: None,
        floor_correct: None,
        ceiling_correct: None,
        panel: Default::default(),
    }
}

pub(super) fn failure_row(
    job: &MemoryJob,
    stage: Stage,
    key: &str,
    callback: &str,
    failure: &Failure,
    question_id: Option<&str>,
) -> FailureRow {
    crate::trace::record(&TraceEvent::JobFailed {
        job: Cow::Borrowed(key),
        stage,
        callback: Cow::Borrowed(callback),
        reason: Cow::Owned(failure.kind.to_string()),
        attempts: failure.attempts,
        stderr: Cow::Borrowed(&failure.stderr_tail),
    });
    FailureRow {
        job: key.to_owned(),
        stage,
        callback: callback.to_owned(),
        reason: failure.kind.to_string(),
        attempts: failure.attempts,
        stderr_tail: failure.stderr_tail.clone(),
        seed: job.id.seed,
        cell: job.id.cell.clone(),
        source_id: job.id.source_id.clone(),
        question_id: question_id.map(str::to_owned),
    }
}

/// Records a finished step of a job: its stage's progress (done and cached, or failed) and,
/// unless it was served without a call, its trace line.
pub(super) fn finished(
    progress: &StageProgress,
    job: &MemoryJob,
    stage: Stage,
    key: &dyn Fn() -> String,
    cache_key: &str,
    started: Instant,
    ended: Result<Origin, &Failure>,
) {
    match ended {
        Ok(origin) => note_done(progress, origin),
        Err(_) => {
            progress.failed.fetch_add(1, Ordering::Relaxed);
        }
    }
    let (origin, failure) = match ended {
        Ok(origin) => (Some(origin), None),
        Err(failure) => (None, Some(failure)),
    };
    let duration_ms = started.elapsed().as_secs_f64() * 1000.0;
    let cache_hit = matches!(origin, Some(Origin::Cache | Origin::RunState));
    // A job served without a call gets no line of its own: each stage's summary counts it,
    // and `gacc trace --job` tells its story from the run folder's other files. The job's
    // seed, condition, ratio and source are in plan.json.gz under its key. The terminal shows
    // every job only when asked to (`-vv`, `RUST_LOG`).
    if cache_hit && !tracing::enabled!(target: crate::trace::EVENT_TARGET, tracing::Level::INFO) {
        return;
    }
    let event = TraceEvent::JobFinished {
        job: Cow::Owned(key()),
        stage,
        cache_key: Cow::Borrowed(cache_key),
        compressor: Cow::Borrowed(&job.id.cell.compressor),
        duration_ms,
        cache_hit,
        skipped: origin == Some(Origin::Skipped),
        failed: failure.is_some(),
    };
    if cache_hit {
        crate::trace::show(&event);
    } else {
        crate::trace::record(&event);
    }
}
