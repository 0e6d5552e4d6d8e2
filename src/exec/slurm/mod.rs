//! The Slurm executor: calls are handed to a cluster as job arrays whose tasks run
//! `gacc worker` on the nodes. Requests and responses are files in a work folder every node
//! sees; gacc polls Slurm itself (`squeue`), takes responses as they appear, and hands each
//! failure to the same retries and accounting as a local call.
//!
//! The work folder:
//!
//! ```text
//! calls/<ab>/<key>.request.json   a request, written before its array is submitted
//! calls/<ab>/<key>.task           "<batch> <index>": the array task that makes the call
//! calls/<ab>/<key>.response.json  the worker's answer, written whole (temporary file + rename)
//! batches/<batch>/batch.json      the callback to run and where the calls are
//! batches/<batch>/tasks/<index>   the call keys of one array task, one per line
//! batches/<batch>/job             the Slurm job id, once sbatch has accepted the array
//! batches/<batch>/logs/<index>.{out,err}
//! ```
//!
//! A call's key is the SHA-256 of its callback's identity and its request, so a gacc that
//! restarts finds what an earlier one submitted: a response is taken as it is, and a task that
//! Slurm still runs is waited for instead of being submitted again.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::sync::{Notify, oneshot};

use crate::exec::callback::{Attempt, Callback, FailureKind, Launcher};
use crate::exec::sandbox::Policy;
use crate::files::write_durably;

pub(crate) mod task;
use crate::inputs::manifest::{SlurmResources, SlurmSpec};
use crate::protocol::Role;
use crate::protocol::STDERR_TAIL_BYTES;

/// The environment variable Slurm sets to an array task's index.
/// How many polls a submitted task may be missing from `squeue` before it counts as gone.
const MISSES_BEFORE_GONE: u32 = 3;
/// How long one `sbatch`, `squeue` or `scancel` may take.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(120);

/// Job states after which a task makes no more calls.
const ENDED: &[&str] = &[
    "COMPLETED",
    "FAILED",
    "TIMEOUT",
    "CANCELLED",
    "NODE_FAIL",
    "PREEMPTED",
    "BOOT_FAIL",
    "DEADLINE",
    "OUT_OF_MEMORY",
];

/// The Slurm executor of one run.
pub(crate) struct Slurm {
    spec: SlurmSpec,
    work: PathBuf,
    gacc: PathBuf,
    state: Mutex<State>,
    wake: Notify,
    driving: AtomicBool,
    batches: AtomicU64,
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
    batches: BTreeSet<String>,
    /// Each callback's description for the workers, made once.
    described: HashMap<String, Arc<Value>>,
    /// Job ids of earlier batches found by name (None: that batch never reached Slurm).
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
    /// submitted again rather than failed (the earlier gacc may have lost it).
    adopted: bool,
    misses: u32,
    /// Description of the callback, to submit the call again.
    callback: Arc<Value>,
    role: Role,
}

#[derive(Debug, Clone, PartialEq)]
struct Task {
    batch: String,
    job: String,
    index: usize,
}

impl Task {
    /// Slurm's name of the array task, `JOB_INDEX`.
    fn id(&self) -> String {
        format!("{}_{}", self.job, self.index)
    }
}

/// The job ids this process submitted, so an interrupted run can cancel them.
static LIVE_JOBS: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());

