//! Runs a plan on this machine: every memory, then every question read from it and judged,
//! with calls answered from the cache where they can be and identical calls made once.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde::Serialize;
use serde_json::{Value, json};
use tokio::sync::{OnceCell, Semaphore};
use tokio::task::JoinSet;
use tracing::Instrument;

use crate::exec::callback::{Callback, Failure, FailureKind};
use crate::hash::sha256;
use crate::inputs::budget::truncate_to_budget;
use crate::inputs::dataset::Dataset;
use crate::inputs::tokenizer::Tokenizer;
use crate::plan::{self, JudgeInputs, MemoryJob, Plan, QuestionJob};
use crate::protocol::PROTOCOL;
use crate::protocol::Role;
use crate::protocol::TruncationMode;
use crate::store::cache::Cache;
use crate::store::ledger::{FailureRow, LedgerRow, ResultRow};

/// The callbacks of one run, ready to call.
#[derive(Debug)]
pub struct Callbacks {
    pub compressors: BTreeMap<String, Callback>,
    pub reader: Callback,
    pub judge: Callback,
}

/// Everything a run shares between its tasks.
pub struct Setup {
    pub plan: Arc<Plan>,
    pub dataset: Arc<Dataset>,
    pub callbacks: Callbacks,
    pub cache: Cache,
    pub tokenizer: Arc<dyn Tokenizer>,
    pub truncation: TruncationMode,
    pub concurrency: usize,
    pub progress: Arc<Progress>,
    /// Stop starting calls after the first failure (finished work is kept).
    pub fail_fast: bool,
    /// Where each distinct memory goes as soon as its ledger row is final (the report's
    /// recount starts on it while the run goes on).
    pub memories: Option<std::sync::mpsc::Sender<Arc<str>>>,
}

/// Where a call's answer came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Origin {
    Called,
    Cache,
    /// Another job of this run needed the identical call.
    Shared,
    /// `L = 0`: nothing to call.
    Skipped,
}

/// Calls made, served from the cache, shared and failed, per role, in this run.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct CallCounts {
    pub made: usize,
    pub cached: usize,
    pub shared: usize,
    pub failed: usize,
}

/// Token and cost usage reported by callbacks.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cost_usd: f64,
}

impl Usage {
    /// Adds another usage.
    pub fn plus(&mut self, other: &Usage) {
        self.input_tokens += other.input_tokens;
        self.output_tokens += other.output_tokens;
        self.cost_usd += other.cost_usd;
    }

    /// The usage a response reported.
    pub fn of(response: &Value) -> Usage {
        let mut usage = Usage::default();
        usage.add(response);
        usage
    }

    /// Adds a response's `usage`, if it has one.
    pub fn add(&mut self, response: &Value) {
        if let Some(usage) = response.get("usage") {
            self.input_tokens += usage.get("input_tokens").and_then(Value::as_u64).unwrap_or(0);
            self.output_tokens += usage.get("output_tokens").and_then(Value::as_u64).unwrap_or(0);
            self.cost_usd += usage.get("cost_usd").and_then(Value::as_f64).unwrap_or(0.0);
        }
    }
}

/// What a run produced, in plan order.
#[derive(Debug, Default)]
pub struct Outcome {
    pub ledger: Vec<LedgerRow>,
    pub results: Vec<ResultRow>,
    pub failures: Vec<FailureRow>,
    pub exposure_violations: usize,
    /// This run's calls per role.
    pub this_run: BTreeMap<Role, CallCounts>,
    /// What this run paid, per role (calls it made).
    pub paid: BTreeMap<Role, Usage>,
    /// Every distinct successful call the results rest on, per role, with the usage it reported.
    pub calls: BTreeMap<Role, BTreeMap<String, Usage>>,
    /// Jobs per role that needed a call (all but `L = 0` memories).
    pub jobs: BTreeMap<Role, usize>,
    /// Jobs not run because `--fail-fast` stopped the run.
    pub cancelled: usize,
    /// Each compressor's distinct calls, with their usage.
    pub compressor_calls: BTreeMap<String, BTreeMap<String, Usage>>,
}

/// Progress counters, per stage, read by the progress display.
#[derive(Debug)]
pub struct Progress {
    pub stages: [StageProgress; 3],
    pub started: Instant,
}

