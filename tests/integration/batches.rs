//! Provider batch APIs (SPEC §9) against the mock's batch routes: the same report as online in
//! every format, a gacc killed while its batches run that re-attaches and submits nothing
//! twice, expired batches and per-request errors, a refused upload, and `gacc batches`.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::mock_api::{Behaviour, Format, MockApi, PRICE, llm_manifest};
use common::{Scratch, read_json};
use serde_json::Value;

const KEY: &str = "sk-Zq8xW3vR7tK2mN9pL4";
/// Fast batches for tests: a poll every 50 ms, calls gathered for 100 ms.
const BATCH: &str = "batch = { poll = \"50ms\", gather = \"100ms\" }";

fn write(scratch: &Scratch, name: &str, manifest: &str) -> String {
    let path = format!("experiments/{name}.toml");
    scratch.write(&path, manifest);
    path
}

fn run(scratch: &Scratch, manifest: &str, extra: &[&str]) -> (i32, std::path::PathBuf, String) {
    scratch.run_with_env(manifest, extra, &[("MOCK_API_KEY", KEY)])
}

/// The first place two JSON values differ, for a failure's message.
fn first_difference(a: &Value, b: &Value, at: &str) -> Option<String> {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => x.keys().chain(y.keys()).find_map(|k| {
            first_difference(
                x.get(k).unwrap_or(&Value::Null),
                y.get(k).unwrap_or(&Value::Null),
                &format!("{at}.{k}"),
            )
        }),
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => x
            .iter()
            .zip(y)
            .enumerate()
            .find_map(|(i, (p, q))| first_difference(p, q, &format!("{at}[{i}]"))),
        _ if a == b => None,
        _ => Some(format!("{at}: {a} vs {b}")),
    }
}

fn same_report(one: &std::path::Path, other: &std::path::Path) -> Result<(), String> {
    let (a, b) = (
        std::fs::read(one.join("report.json")).unwrap(),
        std::fs::read(other.join("report.json")).unwrap(),
    );
    if a == b {
        return Ok(());
    }
    let (x, y): (Value, Value) = (
        serde_json::from_slice(&a).unwrap(),
        serde_json::from_slice(&b).unwrap(),
    );
    Err(first_difference(&x, &y, "").unwrap_or_else(|| "the same values, other bytes".into()))
}

/// A scratch folder and a mock behaving as told, and a run of the fixture through its batches.
fn batch_run(format: Format, behaviour: Behaviour) -> (Scratch, MockApi, i32, std::path::PathBuf, String) {
    let scratch = Scratch::new();
    let api = MockApi::start(format, behaviour);
    let manifest = write(&scratch, "batch", &llm_manifest(&api.url, format, BATCH, ""));
    let (status, folder, stderr) = run(&scratch, &manifest, &[]);
    (scratch, api, status, folder, stderr)
}

fn every_request_submitted_once(api: &MockApi) {
    let submitted = api.submitted();
    assert!(!submitted.is_empty(), "nothing went through the batch API");
    let twice: Vec<_> = submitted.iter().filter(|(_, n)| **n != 1).collect();
    assert!(twice.is_empty(), "submitted more than once: {twice:?}");
}

