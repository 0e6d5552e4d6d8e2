//! The callback protocol `gacc/1` (SPEC §3): one JSON request on stdin, one JSON response on
//! stdout, in a child process with a cleared environment and its own process group.

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout};
use tokio::sync::Semaphore;

use crate::builtin::Role;
use crate::manifest::Mode;
use crate::sandbox::{Policy, Scratch};

pub const PROTOCOL: &str = "gacc/1";
/// The largest response a callback may write to stdout.
pub const MAX_RESPONSE_BYTES: usize = 64 << 20;
/// How much of a callback's stderr is kept for messages and the trace.
pub const STDERR_TAIL_BYTES: usize = 8 << 10;
/// The exit status a callback uses to ask for a retry (BSD `EX_TEMPFAIL`).
pub const EXIT_TEMPFAIL: i32 = 75;
/// The variables a callback inherits, besides those its manifest lists (SPEC §3).
pub const KEPT_VARIABLES: &[&str] = &["PATH", "HOME", "LANG", "LC_ALL", "TMPDIR"];
/// How long to wait for output pipes after the process has exited.
const PIPE_GRACE: Duration = Duration::from_secs(2);
const BACKOFF_BASE: Duration = Duration::from_millis(250);
const BACKOFF_MAX: Duration = Duration::from_secs(30);

/// A callback ready to be called: the program, its settings and its cache identity.
#[derive(Debug)]
pub struct Callback {
    /// The manifest key that declared it: `compressors.NAME`, `reader` or `judge`.
    pub name: String,
    pub role: Role,
    pub argv: Vec<String>,
    pub cwd: PathBuf,
    /// Passed-through variables; their values are never written anywhere.
    pub env: Vec<(String, String)>,
    pub timeout: Duration,
    pub retries: u32,
    pub params: Value,
    /// What determines its answers: command or built-in name, revision, params.
    pub identity: Value,
    pub limit: Arc<Semaphore>,
    pub mode: Mode,
    /// Idle persistent workers, ready for their next request.
    pub workers: std::sync::Mutex<Vec<Worker>>,
    /// The sandbox each of its processes starts in; None runs it unrestricted.
    pub sandbox: Option<Policy>,
    /// Where its calls run when not here: the Slurm executor.
    pub remote: Option<Arc<crate::slurm::Slurm>>,
}

/// Why a call failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureKind {
    #[error("could not start `{program}`: {error}")]
    Spawn { program: String, error: String },
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    #[error("exited with status {0}")]
    Exit(i32),
    #[error("was killed by signal {0}")]
    Signal(i32),
    #[error("exited 0 but wrote nothing to stdout")]
    NoOutput,
    #[error("wrote stdout that is not valid UTF-8")]
    NotUtf8,
    #[error("wrote stdout that is not one JSON object: {0}")]
    InvalidJson(String),
    #[error("answered without {0}")]
    MissingField(String),
    #[error("wrote more than {0} bytes to stdout")]
    TooLarge(usize),
    #[error("reported an error: {message}")]
    Reported { message: String, retryable: bool },
    #[error("persistent worker ended before answering ({0})")]
    WorkerDied(String),
    /// The tokenizer could not cut or count a memory.
    #[error("{0}")]
    Tokenizer(String),
    /// Not run: `--fail-fast` stopped the run after another job failed.
    #[error("not run: --fail-fast stopped the run after a failure")]
    Cancelled,
    /// The Slurm task that was to make the call ended without answering it.
    #[error("Slurm task {task} ended {state} without answering")]
    Cluster { task: String, state: String },
    /// `sbatch` refused the array that was to make the call.
    #[error("sbatch failed: {0}")]
    Submit(String),
}

impl FailureKind {
    /// Timeouts, exit status 75 and `"retryable": true` are worth another try (SPEC §3).
    pub fn retryable(&self) -> bool {
        match self {
            FailureKind::Timeout(_) => true,
            FailureKind::Exit(status) => *status == EXIT_TEMPFAIL,
            FailureKind::Reported { retryable, .. } => *retryable,
            FailureKind::WorkerDied(_) => true,
            // The node, not the call, failed.
            FailureKind::Cluster { state, .. } => {
                matches!(state.as_str(), "NODE_FAIL" | "BOOT_FAIL" | "PREEMPTED")
            }
            _ => false,
        }
    }
}