/// Cancels every array this process submitted (on Ctrl-C). Finished ones are not affected.
pub(crate) fn cancel_all() {
    let jobs: Vec<String> = lock(&LIVE_JOBS).iter().cloned().collect();
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

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// The files of one call in the work folder.
pub(super) struct CallFiles {
    pub(super) request: PathBuf,
    pub(super) response: PathBuf,
    pub(super) task: PathBuf,
}

pub(super) fn call_files(calls: &Path, key: &str) -> CallFiles {
    let folder = calls.join(&key[..2]);
    CallFiles {
        request: folder.join(format!("{key}.request.json")),
        response: folder.join(format!("{key}.response.json")),
        task: folder.join(format!("{key}.task")),
    }
}

/// The last `STDERR_TAIL_BYTES` of a file, or nothing.
fn tail_of(path: &Path) -> String {
    let bytes = std::fs::read(path).unwrap_or_default();
    let start = bytes.len().saturating_sub(STDERR_TAIL_BYTES);
    String::from_utf8_lossy(&bytes[start..]).into_owned()
}

/// What a task writes for one call: the answer, or why there is none.
pub(super) fn response_file(attempt: &Attempt) -> Value {
    match &attempt.result {
        Ok(response) => json!({"ok": response, "stderr_tail": attempt.stderr_tail}),
        Err(kind) => json!({"error": kind, "stderr_tail": attempt.stderr_tail}),
    }
}

/// Reads a response file back into an attempt; a file that is not one is a failure to report.
fn read_response(bytes: &[u8]) -> Attempt {
    let parsed: Option<Value> = serde_json::from_slice(bytes).ok();
    let stderr_tail = parsed
        .as_ref()
        .and_then(|v| v["stderr_tail"].as_str())
        .unwrap_or_default()
        .to_owned();
    let result = match parsed {
        Some(mut value) if value.get("ok").is_some() => Ok(value["ok"].take()),
        Some(mut value) if value.get("error").is_some() => Err(serde_json::from_value(value["error"].take())
            .unwrap_or_else(|error| {
                FailureKind::InvalidJson(format!("an unreadable worker failure: {error}"))
            })),
        _ => Err(FailureKind::InvalidJson(
            "the worker's response file is not one".into(),
        )),
    };
    Attempt { result, stderr_tail }
}

/// Slurm's `--time` for a duration: whole minutes, rounded up, at least one.
fn slurm_time(limit: Duration) -> String {
    let minutes = limit.as_secs().div_ceil(60).max(1);
    format!("{}:{:02}:00", minutes / 60, minutes % 60)
}

/// What a task that ended without answering a call means for the call.
fn lost_call(task: &Task, state: &str, time_limit: Option<Duration>) -> FailureKind {
    match (state, time_limit) {
        ("TIMEOUT", Some(limit)) => FailureKind::Timeout(limit),
        _ => FailureKind::Cluster {
            task: task.id(),
            state: state.to_owned(),
        },
    }
}

/// What a worker needs to make a callback's calls on another machine. Values of passed-through
/// variables are not written: the task inherits them from the environment gacc submits from.
fn describe(callback: &Callback) -> Value {
    json!({
        "name": callback.name,
        "role": callback.role,
        "argv": callback.argv,
        "cwd": callback.cwd,
        "env": callback.env.iter().map(|(name, _)| name).collect::<Vec<_>>(),
        "timeout_ms": callback.timeout.as_millis() as u64,
        "mode": callback.mode,
        "sandbox": callback.sandbox.as_ref().map(Policy::describe),
    })
}

/// A command's output, or why it could not be run.
async fn command_output(program: &str, args: &[String]) -> Result<std::process::Output, String> {
    let mut command = tokio::process::Command::new(program);
    command.args(args).kill_on_drop(true);
    match tokio::time::timeout(COMMAND_TIMEOUT, command.output()).await {
        Err(_) => Err(format!("`{program}` did not answer within {COMMAND_TIMEOUT:?}")),
        Ok(Err(error)) => Err(format!("could not run `{program}`: {error}")),
        Ok(Ok(output)) => Ok(output),
    }
}

/// The launcher of a callback whose calls run as tasks of Slurm job arrays.
#[derive(Debug, Clone)]
pub(crate) struct SlurmLauncher(pub Arc<Slurm>);

impl Launcher for SlurmLauncher {
    fn attempt<'a>(
        &'a self,
        callback: &'a Callback,
        request: &'a [u8],
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Attempt> + Send + 'a>> {
        Box::pin(self.0.attempt(callback, request))
    }
}

