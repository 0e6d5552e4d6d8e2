//! Runs a plan on this machine: every memory, then every question read from it and judged,
//! with calls answered from the cache where they can be and identical calls made once.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use tokio::sync::Semaphore;
use tokio::task::JoinSet;

mod batches;
mod calls;
mod costs;
mod distinct;
mod exposure;
mod ladder;
mod memory;
mod progress;
mod question;
mod rows;
mod stop;

pub(crate) use batches::Batches;
pub(crate) use progress::{CallCounts, Progress, Usage};
pub(crate) use stop::Stop;

use crate::exec::callback::{Callback, FailureKind};
use crate::hash::key_bytes;
use crate::inputs::dataset::Dataset;
use crate::inputs::manifest::{CallbackSpec, Manifest};
use crate::inputs::tokenizer::Tokenizer;
use crate::parallel::Locked;
use crate::plan::Plan;
use crate::protocol::TruncationMode;
use crate::protocol::{CallbackSet, Role};
use crate::store::cache::{Cache, Kind};
use crate::store::ledger::{CallKeys, FailureRow, LedgerRow, ResultRow};
use crate::store::row_sink::{RowLines, RowSink, Written};
use calls::CallBook;
pub(crate) use costs::CellCost;
use distinct::DistinctCalls;
pub(crate) use distinct::{CallKey, Distinct};
use memory::{Measured, run_memory};

/// The callbacks of one run, ready to call.
pub(crate) type Callbacks = CallbackSet<Callback>;

/// One callback per callback a run calls (`Manifest::callback_set`), each made by `make` from
/// its key (`compressors.NAME`, `reader`, `judge`, `judges.NAME`, `readers.NAME`), its role and its table.
pub(crate) fn callbacks_of_manifest(
    manifest: &Manifest,
    mut make: impl FnMut(String, Role, &CallbackSpec) -> Callback,
) -> Callbacks {
    manifest
        .callback_set()
        .map(|key, role, spec| make(key, role, spec))
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
    /// Memory jobs in flight at once, when the default window is too small: a provider batch
    /// gathers every call that is ready, so a batch endpoint wants them all.
    pub jobs_in_flight: Option<usize>,
    /// Where each memory's rows are written as they fold (the run folder's row files).
    pub rows: Option<RowSink>,
    /// With `Some`, only the callbacks named may call; any other call the cache does not
    /// answer fails (`gacc verify`'s replay, and its `--rejudge` judge).
    pub offline: Option<Vec<String>>,
    /// The failures a replayed run recorded, by job key (`gacc verify`): a job the replay
    /// cannot run because its call failed then (and so was never cached) fails as it did.
    pub replayed_failures: HashMap<String, FailureRow>,
    /// Goals read in batches, a check after each (`[run] stop`); None: plan order, no check.
    pub batches: Option<Batches>,
    /// Whether the outcome keeps every ledger and result row (a run's report reads them);
    /// `gacc plan` only counts, and a plan of a million seeds holds no row.
    pub keep_rows: bool,
}

/// What a run produced, in plan order.
#[derive(Debug, Default)]
pub(crate) struct Outcome {
    pub ledger: Vec<LedgerRow>,
    pub results: Vec<ResultRow>,
    pub failures: Vec<FailureRow>,
    pub exposure_violations: usize,
    /// This run's calls per role, and the audit's (audit judges and panel readers) apart.
    pub this_run: BTreeMap<Role, CallCounts>,
    pub audit_calls: CallCounts,
    /// What this run paid, per role (calls it made).
    pub paid: BTreeMap<Role, Usage>,
    /// Every distinct successful call the results rest on, per role, with the usage it reported.
    pub calls: BTreeMap<Role, Distinct>,
    /// Jobs per role that needed a call (all but `L = 0` memories).
    pub jobs: BTreeMap<Role, usize>,
    /// Jobs not run because the run stopped early.
    pub cancelled: usize,
    /// Each compressor's distinct calls, with their usage.
    pub compressor_calls: BTreeMap<String, Distinct>,
    /// What each cell's memories and reads cost (SPEC §15).
    pub cell_costs: HashMap<crate::protocol::CellId, CellCost>,
    /// Why the run stopped before its plan was done, if it did.
    pub stop: Option<Stop>,
    /// What the row sink wrote, when there was one.
    pub written: Option<Result<Written, crate::error::Error>>,
}