/// A failed call, after its retries.
#[derive(Debug, Clone)]
pub struct Failure {
    pub kind: FailureKind,
    pub stderr_tail: String,
    pub attempts: u32,
}

/// A successful call.
#[derive(Debug, Clone)]
pub struct Answer {
    pub response: Value,
    pub attempts: u32,
    pub stderr_tail: String,
}

/// What one attempt produced.
#[derive(Debug)]
pub(crate) struct Attempt {
    pub result: Result<Value, FailureKind>,
    pub stderr_tail: String,
}

impl Callback {
    /// Calls the callback, retrying retryable failures with backoff; waits for a free slot
    /// of both this callback's and the run's concurrency for each attempt. The request is
    /// written out only once a slot is free, so waiting calls hold no payload.
    pub async fn call(&self, request: impl Fn() -> Value, run_limit: &Semaphore) -> Result<Answer, Failure> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let outcome = {
                let _mine = self.limit.acquire().await;
                // A closed run limit means the run is stopping (--fail-fast): start nothing.
                let Ok(_run) = run_limit.acquire().await else {
                    return Err(Failure {
                        kind: FailureKind::Cancelled,
                        stderr_tail: String::new(),
                        attempts: attempt - 1,
                    });
                };
                let bytes = request().to_string();
                let started = Instant::now();
                let outcome = match &self.remote {
                    Some(remote) => {
                        let mut outcome = remote.attempt(self, bytes.as_bytes()).await;
                        self.redact_attempt(&mut outcome);
                        outcome
                    }
                    None => self.attempt_here(bytes.as_bytes()).await,
                };
                tracing::debug!(
                    callback = %self.name,
                    attempt,
                    duration_ms = started.elapsed().as_millis() as u64,
                    request_bytes = bytes.len(),
                    ok = outcome.result.is_ok(),
                    stderr = %outcome.stderr_tail,
                    "callback attempt"
                );
                outcome
            };
            match outcome.result {
                Ok(response) => {
                    return Ok(Answer {
                        response,
                        attempts: attempt,
                        stderr_tail: outcome.stderr_tail,
                    });
                }
                // A persistent worker that dies is replaced and its request tried again.
                Err(kind)
                    if kind.retryable()
                        && (attempt <= self.retries
                            || (attempt == 1 && matches!(kind, FailureKind::WorkerDied(_)))) =>
                {
                    tracing::warn!(callback = %self.name, attempt, reason = %kind, "retrying");
                    tokio::time::sleep(backoff(attempt)).await;
                }
                Err(kind) => {
                    return Err(Failure {
                        kind,
                        stderr_tail: outcome.stderr_tail,
                        attempts: attempt,
                    });
                }
            }
        }
    }

    /// One attempt in a process of this machine. Nothing a callback says is stored (trace,
    /// failures, report, a Slurm response file) before it is redacted here.
    pub(crate) async fn attempt_here(&self, request: &[u8]) -> Attempt {
        let mut outcome = match self.mode {
            Mode::Oneshot => self.attempt(request).await,
            Mode::Persistent => self.persistent_attempt(request).await,
        };
        self.redact_attempt(&mut outcome);
        outcome
    }

    /// Replaces the value of every variable passed through `env` with `[redacted:NAME]`,
    /// including a piece of one cut off at either end of a tail.
    pub fn redact(&self, text: &str) -> String {
        redact(text, &self.env)
    }

    fn redact_attempt(&self, attempt: &mut Attempt) {
        if self.env.is_empty() {
            return;
        }
        attempt.stderr_tail = self.redact(&attempt.stderr_tail);
        if let Err(FailureKind::Reported { message, .. }) = &mut attempt.result {
            *message = self.redact(message);
        }
    }

    /// The process to start, and the scratch folder it lives in when it is sandboxed: then
    /// gacc starts it through `gacc sandbox-exec`, which enters the sandbox and becomes it.
    fn command(&self) -> Result<(tokio::process::Command, Option<Scratch>), FailureKind> {
        let (line, scratch) = match &self.sandbox {
            None => (self.argv.iter().map(Into::into).collect(), None),
            Some(policy) => {
                let (scratch, line) = policy.jail(&self.argv).map_err(|error| FailureKind::Spawn {
                    program: self.argv[0].clone(),
                    error: format!("could not prepare its sandbox: {error}"),
                })?;
                (line, Some(scratch))
            }
        };
        let line: Vec<std::ffi::OsString> = line;
        let mut command = tokio::process::Command::new(&line[0]);
        command
            .args(&line[1..])
            .current_dir(&self.cwd)
            .env_clear()
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        for name in KEPT_VARIABLES {
            if let Some(value) = std::env::var_os(name) {
                command.env(name, value);
            }
        }
        command.envs(self.env.iter().map(|(k, v)| (k, v)));
        command
            .env("GACC_PROTOCOL", PROTOCOL)
            .env("GACC_ROLE", self.role.as_str());
        if let Some(scratch) = &scratch {
            command.env("TMPDIR", &scratch.path);
        }
        Ok((command, scratch))
    }

    fn spawn_failure(&self, error: std::io::Error) -> FailureKind {
        FailureKind::Spawn {
            program: self.argv[0].clone(),
            error: error.to_string(),
        }
    }

    async fn attempt(&self, request: &[u8]) -> Attempt {
        let failed = |kind| Attempt {
            result: Err(kind),
            stderr_tail: String::new(),
        };
        // The scratch folder goes when the call ends, after its process group.
        let (mut command, _scratch) = match self.command() {
            Ok(command) => command,
            Err(kind) => return failed(kind),
        };
        let mut child = match command.spawn() {
            Ok(child) => child,
            Err(error) => return failed(self.spawn_failure(error)),
        };
        let group = child.id().map(|pid| pid as i32);
        live_groups().extend(group);
        let (Some(mut stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            kill_group(group);
            return Attempt {
                result: Err(FailureKind::Spawn {
                    program: self.argv[0].clone(),
                    error: "no pipes to the child".into(),
                }),
                stderr_tail: String::new(),
            };
        };
        // All pipes are driven from this task (no task per pipe: a call is cheap to make).
        // A callback may answer before reading, or never read: a broken pipe is not our failure.
        let write = async {
            let _ = stdin.write_all(request).await;
            let _ = stdin.shutdown().await;
            drop(stdin);
        };
        let received = Arc::new(std::sync::Mutex::new(Vec::new()));
        let pipes = async {
            let ((), too_large, tail) = tokio::join!(
                write,
                read_limited(stdout, MAX_RESPONSE_BYTES, group, received.clone()),
                read_tail(stderr, STDERR_TAIL_BYTES)
            );
            (too_large, tail)
        };
        tokio::pin!(pipes);
        let mut drained = None;
        let deadline = tokio::time::sleep(self.timeout);
        tokio::pin!(deadline);
        let status = loop {
            tokio::select! {
                biased;
                done = &mut pipes, if drained.is_none() => drained = Some(done),
                status = child.wait() => break status.ok(),
                _ = &mut deadline => break None,
            }
        };
        // Whatever happened, nothing the callback started outlives its call.
        kill_group(group);
        live_groups().retain(|g| Some(*g) != group);
        if status.is_none() {
            let _ = child.kill().await;
        }
        // A grandchild that left the group may hold the pipes open: give them a little while,
        // then take what arrived.
        let (too_large, stderr_tail) = match drained {
            Some(done) => done,
            None => tokio::time::timeout(PIPE_GRACE, &mut pipes)
                .await
                .unwrap_or((false, String::new())),
        };
        let output = if too_large {
            Output::TooLarge
        } else {
            Output::Complete(std::mem::take(
                &mut *received.lock().unwrap_or_else(|e| e.into_inner()),
            ))
        };
        let result = match status {
            None => Err(FailureKind::Timeout(self.timeout)),
            Some(status) => classify(self.role, status, output),
        };
        Attempt { result, stderr_tail }
    }
}

