//! `gacc trace`: the tracing log reviewed — failures, latency, cache hits, one job's story.

use crate::common;

use common::{Scratch, read_lines};
use serde_json::Value;

/// The fixture with a reader that fails (with a message on stderr) on one question.
fn run_with_a_failing_reader(scratch: &Scratch) -> std::path::PathBuf {
    scratch.script(
        "experiments/reader.sh",
        "#!/bin/sh\nrequest=$(cat)\ncase \"$request\" in\n  *\"status of the reactor\"*) echo 'GPU out of memory' >&2; exit 3 ;;\nesac\nprintf '%s' \"$request\" | exec @GACC@ callback field-lookup\n",
    );
    let manifest = std::fs::read_to_string(scratch.path("experiments/fixture.toml"))
        .unwrap()
        .replace(
            "[reader]\nbuiltin = \"field-lookup\"",
            "[reader]\ncommand = [\"./reader.sh\"]\nretries = 0",
        );
    scratch.write("experiments/failing.toml", &manifest);
    let (status, folder, _) = scratch.run("experiments/failing.toml", &[]);
    assert_eq!(status, 1);
    folder
}

fn review(scratch: &Scratch, folder: &std::path::Path, extra: &[&str]) -> Value {
    let mut args = vec![
        std::ffi::OsStr::new("trace"),
        folder.as_os_str(),
        "--format".as_ref(),
        "json".as_ref(),
    ];
    args.extend(extra.iter().map(std::ffi::OsStr::new));
    scratch.json(args)
}

#[test]
fn failures_latency_and_cache_hits() {
    let scratch = Scratch::new();
    let folder = run_with_a_failing_reader(&scratch);
    let all = review(&scratch, &folder, &[]);
    let failures = all["failures"].as_array().unwrap();
    assert_eq!(failures.len(), 3);
    for failure in failures {
        assert_eq!(failure["callback"], "reader");
        assert!(failure["stderr"].as_str().unwrap().contains("GPU out of memory"));
        assert!(
            failure["reason"]
                .as_str()
                .unwrap()
                .contains("exited with status 3")
        );
    }
    let latency = all["latency"].as_object().unwrap();
    let names: Vec<&String> = latency.keys().collect();
    assert_eq!(names, ["compressors.goal-line", "judge", "reader"]);
    assert_eq!(latency["reader"]["calls"], 36);
    assert_eq!(latency["judge"]["calls"], 33, "no judge for the failed reads");
    for l in latency.values() {
        assert!(l["p50"].as_f64().unwrap() <= l["p95"].as_f64().unwrap());
        assert!(l["p95"].as_f64().unwrap() <= l["max"].as_f64().unwrap());
    }
    assert_eq!(all["cache"]["compress"]["hits"], 0);
    assert_eq!(all["slowest"].as_array().unwrap().len(), 10);
    // Each slowest call that succeeded is named by its job, as the rows resting on it say.
    for call in all["slowest"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["ok"] == true)
    {
        let job = call["job"]
            .as_str()
            .unwrap_or_else(|| panic!("a call without its job: {call}"));
        assert!(job.contains(" · own-goal · r=0.15 · seed "), "{job}");
    }

    // Re-run: every finished job is a cache hit.
    let (_, again, _) = scratch.run("experiments/failing.toml", &[]);
    let cached = review(&scratch, &again, &[]);
    assert_eq!(cached["cache"]["compress"]["rate"], 1.0);
    assert_eq!(cached["cache"]["read"]["hits"], 33);

    let reads = review(&scratch, &folder, &["--stage", "read"]);
    let stages: Vec<&String> = reads["cache"].as_object().unwrap().keys().collect();
    assert_eq!(stages, ["read"]);
    let judge = review(&scratch, &folder, &["--callback", "judge"]);
    assert_eq!(judge["latency"].as_object().unwrap().len(), 1);
}

#[test]
fn one_jobs_whole_story() {
    let scratch = Scratch::new();
    let folder = run_with_a_failing_reader(&scratch);
    let results = read_lines(&folder.join("results.jsonl.gz"));
    assert!(results.iter().any(|r| r["failure"].is_string()));
    let failed = review(&scratch, &folder, &[])["failures"][0]["job"]
        .as_str()
        .unwrap()
        .to_owned();
    let story = review(&scratch, &folder, &["--job", &failed[..12]])["story"]
        .as_array()
        .unwrap()
        .clone();
    let messages: Vec<&str> = story.iter().map(|e| e["message"].as_str().unwrap()).collect();
    assert!(
        messages.contains(&"job failed") && messages.contains(&"job finished"),
        "{messages:?}"
    );
    // A cache key names the calls themselves, with their attempts.
    let finished = story.iter().find(|e| e["message"] == "job finished").unwrap();
    let cache_key = finished["cache_key"].as_str().unwrap();
    let calls = review(&scratch, &folder, &["--job", cache_key])["story"]
        .as_array()
        .unwrap()
        .clone();
    let attempt = calls
        .iter()
        .find(|e| e["message"] == "callback attempt")
        .expect("the attempt");
    assert_eq!(attempt["ok"], false);
    assert!(attempt["stderr"].as_str().unwrap().contains("GPU out of memory"));
}