/// Memory jobs in flight per slot of run concurrency (each with all its questions).
const JOBS_IN_FLIGHT_PER_SLOT: usize = 16;
/// Memory jobs in flight at the least, however small the run's concurrency.
const MIN_JOBS_IN_FLIGHT: usize = 64;

/// The memory jobs in flight at once for a run's concurrency, unless the run says otherwise.
pub(crate) fn default_window(concurrency: usize) -> usize {
    (JOBS_IN_FLIGHT_PER_SLOT * concurrency).max(MIN_JOBS_IN_FLIGHT)
}

/// The most normalised memory text a run keeps (`RunState::normalised`). The paper-scale bench's
/// 64,050 memories are 9,554 texts, 48 MB normalised; a run whose every memory differs keeps
/// the first 64 MB and normalises the rest once each, as it must.
const NORMALISED_BYTES: usize = 64 << 20;

impl RunState {
    /// A memory's text normalised for its evidence (SPEC §11): this run's copy, else made (and
    /// kept while the copies stay under `NORMALISED_BYTES`).
    fn normalised(&self, sha256: &str, text: &str) -> Arc<[u8]> {
        if let Some(normalised) = self.normalised.locked().0.get(sha256) {
            return normalised.clone();
        }
        let mut bytes = Vec::new();
        crate::builtin::text::normalize_into(text, &mut bytes);
        let normalised: Arc<[u8]> = bytes.into();
        let mut kept = self.normalised.locked();
        if kept.1 + normalised.len() <= NORMALISED_BYTES {
            kept.1 += normalised.len();
            kept.0.insert(sha256.to_owned(), normalised.clone());
        }
        normalised
    }
}

/// Normalised memory texts by SHA-256.
type NormalisedTexts = HashMap<String, Arc<[u8]>>;

/// What a run's tasks share: the setup, the book of calls, the limits and what is measured.
pub(super) struct RunState {
    setup: Setup,
    calls: CallBook,
    run_limit: Semaphore,
    /// Memories already measured in this run, by (SHA-256 of the generation, budget).
    measured: Mutex<HashMap<(String, usize), Arc<Measured>>>,
    /// One copy of each memory text, by its SHA-256, however many rows and tasks hold it.
    memories: Mutex<HashMap<String, Arc<str>>>,
    /// Memory texts normalised for their evidence (SPEC §11), by SHA-256, up to
    /// `NORMALISED_BYTES` in all: jobs that share a memory (a compressor that ignores the goal,
    /// under each condition) normalise it once.
    normalised: Mutex<(NormalisedTexts, usize)>,
    /// Tokenizing runs on at most this many threads at once (it is CPU work).
    tokenizing: Semaphore,
    /// What the recount's proven counts are bound to (a ledger row names its memory's).
    count_identity: String,
    /// Whether each memory's task writes its rows' lines (the run has a row sink).
    writes_rows: bool,
    /// Set by the first failure under `--fail-fast`, a refused key or the spending cap: no
    /// new call starts.
    stopped: std::sync::atomic::AtomicBool,
    /// Why the run stopped early, the first reason only.
    stop: Mutex<Option<Stop>>,
    /// Each budget ladder's rungs (SPEC §14), by its key.
    ladders: ladder::Ladders,
    /// The exposure audit's findings, once per request shape.
    exposures: exposure::Exposures,
}

impl RunState {
    /// Stops the run: no new call starts, and calls waiting for a slot are cancelled.
    fn stop(&self, why: Stop) {
        self.stop.locked().get_or_insert(why);
        self.stopped.store(true, Ordering::Relaxed);
        self.run_limit.close();
    }

