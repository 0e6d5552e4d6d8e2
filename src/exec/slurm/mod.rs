//! The Slurm executor: calls are handed to a cluster as job arrays whose tasks run
//! `gacc array-task` on the nodes. Requests and responses are files in a work folder every node
//! sees; gacc polls Slurm itself (`squeue`), takes responses as they appear, and hands each
//! failure to the same retries and accounting as a local call.
//!
//! The work folder:
//!
//! ```text
//! calls/<ab>/<key>.request.json   a request, written before its array is submitted
//! calls/<ab>/<key>.task           "<array> <index>": the array task that makes the call
//! calls/<ab>/<key>.response.json  the task's answer, written whole (temporary file + rename)
//! arrays/<array>/array.json      the callback to run and where the calls are
//! arrays/<array>/tasks/<index>   the call keys of one array task, one per line
//! arrays/<array>/job             the Slurm job id, once sbatch has accepted the array
//! arrays/<array>/logs/<index>.{out,err}
//! format                          the folder's format, `gacc.slurm/2`
//! ```
//!
//! A work folder of another format (or of the unnamed one before it, whose arrays were in
//! `batches/`) is refused, naming the gacc that reads it: its tasks may still run and answer.
//!
//! A call's key is the SHA-256 of its callback's identity and its request, so a gacc that
//! restarts finds what an earlier one submitted: a response is taken as it is, and a task that
//! Slurm still runs is waited for instead of being submitted again.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::sync::{Notify, oneshot};

use crate::exec::EngineKind;
use crate::exec::callback::{Attempt, AttemptFuture, Callback, FailureKind, Launcher};
use crate::exec::engine::Engine;
use crate::exec::program::Program;
use crate::files::write_durably;
use crate::inputs::manifest::Loaded;

mod cluster;
mod format;
mod settings;
pub(crate) mod task;

use crate::exec::remote::{CallFiles, call_files, call_key, describe, read_response};
use crate::parallel::Locked;
use crate::protocol::Role;

use settings::{SlurmResources, SlurmSpec};

/// The Slurm executor of one run.
pub(crate) struct Slurm {
    spec: SlurmSpec,
    work: PathBuf,
    gacc: PathBuf,
    state: Mutex<State>,
    wake: Notify,
    driving: AtomicBool,
    arrays: AtomicU64,
}

#[derive(Default)]
struct State {
    /// Calls waiting to be submitted, per callback.
    queued: BTreeMap<String, Queue>,
    /// Calls in a submitted task, by key.
    outstanding: HashMap<String, Outstanding>,
    /// Calls answered, whose files go when the run ends.
    answered: Vec<String>,
    /// Batches this gacc submitted or adopted.
    arrays: BTreeSet<String>,
    /// Each callback's description for its array tasks, made once.
    described: HashMap<String, Arc<Value>>,
    /// Job ids of earlier arrays found by name (None: that array never reached Slurm).
    found: HashMap<String, Option<String>>,
}

struct Queue {
    callback: Arc<Value>,
    role: Role,
    since: Instant,
    calls: Vec<(String, oneshot::Sender<Attempt>)>,
}

struct Outstanding {
    task: Task,
    reply: oneshot::Sender<Attempt>,
    /// Found running when this gacc started: if it ends without an answer, the call is
    /// submitted again rather than failed (the earlier run may have lost it).
    adopted: bool,
    misses: u32,
    /// Description of the callback, to submit the call again.
    callback: Arc<Value>,
    role: Role,
}

#[derive(Debug, Clone, PartialEq)]
struct Task {
    array: String,
    job: String,
    index: usize,
}

impl Task {
    /// Slurm's name of the array task, `JOB_INDEX`.
    fn id(&self) -> String {
        format!("{}_{}", self.job, self.index)
    }
}

/// The work folder's folder of arrays.
const ARRAYS: &str = "arrays";
/// The job ids this process submitted, so an interrupted run can cancel them.
static LIVE_JOBS: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());

/// Cancels every array this process submitted (on Ctrl-C). Finished ones are not affected.
pub(crate) fn cancel_all() {
    let jobs: Vec<String> = LIVE_JOBS.locked().iter().cloned().collect();
    if jobs.is_empty() {
        return;
    }
    match std::process::Command::new("scancel").args(&jobs).output() {
        Ok(output) if output.status.success() => {}
        Ok(output) => tracing::warn!(
            jobs = %jobs.join(","),
            stderr = %String::from_utf8_lossy(&output.stderr),
            "scancel failed"
        ),
        Err(error) => tracing::warn!(%error, "could not run scancel"),
    }
}

