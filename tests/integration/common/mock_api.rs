//! A model API on 127.0.0.1 for the tests: OpenAI's chat completions and Anthropic's messages,
//! answering as the fixture's built-ins would (goal-line compressor, field-lookup reader, exact
//! judge) from the prompts gacc renders, with rate limits, bursts of 5xx, slow and malformed
//! replies, a refused key and a judge without a verdict on request. It counts every request
//! and the tokens it billed. Bounded: it serves at most `MAX_REQUESTS` and lives at most
//! `MAX_LIFETIME`.
#![allow(dead_code)]

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

const MAX_REQUESTS: u64 = 200_000;
const MAX_LIFETIME: Duration = Duration::from_secs(900);
const MAX_BODY: usize = 64 << 20;

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Format {
    OpenAi,
    Anthropic,
    /// OpenAI's Responses API: `/v1/responses`; its batches as chat's.
    OpenAiResponses,
}

impl Format {
    /// Its `api` name in a manifest.
    pub fn api(self) -> &'static str {
        match self {
            Format::OpenAi => "openai-chat",
            Format::Anthropic => "anthropic-messages",
            Format::OpenAiResponses => "openai-responses",
        }
    }

    /// OpenAI's batch API and its `/v1` base (chat and responses alike).
    fn openai_like(self) -> bool {
        self != Format::Anthropic
    }
}

/// How the mock misbehaves.
#[derive(Debug, Clone, Default)]
pub struct Behaviour {
    /// Requests admitted per second (a bucket of one second's worth); above it, 429.
    pub rate: Option<f64>,
    /// The bucket's size, when it is not one second's worth.
    pub burst: Option<f64>,
    /// A 429 says `Retry-After: N` whole seconds only (as most providers do), not the exact wait.
    pub retry_after: Option<u64>,
    /// Every reply carries OpenAI's `x-ratelimit-*` headers for the request bucket.
    pub ratelimit_headers: bool,
    /// Prompt tokens (a token per four bytes) admitted per second, a bucket of `token_burst`.
    pub token_rate: Option<f64>,
    pub token_burst: f64,
    /// The first N requests answer 503.
    pub fail_first: u64,
    /// The first N requests answer a 200 whose body is cut off.
    pub malformed_first: u64,
    /// Every request answers 401.
    pub unauthorized: bool,
    /// Every model request answers OpenAI's 429 for an account out of credit.
    pub out_of_credit: bool,
    /// Each reply waits this long.
    pub delay: Duration,
    /// The judge replies without a verdict.
    pub judge_without_verdict: bool,
    /// Every reply says it was cut at `max_tokens` (OpenAI's `finish_reason: length`).
    pub cut_at_max_tokens: bool,
    /// The model id a reply says served it.
    pub served_model: Option<String>,
    /// What the reader answers instead of looking the answer up.
    pub reader_answer: Option<String>,
    /// Polls of a batch before it ends.
    pub batch_polls: u32,
    /// While set, no batch ends.
    pub hold_batches: Option<Arc<AtomicBool>>,
    /// The first batch expires with only its first half answered.
    pub expire_first_batch: bool,
    /// Every Nth request of a batch is answered with a 400 error.
    pub batch_error_every: Option<usize>,
    /// Uploads (OpenAI) and batch creations (Anthropic) are refused.
    pub refuse_batches: bool,
    /// The key a request carries comes back: in a 500 (first request), a 429 (second), every
    /// 401 when `unauthorized`, and in every 200's text and served `model`.
    pub echo_key: bool,
    /// The first N model requests answer 429 with `limited_retry_after` (none: no header).
    pub limited_first: u64,
    pub limited_retry_after: Option<u64>,
    /// Every request answers `301 Moved Permanently` to this URL.
    pub redirect: Option<String>,
    /// Every 200 reply reports this `usage` instead of what it billed.
    pub usage: Option<Value>,
    /// A server that batches this many sequences: past it, each reply's `delay` grows in
    /// proportion to the requests in flight (its throughput stays at its peak).
    pub capacity: Option<u64>,
    /// Every model request in this span after the first request answers 429 (`Retry-After: 1`).
    pub storm: Option<(Duration, Duration)>,
    /// A request asking for `response_format` `json_schema` answers 500, as llama.cpp's server
    /// does for a schema it cannot compile.
    pub refuse_json_schema: bool,
    /// The server computes one model request at a time (each waits for the one before, then
    /// takes `delay`), as llama.cpp's does with one slot.
    pub one_at_a_time: bool,
    /// After this many 200 model replies the server stops: it closes its connections and
    /// refuses new ones.
    pub exit_after: Option<u64>,
    /// The first N writer requests answer prose that holds no JSON.
    pub prose_writer_first: u64,
}