    /// A write that failed: the first stops the run (no new call starts); each counts.
    fn lost_write(&self, what: &str, answers: usize) {
        let mut stop = self.stop.locked();
        match stop.as_mut() {
            Some(Stop::LostWrite { lost, .. }) => *lost += answers,
            Some(_) => {}
            None => {
                *stop = Some(Stop::LostWrite {
                    what: what.to_owned(),
                    lost: answers,
                });
                tracing::error!(error = what, "a write failed: no new call starts");
            }
        }
        drop(stop);
        self.stopped.store(true, Ordering::Relaxed);
        self.run_limit.close();
    }

    /// A memory's text by its hash: from this run's copies, else from the cache.
    fn memory_text(&self, sha256: &str) -> Option<Arc<str>> {
        if let Some(text) = self.memories.locked().get(sha256) {
            return Some(text.clone());
        }
        let entry = self.setup.cache.get(Kind::Text, sha256)?;
        let text = crate::protocol::messages::read::<crate::protocol::messages::CompressorResponse>(&entry)?;
        Some(self.intern(sha256, &text.memory))
    }

    fn intern(&self, sha256: &str, text: &str) -> Arc<str> {
        let mut memories = self.memories.locked();
        memories
            .entry(sha256.to_owned())
            .or_insert_with(|| Arc::from(text))
            .clone()
    }
}

/// The result of one memory job and its questions.
pub(super) struct MemoryOutcome {
    /// The memory's row and its questions', each with the cache entries it rests on.
    ledger: Option<(LedgerRow, CallKeys)>,
    results: Vec<(ResultRow, CallKeys)>,
    /// Those rows as their files hold them, when the run writes them.
    lines: Option<RowLines>,
    failures: Vec<FailureRow>,
    exposure_violation: bool,
    calls: Vec<(Role, String, Usage)>,
    /// The wall time of the compressor call among `calls`, where known.
    compressor_wall_ms: Option<u64>,
    jobs: Vec<Role>,
}

