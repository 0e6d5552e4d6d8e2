//! Attempts in processes of this machine (SPEC §3): a process per call (`oneshot`) or a pool
//! of long-lived ones (`persistent`), each with a cleared environment, in its own process
//! group, in its sandbox when it has one. Whatever happens, nothing a call started outlives it.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

use crate::exec::callback::{
    Attempt, AttemptFuture, Callback, FailureKind, Launcher, check_response, reported_error,
};
use crate::exec::program::Program;
use crate::exec::sandbox::Scratch;
use crate::parallel::Locked;
use crate::protocol::{MAX_RESPONSE_BYTES, Mode, Role, STDERR_TAIL_BYTES};

mod groups;
mod persistent;
mod pipelined;
use pipelined::Pipelined;

pub(crate) use groups::kill_all;
use groups::{kill_group, live_groups, register};

pub(crate) use persistent::PersistentProcess;
use persistent::{Group, read_line_limited};

/// How long to wait for output pipes after the process has exited.
const PIPE_GRACE: Duration = Duration::from_secs(2);

/// The launcher of a callback whose calls run here: it keeps the callback's idle persistent
/// processes, ready for their next request.
#[derive(Debug)]
pub(crate) struct ProcessLauncher {
    program: Program,
    idle: Mutex<Vec<PersistentProcess>>,
    /// Workers that take several requests at once (`max_inflight > 1`).
    pipelined: Mutex<Vec<Arc<Pipelined>>>,
}

impl Launcher for ProcessLauncher {
    fn attempt<'a>(&'a self, callback: &'a Callback, _key: &'a str, request: &'a [u8]) -> AttemptFuture<'a> {
        Box::pin(self.attempt_here(callback, request))
    }

    fn program(&self) -> Option<&Program> {
        Some(&self.program)
    }
}

impl ProcessLauncher {
    /// The launcher of `program`, with no process started yet.
    pub(crate) fn new(program: Program) -> ProcessLauncher {
        ProcessLauncher {
            program,
            idle: Mutex::default(),
            pipelined: Mutex::default(),
        }
    }

    /// One attempt in a process of this machine. Nothing a callback says is stored (trace,
    /// failures, report, a cluster task's response file) before it is redacted here.
    pub(crate) async fn attempt_here(&self, callback: &Callback, request: &[u8]) -> Attempt {
        let program = &self.program;
        let mut outcome = match program.mode {
            Mode::Oneshot => oneshot(program, callback.role, request).await,
            Mode::Persistent if program.max_inflight > 1 => self.pipelined(callback, request).await,
            Mode::Persistent => self.persistent(callback, request).await,
        };
        crate::exec::callback::redact_attempt(&mut outcome);
        outcome
    }

    /// One request to a persistent worker: a line out, a line back, within the timeout.
    async fn persistent(&self, callback: &Callback, request: &[u8]) -> Attempt {
        loop {
            let (worker, reused) = match self.idle() {
                Some(worker) => (worker, true),
                None => match PersistentProcess::start(&self.program, callback.role) {
                    Ok(worker) => (worker, false),
                    Err(kind) => {
                        return Attempt {
                            result: Err(kind),
                            stderr_tail: String::new(),
                            stderr_of_worker: false,
                        };
                    }
                },
            };
            let attempt = self.exchange(callback, worker, request).await;
            // An idle worker that died since its last answer is replaced without using up an
            // attempt: only a fresh worker's death counts against the request.
            if reused && matches!(attempt.result, Err(FailureKind::WorkerDied(_))) {
                continue;
            }
            return attempt;
        }
    }

