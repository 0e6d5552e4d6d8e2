//! Built-in callbacks, served over the same protocol as any other (`gacc callback NAME`).

use std::io::Write;

use serde_json::{Value, json};

use crate::protocol::Role;
use crate::protocol::messages::{
    self, CompressorRequest, CompressorResponse, JudgeRequest, JudgeResponse, LadderRequest, LadderResponse,
    ReaderRequest, ReaderResponse, TokenizerRequest,
};
use callbacks::{
    bench_judge, bench_reader, bench_window, contains, exact, extractive, field_lookup, goal_bm25, goal_line,
    identity, normalized, random_sentences, token_f1,
};

mod callbacks;
mod requests;
pub(crate) mod text;

/// A built-in callback: its name, how it answers (and so its role), and behaviour version
/// (part of its cache identity).
struct Builtin {
    name: &'static str,
    revision: &'static str,
    summary: &'static str,
    respond: Respond,
    /// A rule built-in, a pure function of the request, that gacc answers in process. The
    /// `bench-*` built-ins stand in for programs, and stay programs.
    in_process: bool,
    /// The params it reads; any other is refused when the manifest is loaded.
    params: &'static [Param],
}

/// One param a built-in reads: its name, what it must be, and the test of a value.
struct Param {
    name: &'static str,
    what: &'static str,
    ok: fn(&Value) -> bool,
}

const NON_NEGATIVE: fn(&Value) -> bool = |v| v.as_f64().is_some_and(|v| v >= 0.0);

const BM25: &[Param] = &[
    Param {
        name: "k1",
        what: "a number ≥ 0",
        ok: NON_NEGATIVE,
    },
    Param {
        name: "b",
        what: "a number ≥ 0",
        ok: NON_NEGATIVE,
    },
];

