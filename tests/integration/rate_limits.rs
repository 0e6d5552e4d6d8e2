//! Rate limits found without being told (SPEC §8, "Rate limits"), against three mock servers
//! on 127.0.0.1 whose limits gacc is not given: (a) requests per second with a small burst,
//! instant replies and `Retry-After: 1`; (b) the same with 300 ms replies and OpenAI's
//! rate-limit headers; (c) prompt tokens per second with long prompts. The tests check what
//! must hold whatever the machine's speed: no failed call, no request sent twice, the learned
//! pace in `run.json`, and few 429s where the server announces its limits. The benchmark
//! (ignored) measures goodput, and drives a peer against the same servers when asked.

use crate::common;

use std::time::{Duration, Instant};

use common::mock_api::{Behaviour, Format, MockApi};
use common::{Scratch, read_json};
use serde_json::{Value, json};

const RATE: f64 = 20.0;
const BURST: f64 = 5.0;
const TOKEN_RATE: f64 = 20_000.0;

/// Sequences the saturating server batches, and how long each takes unloaded.
const CAPACITY: u64 = 64;
const SEQUENCE: Duration = Duration::from_millis(500);

/// The servers.
#[derive(Debug, Clone, Copy)]
enum Server {
    /// (a)
    Requests,
    /// (b)
    Announced,
    /// (c)
    Tokens,
    /// A local model server with no rate limit: `CAPACITY` sequences at once, each taking
    /// `SEQUENCE`; past it, latency grows in proportion (peak throughput 128 requests/s).
    Saturating,
    /// (a), every request refused for this many seconds from the first second on.
    Storm(u64),
    /// Ten requests a second, a burst of ten, 300 ms replies and OpenAI's rate-limit headers:
    /// a budget announced from the first reply on.
    AnnouncedTen,
}

impl Server {
    fn behaviour(self) -> Behaviour {
        match self {
            Server::Requests => Behaviour {
                rate: Some(RATE),
                burst: Some(BURST),
                retry_after: Some(1),
                ..Behaviour::default()
            },
            Server::Announced => Behaviour {
                rate: Some(RATE),
                burst: Some(BURST),
                retry_after: Some(1),
                ratelimit_headers: true,
                delay: Duration::from_millis(300),
                ..Behaviour::default()
            },
            Server::Tokens => Behaviour {
                token_rate: Some(TOKEN_RATE),
                token_burst: TOKEN_RATE,
                retry_after: Some(1),
                delay: Duration::from_millis(200),
                ..Behaviour::default()
            },
            Server::Saturating => Behaviour {
                capacity: Some(CAPACITY),
                delay: SEQUENCE,
                ..Behaviour::default()
            },
            Server::AnnouncedTen => Behaviour {
                rate: Some(10.0),
                burst: Some(10.0),
                retry_after: Some(1),
                ratelimit_headers: true,
                delay: Duration::from_millis(300),
                ..Behaviour::default()
            },
            Server::Storm(seconds) => Behaviour {
                storm: Some((Duration::from_secs(1), Duration::from_secs(seconds))),
                ..Server::Requests.behaviour()
            },
        }
    }

    fn name(self) -> String {
        match self {
            Server::Storm(_) => "storm".into(),
            other => format!("{other:?}").to_lowercase(),
        }
    }

    /// Each question's prompt: short, or about 2,000 tokens for the tokens server.
    fn line_bytes(self) -> usize {
        match self {
            Server::Tokens => 8_000,
            _ => 0,
        }
    }
}

/// A dataset of `calls` questions in sources of 20, each source read whole (identity) by an
/// `llm-reader` and judged by `exact`: one reader call per question.
fn workload(scratch: &Scratch, calls: usize, filler: usize) {
    let mut lines = String::new();
    for s in 0..calls.div_ceil(20) {
        let mut text: String = (0..20)
            .map(|q| format!("item{q}: weight={}\n", s * 100 + q))
            .collect();
        text.push_str(&"filler text ".repeat(filler / 12));
        let questions: Vec<Value> = (0..20.min(calls - s * 20))
            .map(|q| json!({"id": format!("s{s}q{q}"), "question": format!("What is the weight of item{q}?"), "reference": (s * 100 + q).to_string()}))
            .collect();
        let goals = json!([{"id": format!("s{s}g"), "text": "know the weights", "questions": questions}]);
        lines.push_str(&json!({"id": format!("s{s}"), "text": text, "goals": goals}).to_string());
        lines.push('\n');
    }
    scratch.write("data.jsonl", &lines);
}