impl Default for Progress {
    fn default() -> Self {
        Progress {
            stages: Default::default(),
            started: Instant::now(),
        }
    }
}

#[derive(Debug, Default)]
pub struct StageProgress {
    pub total: AtomicUsize,
    pub done: AtomicUsize,
    pub cached: AtomicUsize,
    pub failed: AtomicUsize,
}

impl Progress {
    pub fn stage(&self, role: Role) -> &StageProgress {
        &self.stages[role as usize]
    }
}

/// A call's response and whether it came from the cache, or its failure.
/// Memory jobs in flight per slot of run concurrency (each with all its questions).
const JOBS_IN_FLIGHT_PER_SLOT: usize = 16;
const MIN_JOBS_IN_FLIGHT: usize = 64;

type Slot = Arc<OnceCell<Result<(Value, bool), Failure>>>;

/// Identical calls in flight share one slot, so each is made once.
#[derive(Default)]
struct Calls {
    slots: Mutex<HashMap<(Role, String), Slot>>,
    counts: Mutex<BTreeMap<Role, CallCounts>>,
    paid: Mutex<BTreeMap<Role, Usage>>,
}

impl Calls {
    fn slot(&self, role: Role, key: &str) -> Slot {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        slots.entry((role, key.to_owned())).or_default().clone()
    }

    fn count(&self, role: Role, update: impl FnOnce(&mut CallCounts)) {
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        update(counts.entry(role).or_default());
    }
}

struct Shared {
    run: Setup,
    calls: Calls,
    run_limit: Semaphore,
    /// Memories already measured in this run, by (SHA-256 of the generation, budget).
    measured: Mutex<HashMap<(String, usize), Arc<Measured>>>,
    /// One copy of each memory text, by its SHA-256, however many rows and tasks hold it.
    memories: Mutex<HashMap<String, Arc<str>>>,
    /// Tokenizing runs on at most this many threads at once (it is CPU work).
    tokenizing: Semaphore,
    /// Set by the first failure under `--fail-fast`: no new call starts.
    stopped: std::sync::atomic::AtomicBool,
}

impl Shared {
    /// A memory's text by its hash: from this run's copies, else from the cache.
    fn memory_text(&self, sha256: &str) -> Option<Arc<str>> {
        if let Some(text) = self
            .memories
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(sha256)
        {
            return Some(text.clone());
        }
        let entry = self.run.cache.get("text", sha256)?;
        Some(self.intern(sha256, entry.get("memory")?.as_str()?))
    }

    fn intern(&self, sha256: &str, text: &str) -> Arc<str> {
        let mut memories = self.memories.lock().unwrap_or_else(|e| e.into_inner());
        memories
            .entry(sha256.to_owned())
            .or_insert_with(|| Arc::from(text))
            .clone()
    }
}

/// The result of one memory job and its questions.
struct MemoryOutcome {
    ledger: Option<LedgerRow>,
    results: Vec<ResultRow>,
    failures: Vec<FailureRow>,
    exposure_violation: bool,
    calls: Vec<(Role, String, Usage)>,
    jobs: Vec<Role>,
}