/// How a built-in answers one request: a function from its role's request to its role's
/// response (SPEC §3), the request read and the response written through the protocol's types.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Respond {
    Compressor(fn(&CompressorRequest) -> Result<CompressorResponse<'static>, String>),
    Reader(fn(&ReaderRequest) -> Result<ReaderResponse<'static>, String>),
    Judge(fn(&JudgeRequest) -> Result<JudgeResponse<'static>, String>),
}

impl Respond {
    pub(crate) fn role(self) -> Role {
        match self {
            Respond::Compressor(_) => Role::Compressor,
            Respond::Reader(_) => Role::Reader,
            Respond::Judge(_) => Role::Judge,
        }
    }

    /// The response to `request`, a JSON value, as a JSON value.
    pub(crate) fn answer(self, request: &Value) -> Result<Value, String> {
        let role = self.role();
        match self {
            Respond::Compressor(respond) if request.get("token_budgets").is_some() => {
                ladder(respond, &messages::request(request, role)?)
            }
            Respond::Compressor(respond) => {
                Ok(messages::to_value(&respond(&messages::request(request, role)?)?))
            }
            Respond::Reader(respond) => Ok(messages::to_value(&respond(&messages::request(request, role)?)?)),
            Respond::Judge(respond) => Ok(messages::to_value(&respond(&messages::request(request, role)?)?)),
        }
    }

    /// The response to the request in `bytes`, read straight into its role's type (its texts
    /// borrowed from the bytes where they hold no escape), as a JSON value.
    pub(crate) fn answer_bytes(self, bytes: &[u8]) -> Result<Value, String> {
        let role = self.role();
        let not = |error: serde_json::Error| format!("the request is not a {role} request: {error}");
        match self {
            // A single budget's request is the usual one: a ladder's is read only when it is not.
            Respond::Compressor(respond) => match serde_json::from_slice::<CompressorRequest>(bytes) {
                Ok(request) => Ok(messages::to_value(&respond(&request)?)),
                Err(error) => match serde_json::from_slice::<LadderRequest>(bytes) {
                    Ok(request) => ladder(respond, &request),
                    Err(_) => Err(not(error)),
                },
            },
            Respond::Reader(respond) => Ok(messages::to_value(&respond(
                &serde_json::from_slice(bytes).map_err(not)?,
            )?)),
            Respond::Judge(respond) => Ok(messages::to_value(&respond(
                &serde_json::from_slice(bytes).map_err(not)?,
            )?)),
        }
    }
}

/// A ladder request served by a single-budget built-in (SPEC §14): each budget answered as its
/// own request would be, so each memory is the one a single-budget call makes.
fn ladder(
    respond: fn(&CompressorRequest) -> Result<CompressorResponse<'static>, String>,
    request: &LadderRequest,
) -> Result<Value, String> {
    let memories = (request.token_budgets.iter())
        .map(|&budget| respond(&CompressorRequest::rung(request, budget)).map(|reply| reply.memory))
        .collect::<Result<Vec<_>, String>>()?;
    Ok(messages::to_value(&LadderResponse { memories }))
}

const BUILTINS: &[Builtin] = &[
    Builtin {
        name: "identity",
        revision: "1",
        summary: "the whole context (at r = 1, the full-context baseline)",
        respond: Respond::Compressor(identity),
        in_process: true,
        params: &[],
    },
    Builtin {
        name: "prefix",
        revision: "1",
        summary: "the source itself, so truncation keeps its first L tokens",
        respond: Respond::Compressor(identity),
        in_process: true,
        params: &[],
    },
    Builtin {
        name: "goal-line",
        revision: "1",
        summary: "the source lines containing the goal's keyword (its last word)",
        respond: Respond::Compressor(goal_line),
        in_process: true,
        params: &[],
    },
    Builtin {
        name: "goal-bm25",
        revision: "1",
        summary: "the source's sentences ranked by BM25 (params k1, b) against the goal, the best kept in source order until L tokens are used",
        respond: Respond::Compressor(goal_bm25),
        in_process: true,
        params: BM25,
    },
    Builtin {
        name: "random-sentences",
        revision: "1",
        summary: "source sentences drawn at random (seeded), kept in source order until L tokens are used",
        respond: Respond::Compressor(random_sentences),
        in_process: true,
        params: &[],
    },
    Builtin {
        name: "field-lookup",
        revision: "1",
        summary: "the value of the first field=value pair in the memory whose field the question names",
        respond: Respond::Reader(field_lookup),
        in_process: true,
        params: &[],
    },
    Builtin {
        name: "extractive",
        revision: "1",
        summary: "the memory sentence that best matches the question by BM25 (params k1, b)",
        respond: Respond::Reader(extractive),
        in_process: true,
        params: BM25,
    },
    Builtin {
        name: "exact",
        revision: "1",
        summary: "the answer equals the reference, ignoring surrounding white space",
        respond: Respond::Judge(exact),
        in_process: true,
        params: &[],
    },
    Builtin {
        name: "normalized",
        revision: "1",
        summary: "equal after SQuAD normalisation (lowercase, no punctuation or articles, single spaces)",
        respond: Respond::Judge(normalized),
        in_process: true,
        params: &[],
    },
    Builtin {
        name: "contains",
        revision: "1",
        summary: "the normalised reference's words appear, in order and together, in the normalised answer",
        respond: Respond::Judge(contains),
        in_process: true,
        params: &[],
    },
    Builtin {
        name: "token-f1",
        revision: "1",
        summary: "SQuAD token F1 of answer and reference at least `threshold` (param, default 0.5); the F1 is the score",
        respond: Respond::Judge(token_f1),
        in_process: true,
        params: &[Param {
            name: "threshold",
            what: "a number from 0 to 1",
            ok: |v| v.as_f64().is_some_and(|t| (0.0..=1.0).contains(&t)),
        }],
    },
    Builtin {
        name: "bench-window",
        revision: "1",
        summary: "for gacc bench: about L tokens (4 bytes each) of the context, from an offset set by params.offset",
        respond: Respond::Compressor(bench_window),
        in_process: false,
        params: &[Param {
            name: "offset",
            what: "a whole number ≥ 0",
            ok: |v| v.as_u64().is_some(),
        }],
    },
    Builtin {
        name: "bench-reader",
        revision: "1",
        summary: "for gacc bench: an answer that differs per memory and question",
        respond: Respond::Reader(bench_reader),
        in_process: false,
        params: &[],
    },
    Builtin {
        name: "bench-batch-reader",
        revision: "1",
        summary: "for gacc bench: bench-reader as a batching model serves, 50 ms per batch of up to 32 requests (persistent)",
        respond: Respond::Reader(bench_reader),
        in_process: false,
        params: &[],
    },
    Builtin {
        name: "bench-judge",
        revision: "1",
        summary: "for gacc bench: a verdict that differs per answer",
        respond: Respond::Judge(bench_judge),
        in_process: false,
        params: &[],
    },
];

/// The built-in callbacks that can play `role`.
pub(crate) fn names(role: Role) -> Vec<&'static str> {
    BUILTINS
        .iter()
        .filter(|b| b.respond.role() == role)
        .map(|b| b.name)
        .collect()
}

/// The behaviour version of a built-in, bound into its cache keys.
/// What is wrong with `params` for built-in `name`: each param it does not read (with those it
/// does), each value of the wrong kind.
pub(crate) fn param_problems(name: &str, params: &Value) -> Vec<String> {
    let Some(builtin) = BUILTINS.iter().find(|b| b.name == name) else {
        return Vec::new();
    };
    let Some(params) = params.as_object() else {
        return Vec::new();
    };
    let accepted: Vec<&str> = builtin.params.iter().map(|p| p.name).collect();
    let mut problems = Vec::new();
    for (key, value) in params {
        match builtin.params.iter().find(|p| p.name == key) {
            None if accepted.is_empty() => {
                problems.push(format!("`params.{key}`: `{name}` takes no params"));
            }
            None => problems.push(format!(
                "`params.{key}`: `{name}` takes no such param; it takes {}",
                accepted.join(", ")
            )),
            Some(param) if !(param.ok)(value) => {
                problems.push(format!("`params.{key}` must be {}, got {value}", param.what))
            }
            Some(_) => {}
        }
    }
    problems
}

pub(crate) fn revision(name: &str) -> Option<&'static str> {
    BUILTINS.iter().find(|b| b.name == name).map(|b| b.revision)
}