    /// One request to a pipelined worker: sent with an `id` beside the others in flight, its
    /// reply matched by that id whenever it comes. A worker that dies fails its requests in
    /// flight as `WorkerDied`, which the callback retries.
    async fn pipelined(&self, callback: &Callback, request: &[u8]) -> Attempt {
        let worker = {
            let mut workers = self.pipelined.locked();
            workers.retain(|w| !w.dead.load(Ordering::Relaxed));
            let free = workers
                .iter()
                .filter(|w| w.in_flight.load(Ordering::Relaxed) < self.program.max_inflight)
                .min_by_key(|w| w.in_flight.load(Ordering::Relaxed))
                .cloned();
            match free {
                Some(worker) => worker,
                None => match Pipelined::start(&self.program, callback.role) {
                    Ok(worker) => {
                        workers.push(worker.clone());
                        worker
                    }
                    Err(kind) => {
                        return Attempt {
                            result: Err(kind),
                            stderr_tail: String::new(),
                            stderr_of_worker: false,
                        };
                    }
                },
            }
        };
        worker.call(self.program.timeout, request).await
    }

    /// An idle worker that is still running, if there is one; exited ones are dropped.
    fn idle(&self) -> Option<PersistentProcess> {
        let mut idle = self.idle.locked();
        while let Some(mut worker) = idle.pop() {
            if matches!(worker.group.child.try_wait(), Ok(None)) {
                return Some(worker);
            }
        }
        None
    }

    async fn exchange(&self, callback: &Callback, mut worker: PersistentProcess, request: &[u8]) -> Attempt {
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
        let mut framed = None;
        let result = match tokio::time::timeout(self.program.timeout, exchange).await {
            Err(_) => Err(FailureKind::Timeout(self.program.timeout)),
            Ok(Err(kind)) => Err(kind),
            Ok(Ok(line)) => {
                let (parsed, log) = crate::exec::callback::parse_framed(&line);
                framed = log;
                parsed.and_then(|response| {
                    if let Some(error) = reported_error(&response, 0) {
                        return Err(error);
                    }
                    check_response(callback.role, &response).map(|()| response)
                })
            }
        };
        // A worker that answered in protocol (even with an error) serves on; any other is replaced.
        let healthy = matches!(&result, Ok(_) | Err(FailureKind::Reported { .. }));
        // Its stderr while it served this call (and, for its first, its start-up's); a log the
        // reply framed is exactly this call's, where the worker's stderr may hold a neighbour's.
        let stderr_of_worker = framed.is_none();
        let window = stderr_since(&worker.stderr, worker.mark, result.is_err() && stderr_of_worker).await;
        let stderr_tail = framed.unwrap_or(window);
        worker.mark = worker.stderr.locked().written();
        if healthy {
            self.idle.locked().push(worker);
        }
        Attempt {
            result,
            stderr_tail,
            stderr_of_worker,
        }
    }
}

/// The process to start, and the scratch folder it lives in when it is sandboxed: then
/// gacc starts it through `gacc sandbox-exec`, which enters the sandbox and becomes it.
fn command(program: &Program, role: Role) -> Result<(tokio::process::Command, Option<Scratch>), FailureKind> {
    let (line, scratch) = match &program.sandbox {
        None => (program.argv.iter().map(Into::into).collect(), None),
        Some(policy) => {
            let (scratch, line) = policy.jail(&program.argv).map_err(|error| FailureKind::Spawn {
                program: program.program().to_owned(),
                error: format!("could not prepare its sandbox: {error}"),
            })?;
            (line, Some(scratch))
        }
    };
    let line: Vec<std::ffi::OsString> = line;
    let passed = program.passed();
    let mut command = tokio::process::Command::from(crate::protocol::callback_command(
        &line,
        &program.cwd,
        role.as_str(),
        program.mode,
        passed.iter().map(|(k, v)| (k.as_str(), v.as_str())),
    ));
    command.kill_on_drop(true);
    if let Some(scratch) = &scratch {
        command.env("TMPDIR", &scratch.path);
    }
    Ok((command, scratch))
}

fn spawn_failure(program: &Program, error: std::io::Error) -> FailureKind {
    FailureKind::Spawn {
        program: program.program().to_owned(),
        error: error.to_string(),
    }
}