/// Runs every job of the plan; never fails as a whole: failed jobs are in the outcome.
pub async fn execute(mut run: Setup) -> Outcome {
    // Held here, not in what tasks share, so it is closed when the run is over.
    let memories = run.memories.take();
    for memory in &run.plan.memories {
        run.progress
            .stage(Role::Compressor)
            .total
            .fetch_add(1, Ordering::Relaxed);
        run.progress
            .stage(Role::Reader)
            .total
            .fetch_add(memory.questions.len(), Ordering::Relaxed);
        run.progress
            .stage(Role::Judge)
            .total
            .fetch_add(memory.questions.len(), Ordering::Relaxed);
    }
    let shared = Arc::new(Shared {
        run_limit: Semaphore::new(run.concurrency.max(1)),
        run,
        calls: Calls::default(),
        measured: Mutex::default(),
        memories: Mutex::default(),
        tokenizing: Semaphore::new(std::thread::available_parallelism().map_or(2, |n| n.get())),
        stopped: Default::default(),
    });
    // A window of memory jobs in flight, each with its questions: enough to keep every
    // callback busy, few enough that a million-job plan never lives in memory at once.
    let window = (JOBS_IN_FLIGHT_PER_SLOT * shared.run.concurrency).max(MIN_JOBS_IN_FLIGHT);
    let total = shared.run.plan.memories.len();
    let mut tasks = JoinSet::new();
    let mut next = 0;
    let mut outcomes: Vec<Option<MemoryOutcome>> = (0..total).map(|_| None).collect();
    // Finished memories are folded into the outcome in plan order while later ones run.
    let mut folded = 0;
    let mut outcome = Outcome {
        ledger: Vec::with_capacity(total),
        results: Vec::with_capacity(shared.run.plan.question_jobs()),
        ..Outcome::default()
    };
    let mut distinct = Distinct::default();
    loop {
        while next < total && tasks.len() < window {
            let shared = shared.clone();
            let index = next;
            tasks.spawn(async move { (index, run_memory(&shared, index).await) });
            next += 1;
        }
        match tasks.join_next().await {
            None => break,
            Some(Ok((index, memory))) => outcomes[index] = Some(memory),
            Some(Err(error)) => tracing::error!(%error, "a job task stopped unexpectedly"),
        }
        while folded < next && outcomes[folded].is_some() {
            if let Some(memory) = outcomes[folded].take() {
                let compressor = &shared.run.plan.memories[folded].compressor;
                fold(&mut outcome, &mut distinct, compressor, memory, memories.as_ref());
            }
            folded += 1;
        }
    }
    // A task that stopped unexpectedly leaves a gap; what follows it is still kept.
    for (index, memory) in outcomes.into_iter().enumerate().skip(folded) {
        if let Some(memory) = memory {
            let compressor = &shared.run.plan.memories[index].compressor;
            fold(&mut outcome, &mut distinct, compressor, memory, memories.as_ref());
        }
    }
    outcome.this_run = shared
        .calls
        .counts
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    outcome.paid = shared
        .calls
        .paid
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    outcome.calls = distinct
        .calls
        .into_iter()
        .map(|(role, calls)| (role, calls.into_iter().collect()))
        .collect();
    outcome.compressor_calls = distinct
        .compressor_calls
        .into_iter()
        .map(|(name, calls)| (name, calls.into_iter().collect()))
        .collect();
    outcome
}

/// Distinct calls while a run's outcomes are gathered: hashed, then sorted once at the end.
#[derive(Default)]
struct Distinct {
    calls: BTreeMap<Role, HashMap<String, Usage>>,
    compressor_calls: BTreeMap<String, HashMap<String, Usage>>,
    /// Memory texts handed over already, by address (rows of one memory share its `Arc`).
    memories: std::collections::HashSet<usize>,
}

/// Adds one memory's rows, failures and calls to the run's outcome.
fn fold(
    outcome: &mut Outcome,
    distinct: &mut Distinct,
    compressor: &str,
    memory: MemoryOutcome,
    memories: Option<&std::sync::mpsc::Sender<Arc<str>>>,
) {
    if let (Some(memories), Some(row)) = (memories, &memory.ledger)
        && distinct
            .memories
            .insert(Arc::as_ptr(&row.memory) as *const u8 as usize)
    {
        let _ = memories.send(row.memory.clone());
    }
    outcome.ledger.extend(memory.ledger);
    outcome.results.extend(memory.results);
    for failure in memory.failures {
        if failure.reason == FailureKind::Cancelled.to_string() {
            outcome.cancelled += 1;
        } else {
            outcome.failures.push(failure);
        }
    }
    outcome.exposure_violations += usize::from(memory.exposure_violation);
    for (role, key, usage) in memory.calls {
        if role == Role::Compressor {
            let calls = match distinct.compressor_calls.get_mut(compressor) {
                Some(calls) => calls,
                None => distinct
                    .compressor_calls
                    .entry(compressor.to_owned())
                    .or_default(),
            };
            calls.insert(key.clone(), usage.clone());
        }
        distinct.calls.entry(role).or_default().insert(key, usage);
    }
    for role in memory.jobs {
        *outcome.jobs.entry(role).or_default() += 1;
    }
}

