//! The Python helper (`python/gacc_callback/`) under gacc: one script serves oneshot and
//! persistent mode with the same results, and output on fd 1 never corrupts the protocol.

use crate::common;

use common::{Scratch, python3_on_path, read_json};
use serde_json::Value;

/// A compressor on the helper that keeps the goal's keyword lines, and writes to stdout both
/// through print() and straight to fd 1.
const NOISY: &str = r#"import os, sys
from gacc_callback import compressor, serve, setup

@setup
def load():
    print("loading")
    os.write(1, b"a C library says hello on fd 1\n")

@compressor
def keep(context, goal, **_):
    print("compressing for", goal)
    os.write(1, b'{"memory": "not the reply"}\n')
    keyword = goal.split()[-1].lower()
    return "\n".join(line for line in context.splitlines() if keyword in line.lower())

if __name__ == "__main__":
    sys.exit(serve())
"#;

fn report_without_manifest_hash(folder: &std::path::Path) -> Value {
    let mut report = read_json(&folder.join("report.json"));
    report["experiment"]["manifest_sha256"] = Value::Null;
    report
}

#[test]
fn the_helper_gives_the_same_report_in_both_modes_whatever_it_prints() {
    if !python3_on_path() {
        eprintln!("skipped: python3 is not on PATH");
        return;
    }
    let scratch = Scratch::new();
    scratch.copy_helper();
    scratch.write("experiments/callbacks/noisy.py", NOISY);
    let manifest = scratch.fixture_with("helper", "command = [\"python3\", \"callbacks/noisy.py\"]");
    let mut reports = Vec::new();
    for mode in ["oneshot", "persistent"] {
        let set = format!("compressors.goal-line.mode=\"{mode}\"");
        let cache = format!("run.cache=\"cache-{mode}\"");
        let (status, folder, stderr) = scratch.run(&manifest, &["--set", &set, "--set", &cache]);
        assert_eq!(status, 0, "{mode}: {stderr}");
        let run = read_json(&folder.join("run.json"));
        assert_eq!(run["calls"]["compressor"]["made"], 12, "{mode}");
        let report = read_json(&folder.join("report.json"));
        assert_eq!(
            report["holdout"]["compressor"]["holdout_enforced"], true,
            "{mode}: sandboxed"
        );
        reports.push(report_without_manifest_hash(&folder));
    }
    assert_eq!(reports[0], reports[1], "the same results in both modes");
    // The same memories the built-in goal-line keeps: Micro 2/3 on every seed.
    assert_eq!(
        reports[0]["cells"][0]["micro"]["mean"].as_f64().unwrap(),
        2.0 / 3.0
    );
}