#[test]
fn batches_give_the_online_report_byte_for_byte_in_every_format() {
    for format in [Format::OpenAi, Format::Anthropic, Format::OpenAiResponses] {
        let scratch = Scratch::new();
        // One mock, so that both runs call the same endpoint (its URL is in the identity).
        let batch_api = MockApi::start(
            format,
            Behaviour {
                batch_polls: 2,
                ..Behaviour::default()
            },
        );
        let online = write(
            &scratch,
            "online",
            &llm_manifest(&batch_api.url, format, "", "cache = \"cache-online\""),
        );
        let (status, online_folder, stderr) = run(&scratch, &online, &[]);
        assert_eq!(status, 0, "{stderr}");
        let counts = batch_api.counts();
        let online_calls = counts.get(&counts.answered);
        assert!(batch_api.submitted().is_empty());

        batch_api.forget_prompt_cache();
        let batch = write(
            &scratch,
            "batch",
            &llm_manifest(&batch_api.url, format, BATCH, "cache = \"cache-batch\""),
        );
        let (status, batch_folder, stderr) = run(&scratch, &batch, &[]);
        assert_eq!(status, 0, "{format:?}: {stderr}");
        every_request_submitted_once(&batch_api);
        assert_eq!(
            counts.get(&counts.answered),
            2 * online_calls,
            "every call was a batch request"
        );
        assert_eq!(batch_api.submitted().len() as u64, online_calls);
        if let Err(difference) = same_report(&online_folder, &batch_folder) {
            panic!("{format:?}: report.json differs between online and batch runs: {difference}");
        }

        // A second run asks nothing: the results are in the cache.
        let before = batch_api.requests();
        let (status, _, stderr) = run(&scratch, &batch, &[]);
        assert_eq!(status, 0, "{stderr}");
        assert_eq!(batch_api.requests(), before);
    }
}

#[test]
fn batch_calls_cost_half_and_the_report_says_what_the_batch_api_saved() {
    let scratch = Scratch::new();
    let api = MockApi::start(Format::OpenAi, Behaviour::default());
    let manifest = write(
        &scratch,
        "batch",
        &llm_manifest(&api.url, Format::OpenAi, &format!("{PRICE}\n{BATCH}"), ""),
    );
    let (status, folder, stderr) = run(&scratch, &manifest, &[]);
    assert_eq!(status, 0, "{stderr}");
    let usage = &read_json(&folder.join("report.json"))["endpoints"]["mock"]["usage"];
    let counts = api.counts();
    let (input, cached, output) = (
        counts.get(&counts.input_tokens),
        counts.get(&counts.cached_input_tokens),
        counts.get(&counts.output_tokens),
    );
    let online = ((input - cached) as f64 * 1.0 + cached as f64 * 0.25 + output as f64 * 4.0) / 1e6;
    let cost = usage["cost_usd"].as_f64().unwrap();
    assert!(
        (cost - online / 2.0).abs() < 1e-12,
        "{cost} is not half of {online}"
    );
    let saved = usage["batch_saved_usd"].as_f64().unwrap();
    assert!((saved - online / 2.0).abs() < 1e-12, "{saved}");
    assert!(stderr.contains("the batch API saved"), "{stderr}");
}

/// The cache's batch records, parsed.
fn records(scratch: &Scratch, cache: &str) -> Vec<Value> {
    let folder = scratch.path(&format!("{cache}/batches"));
    std::fs::read_dir(folder)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| serde_json::from_slice(&std::fs::read(e.path()).ok()?).ok())
        .collect()
}

/// Starts `gacc run MANIFEST` (stderr piped) and returns once it recorded a batch open.
fn start_until_a_batch_is_open(scratch: &Scratch, manifest: &str) -> std::process::Child {
    let child = scratch
        .gacc_process()
        .args(["run", manifest])
        .env("MOCK_API_KEY", KEY)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !records(scratch, "experiments/cache-batch")
        .iter()
        .any(|r| r["state"] == "open")
    {
        assert!(Instant::now() < deadline, "no batch was recorded open");
        std::thread::sleep(Duration::from_millis(20));
    }
    child
}

