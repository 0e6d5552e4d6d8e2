//! Built-in callbacks, served over the same protocol as any other (`gacc callback NAME`).

use std::io::Write;

use serde_json::{Value, json};

use crate::protocol::Role;
use callbacks::{
    bench_judge, bench_reader, bench_window, contains, exact, extractive, field_lookup, goal_bm25, goal_line,
    identity, normalized, random_sentences, token_f1,
};

mod callbacks;
mod text;

/// A built-in callback: its name, role, and behaviour version (part of its cache identity).
struct Builtin {
    name: &'static str,
    role: Role,
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

/// How a built-in answers one request.
pub(crate) type Respond = fn(&Value) -> Result<Value, String>;

const BUILTINS: &[Builtin] = &[
    Builtin {
        name: "identity",
        role: Role::Compressor,
        revision: "1",
        summary: "the whole context (at r = 1, the full-context baseline)",
        respond: identity,
        in_process: true,
        params: &[],
    },
    Builtin {
        name: "prefix",
        role: Role::Compressor,
        revision: "1",
        summary: "the source itself, so truncation keeps its first L tokens",
        respond: identity,
        in_process: true,
        params: &[],
    },
    Builtin {
        name: "goal-line",
        role: Role::Compressor,
        revision: "1",
        summary: "the source lines containing the goal's keyword (its last word)",
        respond: goal_line,
        in_process: true,
        params: &[],
    },
    Builtin {
        name: "goal-bm25",
        role: Role::Compressor,
        revision: "1",
        summary: "the source's sentences ranked by BM25 (params k1, b) against the goal, the best kept in source order until L tokens are used",
        respond: goal_bm25,
        in_process: true,
        params: BM25,
    },
    Builtin {
        name: "random-sentences",
        role: Role::Compressor,
        revision: "1",
        summary: "source sentences drawn at random (seeded), kept in source order until L tokens are used",
        respond: random_sentences,
        in_process: true,
        params: &[],
    },
    Builtin {
        name: "field-lookup",
        role: Role::Reader,
        revision: "1",
        summary: "the value of the first field=value pair in the memory whose field the question names",
        respond: field_lookup,
        in_process: true,
        params: &[],
    },
    Builtin {
        name: "extractive",
        role: Role::Reader,
        revision: "1",
        summary: "the memory sentence that best matches the question by BM25 (params k1, b)",
        respond: extractive,
        in_process: true,
        params: BM25,
    },
    Builtin {
        name: "exact",
        role: Role::Judge,
        revision: "1",
        summary: "the answer equals the reference, ignoring surrounding white space",
        respond: exact,
        in_process: true,
        params: &[],
    },
    Builtin {
        name: "normalized",
        role: Role::Judge,
        revision: "1",
        summary: "equal after SQuAD normalisation (lowercase, no punctuation or articles, single spaces)",
        respond: normalized,
        in_process: true,
        params: &[],
    },
    Builtin {
        name: "contains",
        role: Role::Judge,
        revision: "1",
        summary: "the normalised reference's words appear, in order and together, in the normalised answer",
        respond: contains,
        in_process: true,
        params: &[],
    },
    Builtin {
        name: "token-f1",
        role: Role::Judge,
        revision: "1",
        summary: "SQuAD token F1 of answer and reference at least `threshold` (param, default 0.5); the F1 is the score",
        respond: token_f1,
        in_process: true,
        params: &[Param {
            name: "threshold",
            what: "a number from 0 to 1",
            ok: |v| v.as_f64().is_some_and(|t| (0.0..=1.0).contains(&t)),
        }],
    },
    Builtin {
        name: "bench-window",
        role: Role::Compressor,
        revision: "1",
        summary: "for gacc bench: about L tokens (4 bytes each) of the context, from an offset set by params.offset",
        respond: bench_window,
        in_process: false,
        params: &[Param {
            name: "offset",
            what: "a whole number ≥ 0",
            ok: |v| v.as_u64().is_some(),
        }],
    },
    Builtin {
        name: "bench-reader",
        role: Role::Reader,
        revision: "1",
        summary: "for gacc bench: an answer that differs per memory and question",
        respond: bench_reader,
        in_process: false,
        params: &[],
    },
    Builtin {
        name: "bench-batch-reader",
        role: Role::Reader,
        revision: "1",
        summary: "for gacc bench: bench-reader as a batching model serves, 50 ms per batch of up to 32 requests (persistent)",
        respond: bench_reader,
        in_process: false,
        params: &[],
    },
    Builtin {
        name: "bench-judge",
        role: Role::Judge,
        revision: "1",
        summary: "for gacc bench: a verdict that differs per answer",
        respond: bench_judge,
        in_process: false,
        params: &[],
    },
];

/// The built-in callbacks that can play `role`.
pub(crate) fn names(role: Role) -> Vec<&'static str> {
    BUILTINS
        .iter()
        .filter(|b| b.role == role)
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
        Some(builtin) => (builtin.respond)(request),
        None if name == TOKENIZER => tokenize(request),
        None => Err(format!("unknown built-in `{name}`")),
    }
}

