//! One memory job: its compressor call (or the cache's answer), the generation cut to its
//! budget and counted, its ledger row, and then each of its questions.

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use serde_json::{Value, json};
use tokio::task::JoinSet;

use super::calls::{Origin, obtain_answer};
use super::ladder::{LadderMark, obtain_rung};
use super::progress::Usage;
use super::question::{QuestionOutcome, run_question};
use super::rows::{failure_row, finished, result_row};
use super::{MemoryOutcome, RunState};
use crate::exec::callback::{Callback, Failure, FailureKind};
use crate::hash::sha256;
use crate::inputs::budget::truncate_to_budget;
use crate::parallel::Locked;
use crate::plan::MemoryJob;
use crate::plan::keys::count_key;
use crate::protocol::messages::{self, CompressorRequest, CompressorResponse};
use crate::protocol::{Role, Stage, TruncationMode};
use crate::store::cache::Kind;
use crate::store::ledger::{CallKeys, LedgerRow};
use crate::store::row_sink::RowLines;

/// Memory job `index` and its questions, with its rows' lines when the run writes them (made
/// here, on the job's own task, so that folding rows in plan order stays cheap).
pub(super) async fn run_memory(shared: &Arc<RunState>, index: usize) -> MemoryOutcome {
    let mut outcome = memory_and_questions(shared, index).await;
    if shared.writes_rows {
        outcome.lines = Some(RowLines::of(outcome.ledger.as_ref(), &outcome.results));
    }
    // The keys are written now (or not at all): freed here, on the job's own task, not by the
    // fold, which runs one memory at a time.
    let ledger = outcome.ledger.iter_mut().map(|(_, keys)| keys);
    for keys in ledger.chain(outcome.results.iter_mut().map(|(_, keys)| keys)) {
        drop(std::mem::take(keys));
    }
    outcome
}

async fn memory_and_questions(shared: &Arc<RunState>, index: usize) -> MemoryOutcome {
    let setup = &shared.setup;
    let job = &setup.plan.memories[index];
    let source = &setup.dataset.sources[job.source];
    let callback = &setup.callbacks.compressors[&job.id.cell.compressor];
    let goal_text = goal_text(shared, job);
    let request = CompressorRequest::new(&source.text, goal_text, job.budget, job.id.seed, &callback.params);
    let held_out = &setup.plan.held_out_texts[job.source];
    let exposure_violation = shared.exposures.of(job, &request, held_out);
    if exposure_violation {
        tracing::error!(job = %job.key, "compressor request carries held-out text");
    }
    let mut outcome = MemoryOutcome {
        ledger: None,
        results: Vec::new(),
        failures: Vec::new(),
        exposure_violation,
        calls: Vec::new(),
        compressor_wall_ms: None,
        jobs: Vec::new(),
        lines: None,
    };

    let started = Instant::now();
    let made = if job.budget == 0 {
        Ok(Made::skipped())
    } else {
        outcome.jobs.push(Role::Compressor);
        make_memory(shared, callback, job, request).await
    };
    let progress = setup.progress.stage(Role::Compressor);
    let ended = made
        .as_ref()
        .map(|made| made.origin)
        .map_err(|(failure, _)| failure);
    finished(
        progress,
        job,
        Stage::Compress,
        &|| job.key.clone(),
        &job.cache_key,
        started,
        ended,
    );
    let made = match made {
        Ok(made) => made,
        Err((failure, culprit)) => {
            let failure = super::calls::as_recorded(shared, &job.key, failure);
            outcome.failures.push(failure_row(
                job,
                Stage::Compress,
                &job.key,
                culprit,
                &failure,
                None,
            ));
            let reason = format!("the memory was not made: {culprit} {}", failure.kind);
            for question in &job.questions {
                let row = result_row(job, source, question, None, None, Some(reason.clone()));
                outcome.results.push((row, CallKeys::new()));
            }
            return outcome;
        }
    };
    if made.origin != Origin::Skipped {
        let call = (Role::Compressor, job.cache_key.clone(), made.usage.clone());
        outcome.calls.push(call);
        outcome.compressor_wall_ms = made.wall_ms;
    }
    let row = ledger_row(job, &made, setup.truncation);
    outcome.ledger = Some((row, made.calls));

    answer_questions(shared, index, &made.measured, &mut outcome).await;
    outcome
}