#[test]
fn count_tokens_and_fit_agree_with_gacc_and_a_sandboxed_compressor_fills_its_budget_exactly() {
    if !python3_on_path() {
        eprintln!("skipped: python3 is not on PATH");
        return;
    }
    let scratch = Scratch::new();
    scratch.copy_helper();
    // SPEC §7's vectors, counted by the helper as gacc counts them; and `fit`'s cuts.
    let check = r#"
import json, sys
sys.path.insert(0, "experiments/callbacks")
from gacc_callback import count_tokens, fit
vectors = {"hello world": 2, "rer": 1, "'rer": 2, "today\n ": 3, "today\n \n": 2, "today\n  \n": 2,
           "\U0001F44D": 3, "Hello world!": 3, "こんにちは世界": 4, "I love \U0001F355": 5,
           "How about numbers? 123 45.6 -78.9": 14, "line1\r\nline2\r\nline3": 8,
           "<|endoftext|>": 7, "a" * 1000: 125}
counted = {text: count_tokens(text) for text in vectors}
assert counted == vectors, counted
assert fit("hello world", 1) == "hello"
assert fit("a" * 1000, 10) == "a" * 80
assert fit("hello world", 0) == ""
assert fit("hello world", 5) == "hello world"
# A cut through a character's bytes decodes as gacc cuts a memory: U+FFFD.
assert fit("\U0001F44D", 1) == "\ufffd", repr(fit("\U0001F44D", 1))
print("ok")
"#;
    let output = std::process::Command::new("python3")
        .args(["-c", check])
        .current_dir(scratch.path(""))
        .env("GACC_EXE", common::gacc_binary())
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&output.stdout).trim(),
        "ok",
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    // A compressor that fills its budget with `fit`, run by gacc in its sandbox: every memory
    // keeps exactly its budget (or the whole source), and none is cut by gacc.
    scratch.write(
        "experiments/callbacks/fill.py",
        "from gacc_callback import compressor, fit, serve\n\n\n@compressor\ndef fill(context, token_budget, **_):\n    return fit(context, token_budget)\n\n\nif __name__ == \"__main__\":\n    serve()\n",
    );
    let manifest = scratch.fixture_with(
        "fill",
        "command = [\"python3\", \"callbacks/fill.py\"]\nmode = \"persistent\"",
    );
    let (status, folder, stderr) = scratch.run(&manifest, &["-q", "--set", "ratios=[0.1, 0.37]"]);
    assert_eq!(status, 0, "{stderr}");
    let memories = common::read_lines(&folder.join("memories.jsonl.gz"));
    assert!(!memories.is_empty());
    for row in &memories {
        let budget = row["budget"].as_u64().unwrap();
        let source = row["source_tokens"].as_u64().unwrap();
        assert_eq!(
            row["retained_tokens"].as_u64().unwrap(),
            budget.min(source),
            "{row}"
        );
        assert_eq!(row["truncated"], false, "{row}");
        assert_eq!(row["unused_budget"], 0, "{row}");
    }
}

#[test]
fn each_call_of_a_persistent_helper_worker_carries_exactly_its_own_log() {
    if !python3_on_path() {
        eprintln!("skipped: python3 is not on PATH");
        return;
    }
    let scratch = Scratch::new();
    scratch.copy_helper();
    // Each call prints its own token three ways: print(), print to stderr, stderr flushed.
    scratch.write(
        "experiments/callbacks/noisy.py",
        "import sys\nfrom gacc_callback import compressor, serve\n\n\n@compressor\ndef noisy(context, goal, token_budget, seed, **_):\n    token = f\"TOKEN={seed}-{token_budget}-{goal}\"\n    print(token)\n    print(token, file=sys.stderr)\n    sys.stderr.write(token + \"\\n\")\n    sys.stderr.flush()\n    return context\n\n\nif __name__ == \"__main__\":\n    serve()\n",
    );
    let manifest = scratch.fixture_with(
        "noisy",
        "command = [\"python3\", \"callbacks/noisy.py\"]\nmode = \"persistent\"",
    );
    let (status, folder, stderr) = scratch.run(
        &manifest,
        &[
            "-q",
            "--set",
            "seeds=[1, 2, 3, 4, 5, 6, 7, 8]",
            "--set",
            "conditions=[\"own-goal\", \"no-goal\"]",
        ],
    );
    assert_eq!(status, 0, "{stderr}");
    let trace = std::fs::read_to_string(folder.join("trace.jsonl")).unwrap();
    let mut calls = 0;
    for line in trace.lines() {
        let event: serde_json::Value = serde_json::from_str(line).unwrap();
        if event["message"] != "callback attempt" {
            continue;
        }
        let log = event["stderr"].as_str().unwrap_or("");
        let tokens: Vec<&str> = log.lines().filter(|l| l.starts_with("TOKEN=")).collect();
        if event["callback"]
            .as_str()
            .is_some_and(|c| c.contains("goal-line"))
        {
            calls += 1;
            assert!(
                event.get("stderr_of").is_none(),
                "a framed log is the call's: {event}"
            );
            assert_eq!(tokens.len(), 3, "a call's log holds its three lines: {log:?}");
            assert!(
                tokens.iter().all(|t| *t == tokens[0]),
                "another call's line: {log:?}"
            );
        }
    }
    assert_eq!(
        calls,
        8 * 6,
        "8 seeds × 6 memories (4 goals under own-goal, 2 sources under no-goal)"
    );
}