#[derive(Debug, Default)]
pub struct Counts {
    pub requests: AtomicU64,
    pub answered: AtomicU64,
    pub rate_limited: AtomicU64,
    pub input_tokens: AtomicU64,
    pub cached_input_tokens: AtomicU64,
    pub output_tokens: AtomicU64,
    /// Requests per role, as the mock recognised them.
    pub compressor: AtomicU64,
    pub reader: AtomicU64,
    pub judge: AtomicU64,
    pub writer: AtomicU64,
    /// The most requests in flight at once.
    pub peak_in_flight: AtomicU64,
    /// Prompt tokens the token bucket admitted.
    pub prompt_tokens_admitted: AtomicU64,
    in_flight: AtomicU64,
    /// When each model request was answered with a 200, and how long it took, from the first
    /// request.
    pub answered_at: Mutex<Vec<(Duration, Duration)>>,
    /// When each 429 was sent, from the first request.
    pub limited_at: Mutex<Vec<Duration>>,
    /// 500s sent for a `json_schema` response format (`refuse_json_schema`).
    pub schema_refused: AtomicU64,
    first: Mutex<Option<Instant>>,
}

impl Counts {
    pub fn get(&self, counter: &AtomicU64) -> u64 {
        counter.load(Ordering::SeqCst)
    }

    /// (when from the first request, latency) of every 200 model reply, in order.
    pub fn answered_at(&self) -> Vec<(Duration, Duration)> {
        let mut answered = self.answered_at.lock().unwrap().clone();
        answered.sort();
        answered
    }

    fn since_first(&self) -> Duration {
        self.first
            .lock()
            .unwrap()
            .get_or_insert_with(Instant::now)
            .elapsed()
    }
}

struct State {
    format: Format,
    behaviour: Behaviour,
    counts: Counts,
    bucket: Mutex<(f64, Instant)>,
    token_bucket: Mutex<(f64, Instant)>,
    /// Prompt prefixes (memories) seen, for the prefix cache it reports.
    prefixes: Mutex<HashSet<String>>,
    /// Headers of every request (to check that no key leaks and the right ones are sent).
    headers: Mutex<Vec<String>>,
    /// How often each distinct model request body (as canonical JSON) was received.
    bodies: Mutex<HashMap<String, u64>>,
    stop: AtomicBool,
    started: Instant,
    batches: Mutex<Batches>,
    /// Held while a request is computed (`one_at_a_time`).
    slot: Mutex<()>,
}

/// The batch API's files and batches, and how often each request was submitted.
#[derive(Default)]
struct Batches {
    files: HashMap<String, String>,
    batches: HashMap<String, MockBatch>,
    /// Submissions per custom_id.
    submitted: HashMap<String, u64>,
    next: u64,
}

struct MockBatch {
    requests: Vec<(String, Value)>,
    polls: u32,
    metadata: Value,
    created: String,
    /// Set once it ended: (status, output JSON Lines, error JSON Lines).
    ended: Option<(String, String, String)>,
    cancelled: bool,
}

pub struct MockApi {
    pub url: String,
    state: Arc<State>,
    port: u16,
}

impl MockApi {
    pub fn start(format: Format, behaviour: Behaviour) -> MockApi {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let state = Arc::new(State {
            format,
            bucket: Mutex::new((behaviour.burst.or(behaviour.rate).unwrap_or(0.0), Instant::now())),
            token_bucket: Mutex::new((behaviour.token_burst, Instant::now())),
            behaviour,
            counts: Counts::default(),
            prefixes: Mutex::new(HashSet::new()),
            headers: Mutex::new(Vec::new()),
            bodies: Mutex::new(HashMap::new()),
            stop: AtomicBool::new(false),
            started: Instant::now(),
            batches: Mutex::new(Batches::default()),
            slot: Mutex::new(()),
        });
        let serving = state.clone();
        std::thread::spawn(move || {
            let _ = listener.set_nonblocking(false);
            for stream in listener.incoming() {
                if serving.stop.load(Ordering::SeqCst)
                    || serving.started.elapsed() > MAX_LIFETIME
                    || serving.counts.get(&serving.counts.requests) >= MAX_REQUESTS
                {
                    break;
                }
                let Ok(stream) = stream else { continue };
                let state = serving.clone();
                std::thread::spawn(move || serve_connection(stream, &state));
            }
        });
        let url = match format {
            Format::OpenAi | Format::OpenAiResponses => format!("http://127.0.0.1:{port}/v1"),
            Format::Anthropic => format!("http://127.0.0.1:{port}"),
        };
        MockApi { url, state, port }
    }

    pub fn counts(&self) -> &Counts {
        &self.state.counts
    }

    pub fn requests(&self) -> u64 {
        self.state.counts.get(&self.state.counts.requests)
    }

    /// Forgets the prompt prefixes seen, as a provider's prompt cache does after a while.
    pub fn forget_prompt_cache(&self) {
        self.state.prefixes.lock().unwrap().clear();
    }

    /// How many times each custom_id was submitted in a batch.
    pub fn submitted(&self) -> HashMap<String, u64> {
        self.state.batches.lock().unwrap().submitted.clone()
    }

    /// How often each distinct model request body was received (canonical JSON).
    pub fn bodies(&self) -> HashMap<String, u64> {
        self.state.bodies.lock().unwrap().clone()
    }

    /// Model requests received more than once: none, where no call is made twice.
    pub fn repeated(&self) -> u64 {
        self.bodies().values().map(|n| n - 1).sum()
    }

    /// Every request's headers, one string each.
    pub fn headers(&self) -> Vec<String> {
        self.state.headers.lock().unwrap().clone()
    }
}