async fn run_memory(shared: &Arc<Shared>, index: usize) -> MemoryOutcome {
    let run = &shared.run;
    let job = &run.plan.memories[index];
    let source = &run.dataset.sources[job.source];
    let callback = &run.callbacks.compressors[&job.compressor];
    let goal_text = job
        .shown_goal
        .map(|(s, g)| run.dataset.sources[s].goals[g].text.as_str());
    // The request as sent, but for `context`, which is the source itself by construction.
    let skeleton = json!({
        "protocol": PROTOCOL,
        "role": "compressor",
        "goal": goal_text,
        "token_budget": job.budget,
        "seed": job.seed,
        "params": callback.params,
    });
    let exposure_violation = exposes(&skeleton, &run.plan.held_out[job.source]);
    if exposure_violation {
        tracing::error!(job = %job.key, "compressor request carries held-out text");
    }
    let mut outcome = MemoryOutcome {
        ledger: None,
        results: Vec::new(),
        failures: Vec::new(),
        exposure_violation,
        calls: Vec::new(),
        jobs: Vec::new(),
    };

    let started = Instant::now();
    let made = if job.budget == 0 {
        Ok((Arc::new(Measured::empty()), Origin::Skipped, Usage::default()))
    } else {
        outcome.jobs.push(Role::Compressor);
        make_memory(shared, callback, job, skeleton).await
    };
    let progress = run.progress.stage(Role::Compressor);
    let (measured, origin, usage) = match made {
        Ok(made) => made,
        Err((failure, culprit)) => {
            progress.failed.fetch_add(1, Ordering::Relaxed);
            trace_job(
                job,
                "compress",
                &job.key,
                &job.cache_key,
                started,
                None,
                Some(&failure),
            );
            outcome
                .failures
                .push(failure_row(job, "compress", &job.key, culprit, &failure, None));
            let reason = format!("the memory was not made: {culprit} {}", failure.kind);
            for question in &job.questions {
                outcome.results.push(result_row(
                    job,
                    source,
                    question,
                    None,
                    None,
                    Some(reason.clone()),
                ));
            }
            return outcome;
        }
    };
    progress.done.fetch_add(1, Ordering::Relaxed);
    if matches!(origin, Origin::Cache | Origin::Shared) {
        progress.cached.fetch_add(1, Ordering::Relaxed);
    }
    if origin != Origin::Skipped {
        outcome
            .calls
            .push((Role::Compressor, job.cache_key.clone(), usage));
    }
    trace_job(
        job,
        "compress",
        &job.key,
        &job.cache_key,
        started,
        Some(origin),
        None,
    );
    let memory_sha256 = measured.memory_sha256.clone();
    let memory = measured.memory.clone();
    let memory_tokens = measured.memory_tokens;
    outcome.ledger = Some(LedgerRow {
        seed: job.seed,
        compressor: job.compressor.clone(),
        condition: job.condition,
        ratio: job.ratio,
        source_id: job.source_id.clone(),
        goal_id: job.goal_id.clone(),
        shown_goal_id: job.shown_goal_id.clone(),
        source_tokens: job.source_tokens,
        budget: job.budget,
        generated_tokens: measured.generated_tokens,
        retained_tokens: measured.retained_tokens,
        unused_budget: job.budget - measured.retained_tokens,
        truncated: measured.truncated,
        memory_tokens,
        padding_tokens: 0,
        utf8_split: measured.utf8_split,
        truncation: run.truncation,
        budget_violation: memory_tokens > job.budget,
        memory_sha256: memory_sha256.clone(),
        key: job.key.clone(),
        cache_key: job.cache_key.clone(),
        cached: origin != Origin::Called,
        memory: measured.memory.clone(),
    });

    let mut answered: Vec<Option<QuestionOutcome>> = (0..job.questions.len()).map(|_| None).collect();
    let mut questions = JoinSet::new();
    for (position, _) in job.questions.iter().enumerate() {
        let shared = shared.clone();
        let memory = memory.clone();
        let memory_sha256 = memory_sha256.clone();
        let mut question = Box::pin(async move {
            let outcome = run_question(&shared, index, position, &memory, &memory_sha256).await;
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
        outcome.results.push(question.row);
        outcome.failures.extend(question.failure);
        outcome.calls.extend(question.calls);
        outcome
            .jobs
            .extend([Role::Reader, Role::Judge].into_iter().take(question.jobs));
    }
    outcome
}

/// A read or a judge of one question: what a failure of it is recorded under.
struct Step<'a> {
    stage: &'a str,
    job_key: &'a str,
    cache_key: &'a str,
    callback: &'a str,
    started: Instant,
}

impl QuestionOutcome {
    /// Records a failed step: progress, trace, the result row's reason and the failure row.
    fn fail(
        &mut self,
        progress: &StageProgress,
        job: &MemoryJob,
        step: &Step,
        failure: &Failure,
        question_id: &str,
    ) {
        progress.failed.fetch_add(1, Ordering::Relaxed);
        trace_job(
            job,
            step.stage,
            step.job_key,
            step.cache_key,
            step.started,
            None,
            Some(failure),
        );
        self.row.failure = Some(format!("{} {}", step.callback, failure.kind));
        self.failure = Some(failure_row(
            job,
            step.stage,
            step.job_key,
            step.callback,
            failure,
            Some(question_id),
        ));
    }
}

struct QuestionOutcome {
    row: ResultRow,
    failure: Option<FailureRow>,
    calls: Vec<(Role, String, Usage)>,
    jobs: usize,
}

async fn run_question(
    shared: &Arc<Shared>,
    index: usize,
    position: usize,
    memory: &str,
    memory_sha256: &str,
) -> QuestionOutcome {
    let run = &shared.run;
    let job = &run.plan.memories[index];
    let question_job = &job.questions[position];
    let source = &run.dataset.sources[job.source];
    let question = &source.goals[question_job.goal].questions[question_job.question];
    let reader = &run.callbacks.reader;
    let judge = &run.callbacks.judge;
    let mut outcome = QuestionOutcome {
        row: result_row(job, source, question_job, None, None, None),
        failure: None,
        calls: Vec::new(),
        jobs: 1,
    };

    let started = Instant::now();
    let read_key = plan::reader_key_with(
        &run.plan.reader_identity_json,
        memory_sha256,
        &run.plan.question_sha256[job.source][question_job.goal][question_job.question].question,
        job.seed,
    );
    let request = || {
        json!({
            "protocol": PROTOCOL,
            "role": "reader",
            "memory": memory,
            "question": question.question,
            "seed": job.seed,
            "params": reader.params,
        })
    };
    let description = json!({"job": "read", "cache_key": read_key});
    let read = obtain(shared, reader, &read_key, &description, request).await;
    let progress = run.progress.stage(Role::Reader);
    let answer = match read {
        Ok((response, origin)) => {
            note_done(progress, origin);
            trace_job(
                job,
                "read",
                &question_job.read_key,
                &read_key,
                started,
                Some(origin),
                None,
            );
            outcome.calls.push((Role::Reader, read_key, Usage::of(&response)));
            response
                .get("answer")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned()
        }
        Err(failure) => {
            let step = Step {
                stage: "read",
                job_key: &question_job.read_key,
                cache_key: &read_key,
                callback: &reader.name,
                started,
            };
            outcome.fail(progress, job, &step, &failure, &question.id);
            return outcome;
        }
    };
    outcome.row.answer = Some(answer.clone());

    outcome.jobs = 2;
    let started = Instant::now();
    let hashes = &run.plan.question_sha256[job.source][question_job.goal][question_job.question];
    let inputs = JudgeInputs {
        source_sha256: &run.plan.source_sha256[job.source],
        question_sha256: &hashes.question,
        reference_sha256: &hashes.reference,
        answer: &answer,
    };
    let judge_key = plan::judge_key_with(&run.plan.judge_identity_json, &inputs, job.seed);
    let request = || {
        json!({
            "protocol": PROTOCOL,
            "role": "judge",
            "source": source.text,
            "question": question.question,
            "reference": question.reference,
            "answer": answer,
            "seed": job.seed,
            "params": judge.params,
        })
    };
    let description = json!({"job": "judge", "cache_key": judge_key});
    let judged = obtain(shared, judge, &judge_key, &description, request).await;
    let progress = run.progress.stage(Role::Judge);
    match judged {
        Ok((response, origin)) => {
            note_done(progress, origin);
            trace_job(
                job,
                "judge",
                &question_job.judge_key,
                &judge_key,
                started,
                Some(origin),
                None,
            );
            outcome.row.correct = response.get("correct").and_then(Value::as_bool);
            outcome.row.score = response.get("score").and_then(Value::as_f64);
            outcome.calls.push((Role::Judge, judge_key, Usage::of(&response)));
        }
        Err(failure) => {
            let step = Step {
                stage: "judge",
                job_key: &question_job.judge_key,
                cache_key: &judge_key,
                callback: &judge.name,
                started,
            };
            outcome.fail(progress, job, &step, &failure, &question.id);
        }
    }
    outcome
}

fn note_done(progress: &StageProgress, origin: Origin) {
    progress.done.fetch_add(1, Ordering::Relaxed);
    if matches!(origin, Origin::Cache | Origin::Shared) {
        progress.cached.fetch_add(1, Ordering::Relaxed);
    }
}

/// Answers a call from the cache, from an identical call of this run, or by calling.
async fn obtain(
    shared: &Shared,
    callback: &Callback,
    key: &str,
    description: &Value,
    request: impl Fn() -> Value,
) -> Result<(Value, Origin), Failure> {
    let role = callback.role;
    // The common case at scale: answered by the cache, with no bookkeeping.
    if let Some(response) = shared.run.cache.get(role.as_str(), key) {
        shared.calls.count(role, |c| c.cached += 1);
        return Ok((response, Origin::Cache));
    }
    if shared.stopped.load(Ordering::Relaxed) {
        return Err(Failure {
            kind: FailureKind::Cancelled,
            stderr_tail: String::new(),
            attempts: 0,
        });
    }
    let slot = shared.calls.slot(role, key);
    let mut origin = Origin::Shared;
    let result = slot
        .get_or_init(|| {
            origin = Origin::Called;
            async {
                if let Some(response) = shared.run.cache.get(role.as_str(), key) {
                    return Ok((response, true));
                }
                // Each attempt's trace event carries the call's cache key through this span.
                let span = tracing::info_span!("call", key = %key);
                let answer = callback.call(request, &shared.run_limit).instrument(span).await?;
                if let Err(error) = shared.run.cache.put(role.as_str(), key, description, &answer.response) {
                    tracing::error!(callback = %callback.name, key, %error, "could not write the cache entry");
                }
                Ok((answer.response, false))
            }
        })
        .await;
    if origin == Origin::Called {
        // Later identical calls find the cache; only calls in flight need the slot.
        shared
            .calls
            .slots
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&(role, key.to_owned()));
    }
    let result: Result<Value, Failure> = match (result, origin) {
        (Ok((response, from_cache)), Origin::Called) => {
            if *from_cache {
                origin = Origin::Cache;
                shared.calls.count(role, |c| c.cached += 1);
            } else {
                shared.calls.count(role, |c| c.made += 1);
                let mut paid = shared.calls.paid.lock().unwrap_or_else(|e| e.into_inner());
                paid.entry(role).or_default().add(response);
            }
            Ok(response.clone())
        }
        (Ok((response, _)), _) => {
            shared.calls.count(role, |c| c.shared += 1);
            Ok(response.clone())
        }
        (Err(failure), origin) => {
            if origin == Origin::Called {
                shared.calls.count(role, |c| c.failed += 1);
                if shared.run.fail_fast && failure.kind != FailureKind::Cancelled {
                    shared.stopped.store(true, Ordering::Relaxed);
                    // Calls already waiting for a slot are cancelled too, not started.
                    shared.run_limit.close();
                }
            }
            Err(failure.clone())
        }
    };
    result.map(|response| (response, origin))
}