/// Runs every job of the plan; never fails as a whole: failed jobs are in the outcome.
pub(crate) async fn execute(mut run: Setup) -> Outcome {
    // Held here, not in what tasks share, so it is closed when the run is over.
    let memories = run.memories.take();
    let mut rows = run.rows.take();
    let mut reading = batches::Reading::of(run.batches.take(), run.plan.memories.len());
    count_jobs(&run.progress, &run.plan);
    let count_identity = crate::plan::keys::count_identity(run.tokenizer.as_ref());
    let ladders = ladder::ladders(&run.plan);
    let shared = Arc::new(RunState {
        count_identity,
        ladders,
        writes_rows: rows.is_some(),
        run_limit: Semaphore::new(run.concurrency.max(1)),
        setup: run,
        calls: CallBook::default(),
        measured: Mutex::default(),
        memories: Mutex::default(),
        normalised: Mutex::default(),
        tokenizing: Semaphore::new(std::thread::available_parallelism().map_or(2, |n| n.get())),
        stopped: Default::default(),
        stop: Mutex::default(),
        exposures: Default::default(),
    });
    // A window of memory jobs in flight, each with its questions: enough to keep every
    // callback busy, few enough that a million-job plan never lives in memory at once.
    let window = (shared.setup.jobs_in_flight).unwrap_or(default_window(shared.setup.concurrency));
    let total = shared.setup.plan.memories.len();
    let mut tasks = JoinSet::new();
    let mut next = 0;
    let mut outcomes: Vec<Option<MemoryOutcome>> = (0..total).map(|_| None).collect();
    // Finished memories are folded into the outcome in plan order while later ones run.
    let mut folded = 0;
    let mut outcome = Outcome {
        ledger: Vec::with_capacity(total),
        results: Vec::with_capacity(shared.setup.plan.question_jobs()),
        ..Outcome::default()
    };
    let mut distinct = DistinctCalls::sized_for(&shared.setup.plan);
    loop {
        while next < reading.limit() && tasks.len() < window {
            let shared = shared.clone();
            let index = reading.job(next);
            tasks.spawn(async move { (index, run_memory(&shared, index).await) });
            next += 1;
        }
        match tasks.join_next().await {
            None if next >= reading.total() => break,
            None => {
                // A batch of goals is read: the check may stop the run before the next starts.
                let Some(why) = reading.batch_read() else { continue };
                shared.stop(Stop::Early(why));
                break;
            }
            Some(Ok((index, memory))) => {
                reading.saw(&memory);
                outcomes[index] = Some(memory);
            }
            Some(Err(error)) => tracing::error!(%error, "a job task stopped unexpectedly"),
        }
        let mut folding = Folding {
            outcome: &mut outcome,
            distinct: &mut distinct,
            memories: memories.as_ref(),
            rows: rows.as_mut(),
            keep_rows: shared.setup.keep_rows,
        };
        while folded < total && outcomes[folded].is_some() {
            if let Some(memory) = outcomes[folded].take() {
                folding.fold(&shared.setup.plan.memories[folded].id, memory);
            }
            // A row file that can no longer be written (a full disk) stops the run as a lost
            // cache entry does: the calls made from here on could not be shown.
            if let Some(what) = folding.rows.as_deref_mut().and_then(RowSink::failure) {
                shared.lost_write(&what, 0);
            }
            folded += 1;
        }
    }
    let mut folding = Folding {
        outcome: &mut outcome,
        distinct: &mut distinct,
        memories: memories.as_ref(),
        rows: rows.as_mut(),
        keep_rows: shared.setup.keep_rows,
    };
    // A task that stopped unexpectedly leaves a gap; what follows it is still kept.
    for (index, memory) in outcomes.into_iter().enumerate().skip(folded) {
        if let Some(memory) = memory {
            folding.fold(&shared.setup.plan.memories[index].id, memory);
        }
    }
    outcome.written = rows.map(RowSink::finish);
    trace_stages(&shared.setup.progress);
    distinct::settle(&mut outcome, distinct, &shared);
    outcome
}

/// Each stage's total jobs, for the progress line.
fn count_jobs(progress: &Progress, plan: &Plan) {
    for memory in &plan.memories {
        let questions = memory.questions.len();
        for (role, jobs) in [
            (Role::Compressor, 1),
            (Role::Reader, questions),
            (Role::Judge, questions),
        ] {
            progress.stage(role).total.fetch_add(jobs, Ordering::Relaxed);
        }
    }
}

/// Each stage's summary in the trace: what its jobs came to, those served without a call
/// included (they get no line of their own).
pub(crate) fn trace_stages(progress: &progress::Progress) {
    for stage in crate::protocol::Stage::ALL {
        let counts = progress.stage(stage.role());
        let load = |counter: &std::sync::atomic::AtomicUsize| counter.load(Ordering::Relaxed);
        let (done, cached, shared, skipped, failed) = (
            load(&counts.done),
            load(&counts.cached),
            load(&counts.shared),
            load(&counts.skipped),
            load(&counts.failed),
        );
        let count = |n: usize| n as u64;
        crate::trace::record(&crate::trace::TraceEvent::StageFinished {
            stage,
            planned: count(load(&counts.total)),
            finished: count(done + failed),
            called: count(done - cached - shared - skipped),
            cached: count(cached),
            shared: count(shared),
            skipped: count(skipped),
            failed: count(failed),
        });
    }
}

/// Where finished memories go, in plan order: the outcome, the distinct calls, the recount
/// (each distinct memory text) and the row files.
struct Folding<'a> {
    outcome: &'a mut Outcome,
    distinct: &'a mut DistinctCalls,
    memories: Option<&'a std::sync::mpsc::Sender<Arc<str>>>,
    rows: Option<&'a mut RowSink>,
    keep_rows: bool,
}