#[test]
fn a_gacc_killed_while_its_batches_run_reattaches_and_submits_nothing_twice() {
    for format in [Format::OpenAi, Format::Anthropic] {
        let scratch = Scratch::new();
        let hold = Arc::new(AtomicBool::new(true));
        let api = MockApi::start(
            format,
            Behaviour {
                hold_batches: Some(hold.clone()),
                ..Behaviour::default()
            },
        );
        let online = write(
            &scratch,
            "online",
            &llm_manifest(&api.url, format, "", "cache = \"cache-online\""),
        );
        let (status, online_folder, stderr) = run(&scratch, &online, &[]);
        assert_eq!(status, 0, "{stderr}");
        api.forget_prompt_cache();
        let manifest = write(
            &scratch,
            "batch",
            &llm_manifest(&api.url, format, BATCH, "cache = \"cache-batch\""),
        );
        let mut child = start_until_a_batch_is_open(&scratch, &manifest);
        // Let the mock be polled a few times, then kill -9.
        std::thread::sleep(Duration::from_millis(200));
        child.kill().unwrap();
        child.wait().unwrap();

        // What the cache has in flight.
        let listed = scratch
            .gacc()
            .args(["batches", "list", "experiments/cache-batch"])
            .output()
            .unwrap();
        let listed = String::from_utf8(listed.stdout).unwrap();
        assert!(
            listed.contains("open") && listed.contains("1 in flight") && listed.contains("batch_"),
            "{listed}"
        );

        hold.store(false, Ordering::SeqCst);
        let (status, folder, stderr) = run(&scratch, &manifest, &[]);
        assert_eq!(status, 0, "{format:?}: {stderr}");
        every_request_submitted_once(&api);
        if let Err(difference) = same_report(&online_folder, &folder) {
            panic!(
                "{format:?}: the re-attached run's report.json differs from the online run's: {difference}"
            );
        }
        let listed = scratch
            .gacc()
            .args(["batches", "list", "experiments/cache-batch", "--json"])
            .output()
            .unwrap();
        let listed: Value = serde_json::from_slice(&listed.stdout).unwrap();
        assert!(
            listed.as_array().unwrap().iter().all(|r| r["state"] == "ended"),
            "{listed}"
        );
    }
}

#[test]
fn an_expired_batchs_unanswered_requests_are_submitted_again_once() {
    for format in [Format::OpenAi, Format::Anthropic] {
        let (scratch, api, status, folder, stderr) = batch_run(
            format,
            Behaviour {
                expire_first_batch: true,
                ..Behaviour::default()
            },
        );
        assert_eq!(status, 0, "{format:?}: {stderr}");
        let submitted = api.submitted();
        let again = submitted.values().filter(|n| **n == 2).count();
        assert!(again > 0, "nothing was submitted again");
        assert!(submitted.values().all(|n| *n <= 2), "{submitted:?}");
        let report = read_json(&folder.join("report.json"));
        assert!(report["failures"].as_array().unwrap().is_empty());
        let expired: Vec<Value> = records(&scratch, ".gacc/cache")
            .into_iter()
            .filter(|r| r["outcome"].get("unanswered").is_some() || r["outcome"].get("expired").is_some())
            .collect();
        assert_eq!(expired.len(), 1, "one batch expired");
    }
}

#[test]
fn a_request_the_batch_answers_with_an_error_is_a_failed_call_with_the_providers_message() {
    for format in [Format::OpenAi, Format::Anthropic] {
        let (_scratch, api, status, folder, stderr) = batch_run(
            format,
            Behaviour {
                batch_error_every: Some(5),
                ..Behaviour::default()
            },
        );
        assert_eq!(status, 1, "{format:?}: {stderr}");
        let report = read_json(&folder.join("report.json"));
        let failures = report["failures"].as_array().unwrap();
        assert!(!failures.is_empty());
        for failure in failures {
            assert!(
                failure["reason"]
                    .as_str()
                    .unwrap()
                    .contains("max_tokens is too large for this model"),
                "{failure}"
            );
        }
        // Errors are not retried (a 400 would fail again) and never cached.
        assert!(api.submitted().values().all(|n| *n == 1));
    }
}

#[test]
fn a_refused_upload_fails_its_calls_with_the_reason_and_keeps_the_rest() {
    for format in [Format::OpenAi, Format::Anthropic] {
        let (_scratch, _api, status, folder, stderr) = batch_run(
            format,
            Behaviour {
                refuse_batches: true,
                ..Behaviour::default()
            },
        );
        assert_eq!(status, 1, "{stderr}");
        let report = read_json(&folder.join("report.json"));
        let failures = report["failures"].as_array().unwrap();
        assert!(!failures.is_empty());
        assert!(
            failures.iter().all(|f| f["reason"]
                .as_str()
                .unwrap()
                .contains("the batch was refused: 400")),
            "{failures:?}"
        );
        assert!(!stderr.contains(KEY));
    }
}

