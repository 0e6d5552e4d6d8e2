//! gacc against hostile model servers (SPEC §8): a server that echoes the key, one that
//! refuses the first calls with no `Retry-After`, one that redirects, one whose usage is
//! absurd. Nothing leaks, nothing stalls, nothing is paid for twice or silently changed.

use crate::common;

use std::time::{Duration, Instant};

use common::mock_api::{Behaviour, Format, KEY, MockApi, PRICE, assert_no_key, llm_manifest};
use common::{Scratch, read_json};
use serde_json::{Value, json};

fn manifest(scratch: &Scratch, api: &MockApi, format: Format, endpoint: &str, run: &str) -> String {
    let text = llm_manifest(&api.url, format, &format!("{PRICE}\n{endpoint}"), run);
    scratch.write("experiments/llm.toml", &text);
    "experiments/llm.toml".into()
}

fn run(scratch: &Scratch, manifest: &str, extra: &[&str]) -> (i32, std::path::PathBuf, String) {
    scratch.run_with_env(manifest, extra, &[("MOCK_API_KEY", KEY)])
}

#[test]
fn a_key_the_server_echoes_is_nowhere_in_the_run_the_cache_the_trace_or_the_terminal() {
    for format in [Format::OpenAi, Format::Anthropic, Format::OpenAiResponses] {
        let scratch = Scratch::new();
        // A 500 and a 429 that repeat the Authorization header, then 200s whose text and
        // served model repeat it.
        let api = MockApi::start(
            format,
            Behaviour {
                echo_key: true,
                ..Behaviour::default()
            },
        );
        let manifest = manifest(&scratch, &api, format, "", "");
        let (status, folder, stderr) = run(&scratch, &manifest, &["-vvv"]);
        assert_eq!(status, 0, "{format:?}: {stderr}");
        let trace = std::fs::read_to_string(folder.join("trace.jsonl")).unwrap();
        assert!(
            trace.contains("\"message\":\"retrying\"") && trace.contains("[redacted:MOCK_API_KEY]"),
            "{format:?}: the echoing 500 and 429 were retried, redacted"
        );
        let report = read_json(&folder.join("report.json"));
        let served = report["endpoints"]["mock"]["usage"]["served_models"].to_string();
        assert!(served.contains("[redacted:MOCK_API_KEY]"), "{served}");
        let memories = common::read_text(&folder.join("memories.jsonl.gz"));
        assert!(!memories.is_empty());
        assert_no_key(&scratch, &stderr);
        // A rerun is answered by the cache, which holds the redacted replies.
        let made = api.requests();
        let (status, again, stderr) = run(&scratch, &manifest, &[]);
        assert_eq!(status, 0, "{stderr}");
        assert_eq!(api.requests(), made, "{format:?}: the rerun called the server");
        assert_eq!(read_json(&again.join("report.json"))["cells"], report["cells"]);

        // A 401 that repeats the key whole.
        let refusing = MockApi::start(
            format,
            Behaviour {
                echo_key: true,
                unauthorized: true,
                ..Behaviour::default()
            },
        );
        let manifest = self::manifest(&scratch, &refusing, format, "", "cache = \"refused\"");
        let (status, _, stderr) = run(&scratch, &manifest, &["-vvv"]);
        assert_ne!(status, 0, "{stderr}");
        assert!(stderr.contains("401"), "{stderr}");
        assert_no_key(&scratch, &stderr);
    }
}

/// The run's wall time: these servers stalled a run for good when a 429 set the pace.
fn timed(scratch: &Scratch, manifest: &str) -> (i32, Duration, String) {
    let started = Instant::now();
    let (status, _, stderr) = run(scratch, manifest, &[]);
    (status, started.elapsed(), stderr)
}