fn manifest(scratch: &Scratch, api: &MockApi, format: Format, name: &str) -> String {
    let manifest = format!(
        "name = \"{name}\"\nseeds = [1]\nratios = [1.0]\n[dataset]\npath = \"data.jsonl\"\n\
         [models.mock]\napi = \"{}\"\nbase_url = \"{}\"\nmodel = \"m\"\nretries = 8\n\
         [compressors.all]\nbuiltin = \"identity\"\n[reader]\nbuiltin = \"llm-reader\"\n\
         params = {{ model = \"mock\", temperature = 0.0 }}\n[judge]\nbuiltin = \"exact\"\n\
         [run]\ncache = \"cache-{name}\"\nconcurrency = 32\n",
        format.api(),
        api.url
    );
    let path = format!("{name}.toml");
    scratch.write(&path, &manifest);
    path
}

/// What one run against a server did.
struct Ran {
    status: i32,
    seconds: f64,
    failed: usize,
    made: u64,
    endpoint: Value,
    folder: std::path::PathBuf,
}

fn run(scratch: &Scratch, server: Server, calls: usize) -> (Ran, MockApi) {
    run_as(scratch, server, calls, Format::OpenAi)
}

fn run_as(scratch: &Scratch, server: Server, calls: usize, format: Format) -> (Ran, MockApi) {
    let api = MockApi::start(format, server.behaviour());
    workload(scratch, calls, server.line_bytes());
    let manifest = manifest(scratch, &api, format, &server.name());
    let started = Instant::now();
    // The benchmark's `GACC_SET` adds `--set` options (e.g. `models.mock.rpm=1200`).
    let sets: Vec<String> = std::env::var("GACC_SET")
        .unwrap_or_default()
        .split_whitespace()
        .flat_map(|set| ["--set".to_owned(), set.to_owned()])
        .collect();
    let mut extra: Vec<&str> = vec!["-q"];
    extra.extend(sets.iter().map(String::as_str));
    let (status, folder, stderr) = scratch.run(&manifest, &extra);
    let seconds = started.elapsed().as_secs_f64();
    let report = read_json(&folder.join("report.json"));
    let run = read_json(&folder.join("run.json"));
    assert!(status == 0, "{server:?}: {stderr}");
    let ran = Ran {
        status,
        seconds,
        failed: report["failures"].as_array().map_or(0, Vec::len),
        made: report["calls"]["reader"]["made"].as_u64().unwrap_or(0),
        endpoint: run["endpoints"]["mock"].clone(),
        folder,
    };
    (ran, api)
}

/// No failed call, every question answered by one request, none sent twice.
fn assert_clean(server: Server, ran: &Ran, api: &MockApi, calls: usize) {
    assert_eq!((ran.status, ran.failed), (0, 0), "{server:?}");
    assert_eq!(ran.made, calls as u64, "{server:?}");
    let counts = api.counts();
    assert_eq!(counts.get(&counts.answered), calls as u64, "{server:?}");
    assert_eq!(api.repeated(), 0, "{server:?}: a request was sent twice");
}

#[test]
fn an_untold_request_limit_is_learned_with_no_failed_call_and_no_call_twice() {
    let scratch = Scratch::empty();
    let (ran, api) = run(&scratch, Server::Requests, 120);
    assert_clean(Server::Requests, &ran, &api, 120);
    // It drew 429s (the burst is 5) and learned a pace below 1.5 times the limit.
    assert!(api.counts().get(&api.counts().rate_limited) > 0);
    let pace = ran.endpoint["pace_rpm"]
        .as_f64()
        .expect("a learned pace in run.json");
    assert!(pace > 0.0 && pace < RATE * 60.0 * 1.5, "{}", ran.endpoint);
    assert!(ran.endpoint["sustained_rpm"].as_f64().unwrap() > 0.0);
    // Each retry is one `retrying` event in the trace, naming the endpoint, the status and
    // the wait; the trace's count is run.json's.
    let review = scratch.json(["trace", &ran.folder.display().to_string(), "--format", "json"]);
    let retries = ran.endpoint["retries"].as_u64().unwrap();
    assert!(retries > 0, "{}", ran.endpoint);
    assert_eq!(review["retries"].as_u64(), Some(retries), "{review}");
    let events: Vec<Value> = common::read_lines(&ran.folder.join("trace.jsonl"))
        .into_iter()
        .filter(|line| line["message"] == "retrying")
        .collect();
    assert_eq!(events.len() as u64, retries);
    assert!(
        events
            .iter()
            .all(|e| e["endpoint"] == "mock" && e["status"] == 429 && e["wait_ms"].is_u64()),
        "{:?}",
        events.first()
    );
}