/// The ledger row of a memory made (or found) for `job`.
fn ledger_row(job: &MemoryJob, made: &Made, truncation: TruncationMode) -> LedgerRow {
    let (measured, origin) = (&made.measured, made.origin);
    let ladder = made.ladder.as_ref();
    LedgerRow {
        memory_id: job.id.clone(),
        source_tokens: job.source_tokens,
        budget: job.budget,
        generated_tokens: measured.generated_tokens,
        retained_tokens: measured.retained_tokens,
        unused_budget: job.budget - measured.retained_tokens,
        truncated: measured.truncated,
        memory_tokens: measured.memory_tokens,
        padding_tokens: 0,
        utf8_split: measured.utf8_split,
        truncation,
        budget_violation: measured.memory_tokens > job.budget,
        stopped_at_max_tokens: measured.stopped_at_max_tokens,
        redacted: crate::secrets::was_redacted(&measured.memory),
        memory_sha256: measured.memory_sha256.clone(),
        key: job.key.clone(),
        cache_key: job.cache_key.clone(),
        cached: origin != Origin::Called,
        ladder_call: ladder.map(|mark| mark.call.clone()),
        nested: ladder.and_then(|mark| mark.nested),
        memory: measured.memory.clone(),
    }
}

/// Reads and judges every question of memory job `index` from its memory.
async fn answer_questions(
    shared: &Arc<RunState>,
    index: usize,
    measured: &Measured,
    outcome: &mut MemoryOutcome,
) {
    let job = &shared.setup.plan.memories[index];
    let (memory, memory_sha256) = (&measured.memory, &measured.memory_sha256);
    let mut answered: Vec<Option<QuestionOutcome>> = (0..job.questions.len()).map(|_| None).collect();
    let plan = &shared.setup.plan;
    let spans = (job.questions.iter()).map(|q| &plan.spans[job.source][q.goal][q.question]);
    let normalised = shared.normalised(memory_sha256, memory);
    let evidence = crate::inputs::evidence::kept_each(&normalised, spans);
    let mut questions = JoinSet::new();
    for (position, _) in job.questions.iter().enumerate() {
        let shared = shared.clone();
        let memory = memory.clone();
        let memory_sha256 = memory_sha256.clone();
        let evidence = evidence[position];
        let mut question = Box::pin(async move {
            let outcome = run_question(&shared, index, position, &memory, &memory_sha256, evidence).await;
            (position, outcome)
        });
        // A question the cache answers whole finishes at its first poll: it is done here,
        // without a task of its own (at scale, most re-run questions); any other goes on
        // as a task from where it stopped.
        let mut context = std::task::Context::from_waker(std::task::Waker::noop());
        match question.as_mut().poll(&mut context) {
            std::task::Poll::Ready((position, outcome)) => answered[position] = Some(outcome),
            std::task::Poll::Pending => {
                questions.spawn(question);
            }
        }
    }
    while let Some(joined) = questions.join_next().await {
        if let Ok((position, question)) = joined {
            answered[position] = Some(question);
        }
    }
    for question in answered.into_iter().flatten() {
        outcome.results.push((question.row, question.keys));
        outcome.failures.extend(question.failure);
        outcome.calls.extend(question.calls);
        outcome
            .jobs
            .extend([Role::Reader, Role::Judge].into_iter().take(question.jobs));
    }
}

/// A memory and the counts the ledger records about it.
#[derive(Debug, Clone)]
pub(super) struct Measured {
    memory: Arc<str>,
    memory_sha256: String,
    generated_tokens: usize,
    retained_tokens: usize,
    truncated: bool,
    utf8_split: bool,
    memory_tokens: usize,
    /// The provider stopped the compressor at `max_tokens` before it had used its budget.
    stopped_at_max_tokens: bool,
}

impl Measured {
    /// `L = 0`: nothing generated, nothing kept.
    fn empty() -> Measured {
        Measured {
            memory: Arc::from(""),
            memory_sha256: sha256(""),
            generated_tokens: 0,
            retained_tokens: 0,
            truncated: false,
            utf8_split: false,
            memory_tokens: 0,
            stopped_at_max_tokens: false,
        }
    }

    /// A dry run's memory not made yet (`plan::unknown`), of at most `budget` tokens: kept
    /// whole, as its budget bounds it already, with every count at that bound.
    fn unknown(text: String, budget: usize) -> Measured {
        Measured {
            memory_sha256: sha256(&text),
            memory: Arc::from(text),
            generated_tokens: budget,
            retained_tokens: budget,
            truncated: false,
            utf8_split: false,
            memory_tokens: budget,
            stopped_at_max_tokens: false,
        }
    }