impl std::fmt::Debug for Slurm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slurm")
            .field("work", &self.work)
            .finish_non_exhaustive()
    }
}

/// Slurm in the engines' registry: `run.executor = "slurm"`, settings in `[run.slurm]`.
/// The Slurm engine's registration.
pub(super) struct Kind;

impl EngineKind for Kind {
    fn name(&self) -> &'static str {
        "slurm"
    }

    fn settings_schema(&self) -> schemars::Schema {
        schemars::schema_for!(SlurmSpec)
    }

    fn check(&self, table: Option<&toml::Value>) -> Vec<(String, String)> {
        SlurmSpec::read(table).err().unwrap_or_default()
    }

    fn start(&self, loaded: &Loaded) -> Result<Arc<dyn Engine>, String> {
        engine(loaded)
    }

    fn folders(&self, loaded: &Loaded) -> Vec<(PathBuf, &'static str)> {
        vec![(work_dir(loaded), "the Slurm work folder")]
    }

    fn array_task(&self, array: &std::path::Path, task: Option<usize>) -> Option<Result<usize, String>> {
        Some(task::work(array, task))
    }

    fn shutdown(&self) {
        cancel_all();
    }
}

/// A manifest's `[run.slurm]` table.
fn settings(loaded: &Loaded) -> Result<SlurmSpec, String> {
    SlurmSpec::read(loaded.manifest.run.engines.get(Kind.name())).map_err(|problems| {
        let found: Vec<String> = problems
            .iter()
            .map(|(key, message)| format!("`{key}`: {message}"))
            .collect();
        found.join("; ")
    })
}

/// The work folder of a manifest that runs on Slurm: `run.slurm.work_dir` against the
/// manifest's folder, else `.gacc/slurm` (relative to the current folder like the default
/// cache).
fn work_dir(loaded: &Loaded) -> PathBuf {
    match settings(loaded).ok().and_then(|s| s.work_dir) {
        Some(path) => loaded.resolve(&path),
        None => PathBuf::from(".gacc/slurm"),
    }
}

/// The Slurm engine of a manifest: its settings, its work folder, its commands checked.
fn engine(loaded: &Loaded) -> Result<Arc<dyn Engine>, String> {
    let slurm = Slurm::new(settings(loaded)?, work_dir(loaded))?;
    Ok(Arc::new(SlurmEngine(Arc::new(slurm))))
}

/// Slurm as a run's engine: each program's calls made by array tasks.
struct SlurmEngine(Arc<Slurm>);

impl Engine for SlurmEngine {
    fn launcher(&self, program: Program) -> Arc<dyn Launcher> {
        Arc::new(SlurmLauncher {
            slurm: self.0.clone(),
            program,
        })
    }

    fn finish(&self) {
        self.0.finish();
    }
}

/// The launcher of a callback whose calls run as tasks of Slurm job arrays, each task
/// starting its program.
#[derive(Debug, Clone)]
struct SlurmLauncher {
    slurm: Arc<Slurm>,
    program: Program,
}

impl Launcher for SlurmLauncher {
    fn attempt<'a>(&'a self, callback: &'a Callback, _key: &'a str, request: &'a [u8]) -> AttemptFuture<'a> {
        Box::pin(self.slurm.attempt(callback, &self.program, request))
    }

    fn program(&self) -> Option<&Program> {
        Some(&self.program)
    }
}

impl Slurm {
    /// The executor for `spec`, its work folder resolved; checks that Slurm's commands answer.
    fn new(spec: SlurmSpec, work: PathBuf) -> Result<Slurm, String> {
        for program in ["sbatch", "squeue", "scancel"] {
            match std::process::Command::new(program).arg("--version").output() {
                Ok(output) if output.status.success() => {}
                Ok(output) => {
                    return Err(format!(
                        "`{program} --version` failed: {}",
                        String::from_utf8_lossy(&output.stderr).trim()
                    ));
                }
                Err(error) => {
                    return Err(format!(
                        "cannot run `{program}` (is Slurm's client installed?): {error}"
                    ));
                }
            }
        }
        let gacc = match &spec.gacc {
            Some(path) => path.clone(),
            None => std::env::current_exe()
                .map_err(|error| format!("cannot find the gacc executable: {error}"))?,
        };
        format::check(&work)?;
        for folder in ["calls", ARRAYS] {
            std::fs::create_dir_all(work.join(folder))
                .map_err(|error| format!("cannot create the work folder {}: {error}", work.display()))?;
        }
        let work = work.canonicalize().unwrap_or(work);
        Ok(Slurm {
            spec,
            work,
            gacc,
            state: Mutex::default(),
            wake: Notify::new(),
            driving: AtomicBool::new(false),
            arrays: AtomicU64::new(0),
        })
    }