#[test]
fn announced_limits_are_paced_to_and_draw_few_429s() {
    // Both OpenAI APIs announce their limits in the same headers.
    for format in [Format::OpenAi, Format::OpenAiResponses] {
        let scratch = Scratch::empty();
        let calls = 120;
        let (ran, api) = run_as(&scratch, Server::Announced, calls, format);
        assert_clean(Server::Announced, &ran, &api, calls);
        let limited = api.counts().get(&api.counts().rate_limited);
        assert!(
            limited as f64 <= 0.05 * calls as f64,
            "{format:?}: {limited} of {calls} calls drew a 429"
        );
        let pace = ran.endpoint["pace_rpm"].as_f64().expect("the announced pace");
        assert!(pace <= RATE * 60.0, "{format:?}: {}", ran.endpoint);
    }
}

#[test]
fn an_announced_budget_is_not_overdrawn_from_the_first_reply_on() {
    // The start's calls go before anything is announced; after the first reply, no call goes
    // past what the newest `remaining` allows, less the calls in flight.
    let scratch = Scratch::empty();
    let calls = 120;
    let (ran, api) = run(&scratch, Server::AnnouncedTen, calls);
    assert_clean(Server::AnnouncedTen, &ran, &api, calls);
    let limited = api.counts().limited_at.lock().unwrap().clone();
    assert!(
        limited.len() as f64 <= 0.02 * calls as f64,
        "{} of {calls} calls drew a 429, at {limited:?}",
        limited.len()
    );
    let early = limited.iter().filter(|at| **at < Duration::from_secs(2)).count();
    assert!(early <= 3, "{early} 429s in the first 2 seconds: {limited:?}");
    assert!(
        ran.endpoint["announced_limit"].as_f64().is_some(),
        "{}",
        ran.endpoint
    );
}

#[test]
fn a_local_server_without_429s_is_filled_to_its_batch_and_no_further() {
    let scratch = Scratch::empty();
    // About ten seconds at the server's peak, most of them past the start.
    let calls = 1200;
    let (ran, api) = run(&scratch, Server::Saturating, calls);
    assert_clean(Server::Saturating, &ran, &api, calls);
    // The limit grew past the 16 calls a fixed default once allowed, to fill the batch.
    let peak = api.counts().get(&api.counts().peak_in_flight);
    assert!(peak >= CAPACITY, "at most {peak} requests in flight");
    assert!(
        ran.endpoint["peak_in_flight"].as_u64().unwrap() >= CAPACITY,
        "{}",
        ran.endpoint
    );
    // And no further than latency allows: the median reply took at most twice as long as
    // an unloaded one, as the server itself timed them.
    let mut latencies: Vec<Duration> = api.counts().answered_at().iter().map(|(_, took)| *took).collect();
    latencies.sort();
    let median = latencies[latencies.len() / 2];
    assert!(
        median <= SEQUENCE * 2,
        "median latency {median:?}, peak {peak}: {}",
        ran.endpoint
    );
    // Before any reply, the first run sent only the start's few calls; a second run of the
    // experiment (a new server address, so no call is cached) starts where the first ended.
    let before_a_reply = |api: &MockApi| {
        let answered = api.counts().answered_at();
        answered
            .iter()
            .filter(|(done, took)| done.saturating_sub(*took) < SEQUENCE / 2)
            .count()
    };
    assert!(
        before_a_reply(&api) <= 8,
        "{} calls before a reply",
        before_a_reply(&api)
    );
    let ended = ran.endpoint["final_limit"].as_u64().unwrap() as usize;
    let (again, api) = run(&scratch, Server::Saturating, 300);
    assert_clean(Server::Saturating, &again, &api, 300);
    assert!(
        before_a_reply(&api) >= ended * 2 / 3,
        "{} calls before a reply; the first run ended at {ended}",
        before_a_reply(&api)
    );
}