impl Drop for MockApi {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

fn serve_connection(stream: TcpStream, state: &State) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
    let _ = stream.set_nodelay(true);
    let mut reader = BufReader::new(match stream.try_clone() {
        Ok(s) => s,
        Err(_) => return,
    });
    let mut writer = stream;
    // Keep-alive: one request after another on this connection.
    for _ in 0..10_000 {
        let Some((path, headers, body)) = read_request(&mut reader) else {
            return;
        };
        let (status, extra, reply) = respond(state, &path, &headers, &body);
        let text = format!(
            "HTTP/1.1 {status} {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{extra}\r\n",
            reason(status),
            reply.len()
        );
        // One write: a head and a body written apart meet Nagle's algorithm and a delayed
        // ACK, and the body arrives tens of milliseconds late.
        let mut whole = text.into_bytes();
        whole.extend_from_slice(&reply);
        if writer.write_all(&whole).is_err() {
            return;
        }
        if state.stop.load(Ordering::SeqCst) {
            return;
        }
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        301 => "Moved Permanently",
        401 => "Unauthorized",
        429 => "Too Many Requests",
        503 => "Service Unavailable",
        _ => "Status",
    }
}

fn read_request(reader: &mut BufReader<TcpStream>) -> Option<(String, String, Vec<u8>)> {
    let mut line = String::new();
    if reader.read_line(&mut line).ok()? == 0 {
        return None;
    }
    let path = line.split_whitespace().nth(1)?.to_owned();
    let mut headers = String::new();
    let mut length = 0usize;
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header).ok()? == 0 {
            return None;
        }
        if header == "\r\n" || header == "\n" {
            break;
        }
        if let Some((name, value)) = header.split_once(':')
            && name.eq_ignore_ascii_case("content-length")
        {
            length = value.trim().parse().ok()?;
        }
        headers.push_str(&header);
    }
    if length > MAX_BODY {
        return None;
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    Some((path, headers, body))
}

/// (status, extra header lines, body) for one request.
fn respond(state: &State, path: &str, headers: &str, body: &[u8]) -> (u16, String, Vec<u8>) {
    let counts = &state.counts;
    // This request's number, as the counter gave it: read again later, two requests that
    // arrive together would both see the second's.
    let number = counts.requests.fetch_add(1, Ordering::SeqCst) + 1;
    let now = counts.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    counts.peak_in_flight.fetch_max(now, Ordering::SeqCst);
    state.headers.lock().unwrap().push(headers.to_owned());
    let answer = answer(state, number, path, headers, body);
    counts.in_flight.fetch_sub(1, Ordering::SeqCst);
    answer
}

fn error(status: u16, message: &str) -> (u16, String, Vec<u8>) {
    (
        status,
        String::new(),
        json!({"error": {"message": message, "type": "mock"}})
            .to_string()
            .into_bytes(),
    )
}