impl Callback {
    /// One request to a persistent worker: a line out, a line back, within the timeout.
    async fn persistent_attempt(&self, request: &[u8]) -> Attempt {
        loop {
            let (worker, reused) = match self.idle_worker() {
                Some(worker) => (worker, true),
                None => match Worker::start(self) {
                    Ok(worker) => (worker, false),
                    Err(kind) => {
                        return Attempt {
                            result: Err(kind),
                            stderr_tail: String::new(),
                        };
                    }
                },
            };
            let attempt = self.exchange(worker, request).await;
            // An idle worker that died since its last answer is replaced without using up an
            // attempt: only a fresh worker's death counts against the request.
            if reused && matches!(attempt.result, Err(FailureKind::WorkerDied(_))) {
                continue;
            }
            return attempt;
        }
    }

    /// An idle worker that is still running, if there is one; exited ones are dropped.
    fn idle_worker(&self) -> Option<Worker> {
        let mut idle = self.workers.lock().unwrap_or_else(|e| e.into_inner());
        while let Some(mut worker) = idle.pop() {
            if matches!(worker.child.try_wait(), Ok(None)) {
                return Some(worker);
            }
        }
        None
    }

    async fn exchange(&self, mut worker: Worker, request: &[u8]) -> Attempt {
        let exchange = async {
            let mut line = request.to_vec();
            line.push(b'\n');
            if let Err(error) = worker
                .stdin
                .write_all(&line)
                .await
                .and(worker.stdin.flush().await)
            {
                return Err(FailureKind::WorkerDied(format!(
                    "could not write the request: {error}"
                )));
            }
            read_line_limited(&mut worker.stdout, MAX_RESPONSE_BYTES).await
        };
        let result = match tokio::time::timeout(self.timeout, exchange).await {
            Err(_) => Err(FailureKind::Timeout(self.timeout)),
            Ok(Err(kind)) => Err(kind),
            Ok(Ok(line)) => parse_response(&line).and_then(|response| {
                if let Some(error) = reported_error(&response, 0) {
                    return Err(error);
                }
                check_response(self.role, &response).map(|()| response)
            }),
        };
        // A worker that answered in protocol (even with an error) serves on; any other is replaced.
        let healthy = matches!(&result, Ok(_) | Err(FailureKind::Reported { .. }));
        let stderr_tail = if healthy {
            String::new()
        } else {
            worker.stderr_tail()
        };
        if healthy {
            self.workers
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(worker);
        }
        Attempt { result, stderr_tail }
    }
}