/// Spawn, feed, read within limits and classify: each step's failure its own.
async fn oneshot(program: &Program, role: Role, request: &[u8]) -> Attempt {
    let failed = |kind| Attempt {
        result: Err(kind),
        stderr_tail: String::new(),
        stderr_of_worker: false,
    };
    // The scratch folder goes when the call ends, after its process group.
    let (mut command, _scratch) = match command(program, role) {
        Ok(command) => command,
        Err(kind) => return failed(kind),
    };
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(error) => return failed(spawn_failure(program, error)),
    };
    let group = child.id().map(|pid| pid as i32);
    if !register(group) {
        return failed(FailureKind::Cancelled);
    }
    let (Some(mut stdin), Some(stdout), Some(stderr)) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        kill_group(group);
        return Attempt {
            result: Err(FailureKind::Spawn {
                program: program.program().to_owned(),
                error: "no pipes to the child".into(),
            }),
            stderr_tail: String::new(),
            stderr_of_worker: false,
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
    let deadline = tokio::time::sleep(program.timeout);
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
        Output::Complete(std::mem::take(&mut *received.locked()))
    };
    let (result, framed) = match status {
        None => (Err(FailureKind::Timeout(program.timeout)), None),
        Some(status) => classify(role, status, output),
    };
    // A oneshot process's stderr is its call's own; a log its reply framed follows it.
    let stderr_tail = match framed {
        Some(log) if stderr_tail.is_empty() => log,
        Some(log) => format!("{stderr_tail}{log}"),
        None => stderr_tail,
    };
    Attempt {
        result,
        stderr_tail,
        stderr_of_worker: false,
    }
}

/// What a worker wrote to stderr: its last bytes, and how many it wrote in all, so that each
/// call takes what was written while it was served (a traceback, a setup's prints before the
/// first call), as a oneshot call's stderr is its own.
#[derive(Debug, Default)]
pub(super) struct Stderr {
    tail: Vec<u8>,
    written: u64,
}

/// How long a failed call waits for its worker's stderr to arrive: its reply and its traceback
/// come down two pipes, and the reply may be read first.
const STDERR_SETTLE: Duration = Duration::from_millis(50);

impl Stderr {
    fn push(&mut self, bytes: &[u8]) {
        self.tail.extend_from_slice(bytes);
        self.written += bytes.len() as u64;
        if self.tail.len() > 2 * STDERR_TAIL_BYTES {
            let excess = self.tail.len() - STDERR_TAIL_BYTES;
            self.tail.drain(..excess);
        }
    }

    /// The bytes written since `mark` (what `written` was), at most the last
    /// `STDERR_TAIL_BYTES` of them.
    pub(super) fn since(&self, mark: u64) -> String {
        let new = usize::try_from(self.written.saturating_sub(mark)).unwrap_or(usize::MAX);
        let start = self.tail.len().saturating_sub(new.min(STDERR_TAIL_BYTES));
        String::from_utf8_lossy(&self.tail[start..]).into_owned()
    }

    pub(super) fn written(&self) -> u64 {
        self.written
    }
}

/// What a worker's stderr gained since `mark`; for a failed call, after a moment for the last of
/// it to arrive.
pub(super) async fn stderr_since(stderr: &Arc<std::sync::Mutex<Stderr>>, mark: u64, failed: bool) -> String {
    if failed {
        let before = stderr.locked().written();
        tokio::time::sleep(STDERR_SETTLE).await;
        if stderr.locked().written() == before {
            return stderr.locked().since(mark);
        }
        tokio::time::sleep(STDERR_SETTLE).await;
    }
    stderr.locked().since(mark)
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
                let mut received = into.locked();
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

/// A oneshot call's result from its exit status and output, and the log its reply framed.
fn classify(
    role: Role,
    status: std::process::ExitStatus,
    output: Output,
) -> (Result<Value, FailureKind>, Option<String>) {
    let bytes = match output {
        Output::TooLarge => return (Err(FailureKind::TooLarge(MAX_RESPONSE_BYTES)), None),
        Output::Complete(bytes) => bytes,
    };
    let (parsed, log) = crate::exec::callback::parse_framed(&bytes);
    (classify_parsed(role, status, parsed), log)
}

fn classify_parsed(
    role: Role,
    status: std::process::ExitStatus,
    parsed: Result<Value, FailureKind>,
) -> Result<Value, FailureKind> {
    use std::os::unix::process::ExitStatusExt;
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