/// True when a compressor request (all but its `context`, which is the source itself by
/// construction) carries a field outside SPEC §3, or held-out text of its source's goals
/// (a question or reference that the source itself does not contain).
pub fn exposes(request: &Value, held_out: &[String]) -> bool {
    const ALLOWED: &[&str] = &[
        "protocol",
        "role",
        "context",
        "goal",
        "token_budget",
        "seed",
        "params",
    ];
    let Some(fields) = request.as_object() else {
        return true;
    };
    if fields.keys().any(|k| !ALLOWED.contains(&k.as_str())) {
        return true;
    }
    let mut visible = Vec::new();
    collect_strings(request, &mut visible);
    held_out
        .iter()
        .any(|text| visible.iter().any(|v| v.contains(text.as_str())))
}

fn collect_strings<'a>(value: &'a Value, out: &mut Vec<&'a str>) {
    match value {
        Value::String(s) => out.push(s),
        Value::Array(items) => items.iter().for_each(|v| collect_strings(v, out)),
        Value::Object(fields) => fields.iter().for_each(|(k, v)| {
            out.push(k);
            collect_strings(v, out)
        }),
        _ => {}
    }
}

fn result_row(
    job: &MemoryJob,
    source: &crate::inputs::records::Source,
    question: &QuestionJob,
    answer: Option<String>,
    correct: Option<bool>,
    failure: Option<String>,
) -> ResultRow {
    let goal = &source.goals[question.goal];
    ResultRow {
        seed: job.seed,
        compressor: job.compressor.clone(),
        condition: job.condition,
        ratio: job.ratio,
        source_id: job.source_id.clone(),
        goal_id: goal.id.clone(),
        question_id: goal.questions[question.question].id.clone(),
        memory_key: job.key.clone(),
        answer,
        correct,
        score: None,
        failure,
    }
}