    fn to_json(&self, usage: &Usage, wall_ms: Option<u64>, ladder: Option<&LadderMark>) -> Value {
        // The text itself is stored once under its hash (kind `text`): memories repeat.
        let mut entry = json!({
            "memory_sha256": self.memory_sha256,
            "generated_tokens": self.generated_tokens,
            "retained_tokens": self.retained_tokens,
            "truncated": self.truncated,
            "utf8_split": self.utf8_split,
            "memory_tokens": self.memory_tokens,
            "usage": usage,
        });
        if self.stopped_at_max_tokens {
            entry["stopped_at_max_tokens"] = json!(true);
        }
        // The compressor call's, as its own entry records it (SPEC §15).
        if let Some(wall_ms) = wall_ms {
            entry["wall_ms"] = json!(wall_ms);
        }
        if let Some(mark) = ladder {
            entry["ladder"] = json!(mark);
        }
        entry
    }

    fn from_json(shared: &RunState, entry: &Value) -> Option<(Measured, Usage, Option<u64>)> {
        // (Its ladder mark, if any, is read beside: `LadderMark::of`.)
        let count = |name: &str| entry.get(name).and_then(Value::as_u64).map(|n| n as usize);
        // The recount verifies this hash when the report is built.
        let memory_sha256 = entry.get("memory_sha256")?.as_str()?.to_owned();
        let measured = Measured {
            memory: shared.memory_text(&memory_sha256)?,
            memory_sha256,
            generated_tokens: count("generated_tokens")?,
            retained_tokens: count("retained_tokens")?,
            truncated: entry.get("truncated")?.as_bool()?,
            utf8_split: entry.get("utf8_split")?.as_bool()?,
            memory_tokens: count("memory_tokens")?,
            stopped_at_max_tokens: entry.get("stopped_at_max_tokens") == Some(&json!(true)),
        };
        let mut usage = Usage::default();
        usage.add(entry);
        Some((measured, usage, entry.get("wall_ms").and_then(Value::as_u64)))
    }
}

/// The cache entries a memory rests on (`CallKeys`): of its compressor call, its cut memory
/// and its text, those the cache holds; and the recount's proven count of its text (which the
/// recount writes as the run goes).
fn memory_calls(shared: &RunState, job: &MemoryJob, memory_key: String, measured: &Measured) -> CallKeys {
    let cache = &shared.setup.cache;
    let entries = [
        (Kind::Compressor, job.cache_key.clone()),
        (Kind::Memory, memory_key),
        (Kind::Text, measured.memory_sha256.clone()),
    ];
    let mut calls = CallKeys::new();
    for (kind, key) in entries {
        if cache.contains(kind, &key) {
            calls.insert(kind.as_str(), key);
        }
    }
    let count = count_key(&shared.count_identity, &measured.memory_sha256);
    calls.insert(Kind::Count.as_str(), count);
    calls
}

/// A memory made: its counts, where it came from, what its call reported and took, and the
/// cache entries it rests on.
pub(super) struct Made {
    measured: Arc<Measured>,
    origin: Origin,
    usage: Usage,
    /// The compressor call's wall time in milliseconds, where known.
    wall_ms: Option<u64>,
    /// The ladder call that made it, where one did (SPEC §14).
    ladder: Option<LadderMark>,
    calls: CallKeys,
}

impl Made {
    /// `L = 0`: nothing called, nothing kept.
    fn skipped() -> Made {
        Made {
            measured: Arc::new(Measured::empty()),
            origin: Origin::Skipped,
            usage: Usage::default(),
            wall_ms: None,
            ladder: None,
            calls: CallKeys::new(),
        }
    }

    /// The memory as the cache of cut memories holds it under `memory_key`, if it does.
    fn found(shared: &RunState, job: &MemoryJob, memory_key: &str) -> Option<Made> {
        let entry = shared.setup.cache.get(Kind::Memory, memory_key)?;
        let (measured, usage, wall_ms) = Measured::from_json(shared, &entry)?;
        shared.calls.found(Role::Compressor, false);
        let calls = memory_calls(shared, job, memory_key.to_owned(), &measured);
        Some(Made {
            measured: Arc::new(measured),
            origin: Origin::Cache,
            usage,
            wall_ms,
            ladder: LadderMark::of(&entry),
            calls,
        })
    }
}