/// Answers one request as the built-in `name` would, in process (for tests and tools).
pub fn respond(name: &str, request: &Value) -> Result<Value, String> {
    match BUILTINS.iter().find(|b| b.name == name) {
        Some(builtin) => builtin.respond.answer(request),
        None if name == TOKENIZER => tokenize(request),
        None => Err(format!("unknown built-in `{name}`")),
    }
}

/// The rule built-in `name` (its name as the table has it) and how it answers, when gacc answers it
/// in process (SPEC §3: a pure function of the request); None for a program-only or unknown
/// built-in.
pub(crate) fn in_process(name: &str) -> Option<(&'static str, Respond)> {
    BUILTINS
        .iter()
        .find(|b| b.name == name && b.in_process)
        .map(|b| (b.name, b.respond))
}

/// Every built-in: (name, role, what it does).
pub(crate) fn catalogue() -> Vec<(&'static str, Role, &'static str)> {
    BUILTINS
        .iter()
        .map(|b| (b.name, b.respond.role(), b.summary))
        .collect()
}

/// Serves requests from stdin until it closes: one JSON value in, one JSON line out, flushed,
/// so the same program serves oneshot and persistent mode. Returns the exit status.
pub(crate) fn serve(name: &str) -> i32 {
    let respond: &dyn Fn(&Value) -> Result<Value, String> = if name == TOKENIZER {
        &tokenize
    } else if let Some(builtin) = BUILTINS.iter().find(|b| b.name == name) {
        &|request: &Value| builtin.respond.answer(request)
    } else {
        let all: Vec<_> = BUILTINS.iter().map(|b| b.name).collect();
        eprintln!(
            "gacc callback: unknown built-in `{name}`: expected one of {}",
            all.join(", ")
        );
        return 2;
    };
    if name == "bench-batch-reader" {
        return serve_batches(respond, BENCH_BATCH, BENCH_GATHER, BENCH_BATCH_TIME);
    }
    let mut requests = requests::Requests::of(std::io::stdin().lock());
    let mut stdout = std::io::stdout().lock();
    let mut status = 0;
    let mut served = 0;
    loop {
        let (response, stop, id) = match requests.next() {
            None if served > 0 => break,
            None => (Err("no request on stdin".to_owned()), true, None),
            Some(Err(error)) => (Err(format!("the request is not JSON: {error}")), true, None),
            Some(Ok(request)) => (respond(&request), false, request.get("id").cloned()),
        };
        served += 1;
        let (mut response, complaint) = reply(name, response);
        if let Some(complaint) = complaint {
            eprintln!("{complaint}");
            status = 1;
        }
        // A pipelined worker's reply names its request.
        if let (Some(id), Some(fields)) = (id, response.as_object_mut()) {
            fields.insert("id".into(), id);
        }
        if writeln!(stdout, "{response}")
            .and_then(|_| stdout.flush())
            .is_err()
        {
            return 1;
        }
        if stop {
            break;
        }
    }
    status
}