impl Folding<'_> {
    /// Adds one memory's rows, failures and calls to the run's outcome.
    fn fold(&mut self, id: &crate::protocol::MemoryId, mut memory: MemoryOutcome) {
        if let (Some(rows), Some(lines)) = (self.rows.as_deref_mut(), memory.lines.take()) {
            rows.memory(lines);
        }
        fold(
            self.outcome,
            self.distinct,
            id,
            memory,
            (self.memories, self.keep_rows),
        );
    }
}

/// Adds one memory's rows, failures and calls to the run's outcome.
fn fold(
    outcome: &mut Outcome,
    distinct: &mut DistinctCalls,
    id: &crate::protocol::MemoryId,
    memory: MemoryOutcome,
    (memories, keep_rows): (Option<&std::sync::mpsc::Sender<Arc<str>>>, bool),
) {
    if let (Some(memories), Some((row, _))) = (memories, &memory.ledger)
        && distinct
            .memories
            .insert(Arc::as_ptr(&row.memory) as *const u8 as usize)
    {
        let _ = memories.send(row.memory.clone());
    }
    let found = memory.ledger.as_ref().is_some_and(|(row, _)| row.cached);
    if keep_rows {
        outcome.ledger.extend(memory.ledger.map(|(row, _)| row));
        outcome
            .results
            .extend(memory.results.into_iter().map(|(row, _)| row));
    }
    for failure in memory.failures {
        if failure.reason == FailureKind::Cancelled.to_string() {
            outcome.cancelled += 1;
        } else {
            outcome.failures.push(failure);
        }
    }
    outcome.exposure_violations += usize::from(memory.exposure_violation);
    let (compressor, seed) = (id.cell.compressor.as_str(), id.seed);
    for (role, key, usage) in memory.calls {
        let key = key_bytes(&key);
        match role {
            Role::Compressor => distinct.costs.compressor(
                &id.cell,
                costs::CompressorCall {
                    key,
                    usage: &usage,
                    wall_ms: memory.compressor_wall_ms,
                    cached: found,
                },
            ),
            Role::Reader => distinct.costs.read(&id.cell, key, &usage),
            Role::Judge | Role::Writer => {}
        }
        if role == Role::Compressor {
            let calls = match distinct.compressor_calls.get_mut(compressor) {
                Some(calls) => calls,
                None => distinct
                    .compressor_calls
                    .entry(compressor.to_owned())
                    .or_default(),
            };
            calls.insert(key, seed, &usage);
        }
        distinct.calls.entry(role).or_default().insert(key, seed, &usage);
    }
    for role in memory.jobs {
        *outcome.jobs.entry(role).or_default() += 1;
    }
}

#[cfg(test)]
mod tests {
    //! The scheduler in process: a scripted launcher answers every attempt (as the fixture's
    //! built-ins would, or as a test says), so dedupe, fail-fast and resume are seen call by call.

    use std::path::{Path, PathBuf};
    use std::time::Duration;

    use serde_json::Value;

    use super::*;
    use crate::exec::callback::{Attempt, AttemptFuture, Launcher};
    use crate::inputs::tokenizer::Cl100k;

    type Answer = dyn Fn(&Callback, &Value) -> Result<Value, FailureKind> + Send + Sync;

    /// Answers each attempt with `answer` and logs it: (callback name, request).
    struct Scripted {
        answer: Box<Answer>,
        log: Mutex<Vec<(String, Value)>>,
    }