/// The rule built-in `name` (its name as the table has it) and how it answers, when gacc answers it in process (SPEC §3: a pure
/// function of the request); None for a program-only or unknown built-in.
pub(crate) fn in_process(name: &str) -> Option<(&'static str, Respond)> {
    BUILTINS
        .iter()
        .find(|b| b.name == name && b.in_process)
        .map(|b| (b.name, b.respond))
}

/// Every built-in: (name, role, what it does).
pub(crate) fn catalogue() -> Vec<(&'static str, Role, &'static str)> {
    BUILTINS.iter().map(|b| (b.name, b.role, b.summary)).collect()
}

/// Serves requests from stdin until it closes: one JSON value in, one JSON line out, flushed,
/// so the same program serves oneshot and persistent mode. Returns the exit status.
pub(crate) fn serve(name: &str) -> i32 {
    let respond = if name == TOKENIZER {
        tokenize
    } else if let Some(builtin) = BUILTINS.iter().find(|b| b.name == name) {
        builtin.respond
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
    let stdin = std::io::stdin().lock();
    let mut requests = serde_json::Deserializer::from_reader(stdin).into_iter::<Value>();
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
    respond: Respond,
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
    match request.get("op").and_then(Value::as_str) {
        Some("encode") => Ok(json!({"tokens": tokenizer.encode(field(request, "text")?)})),
        Some("decode") => {
            let tokens: Vec<u32> = request
                .get("tokens")
                .and_then(Value::as_array)
                .and_then(|t| {
                    t.iter()
                        .map(|t| t.as_u64().and_then(|t| u32::try_from(t).ok()))
                        .collect()
                })
                .ok_or("the request has no `tokens` list of token ids")?;
            let vocabulary = tokenizer.bpe.num_tokens() as u32;
            if let Some(token) = tokens.iter().find(|t| **t >= vocabulary) {
                return Err(format!("token {token} is outside the vocabulary"));
            }
            let bytes = tokenizer.bpe.decode_tokens(&tokens);
            Ok(json!({"text": String::from_utf8_lossy(&bytes)}))
        }
        _ => Err("`op` must be \"encode\" or \"decode\"".into()),
    }
}

fn field<'a>(request: &'a Value, name: &str) -> Result<&'a str, String> {
    request
        .get(name)
        .and_then(Value::as_str)
        .ok_or_else(|| format!("the request has no string field `{name}`"))
}

fn goal_of(request: &Value) -> Result<Option<&str>, String> {
    match request.get("goal") {
        Some(Value::String(goal)) => Ok(Some(goal.as_str())),
        Some(Value::Null) | None => Ok(None),
        Some(_) => Err("`goal` must be a string or null".into()),
    }
}

fn budget_of(request: &Value) -> Result<usize, String> {
    request
        .get("token_budget")
        .and_then(Value::as_u64)
        .map(|b| b as usize)
        .ok_or_else(|| "the request has no whole-number field `token_budget`".to_owned())
}