/// A built-in's answer as `gacc callback NAME` prints it: the response, or the protocol's
/// error object and the line it writes to stderr.
pub(crate) fn reply(name: &str, answer: Result<Value, String>) -> (Value, Option<String>) {
    match answer {
        Ok(response) => (response, None),
        Err(message) => {
            let complaint = format!("{name}: {message}");
            (json!({"error": message, "retryable": false}), Some(complaint))
        }
    }
}

/// `bench-batch-reader`'s batches: at most this many requests, gathered for at most
/// `gathered` after the first, taking `BENCH_BATCH_TIME` each.
const BENCH_BATCH: usize = 32;
const BENCH_GATHER: std::time::Duration = std::time::Duration::from_millis(5);
const BENCH_BATCH_TIME: std::time::Duration = std::time::Duration::from_millis(50);

/// Serves as a batching model does: the requests that have arrived (up to `most`) are taken
/// together, answered after `takes`, each reply with its request's `id`.
fn serve_batches(
    respond: &dyn Fn(&Value) -> Result<Value, String>,
    most: usize,
    gathered: std::time::Duration,
    takes: std::time::Duration,
) -> i32 {
    use std::io::BufRead;
    let mut stdin = std::io::BufReader::with_capacity(1 << 20, std::io::stdin().lock());
    let mut stdout = std::io::stdout().lock();
    loop {
        let mut batch = Vec::new();
        let mut started = std::time::Instant::now();
        loop {
            let mut line = String::new();
            match stdin.read_line(&mut line) {
                Ok(0) | Err(_) if batch.is_empty() => return 0,
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    if batch.is_empty() {
                        started = std::time::Instant::now();
                    }
                    batch.push(line);
                }
            }
            if batch.len() >= most {
                break;
            }
            // More of the batch: lines already read in, or arriving within the gather window
            // that follows the batch's first request (as a model server's batcher waits).
            if !stdin.buffer().contains(&b'\n')
                && !stdin_readable_within(gathered.saturating_sub(started.elapsed()))
            {
                break;
            }
        }
        std::thread::sleep(takes);
        for line in batch {
            let request: Value = serde_json::from_str(&line).unwrap_or(Value::Null);
            let mut response =
                respond(&request).unwrap_or_else(|message| json!({"error": message, "retryable": false}));
            if let (Some(id), Some(fields)) = (request.get("id"), response.as_object_mut()) {
                fields.insert("id".into(), id.clone());
            }
            if writeln!(stdout, "{response}").is_err() {
                return 1;
            }
        }
        if stdout.flush().is_err() {
            return 1;
        }
    }
}

/// Whether stdin has something to read within `wait`.
fn stdin_readable_within(wait: std::time::Duration) -> bool {
    let mut fd = libc::pollfd {
        fd: 0,
        events: libc::POLLIN,
        revents: 0,
    };
    let millis = wait.as_millis().min(i32::MAX as u128) as i32;
    // SAFETY: poll(2) on one pollfd that lives on this stack frame for the call.
    unsafe { libc::poll(&mut fd, 1, millis) > 0 }
}

/// The built-in cl100k_base served over the tokenizer role, for external tokenizers that
/// wrap it (and for testing external tokenizer support).
pub(crate) const TOKENIZER: &str = "cl100k_base";

fn tokenize(request: &Value) -> Result<Value, String> {
    let tokenizer = bpe_openai::cl100k_base();
    let request: TokenizerRequest = serde::Deserialize::deserialize(request)
        .map_err(|error| format!("the request is not a tokenizer request: {error}"))?;
    match request {
        TokenizerRequest::Encode { text } => Ok(json!({"tokens": tokenizer.encode(&text)})),
        TokenizerRequest::Decode { tokens } => {
            let vocabulary = tokenizer.bpe.num_tokens() as u32;
            if let Some(token) = tokens.iter().find(|t| **t >= vocabulary) {
                return Err(format!("token {token} is outside the vocabulary"));
            }
            let bytes = tokenizer.bpe.decode_tokens(&tokens);
            Ok(json!({"text": String::from_utf8_lossy(&bytes)}))
        }
    }
}