#[test]
fn first_calls_refused_without_retry_after_or_with_zero_do_not_stall_the_run() {
    for retry_after in [None, Some(0), Some(1)] {
        let scratch = Scratch::new();
        let api = MockApi::start(
            Format::OpenAi,
            Behaviour {
                limited_first: 3,
                limited_retry_after: retry_after,
                ..Behaviour::default()
            },
        );
        let manifest = manifest(&scratch, &api, Format::OpenAi, "", "");
        let (status, took, stderr) = timed(&scratch, &manifest);
        assert_eq!(status, 0, "{retry_after:?}: {stderr}");
        // A liveness bound, far above the few seconds it takes and far below a stall.
        assert!(took < Duration::from_secs(60), "{retry_after:?}: {took:?}");
        let counts = api.counts();
        assert_eq!(counts.get(&counts.rate_limited), 3);
        assert_eq!(api.repeated(), 0, "a request answered 200 was sent again");
        // The next run on a new cache meets the same server, refusing again at first.
        let again = MockApi::start(
            Format::OpenAi,
            Behaviour {
                limited_first: 2,
                limited_retry_after: retry_after,
                ..Behaviour::default()
            },
        );
        let manifest = self::manifest(&scratch, &again, Format::OpenAi, "", "cache = \"second\"");
        let (status, took, stderr) = timed(&scratch, &manifest);
        assert_eq!(status, 0, "{retry_after:?}: {stderr}");
        assert!(took < Duration::from_secs(60), "{retry_after:?}: {took:?}");
    }
}

#[test]
fn a_redirect_is_a_failed_call_naming_where_it_pointed_and_nothing_is_cached() {
    let scratch = Scratch::new();
    let elsewhere = MockApi::start(Format::OpenAi, Behaviour::default());
    let location = format!("{}/chat/completions", elsewhere.url);
    let api = MockApi::start(
        Format::OpenAi,
        Behaviour {
            redirect: Some(location.clone()),
            ..Behaviour::default()
        },
    );
    let manifest = manifest(&scratch, &api, Format::OpenAi, "", "");
    let (status, _, stderr) = run(&scratch, &manifest, &[]);
    assert_ne!(status, 0, "{stderr}");
    assert!(
        stderr.contains("301") && stderr.contains(&location),
        "the failure names the status and the location: {stderr}"
    );
    assert_eq!(elsewhere.requests(), 0, "the redirect was followed");
    let plan = scratch.json_with_env(["plan", &manifest, "--json"], &[("MOCK_API_KEY", KEY)]);
    for stage in ["compress", "read", "judge"] {
        assert_eq!(plan[stage]["cached"], 0, "{stage}: {plan}");
    }
}

/// What the usage in every reply says, and whether the run must refuse it.
fn usage_cases() -> Vec<(Value, bool)> {
    vec![
        (json!({"prompt_tokens": 10, "completion_tokens": 3}), false),
        (json!({"prompt_tokens": -5, "completion_tokens": 3}), true),
        (json!({"prompt_tokens": 10.5, "completion_tokens": 3}), true),
        (
            json!({"prompt_tokens": 10, "completion_tokens": 18446744073709551615u64}),
            true,
        ),
        (json!({"prompt_tokens": "10", "completion_tokens": 3}), true),
    ]
}

#[test]
fn absurd_usage_from_a_model_fails_its_call_and_the_reports_stay_sane() {
    for (usage, refused) in usage_cases() {
        let scratch = Scratch::new();
        let api = MockApi::start(
            Format::OpenAi,
            Behaviour {
                usage: Some(usage.clone()),
                ..Behaviour::default()
            },
        );
        let manifest = manifest(&scratch, &api, Format::OpenAi, "retries = 0", "");
        let (status, folder, stderr) = run(&scratch, &manifest, &[]);
        let report = read_json(&folder.join("report.json"));
        let markdown = std::fs::read_to_string(folder.join("report.md")).unwrap();
        assert!(markdown.contains("| compressor |"), "{usage}: {markdown}");
        let account = &report["endpoints"]["mock"]["usage"];
        if refused {
            assert_eq!(status, 1, "{usage}: {stderr}");
            assert!(stderr.contains("usage"), "{usage}: {stderr}");
            assert_eq!(account["input_tokens"].as_u64(), Some(0), "{usage}: {account}");
        } else {
            assert_eq!(status, 0, "{usage}: {stderr}");
            let calls = report["endpoints"]["mock"]["calls"].as_u64().unwrap();
            assert_eq!(account["input_tokens"].as_u64(), Some(10 * calls), "{account}");
        }
        assert!(
            account["cost_usd"].as_f64().is_some_and(f64::is_finite),
            "{usage}: {account}"
        );
    }
}

