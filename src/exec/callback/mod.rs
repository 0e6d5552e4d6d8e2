//! A callback as the runner calls it (SPEC §3): its settings and identity, retries with
//! backoff, redaction of passed-through secrets, and the check of each response against its
//! role. How an attempt is made is its `Launcher`'s business.

use std::borrow::Cow;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::sync::Semaphore;

use crate::exec::program::Program;
use crate::protocol::EXIT_TEMPFAIL;
use crate::protocol::Role;
use crate::trace::TraceEvent;

mod once;
mod response;

pub(crate) use once::call_once;
pub(crate) use response::{check_response, parse_framed, parse_response, reported_error};

const CALLBACK_BACKOFF_BASE: Duration = Duration::from_millis(250);
const CALLBACK_BACKOFF_MAX: Duration = Duration::from_secs(30);

/// A callback ready to be called: its name, role, settings and cache identity, and the
/// launcher that makes its attempts (which holds its program, when it has one).
#[derive(Debug, Clone)]
pub(crate) struct Callback {
    /// The manifest key that declared it: `compressors.NAME`, `reader`, `judge`, `judges.NAME`
    /// or `readers.NAME`.
    pub name: String,
    pub role: Role,
    pub retries: u32,
    pub params: Value,
    /// What determines its answers: command or built-in name, revision, params.
    pub identity: Value,
    pub limit: Arc<Semaphore>,
    /// Where and how each attempt is made: in gacc, a process here, a cluster's task, or a model
    /// endpoint.
    pub launcher: Arc<dyn Launcher>,
}

impl Callback {
    /// Whether it is an audit judge or a panel reader (`judges.NAME`, `readers.NAME`): its
    /// calls are counted apart from the run's own.
    pub(crate) fn audits(&self) -> bool {
        self.name.starts_with("judges.") || self.name.starts_with("readers.")
    }

    /// A callback of `role` called `name`, made by `launcher`, with the manifest's settings
    /// left at their defaults (no retries, no params, one call at a time).
    pub(crate) fn new(name: impl Into<String>, role: Role, launcher: Arc<dyn Launcher>) -> Callback {
        Callback {
            name: name.into(),
            role,
            retries: 0,
            params: Value::Null,
            identity: Value::Null,
            limit: Arc::new(Semaphore::new(1)),
            launcher,
        }
    }

    /// Its program, when its launcher starts one.
    pub(crate) fn program(&self) -> Option<&Program> {
        self.launcher.program()
    }
}

/// Why a call failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum FailureKind {
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
    /// Not run: the run stopped before this call could start (`--fail-fast` after a failure,
    /// the spending cap, a refused key), or a replay that may not call met a call its cache
    /// does not hold. The run's summary says which.
    #[error("not run: the run stopped before this call")]
    Cancelled,
    /// A call that failed in the run a replay (`gacc verify`) replays, as that run recorded
    /// its reason: never cached, so the replay cannot make it, and it fails as it did.
    #[error("{0}")]
    Recorded(String),
    /// The task on another machine that was to make the call ended without answering it;
    /// its engine names the task and says whether another try is worth it.
    #[error("{task} ended {state} without answering")]
    Cluster {
        task: String,
        state: String,
        #[serde(default)]
        retryable: bool,
    },
    /// The engine could not hand the call to its cluster; the message says which command
    /// refused it, and why.
    #[error("{0}")]
    Submit(String),
    /// A model endpoint refused the key, or has no such model or URL (401, 403, 404): every
    /// later call would fail too, so the run stops.
    #[error("endpoint `{endpoint}` refused the call: {message}")]
    Rejected { endpoint: String, message: String },
    /// A model endpoint answered with an error, or kept failing after its retries.
    #[error("endpoint `{endpoint}`: {message}")]
    Provider { endpoint: String, message: String },
    /// Not made: it could have taken the run past `[run] max_cost_usd`.
    #[error("not made: it could take the run past max_cost_usd = {cap}")]
    CostCap { cap: f64 },
}