/// A memory and the counts the ledger records about it.
#[derive(Debug, Clone)]
struct Measured {
    memory: Arc<str>,
    memory_sha256: String,
    generated_tokens: usize,
    retained_tokens: usize,
    truncated: bool,
    utf8_split: bool,
    memory_tokens: usize,
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
        }
    }

    fn to_json(&self, usage: &Usage) -> Value {
        // The text itself is stored once under its hash (kind `text`): memories repeat.
        json!({
            "memory_sha256": self.memory_sha256,
            "generated_tokens": self.generated_tokens,
            "retained_tokens": self.retained_tokens,
            "truncated": self.truncated,
            "utf8_split": self.utf8_split,
            "memory_tokens": self.memory_tokens,
            "usage": usage,
        })
    }

    fn from_json(shared: &Shared, entry: &Value) -> Option<(Measured, Usage)> {
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
        };
        let mut usage = Usage::default();
        usage.add(entry);
        Some((measured, usage))
    }
}

/// The cache key of a memory as measured: its generation cut to its budget, counted.
pub fn memory_key(job: &MemoryJob, tokenizer_identity: &Value, truncation: TruncationMode) -> String {
    crate::store::cache::key(&json!({
        "kind": "memory",
        "compressor_key": job.cache_key,
        "tokenizer": tokenizer_identity,
        "budget": job.budget,
        "truncation": truncation,
    }))
}