#[test]
fn a_persistent_worker_off_the_helper_has_its_stderr_shown_as_the_workers() {
    if !python3_on_path() {
        eprintln!("skipped: python3 is not on PATH");
        return;
    }
    let scratch = Scratch::new();
    // A worker of its own protocol loop: its stderr is not framed with its replies.
    scratch.write(
        "experiments/callbacks/bare.py",
        "import json, sys\nfor line in sys.stdin:\n    request = json.loads(line)\n    print('BUDGET=%s' % request['token_budget'], file=sys.stderr, flush=True)\n    print(json.dumps({'memory': request['context']}), flush=True)\n",
    );
    let manifest = scratch.fixture_with(
        "bare",
        "command = [\"python3\", \"callbacks/bare.py\"]\nmode = \"persistent\"",
    );
    let (status, folder, stderr) = scratch.run(&manifest, &["-q"]);
    assert_eq!(status, 0, "{stderr}");
    let trace = std::fs::read_to_string(folder.join("trace.jsonl")).unwrap();
    let attempts: Vec<serde_json::Value> = trace
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|e| {
            e["message"] == "callback attempt" && e["callback"].as_str().unwrap().contains("goal-line")
        })
        .collect();
    assert!(!attempts.is_empty());
    for event in &attempts {
        assert_eq!(event["stderr_of"], "worker", "{event}");
    }
    // `gacc trace --job` says whose lines they are.
    let key = attempts[0]["key"].as_str().unwrap();
    let output = scratch
        .gacc()
        .args(["trace", folder.to_str().unwrap(), "--job", &key[..12]])
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&output.stdout);
    assert!(shown.contains("stderr_of=worker"), "{shown}");
}

#[test]
fn a_framed_log_is_redacted_like_stderr() {
    if !python3_on_path() {
        eprintln!("skipped: python3 is not on PATH");
        return;
    }
    let key = "sk-framed-0123456789abcdef-secret";
    let scratch = Scratch::new();
    scratch.copy_helper();
    // The log a reply frames echoes a secret, and is long and full of control characters.
    scratch.write(
        "experiments/callbacks/leaky.py",
        "import os, sys\nfrom gacc_callback import compressor, serve\n\n\n@compressor\ndef leaky(context, **_):\n    print('key=' + os.environ['MY_API_KEY'] + '\\x1b[2J\\r\\n' + 'x' * 100000)\n    print('calling with ' + os.environ['MY_API_KEY'])\n    return context\n\n\nif __name__ == \"__main__\":\n    serve()\n",
    );
    let manifest = scratch.fixture_with(
        "leaky",
        "command = [\"python3\", \"callbacks/leaky.py\"]\nmode = \"persistent\"\nenv = [\"MY_API_KEY\"]",
    );
    let (status, folder, stderr) = scratch.run_with_env(&manifest, &["-q"], &[("MY_API_KEY", key)]);
    assert_eq!(status, 0, "{stderr}");
    let trace = std::fs::read_to_string(folder.join("trace.jsonl")).unwrap();
    assert!(!trace.contains(key), "the key is in the trace");
    assert!(
        trace.contains("calling with [redacted:MY_API_KEY]"),
        "{}",
        &trace[..2000.min(trace.len())]
    );
    // The log is cut to the stderr tail gacc keeps.
    for line in trace.lines().filter(|l| l.contains("calling with")) {
        let event: serde_json::Value = serde_json::from_str(line).unwrap();
        assert!(
            event["stderr"].as_str().unwrap().len() <= 8 * 1024 + 64,
            "{}",
            line.len()
        );
    }
}