/// A long-lived persistent callback process: one request per line in, one response per line out.
#[derive(Debug)]
pub struct Worker {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    group: Option<i32>,
    stderr: Arc<std::sync::Mutex<Vec<u8>>>,
    /// Removed after the worker's process group is killed (fields drop after `drop`).
    _scratch: Option<Scratch>,
}

impl Worker {
    fn start(callback: &Callback) -> Result<Worker, FailureKind> {
        let (mut command, scratch) = callback.command()?;
        let mut child = command.spawn().map_err(|error| callback.spawn_failure(error))?;
        let group = child.id().map(|pid| pid as i32);
        live_groups().extend(group);
        let (Some(stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            kill_group(group);
            return Err(FailureKind::Spawn {
                program: callback.argv[0].clone(),
                error: "no pipes to the child".into(),
            });
        };
        let tail = Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = tail.clone();
        tokio::spawn(async move {
            let mut stderr = stderr;
            let mut buffer = vec![0u8; 8 << 10];
            while let Ok(n @ 1..) = stderr.read(&mut buffer).await {
                let mut tail = sink.lock().unwrap_or_else(|e| e.into_inner());
                tail.extend_from_slice(&buffer[..n]);
                if tail.len() > 2 * STDERR_TAIL_BYTES {
                    let excess = tail.len() - STDERR_TAIL_BYTES;
                    tail.drain(..excess);
                }
            }
        });
        Ok(Worker {
            child,
            stdin,
            stdout: BufReader::new(stdout),
            group,
            stderr: tail,
            _scratch: scratch,
        })
    }

    fn stderr_tail(&self) -> String {
        let tail = self.stderr.lock().unwrap_or_else(|e| e.into_inner());
        let start = tail.len().saturating_sub(STDERR_TAIL_BYTES);
        String::from_utf8_lossy(&tail[start..]).into_owned()
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        kill_group(self.group);
        let _ = self.child.start_kill();
        live_groups().retain(|g| Some(*g) != self.group);
    }
}

/// Reads one line (without its newline), failing on EOF or when it grows past `limit`.
async fn read_line_limited(
    reader: &mut BufReader<ChildStdout>,
    limit: usize,
) -> Result<Vec<u8>, FailureKind> {
    let mut line = Vec::new();
    loop {
        let buffer = reader
            .fill_buf()
            .await
            .map_err(|error| FailureKind::WorkerDied(error.to_string()))?;
        if buffer.is_empty() {
            return Err(FailureKind::WorkerDied("its stdout closed".into()));
        }
        let (chunk, done) = match buffer.iter().position(|b| *b == b'\n') {
            Some(end) => (&buffer[..end], Some(end + 1)),
            None => (buffer, None),
        };
        if line.len() + chunk.len() > limit {
            return Err(FailureKind::TooLarge(limit));
        }
        line.extend_from_slice(chunk);
        let consumed = done.unwrap_or(buffer.len());
        reader.consume(consumed);
        if done.is_some() {
            return Ok(line);
        }
    }
}

/// The shortest piece of a secret at either end of a text that is still redacted.
const SECRET_PIECE: usize = 4;

/// `text` with every secret's value replaced by `[redacted:NAME]`; a text that starts with the
/// end of a secret, or ends with its start (a tail cut through it), has that piece redacted too.
pub fn redact(text: &str, secrets: &[(String, String)]) -> String {
    let mut secrets: Vec<&(String, String)> = secrets.iter().filter(|(_, v)| !v.is_empty()).collect();
    // Longest first, so a secret containing another is replaced whole.
    secrets.sort_by_key(|(_, value)| std::cmp::Reverse(value.len()));
    let mut text = text.to_owned();
    for (name, value) in &secrets {
        if text.contains(value.as_str()) {
            text = text.replace(value.as_str(), &format!("[redacted:{name}]"));
        }
    }
    for (name, value) in &secrets {
        let marker = format!("[redacted:{name}]");
        let cuts = || (1..value.len()).filter(|cut| value.is_char_boundary(*cut));
        if let Some(cut) =
            cuts().find(|cut| value.len() - cut >= SECRET_PIECE && text.starts_with(&value[*cut..]))
        {
            text.replace_range(..value.len() - cut, &marker);
        }
        if let Some(cut) = cuts()
            .rev()
            .find(|cut| *cut >= SECRET_PIECE && text.ends_with(&value[..*cut]))
        {
            let start = text.len() - cut;
            text.replace_range(start.., &marker);
        }
    }
    text
}

/// Exponential backoff with jitter: about BASE * 2^(attempt-1), capped.
fn backoff(attempt: u32) -> Duration {
    let exponential = BACKOFF_BASE.saturating_mul(1 << attempt.min(16).saturating_sub(1));
    let capped = exponential.min(BACKOFF_MAX);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    // Between half and the whole of the capped delay.
    capped / 2 + capped.mul_f64(f64::from(nanos % 1000) / 2000.0)
}

/// The process groups of calls in flight, so an interrupted run can end them all.
static LIVE_GROUPS: std::sync::Mutex<Vec<i32>> = std::sync::Mutex::new(Vec::new());

fn live_groups() -> std::sync::MutexGuard<'static, Vec<i32>> {
    LIVE_GROUPS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Kills every callback process group still running (on Ctrl-C).
pub fn kill_all() {
    for group in live_groups().drain(..) {
        kill_group(Some(group));
    }
}

/// Sends SIGKILL to a whole process group; a group that is already gone is fine.
fn kill_group(group: Option<i32>) {
    if let Some(group) = group.filter(|g| *g > 0) {
        // SAFETY: kill(2) with a negative pid signals a process group; it touches no memory.
        unsafe {
            libc::kill(-group, libc::SIGKILL);
        }
    }
}

enum Output {
    Complete(Vec<u8>),
    TooLarge,
}

/// Reads a pipe into `into` until it closes; true when it grew past `limit` (the process
/// group is then killed, so a flood stops at once).
async fn read_limited(
    mut pipe: impl AsyncRead + Unpin,
    limit: usize,
    group: Option<i32>,
    into: Arc<std::sync::Mutex<Vec<u8>>>,
) -> bool {
    let mut buffer = [0u8; 8 << 10];
    loop {
        match pipe.read(&mut buffer).await {
            Ok(0) | Err(_) => return false,
            Ok(n) => {
                let mut received = into.lock().unwrap_or_else(|e| e.into_inner());
                if received.len() + n > limit {
                    kill_group(group);
                    received.clear();
                    return true;
                }
                received.extend_from_slice(&buffer[..n]);
            }
        }
    }
}

async fn read_tail(mut pipe: impl AsyncRead + Unpin, keep: usize) -> String {
    let mut tail = Vec::new();
    let mut buffer = [0u8; 4 << 10];
    loop {
        match pipe.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                tail.extend_from_slice(&buffer[..n]);
                if tail.len() > 2 * keep {
                    tail.drain(..tail.len() - keep);
                }
            }
        }
    }
    if tail.len() > keep {
        tail.drain(..tail.len() - keep);
    }
    String::from_utf8_lossy(&tail).into_owned()
}