fn answer(state: &State, number: u64, path: &str, headers: &str, body: &[u8]) -> (u16, String, Vec<u8>) {
    let behaviour = &state.behaviour;
    let counts = &state.counts;
    let expected = match state.format {
        Format::OpenAi => "/v1/chat/completions",
        Format::Anthropic => "/v1/messages",
        Format::OpenAiResponses => "/v1/responses",
    };
    if let Some(location) = &behaviour.redirect {
        return (301, format!("Location: {location}\r\n"), b"moved".to_vec());
    }
    let key = headers
        .lines()
        .find_map(|line| {
            let (name, value) = line.split_once(':')?;
            (name.eq_ignore_ascii_case("authorization") || name.eq_ignore_ascii_case("x-api-key"))
                .then(|| value.trim().to_owned())
        })
        .unwrap_or_default();
    if behaviour.out_of_credit {
        counts.rate_limited.fetch_add(1, Ordering::SeqCst);
        let body = json!({"error": {"message": "You exceeded your current quota, please check your plan and billing details.",
            "type": "insufficient_quota", "param": null, "code": "insufficient_quota"}});
        return (429, "Retry-After: 1\r\n".into(), body.to_string().into_bytes());
    }
    if behaviour.echo_key && behaviour.unauthorized {
        return error(401, &format!("Incorrect API key provided: {key}"));
    }
    if behaviour.echo_key && number == 1 {
        return error(500, &format!("upstream failed for {key}"));
    }
    if behaviour.echo_key && number == 2 {
        counts.rate_limited.fetch_add(1, Ordering::SeqCst);
        return (
            429,
            "Retry-After: 0\r\n".into(),
            json!({"error": {"message": format!("slow down, {key}")}})
                .to_string()
                .into_bytes(),
        );
    }
    if number <= behaviour.limited_first {
        counts.rate_limited.fetch_add(1, Ordering::SeqCst);
        let retry = behaviour
            .limited_retry_after
            .map_or(String::new(), |seconds| format!("Retry-After: {seconds}\r\n"));
        return (
            429,
            retry,
            json!({"error": {"message": "busy"}}).to_string().into_bytes(),
        );
    }
    if path != expected {
        if behaviour.unauthorized {
            return error(401, "Incorrect API key provided: sk-t****cret.");
        }
        return batch_route(state, path, body).unwrap_or_else(|| error(404, &format!("no route {path}")));
    }
    if behaviour.unauthorized {
        return error(
            401,
            "Incorrect API key provided: sk-t****cret. You can find your API key at https://example.invalid.",
        );
    }
    let arrived = counts.since_first();
    if let Some((from, span)) = behaviour.storm
        && arrived >= from
        && arrived < from + span
    {
        counts.rate_limited.fetch_add(1, Ordering::SeqCst);
        return (
            429,
            "Retry-After: 1\r\n".into(),
            json!({"error": {"message": "Rate limit reached for requests"}})
                .to_string()
                .into_bytes(),
        );
    }
    let mut announced = String::new();
    if let Some(rate) = behaviour.rate {
        let capacity = behaviour.burst.unwrap_or(rate.max(1.0));
        let mut bucket = state.bucket.lock().unwrap();
        let elapsed = bucket.1.elapsed().as_secs_f64();
        bucket.0 = (bucket.0 + elapsed * rate).min(capacity);
        bucket.1 = Instant::now();
        let admitted = bucket.0 >= 1.0;
        if admitted {
            bucket.0 -= 1.0;
        }
        if behaviour.ratelimit_headers {
            let reset_ms = ((capacity - bucket.0) / rate * 1000.0).ceil() as u64;
            announced = format!(
                "x-ratelimit-limit-requests: {}\r\nx-ratelimit-remaining-requests: {}\r\nx-ratelimit-reset-requests: {reset_ms}ms\r\n",
                capacity as u64,
                bucket.0.floor() as u64
            );
        }
        if !admitted {
            return rate_limited(counts, behaviour, (1.0 - bucket.0) / rate, "requests", &announced);
        }
    }
    if let Some(rate) = behaviour.token_rate {
        let tokens = (body.len() / 4) as f64;
        let mut bucket = state.token_bucket.lock().unwrap();
        let elapsed = bucket.1.elapsed().as_secs_f64();
        bucket.0 = (bucket.0 + elapsed * rate).min(behaviour.token_burst);
        bucket.1 = Instant::now();
        if bucket.0 < tokens {
            let wait = (tokens - bucket.0) / rate;
            return rate_limited(counts, behaviour, wait, "tokens", "");
        }
        bucket.0 -= tokens;
        counts
            .prompt_tokens_admitted
            .fetch_add(tokens as u64, Ordering::SeqCst);
    }
    if number <= behaviour.fail_first {
        return error(503, "overloaded");
    }
    if behaviour.refuse_json_schema
        && let Ok(request) = serde_json::from_slice::<Value>(body)
        && request.pointer("/response_format/type") == Some(&json!("json_schema"))
    {
        counts.schema_refused.fetch_add(1, Ordering::SeqCst);
        return error(
            500,
            "Unrecognized response_format type: json_schema is not supported (only json_object)",
        );
    }
    let _computing = behaviour
        .one_at_a_time
        .then(|| state.slot.lock().unwrap_or_else(|e| e.into_inner()));
    if state.stop.load(Ordering::SeqCst) {
        return error(503, "stopping");
    }
    if !behaviour.delay.is_zero() {
        let stretch = behaviour.capacity.map_or(1.0, |capacity| {
            (counts.get(&counts.in_flight) as f64 / capacity as f64).max(1.0)
        });
        std::thread::sleep(behaviour.delay.mul_f64(stretch));
    }
    let Ok(request) = serde_json::from_slice::<Value>(body) else {
        return error(400, "the body is not JSON");
    };
    *state
        .bodies
        .lock()
        .unwrap()
        .entry(request.to_string())
        .or_default() += 1;
    if request.get("model").and_then(Value::as_str).is_none() {
        return error(400, "no model");
    }
    if let Some(unsupported) = unsupported(state.format, &request) {
        return error(400, &format!("Unsupported parameter: '{unsupported}'"));
    }
    if number <= behaviour.fail_first + behaviour.malformed_first {
        return (
            200,
            String::new(),
            b"{\"choices\": [{\"message\": {\"content\": \"cut".to_vec(),
        );
    }
    let mut reply = completion(state, &request, number);
    if behaviour.echo_key {
        // Not into a judge's verdict, which must stay one JSON object.
        let echoed = |text: &Value| match text.as_str() {
            Some(verdict) if verdict.starts_with('{') => json!(verdict),
            other => json!(format!("{} (sent with {key})", other.unwrap_or(""))),
        };
        reply["model"] = json!(key);
        match state.format {
            Format::OpenAi => {
                reply["choices"][0]["message"]["content"] = echoed(&reply["choices"][0]["message"]["content"])
            }
            Format::Anthropic => {
                if reply["content"][0]["type"] == "text" {
                    reply["content"][0]["text"] = echoed(&reply["content"][0]["text"]);
                }
            }
            Format::OpenAiResponses => {
                // The message follows the reasoning item.
                let text = &mut reply["output"][1]["content"][0]["text"];
                *text = echoed(text);
            }
        }
    }
    if let Some(usage) = &behaviour.usage {
        reply["usage"] = usage.clone();
    }
    let done = counts.since_first();
    counts
        .answered_at
        .lock()
        .unwrap()
        .push((done, done.saturating_sub(arrived)));
    if behaviour
        .exit_after
        .is_some_and(|last| counts.get(&counts.answered) >= last)
    {
        state.stop.store(true, Ordering::SeqCst);
    }
    (200, announced, reply.to_string().into_bytes())
}