impl FailureKind {
    /// Timeouts, exit status 75 and `"retryable": true` are worth another try (SPEC §3).
    pub(crate) fn retryable(&self) -> bool {
        match self {
            FailureKind::Timeout(_) => true,
            FailureKind::Exit(status) => *status == EXIT_TEMPFAIL,
            FailureKind::Reported { retryable, .. } => *retryable,
            FailureKind::WorkerDied(_) => true,
            FailureKind::Cluster { retryable, .. } => *retryable,
            _ => false,
        }
    }
}

/// A failed call, after its retries.
#[derive(Debug, Clone)]
pub(crate) struct Failure {
    pub kind: FailureKind,
    pub stderr_tail: String,
    pub attempts: u32,
}

/// How one attempt of a call is made: in gacc (a rule built-in), in a process of this machine,
/// as a task on a cluster (an `Engine`), over HTTP to a model endpoint, or (in tests) by a
/// script. The callback retries what a launcher reports retryable and holds the callback's
/// limit; a model endpoint's launcher also paces, limits, retries and prices its own requests
/// (the provider's replies say how), so its callback is given no retries of its own.
/// `key` is the call's cache key (a provider batch's `custom_id`).
pub(crate) trait Launcher: Send + Sync + std::fmt::Debug {
    fn attempt<'a>(&'a self, callback: &'a Callback, key: &'a str, request: &'a [u8]) -> AttemptFuture<'a>;

    /// The program it starts, if it starts one.
    fn program(&self) -> Option<&Program> {
        None
    }

    /// Whether its attempts use this machine's cores, so that the run's concurrency bounds
    /// them (a model endpoint's calls are bounded by the endpoint's own limit instead).
    fn uses_local_cores(&self) -> bool {
        true
    }

    /// Whether this call's attempt reads its request (else it gets none, and none is made).
    fn reads_request(&self, _callback: &Callback, _key: &str) -> bool {
        true
    }

    /// Whether gacc answers the call itself, at once (a rule built-in, in process): such a
    /// call is not worth waiting for when another gacc process makes it (it costs less than
    /// the wait), and its wall time is gacc's own, not a compressor's, so none is recorded
    /// (SPEC §15; the reference fixture's report stays the same bytes run after run).
    fn answers_at_once(&self) -> bool {
        false
    }
}

/// An attempt under way.
pub(crate) type AttemptFuture<'a> = Pin<Box<dyn Future<Output = Attempt> + Send + 'a>>;

/// What one attempt produced.
#[derive(Debug)]
pub(crate) struct Attempt {
    pub result: Result<Value, FailureKind>,
    pub stderr_tail: String,
    /// `stderr_tail` is what a long-lived worker wrote to stderr while it served this call,
    /// not a log the reply framed: its lines may be a neighbouring call's (a pipelined worker
    /// serves several at once, and a persistent one's stderr arrives when it arrives).
    pub stderr_of_worker: bool,
}

