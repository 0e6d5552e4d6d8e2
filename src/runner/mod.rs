//! Runs a plan on this machine: every memory, then every question read from it and judged,
//! with calls answered from the cache where they can be and identical calls made once.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use tokio::sync::Semaphore;
use tokio::task::JoinSet;

mod audit;
mod calls;
mod memory;
mod progress;
mod question;
mod rows;

pub(crate) use progress::{CallCounts, Progress, Usage};

use crate::exec::callback::{Callback, FailureKind};
use crate::inputs::dataset::Dataset;
use crate::inputs::tokenizer::Tokenizer;
use crate::plan::Plan;
use crate::protocol::Role;
use crate::protocol::TruncationMode;
use crate::store::cache::Cache;
use crate::store::ledger::{FailureRow, LedgerRow, ResultRow};
use calls::Calls;
use memory::{Measured, run_memory};

/// The callbacks of one run, ready to call.
#[derive(Debug)]
pub(crate) struct Callbacks {
    pub compressors: BTreeMap<String, Callback>,
    pub reader: Callback,
    pub judge: Callback,
}

/// Everything a run shares between its tasks.
pub(crate) struct Setup {
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

/// What a run produced, in plan order.
#[derive(Debug, Default)]
pub(crate) struct Outcome {
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

/// A call's response and whether it came from the cache, or its failure.
/// Memory jobs in flight per slot of run concurrency (each with all its questions).
const JOBS_IN_FLIGHT_PER_SLOT: usize = 16;
const MIN_JOBS_IN_FLIGHT: usize = 64;

pub(super) struct Shared {
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
pub(super) struct MemoryOutcome {
    ledger: Option<LedgerRow>,
    results: Vec<ResultRow>,
    failures: Vec<FailureRow>,
    exposure_violation: bool,
    calls: Vec<(Role, String, Usage)>,
    jobs: Vec<Role>,
}

/// Runs every job of the plan; never fails as a whole: failed jobs are in the outcome.
pub(crate) async fn execute(mut run: Setup) -> Outcome {
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
                let compressor = &shared.run.plan.memories[folded].id.cell.compressor;
                fold(&mut outcome, &mut distinct, compressor, memory, memories.as_ref());
            }
            folded += 1;
        }
    }
    // A task that stopped unexpectedly leaves a gap; what follows it is still kept.
    for (index, memory) in outcomes.into_iter().enumerate().skip(folded) {
        if let Some(memory) = memory {
            let compressor = &shared.run.plan.memories[index].id.cell.compressor;
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