/// The fixture with its reader replaced by the shell `script` (`@GACC@` is gacc's path), and
/// with `description` when one is given: the manifest's path.
fn scripted_reader(scratch: &Scratch, script: &str, description: &str) -> String {
    scratch.script("experiments/reader.sh", script);
    let mut manifest = std::fs::read_to_string(scratch.path("experiments/fixture.toml"))
        .unwrap()
        .replace(
            "[reader]\nbuiltin = \"field-lookup\"",
            "[reader]\ncommand = [\"./reader.sh\"]\nsandbox = false\nretries = 0",
        );
    if !description.is_empty() {
        let line = manifest
            .lines()
            .find(|l| l.starts_with("description = "))
            .unwrap()
            .to_owned();
        manifest = manifest.replace(&line, &format!("description = {description:?}"));
    }
    scratch.write("experiments/scripted.toml", &manifest);
    "experiments/scripted.toml".to_owned()
}

#[test]
fn absurd_usage_from_a_callback_fails_its_call_and_the_reports_stay_sane() {
    let absurd = [
        r#"{"cost_usd": 1e308}"#,
        r#"{"cost_usd": -2.5}"#,
        r#"{"input_tokens": 18446744073709551615}"#,
        r#"{"output_tokens": -3}"#,
        r#"{"input_tokens": 2.5}"#,
    ];
    for usage in absurd {
        let scratch = Scratch::new();
        // The reader answers as field-lookup does, with this usage on every answer.
        let script =
            format!("#!/bin/sh\n@GACC@ callback field-lookup | sed 's/}}$/,\"usage\": {usage}}}/'\n");
        let manifest = scripted_reader(&scratch, &script, "");
        let (status, folder, stderr) = scratch.run(&manifest, &[]);
        assert_eq!(status, 1, "{usage}: {stderr}");
        assert!(stderr.contains("usage."), "{usage}: {stderr}");
        let report = read_json(&folder.join("report.json"));
        let reader = &report["usage"]["reader"];
        assert_eq!(
            reader["input_tokens"].as_u64().unwrap_or(0),
            0,
            "{usage}: {reader}"
        );
        assert!(
            reader["cost_usd"].as_f64().is_none_or(|c| c == 0.0),
            "{usage}: {reader}"
        );
        let markdown = std::fs::read_to_string(folder.join("report.md")).unwrap();
        assert!(
            !markdown.contains("paid -") && !stderr.contains("paid -"),
            "{markdown}"
        );
        let stated: Value = serde_json::from_str(usage).unwrap();
        let value = stated.as_object().unwrap().values().next().unwrap();
        assert!(markdown.contains(&format!("(got {value})")), "{markdown}");
        // `gacc report` renders the same run again.
        let output = scratch.gacc().arg("report").arg(&folder).output().unwrap();
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

#[test]
fn report_md_escapes_what_gacc_did_not_write() {
    let scratch = Scratch::new();
    let manifest = scripted_reader(
        &scratch,
        "#!/bin/sh\ncat > /dev/null\necho '{\"error\": \"<img src=x onerror=alert(1)> a|b\", \"retryable\": false}'\n",
        "<script>alert(1)</script> | not a column",
    );
    let (status, folder, stderr) = scratch.run(&manifest, &[]);
    assert_eq!(status, 1, "{stderr}");
    let markdown = std::fs::read_to_string(folder.join("report.md")).unwrap();
    assert!(
        !markdown.contains("<script>") && !markdown.contains("<img"),
        "{markdown}"
    );
    assert!(
        markdown.contains("&lt;script&gt;alert(1)&lt;/script&gt; \\| not a column"),
        "{markdown}"
    );
    // Every failure row has the table's six cells: the reason's `|` is escaped.
    let rows: Vec<&str> = markdown.lines().filter(|l| l.starts_with("| read |")).collect();
    assert!(!rows.is_empty(), "{markdown}");
    for row in rows {
        let cells = row.replace("\\|", "").matches('|').count() - 1;
        assert_eq!(cells, 6, "{row}");
        assert!(row.contains("&lt;img src=x onerror=alert(1)&gt; a\\|b"), "{row}");
    }
}

/// `gacc run MANIFEST` started in the background, in the scratch folder.
fn started(scratch: &Scratch, manifest: &str) -> std::process::Child {
    scratch
        .gacc_process()
        .args(["run", manifest, "-q"])
        .env("MOCK_API_KEY", KEY)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

fn finished(child: std::process::Child, scratch: &Scratch) -> (i32, std::path::PathBuf) {
    let output = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let folder = stdout
        .lines()
        .last()
        .map(|l| scratch.path(l.trim()))
        .unwrap_or_default();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.code().is_some(), "{stderr}");
    (output.status.code().unwrap_or(-1), folder)
}

/// A mock whose replies take 150 ms, so that two runs meet every call in flight.
fn slow_api() -> MockApi {
    MockApi::start(
        Format::OpenAi,
        Behaviour {
            delay: Duration::from_millis(150),
            ..Behaviour::default()
        },
    )
}

#[test]
fn two_runs_of_one_manifest_on_one_cache_pay_for_each_call_once() {
    let scratch = Scratch::new();
    let api = slow_api();
    let manifest = manifest(&scratch, &api, Format::OpenAi, "", "");
    let (first, second) = (started(&scratch, &manifest), started(&scratch, &manifest));
    let ((a, folder_a), (b, folder_b)) = (finished(first, &scratch), finished(second, &scratch));
    assert_eq!((a, b), (0, 0));
    assert_eq!(
        api.repeated(),
        0,
        "a request was sent twice: {:?}",
        api.bodies().values().filter(|n| **n > 1).count()
    );
    assert_eq!(
        std::fs::read(folder_a.join("report.json")).unwrap(),
        std::fs::read(folder_b.join("report.json")).unwrap()
    );
    let calls = |folder: &std::path::Path| read_json(&folder.join("run.json"))["calls"].clone();
    let made: u64 = ["compressor", "reader", "judge"]
        .iter()
        .map(|role| {
            calls(&folder_a)[role]["made"].as_u64().unwrap_or(0)
                + calls(&folder_b)[role]["made"].as_u64().unwrap_or(0)
        })
        .sum();
    assert_eq!(
        made,
        api.requests(),
        "the two runs made each call once between them"
    );

    // One of two runs killed mid-way: the other finishes. Only what the killed run had in
    // flight is paid twice (it paid and died before the answers were written: at most its
    // endpoint's four calls), and a rerun pays for nothing.
    let scratch = Scratch::new();
    let api = slow_api();
    let manifest = self::manifest(&scratch, &api, Format::OpenAi, "max_concurrency = 4", "");
    let (mut killed, other) = (started(&scratch, &manifest), started(&scratch, &manifest));
    std::thread::sleep(Duration::from_millis(1500));
    killed.kill().unwrap();
    let _ = killed.wait();
    let (status, folder) = finished(other, &scratch);
    assert_eq!(status, 0);
    assert!(api.repeated() <= 4, "{} calls paid twice", api.repeated());
    let paid = api.requests();
    let (status, again, stderr) = run(&scratch, &manifest, &[]);
    assert_eq!(status, 0, "{stderr}");
    assert_eq!(api.requests(), paid, "the rerun paid for a call");
    assert_eq!(
        std::fs::read(folder.join("report.json")).unwrap(),
        std::fs::read(again.join("report.json")).unwrap()
    );
}

#[test]
fn a_callbacks_stderr_in_report_md_stays_inside_its_fence_and_holds_no_secret() {
    let scratch = Scratch::new();
    // A fence of its own to break out of, HTML, and the value of a variable it was passed.
    let manifest = scripted_reader(
        &scratch,
        "#!/bin/sh\ncat > /dev/null\nprintf '````\\n<script>alert(1)</script>\\n| a | b |\\nkey %s\\n' \"$READER_TOKEN\" >&2\nexit 1\n",
        "",
    );
    let text = std::fs::read_to_string(scratch.path(&manifest)).unwrap().replace(
        "sandbox = false\nretries = 0",
        "sandbox = false\nretries = 0\nenv = [\"READER_TOKEN\"]",
    );
    scratch.write(&manifest, &text);
    let (status, folder, stderr) =
        scratch.run_with_env(&manifest, &[], &[("READER_TOKEN", "tok-0123456789-secret")]);
    assert_eq!(status, 1, "{stderr}");
    let markdown = std::fs::read_to_string(folder.join("report.md")).unwrap();
    assert!(!markdown.contains("tok-0123456789-secret"), "{markdown}");
    assert!(markdown.contains("[redacted:READER_TOKEN]"), "{markdown}");
    // Every stderr block opens and closes its fence; the callback's own fence is defused.
    let fences = markdown.lines().filter(|l| l.starts_with("````")).count();
    assert!(fences >= 2 && fences % 2 == 0, "{markdown}");
    assert!(markdown.contains("` ` ` `"), "{markdown}");
    // Outside the fences, no HTML a callback wrote.
    let outside: String = markdown.split("````").step_by(2).collect::<Vec<_>>().join("");
    assert!(!outside.contains("<script>"), "{markdown}");
}