/// Makes a memory: from the cache of truncated memories, or by obtaining the generation
/// (cache or call) and cutting it to its budget, which is then stored for next time.
async fn make_memory<'a>(
    shared: &Shared,
    callback: &'a Callback,
    job: &MemoryJob,
    skeleton: Value,
) -> Result<(Arc<Measured>, Origin, Usage), (Failure, &'a str)> {
    let run = &shared.run;
    let memory_key = memory_key(job, &run.plan.tokenizer_identity, run.truncation);
    if let Some((measured, usage)) = run
        .cache
        .get("memory", &memory_key)
        .as_ref()
        .and_then(|entry| Measured::from_json(shared, entry))
    {
        shared.calls.count(Role::Compressor, |c| c.cached += 1);
        return Ok((Arc::new(measured), Origin::Cache, usage));
    }
    let source = &run.dataset.sources[job.source];
    let request = || {
        let mut request = skeleton.clone();
        if let Value::Object(fields) = &mut request {
            fields.insert("context".into(), Value::String(source.text.clone()));
        }
        request
    };
    let description = json!({"job": "compress", "cache_key": job.cache_key});
    let (response, origin) = obtain(shared, callback, &job.cache_key, &description, request)
        .await
        .map_err(|failure| (failure, callback.name.as_str()))?;
    let mut usage = Usage::default();
    usage.add(&response);
    let measured = measure(shared, &response, job.budget)
        .await
        .map_err(|failure| (failure, "tokenizer"))?;
    let description = json!({"job": "memory", "compressor_key": job.cache_key, "budget": job.budget});
    let text_key = &measured.memory_sha256;
    if !run.cache.contains("text", text_key) {
        let text = json!({"memory": &*measured.memory});
        if let Err(error) = run.cache.put("text", text_key, &json!({"job": "text"}), &text) {
            tracing::error!(key = %text_key, %error, "could not write the cache entry");
        }
    }
    if let Err(error) = run
        .cache
        .put("memory", &memory_key, &description, &measured.to_json(&usage))
    {
        tracing::error!(key = memory_key, %error, "could not write the cache entry");
    }
    Ok((measured, origin, usage))
}