    fn calls(&self) -> PathBuf {
        self.work.join("calls")
    }

    /// An array's folder: `arrays/<array>`.
    fn array_folder(&self, array: &str) -> PathBuf {
        self.work.join(ARRAYS).join(array)
    }

    fn resources(&self, role: Role) -> SlurmResources {
        match role {
            Role::Compressor => self.spec.compressor.clone(),
            Role::Reader => self.spec.reader.clone(),
            Role::Judge => self.spec.judge.clone(),
            // A dataset build's writer runs here, never on a cluster.
            Role::Writer => None,
        }
        .unwrap_or_default()
    }

    /// The most calls one array makes.
    fn capacity(&self) -> usize {
        self.spec.array_limit * self.spec.calls_per_task
    }

    fn time_limit(&self, role: Role) -> Option<Duration> {
        self.resources(role).time.or(self.spec.time).map(|t| t.0)
    }

    /// One attempt of a call, made by an array task.
    pub(crate) async fn attempt(
        self: &Arc<Self>,
        callback: &Callback,
        program: &Program,
        request: &[u8],
    ) -> Attempt {
        if !self.driving.swap(true, Ordering::SeqCst) {
            tokio::spawn(self.clone().drive());
        }
        let key = call_key(callback, request);
        let files = call_files(&self.calls(), &key);
        // An answer already there: a task submitted by an earlier run made this call.
        if let Some(attempt) = self.take_response(&key, &files) {
            return attempt;
        }
        let (reply, answer) = oneshot::channel();
        let description = self
            .state
            .locked()
            .described
            .entry(callback.name.clone())
            .or_insert_with(|| Arc::new(describe(callback, program)))
            .clone();
        match self.adopt(&files).await {
            Some(task) => {
                tracing::info!(task = %task.id(), key, "waiting for a task submitted by an earlier run");
                self.state.locked().arrays.insert(task.array.clone());
                self.track(key, task, reply, true, description, callback.role);
            }
            None => {
                if let Err(error) = write_durably(&files.request, request) {
                    return Attempt {
                        result: Err(FailureKind::Submit(format!(
                            "sbatch failed: cannot write {}: {error}",
                            files.request.display()
                        ))),
                        stderr_tail: String::new(),
                        stderr_of_worker: false,
                    };
                }
                self.enqueue(key, reply, description, callback.role);
            }
        }
        self.wake.notify_one();
        answer.await.unwrap_or_else(|_| Attempt {
            result: Err(FailureKind::WorkerDied("the Slurm executor stopped".into())),
            stderr_tail: String::new(),
            stderr_of_worker: false,
        })
    }

    fn enqueue(&self, key: String, reply: oneshot::Sender<Attempt>, callback: Arc<Value>, role: Role) {
        let name = callback["name"].as_str().unwrap_or_default().to_owned();
        let mut state = self.state.locked();
        let queue = state.queued.entry(name).or_insert_with(|| Queue {
            callback,
            role,
            since: Instant::now(),
            calls: Vec::new(),
        });
        queue.calls.push((key, reply));
    }

    fn track(
        &self,
        key: String,
        task: Task,
        reply: oneshot::Sender<Attempt>,
        adopted: bool,
        callback: Arc<Value>,
        role: Role,
    ) {
        self.state.locked().outstanding.insert(
            key,
            Outstanding {
                task,
                reply,
                adopted,
                misses: 0,
                callback,
                role,
            },
        );
    }

    /// The answer in a call's response file, if there is one. A failure is taken away with
    /// its file, so that a retry submits the call again; an answer stays until the run ends.
    fn take_response(&self, key: &str, files: &CallFiles) -> Option<Attempt> {
        let bytes = std::fs::read(&files.response).ok()?;
        let attempt = read_response(&bytes);
        if attempt.result.is_ok() {
            self.state.locked().answered.push(key.to_owned());
        } else {
            let _ = std::fs::remove_file(&files.response);
            let _ = std::fs::remove_file(&files.task);
        }
        Some(attempt)
    }

    /// The task an earlier run submitted this call to. Whether Slurm still runs it is for
    /// the next poll to tell: one that ended without answering is submitted again.
    async fn adopt(&self, files: &CallFiles) -> Option<Task> {
        let recorded = std::fs::read_to_string(&files.task).ok()?;
        let (array, index) = recorded.trim().split_once(' ')?;
        let index: usize = index.parse().ok()?;
        let job = match std::fs::read_to_string(self.array_folder(array).join("job")) {
            Ok(job) => job.trim().to_owned(),
            // sbatch may have accepted the array just before that gacc stopped: ask by name.
            Err(_) => self.find_job(array).await?,
        };
        Some(Task {
            array: array.to_owned(),
            job,
            index,
        })
    }