fn classify(role: Role, status: std::process::ExitStatus, output: Output) -> Result<Value, FailureKind> {
    use std::os::unix::process::ExitStatusExt;
    let bytes = match output {
        Output::TooLarge => return Err(FailureKind::TooLarge(MAX_RESPONSE_BYTES)),
        Output::Complete(bytes) => bytes,
    };
    let parsed = parse_response(&bytes);
    match status.code() {
        None => Err(FailureKind::Signal(status.signal().unwrap_or(0))),
        Some(code) => {
            // A callback that explains itself is believed, whatever its status.
            if let Ok(response) = &parsed
                && let Some(error) = reported_error(response, code)
            {
                return Err(error);
            }
            if code != 0 {
                return Err(FailureKind::Exit(code));
            }
            let response = parsed?;
            check_response(role, &response)?;
            Ok(response)
        }
    }
}

fn parse_response(bytes: &[u8]) -> Result<Value, FailureKind> {
    let text = std::str::from_utf8(bytes).map_err(|_| FailureKind::NotUtf8)?;
    if text.trim().is_empty() {
        return Err(FailureKind::NoOutput);
    }
    let value: Value =
        serde_json::from_str(text).map_err(|error| FailureKind::InvalidJson(error.to_string()))?;
    if !value.is_object() {
        return Err(FailureKind::InvalidJson(format!(
            "expected an object, got {}",
            kind_of(&value)
        )));
    }
    Ok(value)
}