#[test]
fn the_text_review() {
    let scratch = Scratch::new();
    let folder = run_with_a_failing_reader(&scratch);
    let output = scratch.gacc().arg("trace").arg(&folder).output().unwrap();
    let text = String::from_utf8(output.stdout).unwrap();
    // Times, keys and the order of equally slow calls change from run to run; the shape does not.
    let mut in_slowest = false;
    let masked: String = text
        .lines()
        .map(|line| {
            if line.starts_with("slowest") {
                in_slowest = true;
            } else if line.is_empty() {
                in_slowest = false;
            } else if in_slowest {
                return "  <call>\n".to_owned();
            }
            let words: Vec<&str> = line
                .split_whitespace()
                .map(|w| {
                    if w.len() >= 12 || w.chars().any(|c| c.is_ascii_digit()) {
                        "#"
                    } else {
                        w
                    }
                })
                .collect();
            format!(
                "{}{}\n",
                if line.starts_with(' ') { "  " } else { "" },
                words.join(" ")
            )
        })
        .collect();
    insta::assert_snapshot!(masked);
}

#[test]
fn a_job_served_without_a_call_is_told_from_the_run_folder() {
    let scratch = Scratch::new();
    let first = run_with_a_failing_reader(&scratch);
    let (_, again, _) = scratch.run("experiments/failing.toml", &[]);
    let ledger = read_lines(&again.join("memories.jsonl.gz"));
    let memory = &ledger[0];
    assert_eq!(memory["cached"], true);
    let key = memory["key"].as_str().unwrap();

    // A compress job: no event in the re-run's trace, its plan entry and ledger row stored.
    let review_of = |folder: &std::path::Path, job: &str| review(&scratch, folder, &["--job", job]);
    let compress = review_of(&again, &key[..10]);
    assert_eq!(compress["story"].as_array().unwrap().len(), 0);
    let stored = &compress["stored"];
    assert_eq!(stored["stage"], "compress");
    assert_eq!(stored["job"], key);
    assert_eq!(stored["plan"]["cache_key"], memory["cache_key"]);
    assert_eq!(stored["ledger"], *memory);
    let questions = stored["results"].as_array().unwrap();
    assert_eq!(questions.len(), 3);
    assert!(questions.iter().all(|r| r["memory_key"] == key));
    // Its compressor call's cache key names it too.
    let by_cache_key = review_of(&again, memory["cache_key"].as_str().unwrap());
    assert_eq!(by_cache_key["stored"]["job"], key);

    // A read and a judge job, by the keys the first run's trace gave them.
    let events = read_lines(&first.join("trace.jsonl"));
    let job_of = |stage: &str| {
        events
            .iter()
            .find(|e| e["message"] == "job finished" && e["stage"] == stage && e["failed"] == false)
            .map(|e| e["job"].as_str().unwrap().to_owned())
            .unwrap()
    };
    for stage in ["read", "judge"] {
        let job = job_of(stage);
        let told = review_of(&again, &job);
        assert_eq!(told["stored"]["stage"], stage);
        assert_eq!(told["stored"]["job"], job.as_str());
        let result = &told["stored"]["results"][0];
        assert_eq!(result["question_id"], told["stored"]["question_id"]);
        assert!(result["correct"].is_boolean(), "{result}");
        // The first run's own story of it, from its trace, agrees on the stage.
        let story = review_of(&first, &job)["story"].as_array().unwrap().clone();
        assert!(
            story
                .iter()
                .any(|e| e["message"] == "job finished" && e["stage"] == stage)
        );
    }
    // A key of no job: no story, nothing stored.
    let none = review_of(&again, "0000000000000000");
    assert!(none["story"].as_array().unwrap().is_empty() && none.get("stored").is_none());
    // The text form says why the trace has no line for it.
    let output = scratch
        .gacc()
        .arg("trace")
        .arg(&again)
        .args(["--job", &key[..10]])
        .output()
        .unwrap();
    let text = String::from_utf8(output.stdout).unwrap();
    assert!(text.contains("served without a call in this run"), "{text}");
    assert!(text.contains("questions: 3 answered from it"), "{text}");
}

/// A trace written before events were typed (`tests/data/trace-before-events`, made by gacc
/// 39b4d17 on the fixture with a reader that fails on one question, its call attempts keyed in
/// spans) is refused, naming the gacc that reviews it, not reviewed half-right.
#[test]
fn a_trace_written_before_typed_events_is_refused_naming_the_gacc_that_reviews_it() {
    let scratch = Scratch::empty();
    let data = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/trace-before-events");
    let output = scratch.gacc().arg("trace").arg(&data).output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("trace.jsonl")
            && stderr.contains("before trace events were typed")
            && stderr.contains("gacc 0.1.0 at commit 8c6c977 or earlier reviews it"),
        "{stderr}"
    );
}