    /// Submits gathered calls and polls Slurm, for as long as the run lasts.
    async fn drive(self: Arc<Self>) {
        let mut last_poll = Instant::now();
        loop {
            let now = Instant::now();
            let capacity = self.capacity();
            let ready: BTreeMap<String, Queue> = {
                let mut state = self.state.locked();
                let (ready, waiting) = std::mem::take(&mut state.queued).into_iter().partition(|(_, q)| {
                    q.calls.len() >= capacity || now.duration_since(q.since) >= self.spec.gather.0
                });
                state.queued = waiting;
                ready
            };
            for queue in ready.into_values() {
                self.submit(queue).await;
            }
            let busy = !self.state.locked().outstanding.is_empty();
            if busy && last_poll.elapsed() >= self.spec.poll.0 {
                self.poll().await;
                last_poll = Instant::now();
            }
            let wait = {
                let state = self.state.locked();
                let mut wait = Duration::from_secs(3600);
                for queue in state.queued.values() {
                    wait = wait
                        .min((queue.since + self.spec.gather.0).saturating_duration_since(Instant::now()));
                }
                if !state.outstanding.is_empty() {
                    wait = wait.min((last_poll + self.spec.poll.0).saturating_duration_since(Instant::now()));
                }
                wait
            };
            tokio::select! {
                _ = self.wake.notified() => {}
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// Removes the files of answered calls and of this run's arrays once nothing waits on them.
    fn finish(&self) {
        let state = self.state.locked();
        let calls = self.calls();
        for key in &state.answered {
            let files = call_files(&calls, key);
            for path in [files.request, files.response, files.task] {
                let _ = std::fs::remove_file(path);
            }
        }
        let waited_on: BTreeSet<&str> = state
            .outstanding
            .values()
            .map(|o| o.task.array.as_str())
            .collect();
        for array in &state.arrays {
            if !waited_on.contains(array.as_str()) {
                let _ = std::fs::remove_dir_all(self.array_folder(array));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::remote::response_file;
    use cluster::{lost_call, shell_quote, slurm_time};
    use serde_json::json;

    #[test]
    fn time_limits_round_up_to_whole_minutes() {
        assert_eq!(slurm_time(Duration::from_secs(1)), "0:01:00");
        assert_eq!(slurm_time(Duration::from_secs(60)), "0:01:00");
        assert_eq!(slurm_time(Duration::from_secs(61)), "0:02:00");
        assert_eq!(slurm_time(Duration::from_secs(7200)), "2:00:00");
    }

    #[test]
    fn responses_round_trip_through_their_file() {
        let answered = Attempt {
            result: Ok(json!({"memory": "m"})),
            stderr_tail: "note".into(),
            stderr_of_worker: false,
        };
        let back = read_response(&response_file(&answered));
        assert_eq!(back.result, Ok(json!({"memory": "m"})));
        assert_eq!(back.stderr_tail, "note");
        let failed = Attempt {
            result: Err(FailureKind::Timeout(Duration::from_secs(3))),
            stderr_tail: String::new(),
            stderr_of_worker: false,
        };
        let back = read_response(&response_file(&failed));
        assert_eq!(back.result, Err(FailureKind::Timeout(Duration::from_secs(3))));
        assert!(matches!(
            read_response(b"{").result,
            Err(FailureKind::InvalidJson(_))
        ));
    }

    #[test]
    fn a_lost_call_is_a_timeout_only_past_the_time_limit() {
        let task = Task {
            array: "b".into(),
            job: "12".into(),
            index: 3,
        };
        let limit = Some(Duration::from_secs(60));
        assert_eq!(
            lost_call(&task, "TIMEOUT", limit),
            FailureKind::Timeout(Duration::from_secs(60))
        );
        let cancelled = lost_call(&task, "CANCELLED", limit);
        assert_eq!(
            cancelled.to_string(),
            "Slurm task 12_3 ended CANCELLED without answering"
        );
        assert!(!cancelled.retryable());
        assert!(lost_call(&task, "NODE_FAIL", limit).retryable());
    }

    #[test]
    fn quoting_survives_quotes() {
        assert_eq!(shell_quote("/a b/it's"), r"'/a b/it'\''s'");
    }
}