/// A field the format's API refuses (another API's name for it), if the request has one.
fn unsupported(format: Format, request: &Value) -> Option<&'static str> {
    let refused: &[&'static str] = match format {
        Format::OpenAi => &["max_output_tokens", "input", "instructions"],
        Format::Anthropic => &["max_output_tokens"],
        Format::OpenAiResponses => &["max_tokens", "messages", "seed", "response_format"],
    };
    refused.iter().copied().find(|field| request.get(field).is_some())
}

/// A 429 for the limit `what`, saying to retry after `wait` seconds (or as told).
fn rate_limited(
    counts: &Counts,
    behaviour: &Behaviour,
    wait: f64,
    what: &str,
    extra: &str,
) -> (u16, String, Vec<u8>) {
    counts.rate_limited.fetch_add(1, Ordering::SeqCst);
    let at = counts.since_first();
    counts.limited_at.lock().unwrap().push(at);
    let retry = match behaviour.retry_after {
        Some(seconds) => format!("Retry-After: {seconds}\r\n"),
        None => format!(
            "Retry-After: {}\r\nretry-after-ms: {}\r\n",
            wait.ceil() as u64,
            (wait * 1000.0).ceil() as u64
        ),
    };
    let message = format!("Rate limit reached on {what} per min");
    (
        429,
        format!("{retry}{extra}"),
        json!({"error": {"message": message, "type": what}})
            .to_string()
            .into_bytes(),
    )
}

/// A model's reply to one request, billed and counted (online or in a batch).
fn completion(state: &State, request: &Value, number: u64) -> Value {
    let behaviour = &state.behaviour;
    let counts = &state.counts;
    let (system, user) = messages(state.format, request);
    let (mut text, verdict, role) = model(&user, behaviour);
    match role {
        "compressor" => counts.compressor.fetch_add(1, Ordering::SeqCst),
        "reader" => counts.reader.fetch_add(1, Ordering::SeqCst),
        "writer" => {
            let made = counts.writer.fetch_add(1, Ordering::SeqCst);
            if made < behaviour.prose_writer_first {
                text = "Here are some good questions about the document, I hope they help.".into();
            }
            made
        }
        _ => counts.judge.fetch_add(1, Ordering::SeqCst),
    };
    // Billing: a token per four bytes; a reader's memory is a cached prefix the second time.
    let input = ((system.len() + user.len()) / 4) as u64 + 1;
    let output = (text.len() / 4) as u64 + 1;
    let cached = match between(&user, "<memory>\n", "\n</memory>") {
        Some(memory) if role == "reader" && memory.len() >= 8 => {
            let mut seen = state.prefixes.lock().unwrap();
            if seen.insert(memory.to_owned()) {
                0
            } else {
                (memory.len() / 4) as u64
            }
        }
        _ => 0,
    };
    counts.input_tokens.fetch_add(input, Ordering::SeqCst);
    counts.cached_input_tokens.fetch_add(cached, Ordering::SeqCst);
    counts.output_tokens.fetch_add(output, Ordering::SeqCst);
    counts.answered.fetch_add(1, Ordering::SeqCst);
    let served = behaviour
        .served_model
        .clone()
        .unwrap_or_else(|| "mock-model-1".into());
    match state.format {
        Format::OpenAi => json!({
            "id": format!("chatcmpl-{number}"),
            "object": "chat.completion",
            "model": served,
            "system_fingerprint": "fp_mock",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "finish_reason": if state.behaviour.cut_at_max_tokens { "length" } else { "stop" }}],
            "usage": {"prompt_tokens": input, "completion_tokens": output, "total_tokens": input + output,
                      "prompt_tokens_details": {"cached_tokens": cached}},
        }),
        Format::Anthropic => {
            let content = match (verdict, request.get("tool_choice")) {
                (Some(verdict), Some(_)) => {
                    json!([{"type": "tool_use", "id": "toolu_1", "name": "verdict", "input": verdict}])
                }
                _ => json!([{"type": "text", "text": text}]),
            };
            json!({
                "id": format!("msg_{number}"),
                "type": "message",
                "role": "assistant",
                "model": served,
                "content": content,
                "stop_reason": "end_turn",
                "usage": {"input_tokens": input - cached, "cache_read_input_tokens": cached,
                          "cache_creation_input_tokens": 0, "output_tokens": output},
            })
        }
        Format::OpenAiResponses => json!({
            "id": format!("resp_{number}"),
            "object": "response",
            "status": "completed",
            "model": served,
            "output": [
                {"type": "reasoning", "id": format!("rs_{number}"), "summary": []},
                {"type": "message", "id": format!("msg_{number}"), "role": "assistant", "status": "completed",
                 "content": [{"type": "output_text", "text": text, "annotations": []}]},
            ],
            "incomplete_details": null,
            "usage": {"input_tokens": input, "input_tokens_details": {"cached_tokens": cached},
                      "output_tokens": output, "output_tokens_details": {"reasoning_tokens": 0},
                      "total_tokens": input + output},
        }),
    }
}

