//! Pipelined persistent workers (`max_inflight = N`, SPEC §3): each request carries an `id`
//! its reply echoes, so one worker holds several requests at once and answers in any order.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::process::{ChildStdin, ChildStdout};

use super::{Group, PersistentProcess, read_line_limited};
use crate::exec::callback::{Attempt, FailureKind, check_response, reported_error};
use crate::exec::program::Program;
use crate::parallel::Locked;
use crate::protocol::{MAX_RESPONSE_BYTES, Role};

/// A call's result, with the log its reply framed (`crate::exec::callback::take_log`).
type Answered = (Result<Value, FailureKind>, Option<String>);

/// A persistent worker that takes up to `max_inflight` requests at once: a writer shared by
/// its calls, and a reader task that hands each reply to the call whose `id` it echoes.
#[derive(Debug)]
pub(super) struct Pipelined {
    pub(super) stdin: tokio::sync::Mutex<ChildStdin>,
    /// Each call in flight, by id: where its result goes, with the log its reply framed.
    pub(super) waiting: Mutex<HashMap<u64, tokio::sync::oneshot::Sender<Answered>>>,
    pub(super) next_id: AtomicU64,
    pub(super) in_flight: AtomicUsize,
    pub(super) dead: AtomicBool,
    /// Its process (killed with its group when the worker dies or is dropped) and stderr.
    pub(super) process: Mutex<Option<Group>>,
    pub(super) stderr: Arc<std::sync::Mutex<super::Stderr>>,
}

impl Pipelined {
    pub(super) fn start(program: &Program, role: Role) -> Result<Arc<Pipelined>, FailureKind> {
        let PersistentProcess {
            stdin,
            stdout,
            stderr,
            group,
            ..
        } = PersistentProcess::start(program, role)?;
        let worker = Arc::new(Pipelined {
            stdin: tokio::sync::Mutex::new(stdin),
            waiting: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            in_flight: AtomicUsize::new(0),
            dead: AtomicBool::new(false),
            process: Mutex::new(Some(group)),
            stderr,
        });
        let reader = worker.clone();
        tokio::spawn(async move { reader.read_replies(stdout, role).await });
        Ok(worker)
    }

    /// Hands each reply line to its call, until the worker's stdout ends or breaks the
    /// protocol; then every call still in flight fails as `WorkerDied`.
    async fn read_replies(self: Arc<Self>, mut stdout: BufReader<ChildStdout>, role: Role) {
        let why = loop {
            let line = match read_line_limited(&mut stdout, MAX_RESPONSE_BYTES).await {
                Ok(line) => line,
                Err(kind) => break kind.to_string(),
            };
            let (response, log) = match crate::exec::callback::parse_framed(&line) {
                (Ok(response), log) => (response, log),
                (Err(kind), _) => break format!("it {kind}"),
            };
            let Some(id) = response.get("id").and_then(Value::as_u64) else {
                break "it answered without the request's `id` (max_inflight > 1 needs it echoed)".into();
            };
            if id >= self.next_id.load(Ordering::Relaxed) {
                break format!("it answered an `id` it was never sent ({id})");
            }
            // A reply to a call that timed out finds nobody waiting: it is dropped.
            let waiter = self.waiting.locked().remove(&id);
            if let Some(waiter) = waiter {
                let result = match reported_error(&response, 0) {
                    Some(error) => Err(error),
                    None => check_response(role, &response).map(|()| response),
                };
                let _ = waiter.send((result, log));
            }
        };
        self.die(&why);
    }

    fn die(&self, why: &str) {
        self.dead.store(true, Ordering::Relaxed);
        let waiting: Vec<_> = self.waiting.locked().drain().collect();
        for (_, waiter) in waiting {
            let _ = waiter.send((Err(FailureKind::WorkerDied(why.to_owned())), None));
        }
        // Its process group goes with it.
        drop(self.process.locked().take());
    }

    pub(super) async fn call(&self, timeout: Duration, request: &[u8]) -> Attempt {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        // Calls overlap: each takes what the worker wrote to stderr while it was in flight
        // (the first, everything since the worker started), which may hold others' lines.
        let mark = if id == 1 {
            0
        } else {
            self.stderr.locked().written()
        };
        let (sender, receiver) = tokio::sync::oneshot::channel();
        self.waiting.locked().insert(id, sender);
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        // The request with its id first: `{"id":N,` then the rest of the object.
        let mut line = format!("{{\"id\":{id},").into_bytes();
        match request.iter().position(|b| *b == b'{') {
            Some(open)
                if request[open + 1..]
                    .iter()
                    .any(|b| !b.is_ascii_whitespace() && *b != b'}') =>
            {
                line.extend_from_slice(&request[open + 1..]);
            }
            _ => {
                line.pop();
                line.push(b'}');
            }
        }
        line.push(b'\n');
        let exchange = async {
            {
                let mut stdin = self.stdin.lock().await;
                if let Err(error) = stdin.write_all(&line).await.and(stdin.flush().await) {
                    self.die(&format!("could not write the request: {error}"));
                }
            }
            receiver
                .await
                .unwrap_or_else(|_| (Err(FailureKind::WorkerDied("it stopped".into())), None))
        };
        let (result, framed) = match tokio::time::timeout(timeout, exchange).await {
            Ok(answered) => answered,
            Err(_) => {
                self.waiting.locked().remove(&id);
                (Err(FailureKind::Timeout(timeout)), None)
            }
        };
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
        // A log the reply framed is exactly this call's; the worker's stderr is shared.
        let stderr_of_worker = framed.is_none();
        let stderr_tail = match framed {
            Some(log) => log,
            None => super::stderr_since(&self.stderr, mark, result.is_err()).await,
        };
        Attempt {
            result,
            stderr_tail,
            stderr_of_worker,
        }
    }
}