impl Callback {
    /// Calls the callback, retrying retryable failures with backoff; waits for a free slot
    /// of both this callback's and the run's concurrency for each attempt. The request's
    /// bytes are written only once a slot is free, so waiting calls hold no payload. Gives the
    /// response and the wall time of the attempt that gave it (SPEC §15: what a memory took).
    pub(crate) async fn call(
        &self,
        key: &str,
        request: impl Fn() -> Vec<u8>,
        run_limit: &Semaphore,
    ) -> Result<(Value, Duration), Failure> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let outcome = {
                let _mine = self.limit.acquire().await;
                // A closed run limit means the run is stopping (--fail-fast): start nothing.
                let cancelled = || Failure {
                    kind: FailureKind::Cancelled,
                    stderr_tail: String::new(),
                    attempts: attempt - 1,
                };
                let _run = if self.launcher.uses_local_cores() {
                    Some(run_limit.acquire().await.map_err(|_| cancelled())?)
                } else if run_limit.is_closed() {
                    return Err(cancelled());
                } else {
                    None
                };
                let reads = self.launcher.reads_request(self, key);
                let bytes = if reads { request() } else { Vec::new() };
                let started = Instant::now();
                let mut outcome = self.launcher.attempt(self, key, &bytes).await;
                let took = started.elapsed();
                // Whatever the launcher kept, nothing a callback says is stored unredacted.
                redact_attempt(&mut outcome);
                crate::trace::record(&TraceEvent::CallbackAttempt {
                    callback: Cow::Borrowed(&self.name),
                    attempt,
                    duration_ms: took.as_millis() as u64,
                    request_bytes: bytes.len() as u64,
                    ok: outcome.result.is_ok(),
                    stderr: Cow::Borrowed(&outcome.stderr_tail),
                    stderr_of: outcome.stderr_of_worker.then_some(Cow::Borrowed("worker")),
                    served: outcome.result.as_ref().ok().and_then(crate::trace::served),
                    reason: outcome
                        .result
                        .as_ref()
                        .err()
                        .map(|kind| Cow::Owned(kind.to_string())),
                    key: Some(Cow::Borrowed(key)),
                });
                (outcome, took)
            };
            let (outcome, took) = outcome;
            match outcome.result {
                Ok(response) => return Ok((response, took)),
                // A persistent worker that dies is replaced and its request tried again.
                Err(kind)
                    if kind.retryable()
                        && (attempt <= self.retries
                            || (attempt == 1 && matches!(kind, FailureKind::WorkerDied(_)))) =>
                {
                    crate::trace::record(&TraceEvent::Retrying {
                        callback: Cow::Borrowed(&self.name),
                        attempt,
                        reason: Cow::Owned(kind.to_string()),
                        endpoint: None,
                        status: None,
                        wait_ms: None,
                    });
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
}

/// Takes every registered secret (`crate::secrets`) out of what an attempt brought back:
/// its response (a server or callback that echoes a key), its failure text and stderr.
pub(crate) fn redact_attempt(attempt: &mut Attempt) {
    crate::secrets::redact_string(&mut attempt.stderr_tail);
    match &mut attempt.result {
        Ok(response) => {
            crate::secrets::redact_json(response);
        }
        Err(kind) => kind.redact(),
    }
}

impl FailureKind {
    /// Its texts with every registered secret taken out.
    fn redact(&mut self) {
        let clean = crate::secrets::redact_string;
        match self {
            FailureKind::Spawn { program, error } => {
                clean(program);
                clean(error);
            }
            FailureKind::InvalidJson(text)
            | FailureKind::MissingField(text)
            | FailureKind::WorkerDied(text)
            | FailureKind::Tokenizer(text)
            | FailureKind::Submit(text)
            | FailureKind::Reported { message: text, .. }
            | FailureKind::Recorded(text)
            | FailureKind::Rejected { message: text, .. }
            | FailureKind::Provider { message: text, .. } => clean(text),
            FailureKind::Cluster { task, state, .. } => {
                clean(task);
                clean(state);
            }
            FailureKind::Timeout(_)
            | FailureKind::Exit(_)
            | FailureKind::Signal(_)
            | FailureKind::NoOutput
            | FailureKind::NotUtf8
            | FailureKind::TooLarge(_)
            | FailureKind::Cancelled
            | FailureKind::CostCap { .. } => {}
        }
    }
}

/// Exponential backoff with jitter: about BASE * 2^(attempt-1), capped.
fn backoff(attempt: u32) -> Duration {
    jittered_backoff(CALLBACK_BACKOFF_BASE, CALLBACK_BACKOFF_MAX, attempt)
}

/// About `base * 2^(attempt-1)`, capped at `max`, with jitter (callbacks and model endpoints).
pub(crate) fn jittered_backoff(base: Duration, max: Duration, attempt: u32) -> Duration {
    let exponential = base.saturating_mul(1 << attempt.min(16).saturating_sub(1));
    let capped = exponential.min(max);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    // Between half and the whole of the capped delay.
    capped / 2 + capped.mul_f64(f64::from(nanos % 1000) / 2000.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::messages;
    use serde_json::json;

    #[test]
    fn what_check_response_lets_through_reads_as_its_roles_response() {
        // Whatever check_response accepts reads as its role's type, and what it rejects does not.
        let cases = [
            (Role::Compressor, json!({"memory": ""}), true),
            (Role::Compressor, json!({"memory": 3}), false),
            (Role::Compressor, json!({"answer": "a"}), false),
            (Role::Reader, json!({"answer": "a", "meta": {}}), true),
            (Role::Reader, json!({"answer": null}), false),
            (Role::Judge, json!({"correct": false}), true),
            (Role::Judge, json!({"correct": "yes"}), false),
            (Role::Judge, json!({"correct": true, "score": "high"}), false),
            (Role::Judge, json!({"correct": true, "rationale": 2}), false),
            (Role::Judge, json!({"correct": true, "meta": [1]}), false),
            (Role::Writer, json!({"goals": ["plan a trip"]}), true),
            (
                Role::Writer,
                json!({"questions": [{"question": "q", "reference": "r"}]}),
                true,
            ),
            (Role::Writer, json!({"goals": [""]}), false),
            (Role::Writer, json!({"answer": "a"}), false),
            (
                Role::Reader,
                json!({"answer": "a", "usage": {"served_models": {"m": "x"}}}),
                false,
            ),
        ];
        for (role, response, valid) in cases {
            assert_eq!(
                check_response(role, &response).is_ok(),
                valid,
                "{role} {response}"
            );
            let reads = match role {
                Role::Compressor => messages::read::<messages::CompressorResponse>(&response).is_some(),
                Role::Reader => messages::read::<messages::ReaderResponse>(&response).is_some(),
                Role::Judge => messages::read::<messages::JudgeResponse>(&response).is_some(),
                Role::Writer => crate::protocol::writer::check(&response).is_ok(),
            };
            let usage = response
                .get("usage")
                .map(messages::read::<messages::ReportedUsage>);
            assert_eq!(
                reads && usage.is_none_or(|u| u.is_some()),
                valid,
                "{role} {response}"
            );
            assert!(
                messages::response_fields(role)
                    .iter()
                    .all(|f| !messages::SHARED_RESPONSE_FIELDS.contains(f))
            );
        }
    }

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
    fn stdout_that_is_not_one_object_says_why() {
        let reason = |text: &str| match parse_response(text.as_bytes()) {
            Err(FailureKind::InvalidJson(reason)) => reason,
            other => panic!("{other:?}"),
        };
        let logged = reason("loading the model\n{\"memory\": \"m\"}\n");
        assert!(logged.contains("other output came with the response"), "{logged}");
        assert!(logged.contains("`loading the model`"), "{logged}");
        let after = reason("{\"memory\": \"m\"}\ndone\n");
        assert!(after.contains("`done`"), "{after}");
        let garbage = reason(&"x".repeat(500));
        assert!(
            garbage.contains("stdout began `xxx") && garbage.len() < 200,
            "{garbage}"
        );
        assert!(parse_response(b"{\"memory\": \"m\"}\n").is_ok());
    }

    #[test]
    fn retryable_failures() {
        assert!(FailureKind::Timeout(Duration::from_secs(1)).retryable());
        assert!(FailureKind::Exit(75).retryable());
        assert!(!FailureKind::Exit(1).retryable());
        assert!(!FailureKind::InvalidJson("x".into()).retryable());
    }

    #[test]
    fn backoff_grows_and_is_capped() {
        assert!(backoff(1) <= CALLBACK_BACKOFF_BASE);
        assert!(backoff(3) >= CALLBACK_BACKOFF_BASE * 2);
        assert!(backoff(40) <= CALLBACK_BACKOFF_MAX);
    }
}