#[test]
fn after_a_429_storm_no_call_failed_none_was_sent_twice_and_the_pace_is_back_within_seconds() {
    let scratch = Scratch::empty();
    let calls = 300;
    let storm = 10;
    let (ran, api) = run(&scratch, Server::Storm(storm), calls);
    assert_clean(Server::Storm(storm), &ran, &api, calls);
    // The five seconds after the storm admitted at least half of what the limit allows.
    let end = Duration::from_secs(1 + storm);
    let after = api
        .counts()
        .answered_at()
        .iter()
        .filter(|(at, _)| *at >= end && *at < end + Duration::from_secs(5))
        .count();
    assert!(
        after as f64 >= 0.5 * RATE * 5.0,
        "{after} answered in the 5 s after the storm"
    );
}

#[test]
fn an_untold_token_limit_is_learned_with_no_failed_call() {
    let scratch = Scratch::empty();
    let (ran, api) = run(&scratch, Server::Tokens, 40);
    assert_clean(Server::Tokens, &ran, &api, 40);
    if api.counts().get(&api.counts().rate_limited) > 0 {
        assert!(ran.endpoint["pace_tpm"].as_f64().is_some(), "{}", ran.endpoint);
    }
}

/// A benchmark, not a test (`cargo test --release --test integration rate_limits::rate_limit_benchmark -- --ignored
/// --nocapture`): a 420-call run against server (a), 1,500 calls against each of (a), (b) and
/// (c), 840 against the saturating server and 600 through a 30 s storm; goodput as a share of
/// the server's capacity, and for the saturating server the median latency over the unloaded
/// one. With `GACC_PEER` set to a command, each server is also driven by that command (given
/// the server's URL in `MOCK_URL`, the number of calls in `CALLS` and the data in `DATA`), side
/// by side; its goodput is measured from what the server admitted. `SERVERS` picks rows by
/// name. The saturating server's row is followed by a second run of the same experiment.
#[test]
#[ignore]
fn rate_limit_benchmark() {
    let peer = std::env::var("GACC_PEER").ok();
    println!(
        "{:<10} {:<6} {:>6} {:>8} {:>8} {:>7} {:>7} {:>6} {:>6}",
        "server", "runner", "calls", "seconds", "goodput", "429s", "failed", "twice", "lat×"
    );
    let only = std::env::var("SERVERS").unwrap_or_default().to_lowercase();
    let rows = [
        (Server::Requests, 420),
        (Server::Requests, 1500),
        (Server::Announced, 1500),
        (Server::Tokens, 1500),
        (Server::Saturating, 840),
        (Server::Storm(30), 1000),
        (Server::AnnouncedTen, 420),
    ];
    for (server, calls) in rows {
        if !only.is_empty() && !only.split(',').any(|name| name == server.name()) {
            continue;
        }
        let scratch = Scratch::empty();
        let (ran, api) = run(&scratch, server, calls);
        let counts = api.counts();
        println!(
            "{:<10} {:<6} {:>6} {:>8.1} {:>8.3} {:>7} {:>7} {:>6} {:>6.2}",
            server.name(),
            "gacc",
            ran.made,
            ran.seconds,
            goodput(server, &api, ran.seconds),
            counts.get(&counts.rate_limited),
            ran.failed,
            api.repeated(),
            median_latency(server, &api),
        );
        println!("{:<10} run.json: {}", "", ran.endpoint);
        if let Server::Saturating = server {
            // The experiment run again (a new server address: nothing cached) starts from the
            // limit the first run ended on.
            let (again, api) = run(&scratch, server, calls);
            println!(
                "{:<10} {:<6} {:>6} {:>8.1} {:>8.3} {:>7} {:>7} {:>6} {:>6.2}",
                "(again)",
                "gacc",
                again.made,
                again.seconds,
                goodput(server, &api, again.seconds),
                api.counts().get(&api.counts().rate_limited),
                again.failed,
                api.repeated(),
                median_latency(server, &api),
            );
        }
        let Some(peer) = &peer else { continue };
        let api = MockApi::start(Format::OpenAi, server.behaviour());
        let started = Instant::now();
        let status = std::process::Command::new("sh")
            .args(["-c", peer])
            .env("MOCK_URL", &api.url)
            .env("CALLS", calls.to_string())
            .env("DATA", scratch.path("data.jsonl"))
            .status()
            .expect("the peer command starts");
        let seconds = started.elapsed().as_secs_f64();
        let counts = api.counts();
        let answered = counts.get(&counts.answered);
        println!(
            "{:<10} {:<6} {:>6} {:>8.1} {:>8.3} {:>7} {:>7} {:>6} {:>6.2}",
            server.name(),
            "peer",
            answered,
            seconds,
            goodput(server, &api, seconds),
            counts.get(&counts.rate_limited),
            if status.success() {
                calls as u64 - answered.min(calls as u64)
            } else {
                calls as u64
            },
            api.repeated(),
            median_latency(server, &api),
        );
    }
}