/// (system, user) text of a request.
fn messages(format: Format, request: &Value) -> (String, String) {
    let text_of = |content: &Value| match content {
        Value::String(text) => text.clone(),
        Value::Array(blocks) => blocks.iter().filter_map(|b| b["text"].as_str()).collect(),
        _ => String::new(),
    };
    let mut system = String::new();
    let mut user = String::new();
    if format == Format::Anthropic {
        system = text_of(&request["system"]);
    }
    if format == Format::OpenAiResponses {
        system = text_of(&request["instructions"]);
        let input = match &request["input"] {
            Value::String(text) => json!([{"role": "user", "content": text}]),
            other => other.clone(),
        };
        for item in input.as_array().into_iter().flatten() {
            match item["role"].as_str() {
                Some("system" | "developer") => system.push_str(&text_of(&item["content"])),
                Some("user") => user.push_str(&text_of(&item["content"])),
                _ => {}
            }
        }
        return (system, user);
    }
    for message in request["messages"].as_array().into_iter().flatten() {
        match message["role"].as_str() {
            Some("system") => system.push_str(&text_of(&message["content"])),
            Some("user") => user.push_str(&text_of(&message["content"])),
            _ => {}
        }
    }
    (system, user)
}

fn between<'a>(text: &'a str, open: &str, close: &str) -> Option<&'a str> {
    let start = text.find(open)? + open.len();
    let end = text[start..].find(close)? + start;
    Some(&text[start..end])
}

/// What the mock model says: (reply text, structured verdict, role), as the fixture's
/// built-ins answer the same fields.
fn model(user: &str, behaviour: &Behaviour) -> (String, Option<Value>, &'static str) {
    if let Some(written) = writer(user) {
        return (written, None, "writer");
    }
    if let Some(context) = between(user, "<document>\n", "\n</document>")
        .filter(|_| user.contains("Compress the document above"))
    {
        let goal = between(user, "The questions will serve this goal: ", "\n");
        let request =
            json!({"context": context, "goal": goal, "token_budget": 1000, "seed": 0, "params": {}});
        let memory = gacc::builtin::respond("goal-line", &request).unwrap()["memory"]
            .as_str()
            .unwrap()
            .to_owned();
        return (memory, None, "compressor");
    }
    if let Some(memory) = between(user, "<memory>\n", "\n</memory>") {
        let question = user.rsplit("Question: ").next().unwrap_or("").trim();
        let request = json!({"memory": memory, "question": question, "seed": 0, "params": {}});
        let answer = gacc::builtin::respond("field-lookup", &request).unwrap()["answer"]
            .as_str()
            .unwrap()
            .to_owned();
        return (behaviour.reader_answer.clone().unwrap_or(answer), None, "reader");
    }
    // The judge: the reference, and the answer between the two fence lines gacc drew.
    let reference = between(user, "<reference>\n", "\n</reference>").unwrap_or("");
    let fence_at = user.find("\n===== ANSWER ").map(|at| at + 1);
    let answer = fence_at.and_then(|at| {
        let fence = &user[at..at + user[at..].find('\n')?];
        let start = at + fence.len() + 1;
        let end = user[start..].find(&format!("\n{fence}"))? + start;
        Some(&user[start..end])
    });
    if behaviour.judge_without_verdict {
        return ("I would rather not say.".into(), None, "judge");
    }
    let request = json!({"source": "", "question": "", "reference": reference, "answer": answer.unwrap_or("<no fence>"), "seed": 0, "params": {}});
    let correct = gacc::builtin::respond("exact", &request).unwrap()["correct"]
        .as_bool()
        .unwrap();
    let verdict =
        json!({"correct": correct, "rationale": if correct { "the same" } else { "not the reference" }});
    (verdict.to_string(), Some(verdict), "judge")
}

/// What the mock writes for `llm-writer`'s prompts (SPEC §16), from the document's
/// `field=value` pairs: two goals that name none of them (and one more than asked), and per
/// pair a question the fixture's reader answers from the pair, its evidence the pair itself.
fn writer(user: &str) -> Option<String> {
    let document = between(user, "<document>\n", "\n</document>")?;
    if user.contains("distinct goals a reader") {
        return Some(
            json!({"goals": ["know the details", "plan a visit", "one goal more than asked"]}).to_string(),
        );
    }
    if !user.contains("distinct questions this reader needs") {
        return None;
    }
    let questions: Vec<Value> = (document.split(|c: char| c.is_whitespace() || c == ','))
        .filter_map(|pair| pair.trim_end_matches('.').split_once('='))
        .map(|(field, value)| {
            json!({"question": format!("What is the {field}?"), "reference": value, "evidence": [format!("{field}={value}")]})
        })
        .collect();
    Some(format!("```json\n{}\n```", json!({"questions": questions})))
}