    impl std::fmt::Debug for Scripted {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("Scripted")
        }
    }

    impl Launcher for Scripted {
        fn attempt<'a>(
            &'a self,
            callback: &'a Callback,
            _key: &'a str,
            request: &'a [u8],
        ) -> AttemptFuture<'a> {
            let request: Value = serde_json::from_slice(request).unwrap_or(Value::Null);
            let result = (self.answer)(callback, &request);
            // Compressor calls last long enough that identical ones of the run overlap.
            let lasts = match callback.role {
                Role::Compressor => Duration::from_millis(100),
                _ => Duration::from_millis(2),
            };
            self.log.lock().unwrap().push((callback.name.clone(), request));
            Box::pin(async move {
                tokio::time::sleep(lasts).await;
                Attempt {
                    result,
                    stderr_tail: String::new(),
                    stderr_of_worker: false,
                }
            })
        }
    }

    impl Scripted {
        fn new(
            answer: impl Fn(&Callback, &Value) -> Result<Value, FailureKind> + Send + Sync + 'static,
        ) -> Arc<Scripted> {
            Arc::new(Scripted {
                answer: Box::new(answer),
                log: Mutex::default(),
            })
        }

        /// Attempts made, per callback name.
        fn count(&self, name: &str) -> usize {
            self.log.lock().unwrap().iter().filter(|(n, _)| n == name).count()
        }
    }

    /// The answer of the built-in a callback names in its identity.
    fn builtin(callback: &Callback, request: &Value) -> Result<Value, FailureKind> {
        let name = callback.identity["program"]["builtin"]
            .as_str()
            .unwrap_or_default();
        crate::builtin::respond(name, request).map_err(|message| FailureKind::Reported {
            message,
            retryable: false,
        })
    }

    fn fixture() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("experiments/fixture.toml")
    }

    /// The fixture's plan (with `sets`) and callbacks on `launcher`, over the cache in `cache`.
    fn setup(sets: &[&str], launcher: Arc<Scripted>, cache: &Path, fail_fast: bool) -> Setup {
        let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
        let (loaded, problems) = crate::inputs::manifest::load(&fixture(), &sets).unwrap();
        assert!(problems.is_empty(), "{problems:?}");
        let dataset = crate::inputs::dataset::load(&loaded).unwrap();
        let tokenizer: Arc<dyn Tokenizer> = Arc::new(Cl100k::new());
        let plan = crate::plan::plan(&loaded, &dataset, tokenizer.as_ref()).unwrap();
        let callback = |name: String, role: Role, spec: &crate::inputs::manifest::CallbackSpec| Callback {
            retries: spec.retries,
            params: spec.params.clone(),
            identity: crate::plan::keys::callback_identity(spec),
            limit: Arc::new(Semaphore::new(4)),
            ..Callback::new(name, role, launcher.clone())
        };
        let manifest = &loaded.manifest;
        let callbacks = super::callbacks_of_manifest(manifest, callback);
        Setup {
            plan: Arc::new(plan),
            dataset: Arc::new(dataset),
            callbacks,
            cache: Cache::open(cache).unwrap(),
            tokenizer,
            truncation: manifest.truncation,
            concurrency: 4,
            progress: Arc::new(Progress::default()),
            fail_fast,
            memories: None,
            jobs_in_flight: None,
            rows: None,
            offline: None,
            replayed_failures: HashMap::new(),
            batches: None,
            keep_rows: true,
        }
    }

    fn run(setup: Setup) -> Outcome {
        tokio::runtime::Runtime::new().unwrap().block_on(execute(setup))
    }

    fn scratch(name: &str) -> PathBuf {
        let path = std::env::temp_dir().join(format!("gacc-runner-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        path
    }

    #[test]
    fn identical_calls_are_made_once_and_a_rerun_makes_none() {
        let cache = scratch("dedupe");
        // Two compressors with one identity make identical calls: each is made once.
        let twin = [
            "compressors.twin.builtin=goal-line",
            "compressors.twin.revision=1",
        ];
        let launcher = Scripted::new(builtin);
        let outcome = run(setup(&twin, launcher.clone(), &cache, false));
        // 4 goals × 3 seeds: one call each, shared by both compressors' jobs.
        assert_eq!(
            launcher.count("compressors.goal-line") + launcher.count("compressors.twin"),
            12
        );
        assert_eq!(launcher.count("reader"), 36);
        assert_eq!(launcher.count("judge"), 36);
        // The twin's jobs waited on the identical call in flight rather than making it.
        let compress = &outcome.this_run[&Role::Compressor];
        assert_eq!((compress.made, compress.shared, compress.failed), (12, 12, 0));
        assert_eq!(outcome.ledger.len(), 24);
        assert_eq!(outcome.results.len(), 72);
        assert!(outcome.failures.is_empty());
        let correct = outcome.results.iter().filter(|r| r.correct == Some(true)).count();
        assert_eq!(
            correct, 48,
            "2 of 3 answers right per goal, as the fixture's Micro says"
        );

        let again = Scripted::new(builtin);
        let outcome = run(setup(&twin, again.clone(), &cache, false));
        assert!(again.log.lock().unwrap().is_empty(), "a re-run makes no call");
        assert_eq!(outcome.this_run[&Role::Reader].cached, 72);
        std::fs::remove_dir_all(&cache).unwrap();
    }

    #[test]
    fn fail_fast_starts_no_call_after_the_first_failure() {
        let cache = scratch("fail-fast");
        let launcher = Scripted::new(|callback, request| {
            if callback.role == Role::Compressor {
                return Err(FailureKind::Exit(1));
            }
            builtin(callback, request)
        });
        let outcome = run(setup(&[], launcher.clone(), &cache, true));
        let made = launcher.count("compressors.goal-line");
        // CallBook already started when the first failed may finish; no new one starts.
        assert!((1..=4).contains(&made), "{made} compressor calls");
        assert_eq!(launcher.count("reader") + launcher.count("judge"), 0);
        assert_eq!(outcome.failures.len(), made);
        assert_eq!(outcome.failures.len() + outcome.cancelled, 12);
        assert!(outcome.ledger.is_empty());
        std::fs::remove_dir_all(&cache).unwrap();
    }

    #[test]
    fn a_rerun_makes_exactly_the_calls_that_failed() {
        let cache = scratch("resume");
        // The reader fails on every question about the reactor (retryable, but retried out).
        let reactor = |request: &Value| request["question"].as_str().unwrap_or("").contains("reactor");
        let launcher = Scripted::new(move |callback, request| {
            if callback.role == Role::Reader && reactor(request) {
                return Err(FailureKind::Reported {
                    message: "model busy".into(),
                    retryable: true,
                });
            }
            builtin(callback, request)
        });
        let outcome = run(setup(&["reader.retries=1"], launcher.clone(), &cache, false));
        let failed: Vec<&FailureRow> = outcome.failures.iter().collect();
        assert!(!failed.is_empty());
        assert!(
            failed
                .iter()
                .all(|f| f.stage == crate::protocol::Stage::Read && f.attempts == 2),
            "{failed:?}"
        );
        let failed_reads = failed.len();
        // Each failed read was tried twice; every other read once.
        assert_eq!(launcher.count("reader"), 36 + failed_reads);

        let fixed = Scripted::new(builtin);
        let outcome = run(setup(&["reader.retries=1"], fixed.clone(), &cache, false));
        assert_eq!(fixed.count("compressors.goal-line"), 0);
        assert_eq!(fixed.count("reader"), failed_reads);
        assert_eq!(fixed.count("judge"), failed_reads);
        assert!(outcome.failures.is_empty());
        std::fs::remove_dir_all(&cache).unwrap();
    }

    /// `report.json` is written from `Report` and read back (by `gacc diff`, `gacc runs`,
    /// `run --json`) as `StoredReport`, two types: what one writes, the other reads, field for
    /// field, strictly (no field of the stored shape left to its default).
    #[test]
    fn a_report_reads_back_as_stored_field_for_field() {
        use crate::report::stored::{StoredReport, text};
        use serde::Deserialize;
        let cache = scratch("round-trip");
        let sets = ["budgets=[40]", "conditions=[\"own-goal\", \"no-goal\"]"];
        let outcome = run(setup(&sets, Scripted::new(builtin), &cache, false));
        let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
        let (loaded, _) = crate::inputs::manifest::load(&fixture(), &sets).unwrap();
        let manifest = &loaded.manifest;
        let dataset = crate::inputs::dataset::load(&loaded).unwrap();
        let tokenizer: Arc<dyn Tokenizer> = Arc::new(Cl100k::new());
        let plan = crate::plan::plan(&loaded, &dataset, tokenizer.as_ref()).unwrap();
        let inputs = crate::report::Inputs {
            name: &manifest.name,
            description: manifest.description.as_deref(),
            manifest_sha256: "ab12",
            seeds: &manifest.seeds,
            ratios: &manifest.ratios,
            budgets: &manifest.budgets,
            conditions: &manifest.conditions,
            callbacks: plan.callback_identities(),
            dataset: &dataset,
            tokenizer: tokenizer.as_ref(),
            model_callbacks: Vec::new(),
            audits: Vec::new(),
            labels: None,
            anchors: plan.anchors,
            targets: manifest.targets(),
            panel: plan.panel_shares.clone(),
            reader_price: None,
            memo: Default::default(),
        };
        let recount =
            crate::report::Recount::start(tokenizer.clone(), &dataset, Cache::open(&cache).unwrap());
        let report = crate::report::build(&inputs, &outcome, recount);
        let written = serde_json::to_value(&report).unwrap();
        let stored = StoredReport::deserialize(&written).expect("a written report is a stored one");

        assert_eq!(stored.schema, crate::report::SCHEMA);
        assert_eq!(
            stored.experiment.name.as_deref(),
            Some(report.experiment.name.as_str())
        );
        assert_eq!(
            stored.experiment.manifest_sha256,
            report.experiment.manifest_sha256
        );
        assert_eq!(stored.experiment.gacc_version, report.experiment.gacc_version);
        assert_eq!(text(&stored.experiment.conditions[1]), "no-goal");
        assert_eq!(
            stored.experiment.conditions.len(),
            report.experiment.conditions.len()
        );
        assert_eq!(stored.tokenizer.name, report.tokenizer.name.as_str());
        assert_eq!(stored.tokenizer.revision, report.tokenizer.revision.as_str());
        assert_eq!(
            stored.tokenizer.identity_verified,
            report.tokenizer.identity_verified
        );
        assert_eq!(stored.dataset.sha256, report.dataset.sha256.as_str());
        assert_eq!(stored.integrity, serde_json::to_value(&report.integrity).unwrap());
        assert_eq!(stored.failures.len(), report.failures.len());
        // Ratio cells and a token budget's cells, each named as written.
        assert_eq!(stored.cells.len(), report.cells.len());
        assert!(stored.cells.iter().any(|c| c.budget_tokens.is_some()));
        assert!(stored.cells.iter().any(|c| c.budget_tokens.is_none()));
        for (cell, read) in report.cells.iter().zip(&stored.cells) {
            let id = serde_json::to_value(&cell.id).unwrap();
            assert_eq!(read.compressor, id["compressor"]);
            assert_eq!(read.condition, id["condition"]);
            assert_eq!(read.ratio, id.get("ratio").cloned().unwrap_or(Value::Null));
            assert_eq!(read.budget_tokens, id.get("budget_tokens").cloned());
            assert_eq!(read.complete, cell.complete);
            let spread = |s: Option<crate::report::stats::Spread>| s.map(|s| (s.mean, s.std));
            assert_eq!(read.micro.map(|s| (s.mean, s.std)), spread(cell.micro));
            assert_eq!(read.macro_.map(|s| (s.mean, s.std)), spread(cell.macro_));
            assert_eq!(read.ledger.retained_tokens, cell.ledger.retained_tokens as f64);
            assert_eq!(read.ledger.unused_budget, cell.ledger.unused_budget as f64);
        }
        for (role, usage) in &report.usage {
            assert_eq!(stored.usage[role.as_str()].cost_usd, usage.cost_usd, "{role:?}");
        }
        assert_eq!(stored.usage.len(), report.usage.len());
        std::fs::remove_dir_all(&cache).unwrap();
    }
}