/// Admitted requests (prompt tokens for the tokens server) per second over the limit (the
/// peak throughput for the saturating server; the five seconds after a storm).
fn goodput(server: Server, api: &MockApi, seconds: f64) -> f64 {
    let counts = api.counts();
    let answered = counts.get(&counts.answered) as f64;
    match server {
        Server::Tokens => counts.get(&counts.prompt_tokens_admitted) as f64 / seconds / TOKEN_RATE,
        Server::Saturating => answered / seconds / (CAPACITY as f64 / SEQUENCE.as_secs_f64()),
        // The storm: what the five seconds after it admitted, over the limit.
        Server::Storm(storm) => {
            let end = Duration::from_secs(1 + storm);
            let after = counts
                .answered_at()
                .iter()
                .filter(|(at, _)| *at >= end && *at < end + Duration::from_secs(5))
                .count();
            after as f64 / (5.0 * RATE)
        }
        Server::AnnouncedTen => answered / seconds / 10.0,
        _ => answered / seconds / RATE,
    }
}

/// The median reply's time at the server over its unloaded time (the saturating server), or 0.
fn median_latency(server: Server, api: &MockApi) -> f64 {
    let Server::Saturating = server else {
        return 0.0;
    };
    let mut took: Vec<Duration> = api.counts().answered_at().iter().map(|(_, t)| *t).collect();
    took.sort();
    took.get(took.len() / 2)
        .map_or(0.0, |t| t.as_secs_f64() / SEQUENCE.as_secs_f64())
}

#[test]
fn gacc_plan_says_how_long_from_rpm_or_the_last_run() {
    let scratch = Scratch::empty();
    let api = MockApi::start(Format::OpenAi, Server::Requests.behaviour());
    workload(&scratch, 40, 0);
    let manifest = manifest(&scratch, &api, Format::OpenAi, "timed");
    let plan = |extra: &[&str]| {
        let output = scratch
            .gacc()
            .args(["plan", &manifest])
            .args(extra)
            .output()
            .unwrap();
        assert!(output.status.success());
        String::from_utf8(output.stdout).unwrap()
    };
    let first = plan(&[]);
    assert!(
        first.contains("about ")
            && first.contains("from an assumption (no run of this experiment has used it yet")
            && first.contains(
                "1 call(s) in flight, each reading 1000 prompt tokens and writing 30 tokens a second"
            ),
        "{first}"
    );
    let paced = plan(&["--set", "models.mock.rpm=600"]);
    // 40 calls at 10 a second.
    assert!(paced.contains("about 4 s, from rpm/tpm"), "{paced}");
    let (status, _, stderr) = scratch.run(&manifest, &["-q"]);
    assert_eq!(status, 0, "{stderr}");
    // Another reader's calls: none cached, timed from what the endpoint sustained.
    let after = plan(&["--set", "reader.params.temperature=0.5"]);
    assert!(after.contains("from the last run (runs/timed/"), "{after}");
    assert_eq!(
        api.requests() as usize,
        api.counts().get(&api.counts().answered) as usize
            + api.counts().get(&api.counts().rate_limited) as usize
    );
}

#[test]
fn a_persistent_callback_asking_for_more_than_run_concurrency_is_warned_about() {
    let scratch = Scratch::new();
    // The reader as a program: a rule built-in runs inside gacc, with no workers.
    let (status, _, stderr) = scratch.run(
        &scratch.as_programs("experiments/fixture.toml"),
        &[
            "--set",
            "reader.mode=\"persistent\"",
            "--set",
            "reader.max_inflight=16",
            "--set",
            "run.concurrency=2",
        ],
    );
    assert_eq!(status, 0, "{stderr}");
    assert!(
        stderr.contains("warning:")
            && stderr.contains("`reader.max_inflight` asks for 16")
            && stderr.contains("`run.concurrency` is 2"),
        "{stderr}"
    );
}