/// The batch API's routes: OpenAI's `/v1/files` and `/v1/batches`, Anthropic's
/// `/v1/messages/batches`.
fn batch_route(state: &State, path: &str, body: &[u8]) -> Option<(u16, String, Vec<u8>)> {
    let behaviour = &state.behaviour;
    let ok = |value: Value| (200, String::new(), value.to_string().into_bytes());
    let mut batches = state.batches.lock().unwrap();
    let path = path.split('?').next().unwrap_or(path);
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    // Chat's and responses' batches are one API.
    let format = if state.format.openai_like() {
        Format::OpenAi
    } else {
        state.format
    };
    match (format, parts.as_slice()) {
        (Format::OpenAi, ["v1", "files"]) => {
            if behaviour.refuse_batches {
                return Some(error(400, "the upload was refused: invalid file format"));
            }
            let text = String::from_utf8_lossy(body).into_owned();
            let content = text
                .split("Content-Type: application/jsonl\r\n\r\n")
                .nth(1)?
                .rsplit_once("\r\n--")?
                .0
                .to_owned();
            batches.next += 1;
            let id = format!("file-{}", batches.next);
            batches.files.insert(id.clone(), content);
            Some(ok(json!({"id": id, "object": "file", "purpose": "batch"})))
        }
        (Format::OpenAi, ["v1", "batches"]) if !body.is_empty() => {
            let request: Value = serde_json::from_slice(body).ok()?;
            let file = batches.files.get(request["input_file_id"].as_str()?)?.clone();
            let lines: Vec<Value> = file
                .lines()
                .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                .collect();
            // Each line, and the batch, name the path of the API the endpoint speaks.
            let path = match state.format {
                Format::OpenAiResponses => "/v1/responses",
                _ => "/v1/chat/completions",
            };
            if request["endpoint"] != path || lines.iter().any(|l| l["url"] != path) {
                return Some(error(400, &format!("a batch for {path} names another endpoint")));
            }
            let requests: Vec<(String, Value)> = lines
                .into_iter()
                .map(|l| {
                    (
                        l["custom_id"].as_str().unwrap_or("").to_owned(),
                        l["body"].clone(),
                    )
                })
                .collect();
            Some(ok(new_batch(&mut batches, requests, request["metadata"].clone())))
        }
        (Format::OpenAi, ["v1", "batches"]) => {
            let data: Vec<Value> = batches
                .batches
                .iter()
                .map(|(id, b)| json!({"id": id, "metadata": b.metadata}))
                .collect();
            Some(ok(json!({"data": data})))
        }
        (Format::OpenAi, ["v1", "batches", id]) => {
            let id = id.to_string();
            let ended = advance(state, &mut batches, &id)?;
            let mut reply = json!({"id": id, "object": "batch", "status": "in_progress"});
            if let Some((status, output, errors)) = ended {
                reply["status"] = json!(status);
                batches.next += 1;
                let (out_id, err_id) = (
                    format!("file-out-{}", batches.next),
                    format!("file-err-{}", batches.next),
                );
                batches.files.insert(out_id.clone(), output);
                batches.files.insert(err_id.clone(), errors);
                reply["output_file_id"] = json!(out_id);
                reply["error_file_id"] = json!(err_id);
            }
            Some(ok(reply))
        }
        (Format::OpenAi, ["v1", "batches", id, "cancel"])
        | (Format::Anthropic, ["v1", "messages", "batches", id, "cancel"]) => {
            let batch = batches.batches.get_mut(*id)?;
            batch.cancelled = true;
            Some(ok(
                json!({"id": id, "status": "cancelling", "processing_status": "canceling"}),
            ))
        }
        (Format::OpenAi, ["v1", "files", id, "content"]) => {
            let text = batches.files.get(*id)?.clone();
            Some((200, String::new(), text.into_bytes()))
        }
        (Format::Anthropic, ["v1", "messages", "batches"]) if !body.is_empty() => {
            if behaviour.refuse_batches {
                return Some(error(
                    400,
                    "the batch was refused: too many requests in one batch",
                ));
            }
            let request: Value = serde_json::from_slice(body).ok()?;
            let requests: Vec<(String, Value)> = request["requests"]
                .as_array()?
                .iter()
                .map(|r| {
                    (
                        r["custom_id"].as_str().unwrap_or("").to_owned(),
                        r["params"].clone(),
                    )
                })
                .collect();
            let mut reply = new_batch(&mut batches, requests, Value::Null);
            reply["processing_status"] = json!("in_progress");
            Some(ok(reply))
        }
        (Format::Anthropic, ["v1", "messages", "batches"]) => {
            let data: Vec<Value> = batches
                .batches
                .iter()
                .map(|(id, b)| json!({"id": id, "created_at": b.created, "request_counts": {"processing": b.requests.len()}}))
                .collect();
            Some(ok(json!({"data": data})))
        }
        (Format::Anthropic, ["v1", "messages", "batches", id]) => {
            let id = id.to_string();
            let ended = advance(state, &mut batches, &id)?;
            let mut reply = json!({"id": id, "type": "message_batch", "processing_status": "in_progress"});
            if let Some((_, output, errors)) = ended {
                batches
                    .files
                    .insert(format!("results-{id}"), format!("{output}{errors}"));
                reply["processing_status"] = json!("ended");
                reply["results_url"] = Value::Null;
            }
            Some(ok(reply))
        }
        (Format::Anthropic, ["v1", "messages", "batches", id, "results"]) => {
            let text = batches.files.get(&format!("results-{id}"))?.clone();
            Some((200, String::new(), text.into_bytes()))
        }
        _ => None,
    }
}