/// Makes a memory: from the cache of truncated memories, or by obtaining the generation
/// (cache or call) and cutting it to its budget, which is then stored for next time.
pub(super) async fn make_memory<'a>(
    shared: &RunState,
    callback: &'a Callback,
    job: &MemoryJob,
    request: CompressorRequest<'_>,
) -> Result<Made, (Failure, &'a str)> {
    let setup = &shared.setup;
    let memory_key = setup.plan.memory_key(job, setup.truncation);
    if let Some(made) = Made::found(shared, job, &memory_key) {
        return Ok(made);
    }
    let culprit = |failure| (failure, callback.name.as_str());
    let (answer, origin) = match job.ladder.as_deref() {
        Some(ladder) => obtain_rung(shared, callback, job, ladder).await,
        None => {
            let request = || messages::to_bytes(&request);
            let description = || json!({"job": "compress", "cache_key": job.cache_key});
            obtain_answer(shared, callback, &job.cache_key, description, request).await
        }
    }
    .map_err(culprit)?;
    let (response, wall_ms) = (answer.response, answer.wall_ms);
    if job.ladder.is_none() {
        super::ladder::no_memories(&response).map_err(culprit)?;
    }
    let ladder = LadderMark::of(&response);
    let mut usage = Usage::default();
    usage.add(&response);
    let mut measured = measure(shared, &response, job.budget)
        .await
        .map_err(|failure| (failure, "tokenizer"))?;
    // A model endpoint that stopped at max_tokens before L: the ledger says so.
    if response.pointer("/meta/cut_at_max_tokens") == Some(&json!(true)) && !measured.truncated {
        measured = Arc::new(Measured {
            stopped_at_max_tokens: true,
            ..(*measured).clone()
        });
    }
    let description = json!({"job": "memory", "compressor_key": job.cache_key, "budget": job.budget});
    let text_key = &measured.memory_sha256;
    if !setup.cache.contains(Kind::Text, text_key) {
        // A memory's text is kept in the shape of the compressor's response that holds it.
        let text = messages::to_value(&CompressorResponse {
            memory: std::borrow::Cow::Borrowed(&measured.memory),
        });
        if let Err(error) = setup
            .cache
            .put(Kind::Text, text_key, &json!({"job": "text"}), &text)
        {
            shared.lost_write(
                &format!("could not write a memory's text to the cache ({error})"),
                0,
            );
        }
    }
    if let Err(error) = setup.cache.put(
        Kind::Memory,
        &memory_key,
        &description,
        &measured.to_json(&usage, wall_ms, ladder.as_ref()),
    ) {
        shared.lost_write(
            &format!("could not write a memory's measure to the cache ({error})"),
            0,
        );
    }
    let calls = memory_calls(shared, job, memory_key, &measured);
    Ok(Made {
        measured,
        origin,
        usage,
        wall_ms,
        ladder,
        calls,
    })
}

/// The text of the goal `job`'s compressor is shown, if any.
fn goal_text<'a>(shared: &'a RunState, job: &MemoryJob) -> Option<&'a str> {
    let sources = &shared.setup.dataset.sources;
    job.shown_goal.map(|(s, g)| sources[s].goals[g].text.as_str())
}

/// Cuts a generation to its budget and counts the memory again, off the async workers
/// (tokenizing is CPU work, and an external tokenizer blocks); identical generations of a
/// run are measured once.
pub(super) async fn measure(
    shared: &RunState,
    response: &Value,
    budget: usize,
) -> Result<Arc<Measured>, Failure> {
    let setup = &shared.setup;
    let generation =
        messages::read::<CompressorResponse>(response).map_or_else(String::new, |r| r.memory.into_owned());
    if let Some(unknown) = crate::plan::unknown::capped(&generation, budget as u64) {
        return Ok(Arc::new(Measured::unknown(unknown, budget)));
    }
    let memo_key = (sha256(&generation), budget);
    if let Some(measured) = shared.measured.locked().get(&memo_key) {
        return Ok(measured.clone());
    }
    let tokenizer = setup.tokenizer.clone();
    let mode = setup.truncation;
    let _cpu = shared.tokenizing.acquire().await;
    let measured = tokio::task::spawn_blocking(move || {
        let truncation = truncate_to_budget(tokenizer.as_ref(), &generation, budget, mode)?;
        let memory_tokens = tokenizer.count(&truncation.memory)?;
        Ok::<_, crate::inputs::tokenizer::TokenizerError>(Measured {
            memory_sha256: sha256(&truncation.memory),
            memory: Arc::from(truncation.memory),
            generated_tokens: truncation.generated_tokens,
            retained_tokens: truncation.retained_tokens,
            truncated: truncation.truncated,
            utf8_split: truncation.utf8_split,
            memory_tokens,
            stopped_at_max_tokens: false,
        })
    })
    .await;
    let error = match measured {
        Ok(Ok(mut measured)) => {
            measured.memory = shared.intern(&measured.memory_sha256, &measured.memory);
            let measured = Arc::new(measured);
            shared.measured.locked().insert(memo_key, measured.clone());
            return Ok(measured);
        }
        Ok(Err(error)) => error.to_string(),
        Err(error) => format!("tokenizer task failed: {error}"),
    };
    Err(Failure {
        kind: FailureKind::Tokenizer(error),
        stderr_tail: String::new(),
        attempts: 1,
    })
}