#[test]
fn ctrl_c_leaves_batches_running_and_gacc_batches_cancel_cancels_them() {
    let scratch = Scratch::new();
    let hold = Arc::new(AtomicBool::new(true));
    let api = MockApi::start(
        Format::OpenAi,
        Behaviour {
            hold_batches: Some(hold.clone()),
            ..Behaviour::default()
        },
    );
    let manifest = write(
        &scratch,
        "batch",
        &llm_manifest(&api.url, Format::OpenAi, BATCH, "cache = \"cache-batch\""),
    );
    let child = start_until_a_batch_is_open(&scratch, &manifest);
    // SAFETY: signalling a child of this test.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert_eq!(output.status.code(), Some(130), "{stderr}");
    // The hint is the exact command, which finds the manifest's own cache (not the default).
    let command = format!("gacc batches cancel {manifest}");
    assert!(
        stderr.contains("1 provider batch(es) still run") && stderr.contains(&command),
        "{stderr}"
    );
    let listed = scratch
        .gacc()
        .args(["batches", "list", &manifest, "--json"])
        .output()
        .unwrap();
    let listed: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert!(
        listed.as_array().unwrap().iter().any(|r| r["state"] == "open"),
        "{listed}"
    );
    assert!(
        records(&scratch, "experiments/cache-batch")
            .iter()
            .any(|r| r["state"] == "open")
    );
    let listed = scratch
        .gacc()
        .args(["batches", "list", &manifest])
        .output()
        .unwrap();
    let said =
        String::from_utf8_lossy(&listed.stdout).into_owned() + &String::from_utf8_lossy(&listed.stderr);
    assert!(
        said.contains("1 in flight: `gacc run` collects them")
            && said.contains("cancels the 1 the provider accepted"),
        "{said}"
    );

    let cancelled = scratch
        .gacc()
        .args(["batches", "cancel", &manifest])
        .env("MOCK_API_KEY", KEY)
        .output()
        .unwrap();
    let said = String::from_utf8(cancelled.stdout).unwrap();
    assert!(
        cancelled.status.success() && said.contains("cancelled batch_"),
        "{said}"
    );

    // The next run finds the batch cancelled with nothing answered, and submits its
    // requests again, once.
    hold.store(false, Ordering::SeqCst);
    let (status, folder, stderr) = run(&scratch, &manifest, &[]);
    assert_eq!(status, 0, "{stderr}");
    assert!(
        read_json(&folder.join("report.json"))["failures"]
            .as_array()
            .unwrap()
            .is_empty()
    );
    let submitted = api.submitted();
    let thrice: Vec<_> = submitted.iter().filter(|(_, n)| **n > 2).collect();
    let recorded: Vec<String> = records(&scratch, "experiments/cache-batch")
        .iter()
        .map(|r| {
            format!(
                "{} {} {} {}",
                r["local"],
                r["state"],
                r["keys"].as_array().unwrap().len(),
                r["outcome"]
            )
        })
        .collect();
    assert!(
        submitted.values().any(|n| *n == 2) && thrice.is_empty(),
        "{thrice:?} {recorded:#?}"
    );
}

#[test]
fn the_plan_bounds_a_batch_endpoints_calls_at_the_batch_price() {
    let scratch = Scratch::new();
    let api = MockApi::start(Format::OpenAi, Behaviour::default());
    let bound = |name: &str, endpoint: &str| {
        let manifest = write(
            &scratch,
            name,
            &llm_manifest(&api.url, Format::OpenAi, endpoint, ""),
        );
        let plan = scratch.json_with_env(["plan", &manifest, "--json"], &[("MOCK_API_KEY", KEY)]);
        plan["endpoints"]["mock"]["cost_usd"].as_f64().unwrap()
    };
    let online = bound("online", PRICE);
    let batch = bound("batch", &format!("{PRICE}\n{BATCH}"));
    assert!(
        online > 0.0 && (batch - online / 2.0).abs() < 1e-12,
        "{batch} is not half of {online}"
    );
    assert_eq!(api.requests(), 0);
}