fn new_batch(batches: &mut Batches, requests: Vec<(String, Value)>, metadata: Value) -> Value {
    for (id, _) in &requests {
        *batches.submitted.entry(id.clone()).or_default() += 1;
    }
    batches.next += 1;
    let id = format!("batch_{}", batches.next);
    let count = requests.len();
    batches.batches.insert(
        id.clone(),
        MockBatch {
            requests,
            polls: 0,
            metadata,
            created: "2100-01-01T00:00:00Z".into(),
            ended: None,
            cancelled: false,
        },
    );
    json!({"id": id, "status": "validating", "request_counts": {"total": count}})
}

/// One poll of a batch: None while it runs; once it ends, (status, output lines, error lines).
fn advance(state: &State, batches: &mut Batches, id: &str) -> Option<Option<(String, String, String)>> {
    let first = batches
        .batches
        .keys()
        .filter_map(|k| k.strip_prefix("batch_")?.parse::<u64>().ok())
        .min();
    let is_first = id.strip_prefix("batch_").and_then(|n| n.parse::<u64>().ok()) == first;
    let batch = batches.batches.get_mut(id)?;
    if let Some(ended) = &batch.ended {
        return Some(Some(ended.clone()));
    }
    batch.polls += 1;
    let held = state
        .behaviour
        .hold_batches
        .as_ref()
        .is_some_and(|h| h.load(Ordering::SeqCst));
    if !batch.cancelled && (held || batch.polls < state.behaviour.batch_polls.max(1)) {
        return Some(None);
    }
    let expire = state.behaviour.expire_first_batch && is_first;
    let answered = if batch.cancelled {
        0
    } else if expire {
        batch.requests.len() / 2
    } else {
        batch.requests.len()
    };
    let (mut output, mut errors) = (String::new(), String::new());
    for (index, (custom_id, body)) in batch.requests.iter().enumerate() {
        let anthropic = !state.format.openai_like();
        if index >= answered {
            if anthropic {
                let kind = if batch.cancelled { "canceled" } else { "expired" };
                output.push_str(&format!(
                    "{}\n",
                    json!({"custom_id": custom_id, "result": {"type": kind}})
                ));
            }
            continue;
        }
        let erroring = state
            .behaviour
            .batch_error_every
            .is_some_and(|n| (index + 1) % n == 0);
        let line = match (anthropic, erroring) {
            (false, false) => json!({"id": format!("req_{index}"), "custom_id": custom_id,
                "response": {"status_code": 200, "body": completion(state, body, 0)}, "error": null}),
            (false, true) => json!({"id": format!("req_{index}"), "custom_id": custom_id,
                "response": {"status_code": 400, "body": {"error": {"message": "max_tokens is too large for this model"}}},
                "error": {"code": "invalid_request", "message": "max_tokens is too large for this model"}}),
            (true, false) => {
                json!({"custom_id": custom_id, "result": {"type": "succeeded", "message": completion(state, body, 0)}})
            }
            (true, true) => json!({"custom_id": custom_id, "result": {"type": "errored",
                "error": {"type": "error", "error": {"type": "invalid_request_error", "message": "max_tokens is too large for this model"}}}}),
        };
        if erroring && !anthropic {
            errors.push_str(&format!("{line}\n"));
        } else {
            output.push_str(&format!("{line}\n"));
        }
    }
    let status = if batch.cancelled {
        "cancelled"
    } else if expire {
        "expired"
    } else {
        "completed"
    };
    batch.ended = Some((status.to_owned(), output, errors));
    Some(batch.ended.clone())
}

/// The price the model tests give the mock's endpoint (USD per million tokens).
pub const PRICE: &str = "price = { input = 1.0, cached_input = 0.25, output = 4.0 }";

/// The fixture (`experiments/data/fixture.jsonl`) with every role on a model built-in at the
/// mock: `endpoint` and `run` are more lines of `[models.mock]` and `[run]`; the key is read
/// from `MOCK_API_KEY`.
pub fn llm_manifest(url: &str, format: Format, endpoint: &str, run: &str) -> String {
    let api = format.api();
    format!(
        r#"name = "llm-fixture"
seeds = [42, 43, 44]
ratios = [0.15]

[dataset]
path = "data/fixture.jsonl"

[models.mock]
api = "{api}"
base_url = "{url}"
model = "mock-1"
api_key_env = "MOCK_API_KEY"
{endpoint}

[compressors.summarise]
builtin = "llm-compressor"
params = {{ model = "mock", temperature = 0.0 }}

[reader]
builtin = "llm-reader"
params = {{ model = "mock" }}

[judge]
builtin = "llm-judge"
params = {{ model = "mock" }}

[run]
{run}
"#
    )
}

/// The key the tests give the mock; it must appear in no file and no output.
pub const KEY: &str = "sk-test-0123456789abcdef-secret";

/// No byte of the key in any file of the run folder or the cache, nor in what gacc printed.
pub fn assert_no_key(scratch: &super::Scratch, printed: &str) {
    assert!(
        !printed.contains(KEY) && !printed.contains("0123456789abcdef"),
        "{printed}"
    );
    let mut stack = vec![scratch.path("experiments")];
    stack.extend([scratch.path(".gacc"), scratch.path("runs")]);
    while let Some(path) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&path) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.is_file() {
                let bytes = super::read_bytes(&path);
                let text = String::from_utf8_lossy(&bytes);
                assert!(
                    !text.contains("0123456789abcdef"),
                    "the key is in {}",
                    path.display()
                );
            }
        }
    }
}
