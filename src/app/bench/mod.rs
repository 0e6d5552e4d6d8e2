//! `gacc bench`: a paper-scale synthetic experiment with trivial callbacks, and the costs of
//! calling a callback at all. Timings are reported, never asserted: compare ratios within one
//! session, not seconds across machines.

mod baseline;
mod folder;
mod synthetic;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{Value, json};
use tokio::sync::Semaphore;

use crate::app::run::{self, RunOptions};
use crate::error::{Error, io};
use crate::exec::callback::Callback;
use crate::exec::process::ProcessLauncher;
use crate::exec::program::Program;
use crate::inputs::tokenizer::{Cl100k, Tokenizer};
use crate::protocol::Mode;
use crate::protocol::Role;
use crate::protocol::messages::{self, ReaderRequest};
use crate::store::cache::Kind;
use crate::store::run_folder::RUN;
use crate::store::run_record::RunRecord;

use synthetic::generate;

/// The shape of the synthetic experiment (the paper's design by default).
#[derive(Debug, Clone)]
pub struct Shape {
    pub sources: usize,
    pub goals: usize,
    pub questions: usize,
    pub compressors: usize,
    pub ratios: Vec<String>,
    pub source_tokens: usize,
    pub concurrency: usize,
}

impl Default for Shape {
    fn default() -> Self {
        Shape {
            sources: 281,
            goals: 500,
            questions: 2571,
            compressors: 10,
            ratios: ["0.1", "0.2", "0.3", "0.4", "0.5"].map(String::from).to_vec(),
            source_tokens: 8000,
            concurrency: 8,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct Measurement {
    pub(crate) name: String,
    /// In `unit`: seconds for a timing.
    pub(crate) value: f64,
    pub(crate) unit: &'static str,
    pub(crate) detail: Value,
}

/// Another gacc binary to measure this one against (`--baseline`), and the rounds of each
/// timing.
pub struct Baseline<'a> {
    pub binary: &'a Path,
    pub rounds: usize,
}

/// Runs every benchmark and returns the measurements; writes its experiment under `folder`.
/// With a baseline, ends with this gacc against it, side by side.
pub(crate) fn bench(
    folder: &Path,
    shape: &Shape,
    spawns: usize,
    against: Option<Baseline>,
) -> Result<Vec<Measurement>, Error> {
    let mut out = experiment(folder, shape)?;
    out.extend(call_costs(folder, shape.concurrency, spawns)?);
    out.extend(where_time_goes(folder));
    if let Some(against) = against {
        out.extend(baseline::compare(folder, against.binary, against.rounds.max(1))?);
    }
    Ok(out)
}

/// The synthetic experiment: made, planned, run in full, and run again from the cache.
fn experiment(folder: &Path, shape: &Shape) -> Result<Vec<Measurement>, Error> {
    let mut out = Vec::new();
    folder::replace(folder)?;
    let started = Instant::now();
    let manifest = generate(folder, shape).map_err(io(folder))?;
    out.push(measure(
        "generate the synthetic dataset",
        started,
        json!({"manifest": manifest}),
    ));

    let started = Instant::now();
    let prepared = crate::app::prepare::prepare(&manifest, &[])?;
    let stages = json!({"compress": prepared.plan.memories.len(), "read": prepared.plan.question_jobs(),
        "judge": prepared.plan.question_jobs()});
    drop(prepared);
    out.push(measure(
        "plan (load, tokenize sources, expand the job graph)",
        started,
        stages,
    ));

    let options = RunOptions {
        manifest: manifest.clone(),
        out: Some(folder.join("runs")),
        quiet: true,
        ..RunOptions::default()
    };
    for name in ["full run, persistent callbacks", "cached re-run"] {
        let started = Instant::now();
        let finished = run::run(&options)?;
        let record = std::fs::read_to_string(finished.folder.join(RUN))
            .ok()
            .and_then(|text| RunRecord::parse(&text))
            .unwrap_or_default();
        out.push(measure(
            name,
            started,
            json!({"calls": record.calls, "failures": finished.failures}),
        ));
    }
    out.push(Measurement {
        name: "peak memory of this process (VmHWM)".into(),
        unit: "s",
        value: 0.0,
        detail: json!({"mib": peak_memory_kib() / 1024}),
    });
    Ok(out)
}

/// What calling a callback at all costs: bare spawns beside oneshot, sandboxed, persistent
/// and sleeping callbacks.
fn call_costs(folder: &Path, concurrency: usize, spawns: usize) -> Result<Vec<Measurement>, Error> {
    let mut out = Vec::new();
    let runtime = crate::parallel::runtime(None).map_err(io(folder))?;
    let bare = runtime.block_on(spawn_true(spawns, concurrency));
    let piped = runtime.block_on(spawn_piped(spawns, concurrency));
    let oneshot = runtime.block_on(call_many(
        echo_callback(concurrency, Mode::Oneshot),
        spawns,
        concurrency,
    ));
    // The same program as the bare spawn, through the protocol (its call fails: no answer).
    let oneshot_true = runtime.block_on(call_many(
        callback(vec!["/bin/true".into()], concurrency, Mode::Oneshot),
        spawns,
        concurrency,
    ));
    out.push(Measurement {
        name: format!("bare spawn of /bin/true, {spawns} at concurrency {concurrency}"),
        unit: "s",
        value: bare.as_secs_f64(),
        detail: json!({"per_second": spawns as f64 / bare.as_secs_f64()}),
    });
    out.push(Measurement {
        name: format!("bare spawn of /bin/echo with three pipes, {spawns} at concurrency {concurrency}"),
        unit: "s",
        value: piped.as_secs_f64(),
        detail: json!({"per_second": spawns as f64 / piped.as_secs_f64()}),
    });
    out.push(Measurement {
        name: format!("oneshot calls of /bin/true, {spawns} at concurrency {concurrency}"),
        unit: "s",
        value: oneshot_true.as_secs_f64(),
        detail: json!({"per_second": spawns as f64 / oneshot_true.as_secs_f64(),
            "share_of_bare_spawn_rate": bare.as_secs_f64() / oneshot_true.as_secs_f64()}),
    });
    out.push(Measurement {
        name: format!("oneshot callback calls, {spawns} at concurrency {concurrency}"),
        unit: "s",
        value: oneshot.as_secs_f64(),
        detail: json!({"per_second": spawns as f64 / oneshot.as_secs_f64(),
            "share_of_bare_spawn_rate": bare.as_secs_f64() / oneshot.as_secs_f64(),
            "share_of_piped_spawn_rate": piped.as_secs_f64() / oneshot.as_secs_f64()}),
    });
    if let Some(program) = sandboxed(echo_program(Mode::Oneshot)) {
        let callback = launched(program, concurrency);
        let confined = runtime.block_on(call_many(callback, spawns, concurrency));
        out.push(Measurement {
            name: format!(
                "oneshot callback calls in the Landlock sandbox, {spawns} at concurrency {concurrency}"
            ),
            unit: "s",
            value: confined.as_secs_f64(),
            detail: json!({"per_second": spawns as f64 / confined.as_secs_f64(),
                "share_of_unsandboxed_rate": oneshot.as_secs_f64() / confined.as_secs_f64()}),
        });
    }
    out.extend(worker_costs(&runtime, spawns, concurrency));
    Ok(out)
}

/// What workers that stay up cost: persistent round trips, a batching worker at one and at 32
/// requests in flight, and oneshot callbacks that sleep.
fn worker_costs(runtime: &tokio::runtime::Runtime, spawns: usize, concurrency: usize) -> Vec<Measurement> {
    let mut out = Vec::new();
    let persistent = runtime.block_on(call_many(
        builtin_worker("bench-reader", concurrency, 1),
        spawns * 5,
        concurrency,
    ));
    out.push(Measurement {
        name: format!(
            "persistent callback round trips, {} at concurrency {concurrency}",
            spawns * 5
        ),
        unit: "s",
        value: persistent.as_secs_f64(),
        detail: json!({"per_second": (spawns * 5) as f64 / persistent.as_secs_f64()}),
    });
    // A model that serves a batch of up to 32 requests in 50 ms, one worker: one request in
    // flight at a time, then 32 (SPEC's pipelined protocol).
    let mut per_second = Vec::new();
    for inflight in [1, 32] {
        let calls = if inflight == 1 { 40 } else { 640 };
        let worker = builtin_worker("bench-batch-reader", inflight, inflight);
        let took = runtime.block_on(call_many(worker, calls, inflight));
        per_second.push(calls as f64 / took.as_secs_f64());
        out.push(Measurement {
            name: format!(
                "one batching worker (50 ms per batch of up to 32), max_inflight = {inflight}, {calls} calls"
            ),
            unit: "s",
            value: took.as_secs_f64(),
            detail: json!({"per_second": calls as f64 / took.as_secs_f64(),
                "throughput_over_max_inflight_1": per_second.last().copied().unwrap_or(0.0) / per_second[0]}),
        });
    }
    let sleepers = 400;
    let sleeping = runtime.block_on(call_many(sleep_callback(16), sleepers, 16));
    out.push(Measurement {
        name: format!("{sleepers} oneshot callbacks that sleep 200 ms, concurrency 16"),
        unit: "s",
        value: sleeping.as_secs_f64(),
        detail: json!({"per_second": sleepers as f64 / sleeping.as_secs_f64(), "ideal_per_second": 80.0}),
    });
    out
}

fn measure(name: &str, started: Instant, detail: Value) -> Measurement {
    Measurement {
        name: name.to_owned(),
        unit: "s",
        value: started.elapsed().as_secs_f64(),
        detail,
    }
}

fn peak_memory_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

fn callback(argv: Vec<String>, concurrency: usize, mode: Mode) -> Callback {
    launched(program(argv, mode), concurrency)
}

fn program(argv: Vec<String>, mode: Mode) -> Program {
    Program {
        argv,
        cwd: PathBuf::from("/"),
        env: Vec::new(),
        secrets: Vec::new(),
        timeout: Duration::from_secs(60),
        mode,
        sandbox: None,
        max_inflight: 1,
    }
}

/// A callback that runs `program` here, `concurrency` calls at a time.
fn launched(program: Program, concurrency: usize) -> Callback {
    Callback {
        params: json!({}),
        identity: json!({}),
        limit: Arc::new(Semaphore::new(concurrency)),
        ..Callback::new("bench", Role::Reader, Arc::new(ProcessLauncher::new(program)))
    }
}

/// `program` in a sandbox that grants it, where the kernel has Landlock.
fn sandboxed(mut program: Program) -> Option<Program> {
    use crate::exec::sandbox::{Protected, Sandboxing, kernel_abi};
    let sandboxing = Sandboxing::new(kernel_abi(), Protected::default()).ok()?;
    let grants = sandboxing
        .protected()
        .grants(None, &program.argv, false, Path::new("/"))
        .ok()?;
    let (policy, _) = sandboxing.confine(Role::Reader, None, &grants, None).ok()?;
    program.sandbox = Some(policy?);
    Some(program)
}

fn echo_callback(concurrency: usize, mode: Mode) -> Callback {
    launched(echo_program(mode), concurrency)
}

fn echo_program(mode: Mode) -> Program {
    program(vec!["/bin/echo".into(), "{\"answer\": \"x\"}".into()], mode)
}

/// A persistent worker of one of gacc's own built-ins (`gacc callback NAME`), taking up to
/// `max_inflight` requests at once.
fn builtin_worker(name: &str, concurrency: usize, max_inflight: usize) -> Callback {
    let exe = std::env::current_exe()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| "gacc".into());
    let program = Program {
        max_inflight,
        ..program(vec![exe, "callback".into(), name.into()], Mode::Persistent)
    };
    launched(program, concurrency)
}

fn sleep_callback(concurrency: usize) -> Callback {
    callback(
        vec![
            "/bin/sh".into(),
            "-c".into(),
            "sleep 0.2; echo '{\"answer\": \"x\"}'".into(),
        ],
        concurrency,
        Mode::Oneshot,
    )
}

async fn call_many(callback: Callback, calls: usize, concurrency: usize) -> Duration {
    let callback = Arc::new(callback);
    let limit = Arc::new(Semaphore::new(concurrency));
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..calls {
        let callback = callback.clone();
        let limit = limit.clone();
        tasks.spawn(async move {
            let question = format!("q{i}");
            let params = json!({});
            let request = || messages::to_bytes(&ReaderRequest::new("m", &question, 0, &params));
            let _ = callback.call(&format!("bench-{i}"), request, &limit).await;
        });
    }
    while tasks.join_next().await.is_some() {}
    started.elapsed()
}

/// The floor of any protocol over pipes: a spawn with stdin, stdout and stderr piped, its
/// output read to the end.
async fn spawn_piped(calls: usize, concurrency: usize) -> Duration {
    spawn_many(calls, concurrency, || async {
        let _ = tokio::process::Command::new("/bin/echo")
            .arg("{\"answer\": \"x\"}")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .output()
            .await;
    })
    .await
}

async fn spawn_true(calls: usize, concurrency: usize) -> Duration {
    spawn_many(calls, concurrency, || async {
        let _ = tokio::process::Command::new("/bin/true").status().await;
    })
    .await
}

/// How long `calls` spawns take, `concurrency` at a time.
async fn spawn_many<F: std::future::Future<Output = ()> + Send + 'static>(
    calls: usize,
    concurrency: usize,
    spawn: impl Fn() -> F,
) -> Duration {
    let limit = Arc::new(Semaphore::new(concurrency));
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..calls {
        let (limit, spawned) = (limit.clone(), spawn());
        tasks.spawn(async move {
            let _permit = limit.acquire().await;
            spawned.await;
        });
    }
    while tasks.join_next().await.is_some() {}
    started.elapsed()
}