fn reported_error(response: &Value, code: i32) -> Option<FailureKind> {
    let error = response.get("error")?;
    let message = match error {
        Value::String(message) => message.clone(),
        other => other.to_string(),
    };
    let retryable = response
        .get("retryable")
        .and_then(Value::as_bool)
        .unwrap_or(code == EXIT_TEMPFAIL);
    Some(FailureKind::Reported { message, retryable })
}

fn kind_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Checks a response against its role's fields (SPEC §3).
pub fn check_response(role: Role, response: &Value) -> Result<(), FailureKind> {
    let require = |name: &str, is: fn(&Value) -> bool, what: &str| match response.get(name) {
        None => Err(FailureKind::MissingField(format!("the field `{name}`"))),
        Some(value) if is(value) => Ok(()),
        Some(value) => Err(FailureKind::MissingField(format!(
            "`{name}` as {what} (got {})",
            kind_of(value)
        ))),
    };
    let optional = |name: &str, is: fn(&Value) -> bool, what: &str| match response.get(name) {
        None | Some(Value::Null) => Ok(()),
        Some(_) => require(name, is, what),
    };
    match role {
        Role::Compressor => require("memory", Value::is_string, "a string")?,
        Role::Reader => require("answer", Value::is_string, "a string")?,
        Role::Judge => {
            require("correct", Value::is_boolean, "a boolean")?;
            optional("score", Value::is_number, "a number")?;
            optional("rationale", Value::is_string, "a string")?;
        }
    }
    optional("meta", Value::is_object, "an object")?;
    if let Some(usage) = response.get("usage").filter(|u| !u.is_null()) {
        let Some(usage) = usage.as_object() else {
            return Err(FailureKind::MissingField("`usage` as an object".into()));
        };
        for (name, is_valid) in [
            ("input_tokens", Value::is_u64 as fn(&Value) -> bool),
            ("output_tokens", Value::is_u64),
            ("cost_usd", Value::is_number),
        ] {
            if usage.get(name).is_some_and(|v| !is_valid(v)) {
                return Err(FailureKind::MissingField(format!("`usage.{name}` as a number")));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn responses_are_checked_per_role() {
        assert!(check_response(Role::Compressor, &json!({"memory": "m"})).is_ok());
        assert!(check_response(Role::Compressor, &json!({"answer": "m"})).is_err());
        assert!(check_response(Role::Reader, &json!({"answer": 3})).is_err());
        assert!(
            check_response(
                Role::Judge,
                &json!({"correct": true, "score": 0.5, "rationale": null})
            )
            .is_ok()
        );
        assert!(check_response(Role::Judge, &json!({"correct": "yes"})).is_err());
        assert!(
            check_response(
                Role::Reader,
                &json!({"answer": "a", "usage": {"input_tokens": -1}})
            )
            .is_err()
        );
        assert!(
            check_response(
                Role::Reader,
                &json!({"answer": "a", "usage": {"input_tokens": 3, "cost_usd": 0.1}})
            )
            .is_ok()
        );
    }

    #[test]
    fn retryable_failures() {
        assert!(FailureKind::Timeout(Duration::from_secs(1)).retryable());
        assert!(FailureKind::Exit(75).retryable());
        assert!(!FailureKind::Exit(1).retryable());
        assert!(!FailureKind::InvalidJson("x".into()).retryable());
    }

    #[test]
    fn secrets_are_redacted_whole_and_in_pieces_at_either_end() {
        let secrets = vec![
            ("KEY".to_owned(), "sk-0123456789".to_owned()),
            ("LONGER".to_owned(), "sk-0123456789-extra".to_owned()),
            ("EMPTY".to_owned(), String::new()),
        ];
        assert_eq!(
            redact("using sk-0123456789 and sk-0123456789-extra", &secrets),
            "using [redacted:KEY] and [redacted:LONGER]"
        );
        // A tail cut through a secret at its start, or a stream that ended inside one.
        assert_eq!(
            redact("456789-extra failed", &secrets),
            "[redacted:LONGER] failed"
        );
        assert_eq!(redact("23456789 failed", &secrets), "[redacted:KEY] failed");
        // Ambiguous pieces are named after the longest secret they may belong to.
        assert_eq!(redact("key was sk-01234", &secrets), "key was [redacted:LONGER]");
        // Pieces shorter than SECRET_PIECE are left alone.
        assert_eq!(redact("789 apples", &secrets), "789 apples");
        assert_eq!(redact("nothing to hide", &secrets), "nothing to hide");
    }

    #[test]
    fn backoff_grows_and_is_capped() {
        assert!(backoff(1) <= BACKOFF_BASE);
        assert!(backoff(3) >= BACKOFF_BASE * 2);
        assert!(backoff(40) <= BACKOFF_MAX);
    }
}