/// Cuts a generation to its budget and counts the memory again, off the async workers
/// (tokenizing is CPU work, and an external tokenizer blocks); identical generations of a
/// run are measured once.
async fn measure(shared: &Shared, response: &Value, budget: usize) -> Result<Arc<Measured>, Failure> {
    let run = &shared.run;
    let generation = response
        .get("memory")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    let memo_key = (sha256(&generation), budget);
    if let Some(measured) = shared
        .measured
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&memo_key)
    {
        return Ok(measured.clone());
    }
    let tokenizer = run.tokenizer.clone();
    let mode = run.truncation;
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
        })
    })
    .await;
    let error = match measured {
        Ok(Ok(mut measured)) => {
            measured.memory = shared.intern(&measured.memory_sha256, &measured.memory);
            let measured = Arc::new(measured);
            shared
                .measured
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(memo_key, measured.clone());
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

fn failure_row(
    job: &MemoryJob,
    stage: &str,
    key: &str,
    callback: &str,
    failure: &Failure,
    question_id: Option<&str>,
) -> FailureRow {
    tracing::warn!(
        job = key,
        stage,
        callback,
        reason = %failure.kind,
        attempts = failure.attempts,
        stderr = %failure.stderr_tail,
        "job failed"
    );
    FailureRow {
        job: key.to_owned(),
        stage: stage.to_owned(),
        callback: callback.to_owned(),
        reason: failure.kind.to_string(),
        attempts: failure.attempts,
        stderr_tail: failure.stderr_tail.clone(),
        seed: job.seed,
        compressor: job.compressor.clone(),
        condition: job.condition,
        ratio: job.ratio,
        source_id: job.source_id.clone(),
        question_id: question_id.map(str::to_owned),
    }
}

fn trace_job(
    job: &MemoryJob,
    stage: &str,
    key: &str,
    cache_key: &str,
    started: Instant,
    origin: Option<Origin>,
    failure: Option<&Failure>,
) {
    let duration_ms = started.elapsed().as_secs_f64() * 1000.0;
    let cache_hit = matches!(origin, Some(Origin::Cache | Origin::Shared));
    let skipped = origin == Some(Origin::Skipped);
    let failed = failure.is_some();
    // The job's seed, condition, ratio and source are in plan.json under its key.
    crate::trace::job_finished(&crate::trace::JobFinished {
        job: key,
        stage,
        cache_key,
        compressor: &job.compressor,
        duration_ms,
        cache_hit,
        skipped,
        failed,
    });
    // The terminal shows every job only when asked to (`-vv`, `RUST_LOG`).
    if tracing::enabled!(target: crate::trace::JOB_TARGET, tracing::Level::INFO) {
        tracing::info!(
            target: crate::trace::JOB_TARGET,
            job = key,
            stage,
            cache_key,
            compressor = job.compressor.as_str(),
            duration_ms,
            cache_hit,
            skipped,
            failed,
            "job finished"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposure_audit() {
        let exposes = |request: &Value, source: &str, texts: &[&str]| {
            exposes(request, &crate::plan::held_out(source, texts.iter().copied()))
        };
        let request = json!({"protocol": "gacc/1", "role": "compressor", "context": "the sky is blue",
            "goal": "learn colours", "token_budget": 3, "seed": 0, "params": {}});
        assert!(!exposes(
            &request,
            "the sky is blue",
            &["What colour is the sky?", "blue"]
        ));
        let mut leaky = request.clone();
        leaky["goal"] = json!("learn colours: What colour is the sky?");
        assert!(exposes(
            &leaky,
            "the sky is blue",
            &["What colour is the sky?", "blue"]
        ));
        let mut extra = request.clone();
        extra["question_ids"] = json!(["q1"]);
        assert!(exposes(&extra, "the sky is blue", &[]));
        let mut in_params = request.clone();
        in_params["params"] = json!({"hint": "What colour is the sky?"});
        assert!(exposes(
            &in_params,
            "the sky is blue",
            &["What colour is the sky?"]
        ));
    }
}