impl Slurm {
    /// The executor for `spec`, its work folder resolved; checks that Slurm's commands answer.
    pub(crate) fn new(spec: SlurmSpec, work: PathBuf) -> Result<Slurm, String> {
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
        for folder in ["calls", "batches"] {
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
            batches: AtomicU64::new(0),
        })
    }

    fn calls(&self) -> PathBuf {
        self.work.join("calls")
    }

    fn batch_folder(&self, batch: &str) -> PathBuf {
        self.work.join("batches").join(batch)
    }

    fn resources(&self, role: Role) -> SlurmResources {
        match role {
            Role::Compressor => self.spec.compressor.clone(),
            Role::Reader => self.spec.reader.clone(),
            Role::Judge => self.spec.judge.clone(),
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
    pub(crate) async fn attempt(self: &Arc<Self>, callback: &Callback, request: &[u8]) -> Attempt {
        if !self.driving.swap(true, Ordering::SeqCst) {
            tokio::spawn(self.clone().drive());
        }
        let key = call_key(callback, request);
        let files = call_files(&self.calls(), &key);
        // An answer already there: a task submitted by an earlier gacc made this call.
        if let Some(attempt) = self.take_response(&key, &files) {
            return attempt;
        }
        let (reply, answer) = oneshot::channel();
        let description = lock(&self.state)
            .described
            .entry(callback.name.clone())
            .or_insert_with(|| Arc::new(describe(callback)))
            .clone();
        match self.adopt(&files).await {
            Some(task) => {
                tracing::info!(task = %task.id(), key, "waiting for a task submitted by an earlier run");
                lock(&self.state).batches.insert(task.batch.clone());
                self.expect(key, task, reply, true, description, callback.role);
            }
            None => {
                if let Err(error) = write_durably(&files.request, request) {
                    return Attempt {
                        result: Err(FailureKind::Submit(format!(
                            "cannot write {}: {error}",
                            files.request.display()
                        ))),
                        stderr_tail: String::new(),
                    };
                }
                self.enqueue(key, reply, description, callback.role);
            }
        }
        self.wake.notify_one();
        answer.await.unwrap_or_else(|_| Attempt {
            result: Err(FailureKind::WorkerDied("the Slurm executor stopped".into())),
            stderr_tail: String::new(),
        })
    }

    fn enqueue(&self, key: String, reply: oneshot::Sender<Attempt>, callback: Arc<Value>, role: Role) {
        let name = callback["name"].as_str().unwrap_or_default().to_owned();
        let mut state = lock(&self.state);
        let queue = state.queued.entry(name).or_insert_with(|| Queue {
            callback,
            role,
            since: Instant::now(),
            calls: Vec::new(),
        });
        queue.calls.push((key, reply));
    }

    fn expect(
        &self,
        key: String,
        task: Task,
        reply: oneshot::Sender<Attempt>,
        adopted: bool,
        callback: Arc<Value>,
        role: Role,
    ) {
        lock(&self.state).outstanding.insert(
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
            lock(&self.state).answered.push(key.to_owned());
        } else {
            let _ = std::fs::remove_file(&files.response);
            let _ = std::fs::remove_file(&files.task);
        }
        Some(attempt)
    }

    /// The task an earlier gacc submitted this call to. Whether Slurm still runs it is for
    /// the next poll to tell: one that ended without answering is submitted again.
    async fn adopt(&self, files: &CallFiles) -> Option<Task> {
        let recorded = std::fs::read_to_string(&files.task).ok()?;
        let (batch, index) = recorded.trim().split_once(' ')?;
        let index: usize = index.parse().ok()?;
        let job = match std::fs::read_to_string(self.batch_folder(batch).join("job")) {
            Ok(job) => job.trim().to_owned(),
            // sbatch may have accepted the array just before that gacc stopped: ask by name.
            Err(_) => self.find_job(batch).await?,
        };
        Some(Task {
            batch: batch.to_owned(),
            job,
            index,
        })
    }

    /// The job id of a batch whose `job` file was never written, asked of Slurm once.
    async fn find_job(&self, batch: &str) -> Option<String> {
        if let Some(found) = lock(&self.state).found.get(batch) {
            return found.clone();
        }
        let args = ["-h", "-t", "all", "-o", "%F", "-n"].map(String::from);
        // A squeue that fails says nothing: ask again for the next call.
        let output = command_output("squeue", &[&args[..], &[job_name(batch)]].concat())
            .await
            .ok()
            .filter(|output| output.status.success())?;
        let found = String::from_utf8_lossy(&output.stdout)
            .lines()
            .next()
            .map(|job| job.trim().to_owned())
            .filter(|job| !job.is_empty());
        if let Some(job) = &found {
            let _ = write_durably(&self.batch_folder(batch).join("job"), job.as_bytes());
        }
        lock(&self.state).found.insert(batch.to_owned(), found.clone());
        found
    }

    /// Submits gathered calls and polls Slurm, for as long as the run lasts.
    async fn drive(self: Arc<Self>) {
        let mut last_poll = Instant::now();
        loop {
            let now = Instant::now();
            let capacity = self.capacity();
            let ready: BTreeMap<String, Queue> = {
                let mut state = lock(&self.state);
                let (ready, waiting) = std::mem::take(&mut state.queued).into_iter().partition(|(_, q)| {
                    q.calls.len() >= capacity || now.duration_since(q.since) >= self.spec.gather.0
                });
                state.queued = waiting;
                ready
            };
            for queue in ready.into_values() {
                self.submit(queue).await;
            }
            let busy = !lock(&self.state).outstanding.is_empty();
            if busy && last_poll.elapsed() >= self.spec.poll.0 {
                self.poll().await;
                last_poll = Instant::now();
            }
            let wait = {
                let state = lock(&self.state);
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

    /// Submits one callback's gathered calls as arrays of at most `array_limit` tasks.
    async fn submit(&self, queue: Queue) {
        let Queue {
            callback,
            role,
            calls,
            ..
        } = queue;
        let capacity = self.capacity();
        let mut calls = calls;
        while !calls.is_empty() {
            let rest = calls.split_off(calls.len().min(capacity));
            let batch = std::mem::replace(&mut calls, rest);
            self.submit_array(&callback, role, batch).await;
        }
    }

    async fn submit_array(
        &self,
        callback: &Arc<Value>,
        role: Role,
        calls: Vec<(String, oneshot::Sender<Attempt>)>,
    ) {
        let batch = format!(
            "{}-{}-{}",
            crate::clock::utc_timestamp(std::time::SystemTime::now(), false),
            std::process::id(),
            self.batches.fetch_add(1, Ordering::Relaxed)
        );
        let folder = self.batch_folder(&batch);
        let tasks: Vec<&[(String, oneshot::Sender<Attempt>)]> =
            calls.chunks(self.spec.calls_per_task).collect();
        let prepared = (|| -> std::io::Result<()> {
            std::fs::create_dir_all(folder.join("tasks"))?;
            std::fs::create_dir_all(folder.join("logs"))?;
            let parallel = self.resources(role).parallel.unwrap_or(1);
            let description = json!({"callback": **callback, "calls": self.calls(), "parallel": parallel});
            write_durably(&folder.join("batch.json"), description.to_string().as_bytes())?;
            for (index, task) in tasks.iter().enumerate() {
                let keys: String = task.iter().map(|(key, _)| format!("{key}\n")).collect();
                write_durably(&folder.join("tasks").join(index.to_string()), keys.as_bytes())?;
                for (key, _) in task.iter() {
                    let files = call_files(&self.calls(), key);
                    write_durably(&files.task, format!("{batch} {index}\n").as_bytes())?;
                }
            }
            let script = format!(
                "#!/bin/sh\nexec {} worker {}\n",
                shell_quote(&self.gacc.to_string_lossy()),
                shell_quote(&folder.to_string_lossy())
            );
            write_durably(&folder.join("job.sh"), script.as_bytes())
        })();
        let submitted = match prepared {
            Err(error) => Err(format!("cannot prepare {}: {error}", folder.display())),
            Ok(()) => self.sbatch(&batch, &folder, role, tasks.len()).await,
        };
        let job = match submitted {
            Ok(job) => job,
            Err(message) => {
                tracing::error!(callback = %callback["name"], %message, "sbatch failed");
                for (key, reply) in calls {
                    let _ = std::fs::remove_file(call_files(&self.calls(), &key).task);
                    let _ = reply.send(Attempt {
                        result: Err(FailureKind::Submit(message.clone())),
                        stderr_tail: String::new(),
                    });
                }
                return;
            }
        };
        tracing::info!(callback = %callback["name"], job, tasks = tasks.len(), calls = calls.len(), "array submitted");
        let _ = write_durably(&folder.join("job"), job.as_bytes());
        lock(&LIVE_JOBS).insert(job.clone());
        lock(&self.state).batches.insert(batch.clone());
        let per_task = self.spec.calls_per_task;
        for (position, (key, reply)) in calls.into_iter().enumerate() {
            let task = Task {
                batch: batch.clone(),
                job: job.clone(),
                index: position / per_task,
            };
            self.expect(key, task, reply, false, callback.clone(), role);
        }
    }

    /// `sbatch` of one array; its job id.
    async fn sbatch(&self, batch: &str, folder: &Path, role: Role, tasks: usize) -> Result<String, String> {
        let resources = self.resources(role);
        let logs = folder.join("logs");
        let mut args: Vec<String> = vec![
            "--parsable".into(),
            format!("--array=0-{}", tasks - 1),
            format!("--job-name={}", job_name(batch)),
            format!("--output={}", logs.join("%a.out").display()),
            format!("--error={}", logs.join("%a.err").display()),
            format!("--chdir={}", self.work.display()),
        ];
        if let Some(partition) = resources.partition.as_ref().or(self.spec.partition.as_ref()) {
            args.push(format!("--partition={partition}"));
        }
        if let Some(account) = &self.spec.account {
            args.push(format!("--account={account}"));
        }
        if let Some(limit) = self.time_limit(role) {
            args.push(format!("--time={}", slurm_time(limit)));
        }
        if let Some(cpus) = resources.cpus {
            args.push(format!("--cpus-per-task={cpus}"));
        }
        if let Some(memory) = &resources.memory {
            args.push(format!("--mem={memory}"));
        }
        if let Some(gres) = &resources.gres {
            args.push(format!("--gres={gres}"));
        }
        args.extend(self.spec.sbatch_args.iter().cloned());
        args.push(folder.join("job.sh").display().to_string());
        let output = command_output("sbatch", &args).await?;
        let stdout = String::from_utf8_lossy(&output.stdout);
        // `--parsable` prints `JOBID` or `JOBID;CLUSTER`.
        let job = stdout.trim().split(';').next().unwrap_or_default().to_owned();
        if !output.status.success() || job.is_empty() || !job.bytes().all(|b| b.is_ascii_digit()) {
            let stderr = String::from_utf8_lossy(&output.stderr);
            return Err(format!("{} {}", stderr.trim(), stdout.trim()).trim().to_owned());
        }
        Ok(job)
    }

    /// Every array task of this user that Slurm knows, with its state (`JOB_INDEX` → state).
    async fn states(&self) -> Result<HashMap<String, String>, String> {
        // SAFETY: getuid(2) cannot fail and touches no memory.
        let user = unsafe { libc::getuid() };
        let args: Vec<String> = ["-h", "-r", "-t", "all", "-o", "%i|%T"]
            .iter()
            .map(|s| s.to_string())
            .chain([format!("--user={user}")])
            .collect();
        let output = command_output("squeue", &args).await?;
        if !output.status.success() {
            return Err(format!(
                "squeue failed: {}",
                String::from_utf8_lossy(&output.stderr).trim()
            ));
        }
        Ok(String::from_utf8_lossy(&output.stdout)
            .lines()
            .filter_map(|line| line.trim().split_once('|'))
            .map(|(task, state)| (task.to_owned(), state.to_owned()))
            .collect())
    }

    /// Takes the responses that arrived and settles the calls whose task ended without one.
    async fn poll(&self) {
        // States first, files second: a task seen ended has written everything it will write.
        let states = match self.states().await {
            Ok(states) => states,
            Err(message) => {
                tracing::warn!(%message, "could not read job states; trying again");
                return;
            }
        };
        let keys: Vec<(String, Task)> = lock(&self.state)
            .outstanding
            .iter()
            .map(|(key, o)| (key.clone(), o.task.clone()))
            .collect();
        let calls = self.calls();
        for (key, task) in keys {
            let files = call_files(&calls, &key);
            if let Some(attempt) = self.take_response(&key, &files) {
                if let Some(outstanding) = lock(&self.state).outstanding.remove(&key) {
                    let _ = outstanding.reply.send(attempt);
                }
                continue;
            }
            let ended = match states.get(&task.id()) {
                Some(state) if ENDED.contains(&state.as_str()) => state.clone(),
                Some(_) => continue,
                None => {
                    let mut state = lock(&self.state);
                    let Some(outstanding) = state.outstanding.get_mut(&key) else {
                        continue;
                    };
                    outstanding.misses += 1;
                    if outstanding.misses < MISSES_BEFORE_GONE {
                        continue;
                    }
                    "gone from the queue".to_owned()
                }
            };
            let Some(outstanding) = lock(&self.state).outstanding.remove(&key) else {
                continue;
            };
            let _ = std::fs::remove_file(&files.task);
            if outstanding.adopted {
                tracing::info!(task = %task.id(), state = %ended, key, "an earlier run's task ended without answering; submitting again");
                self.enqueue(key, outstanding.reply, outstanding.callback, outstanding.role);
                continue;
            }
            let kind = lost_call(&task, &ended, self.time_limit(outstanding.role));
            let log = self
                .batch_folder(&task.batch)
                .join("logs")
                .join(format!("{}.err", task.index));
            tracing::warn!(task = %task.id(), state = %ended, key, "task ended without answering");
            let _ = outstanding.reply.send(Attempt {
                result: Err(kind),
                stderr_tail: tail_of(&log),
            });
        }
    }

    /// Removes the files of answered calls and of this run's batches once nothing waits on them.
    pub(crate) fn finish(&self) {
        let state = lock(&self.state);
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
            .map(|o| o.task.batch.as_str())
            .collect();
        for batch in &state.batches {
            if !waited_on.contains(batch.as_str()) {
                let _ = std::fs::remove_dir_all(self.batch_folder(batch));
            }
        }
    }
}

/// A call's name in the work folder: its callback's name and identity, and its request.
fn call_key(callback: &Callback, request: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    let mut hasher = Sha256::new();
    hasher.update(callback.name.as_bytes());
    hasher.update(b"\n");
    hasher.update(callback.identity.to_string().as_bytes());
    hasher.update(b"\n");
    hasher.update(request);
    crate::hash::hex(&hasher.finalize())
}

fn job_name(batch: &str) -> String {
    format!("gacc-{batch}")
}

fn shell_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

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
        };
        let back = read_response(response_file(&answered).to_string().as_bytes());
        assert_eq!(back.result, Ok(json!({"memory": "m"})));
        assert_eq!(back.stderr_tail, "note");
        let failed = Attempt {
            result: Err(FailureKind::Timeout(Duration::from_secs(3))),
            stderr_tail: String::new(),
        };
        let back = read_response(response_file(&failed).to_string().as_bytes());
        assert_eq!(back.result, Err(FailureKind::Timeout(Duration::from_secs(3))));
        assert!(matches!(
            read_response(b"{").result,
            Err(FailureKind::InvalidJson(_))
        ));
    }

    #[test]
    fn a_lost_call_is_a_timeout_only_past_the_time_limit() {
        let task = Task {
            batch: "b".into(),
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