/// Throughput of the parts a call is made of: tokenizing, JSON, cache writes and reads.
fn where_time_goes(folder: &Path) -> Vec<Measurement> {
    let mut out = Vec::new();
    let text = std::fs::read_to_string(folder.join("dataset.jsonl"))
        .ok()
        .and_then(|t| t.lines().next().map(str::to_owned))
        .and_then(|l| serde_json::from_str::<Value>(&l).ok())
        .and_then(|v| v["text"].as_str().map(str::to_owned))
        .unwrap_or_default();
    let tokenizer = Cl100k::new();
    let rounds = 50;
    let started = Instant::now();
    for _ in 0..rounds {
        let _ = tokenizer.encode(&text);
    }
    let seconds = started.elapsed().as_secs_f64();
    out.push(Measurement {
        name: "tokenizing (cl100k_base encode)".into(),
        value: seconds,
        unit: "s",
        detail: json!({"mb_per_second": (text.len() * rounds) as f64 / seconds / 1e6}),
    });
    // Written as gacc sends it, read as a built-in or a model prompt reads it.
    let params = json!({});
    let request = messages::CompressorRequest::new(&text, Some("g"), 800, 1, &params);
    let started = Instant::now();
    let mut bytes = 0;
    for _ in 0..rounds {
        let encoded = messages::to_bytes(&request);
        bytes += encoded.len();
        let _ = serde_json::from_slice::<messages::CompressorRequest>(&encoded);
    }
    let seconds = started.elapsed().as_secs_f64();
    out.push(Measurement {
        name: "JSON (serialise and parse a compressor request)".into(),
        value: seconds,
        unit: "s",
        detail: json!({"mb_per_second": bytes as f64 / seconds / 1e6}),
    });
    let cache_folder = folder.join("cache-bench");
    if let Ok(cache) = crate::store::cache::Cache::open(&cache_folder) {
        let entries = 20_000;
        let response = json!({"answer": "x".repeat(200)});
        let keys: Vec<String> = (0..entries).map(|i| crate::plan::keys::key(&json!(i))).collect();
        let started = Instant::now();
        for key in &keys {
            let _ = cache.put(Kind::Reader, key, &json!({}), &response);
        }
        let put = started.elapsed().as_secs_f64();
        let started = Instant::now();
        for key in &keys {
            let _ = cache.get(Kind::Reader, key);
        }
        let get = started.elapsed().as_secs_f64();
        out.push(Measurement {
            name: format!("cache writes, {entries} entries of ~250 bytes"),
            unit: "s",
            value: put,
            detail: json!({"per_second": entries as f64 / put}),
        });
        out.push(Measurement {
            name: format!("cache reads, {entries} entries"),
            unit: "s",
            value: get,
            detail: json!({"per_second": entries as f64 / get}),
        });
    }
    let _ = std::fs::remove_dir_all(cache_folder);
    out
}
