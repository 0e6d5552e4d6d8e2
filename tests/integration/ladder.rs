//! A budget ladder (SPEC §14): one compressor call serves every budget of a source, goal shown
//! and seed; each memory is kept as a single-budget call's would be, so a run without the ladder
//! finds them all, and a run that adds a ratio asks only for the budget it lacks.

use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::path::Path;

use serde_json::Value;

use crate::common;
use common::{Scratch, made, read_json, read_lines};

/// The fixture's dataset with `goal-bm25` behind a script that logs each request it is sent
/// (`calls.log`), takes 0.3 s when `slow` exists, and drops the last memory of a ladder's reply
/// when `short` exists.
fn experiment(scratch: &Scratch, name: &str, ratios: &str, ladder: bool) -> String {
    scratch.script(
        "experiments/bm25.sh",
        "#!/bin/sh\nrequest=$(cat)\nprintf '%s\\n' \"$request\" >> calls.log\nif [ -e slow ]; then sleep 0.3; fi\nif [ -e short ]; then\n  printf '%s' \"$request\" | @GACC@ callback goal-bm25 | sed 's/,\"[^\"]*\"\\]/]/'\nelse\n  printf '%s' \"$request\" | exec @GACC@ callback goal-bm25\nfi\n",
    );
    let path = format!("experiments/{name}.toml");
    scratch.write(
        &path,
        &format!(
            r#"name = "{name}"
seeds = [42]
ratios = [{ratios}]
conditions = ["own-goal", "no-goal"]

[dataset]
path = "data/fixture.jsonl"

[compressors.bm25]
command = ["./bm25.sh"]
sandbox = false
ladder = {ladder}

[reader]
builtin = "field-lookup"

[judge]
builtin = "exact"
"#
        ),
    );
    path
}

/// The requests the compressor was sent, in order.
fn calls(scratch: &Scratch) -> Vec<Value> {
    std::fs::read_to_string(scratch.path("experiments/calls.log"))
        .unwrap_or_default()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

/// Each distinct memory's text, by its SHA-256.
fn texts(folder: &Path) -> HashMap<String, String> {
    let mut text = String::new();
    let file = std::fs::File::open(folder.join("memory_texts.jsonl.gz")).unwrap();
    flate2::read::GzDecoder::new(file)
        .read_to_string(&mut text)
        .unwrap();
    (text.lines())
        .map(|line| serde_json::from_str::<Value>(line).unwrap())
        .map(|row| {
            let sha = row["sha256"].as_str().unwrap().to_owned();
            (sha, row["memory"].as_str().unwrap().to_owned())
        })
        .collect()
}

/// `text`'s cl100k_base tokens, as gacc's tokenizer callback gives them.
fn tokens(scratch: &Scratch, text: &str) -> Vec<u64> {
    let request = serde_json::json!({"op": "encode", "text": text}).to_string();
    let out = scratch
        .gacc()
        .args(["callback", "cl100k_base"])
        .write_stdin(request)
        .output()
        .unwrap();
    let reply: Value = serde_json::from_slice(&out.stdout).unwrap();
    (reply["tokens"].as_array().unwrap().iter())
        .map(|t| t.as_u64().unwrap())
        .collect()
}

#[test]
fn one_call_serves_every_budget_and_its_memories_are_a_single_budget_call_s() {
    let scratch = Scratch::new();
    let ladder = experiment(&scratch, "ladder", "0.1, 0.2, 0.3, 0.5", true);

    // The plan counts ladder calls, not budgets: one per (source, goal shown).
    let plan = scratch.json(["plan", &ladder, "--json"]);
    assert_eq!(plan["compress"]["jobs"], 24, "{plan}");
    assert_eq!(plan["compress"]["calls"], 6, "{plan}");
    let text = scratch.stdout(["plan", &ladder]);
    assert!(text.contains("(compress: 24 memories from 6 call(s)"), "{text}");
    let valid = scratch.stdout(["validate", &ladder]);
    assert!(
        valid.contains("24 memories (from 6 compressor calls: 6 of them ladders)"),
        "{valid}"
    );

    let (status, folder, stderr) = scratch.run(&ladder, &[]);
    assert_eq!(status, 0, "{stderr}");
    let sent = calls(&scratch);
    // Four goals under own-goal, two sources under no-goal: one call each.
    assert_eq!(sent.len(), 6, "{sent:?}");
    let mut shown = std::collections::BTreeSet::new();
    for request in &sent {
        assert!(request.get("token_budget").is_none(), "{request}");
        let budgets: Vec<u64> = (request["token_budgets"].as_array().unwrap().iter())
            .map(|b| b.as_u64().unwrap())
            .collect();
        assert_eq!(budgets.len(), 4, "every budget the run needs: {request}");
        assert!(
            budgets.windows(2).all(|w| w[0] < w[1]),
            "ascending and distinct: {budgets:?}"
        );
        assert!(shown.insert((request["context"].to_string(), request["goal"].to_string())));
    }
    assert_eq!(made(&folder, "compressor"), 6);

    // Every row names its ladder call; `nested` where its cut is a token prefix of the next
    // larger budget's cut, absent for the largest.
    let rows = read_lines(&folder.join("memories.jsonl.gz"));
    assert_eq!(rows.len(), 24);
    let memory = texts(&folder);
    let mut by_call: BTreeMap<String, Vec<&Value>> = BTreeMap::new();
    for row in &rows {
        by_call
            .entry(row["ladder_call"].as_str().unwrap().to_owned())
            .or_default()
            .push(row);
    }
    assert_eq!(by_call.len(), 6);
    let mut nested = 0;
    for rungs in by_call.values_mut() {
        rungs.sort_by_key(|row| row["budget"].as_u64());
        let (last, lower) = rungs.split_last().unwrap();
        assert!(last.get("nested").is_none(), "{last}");
        for (at, row) in lower.iter().enumerate() {
            let (this, next) = (
                &memory[row["memory_sha256"].as_str().unwrap()],
                &memory[rungs[at + 1]["memory_sha256"].as_str().unwrap()],
            );
            let is_nested = row["nested"].as_bool().unwrap();
            let prefix = tokens(&scratch, next).starts_with(&tokens(&scratch, this));
            assert_eq!(is_nested, prefix, "{row}");
            nested += usize::from(is_nested);
        }
    }
    // Without a goal, BM25 keeps sentences in source order: each budget's memory extends the last.
    assert!(nested >= 6, "{nested} nested rows");
    let report = read_json(&folder.join("report.json"));
    let counted: u64 = (report["cells"].as_array().unwrap().iter())
        .map(|cell| cell["ledger"]["nested"].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(counted as usize, nested);
    let ladder_rows: u64 = (report["cells"].as_array().unwrap().iter())
        .map(|cell| cell["ledger"]["ladder_rows"].as_u64().unwrap())
        .sum();
    assert_eq!(ladder_rows, 24);

    // The same compressor one budget at a time, in a cache of its own: the same memories, row
    // by row, and the same cells.
    let alone = Scratch::new();
    let single = experiment(&alone, "single", "0.1, 0.2, 0.3, 0.5", false);
    let (status, one_by_one, stderr) = alone.run(&single, &[]);
    assert_eq!(status, 0, "{stderr}");
    assert_eq!(calls(&alone).len(), 24, "one call per memory without the ladder");
    let singles = read_lines(&one_by_one.join("memories.jsonl.gz"));
    for (a, b) in rows.iter().zip(&singles) {
        assert_eq!(
            (&a["memory_sha256"], &a["cache_key"]),
            (&b["memory_sha256"], &b["cache_key"])
        );
        assert!(b.get("ladder_call").is_none());
    }
    let cells = |folder: &Path| -> Vec<(Value, Value)> {
        (read_json(&folder.join("report.json"))["cells"]
            .as_array()
            .unwrap()
            .iter())
        .map(|c| (c["micro"].clone(), c["macro"].clone()))
        .collect()
    };
    assert_eq!(cells(&folder), cells(&one_by_one));

    // Without the ladder, on the ladder's cache: no call at all.
    let plain = experiment(&scratch, "plain", "0.1, 0.2, 0.3, 0.5", false);
    let (status, again, stderr) = scratch.run(&plain, &[]);
    assert_eq!(status, 0, "{stderr}");
    assert_eq!(made(&again, "compressor"), 0);
    assert_eq!(calls(&scratch).len(), 6);

    // One more ratio: each call asks only for the budget the cache lacks.
    let more = experiment(&scratch, "more", "0.1, 0.2, 0.3, 0.4, 0.5", true);
    let (status, _, stderr) = scratch.run(&more, &[]);
    assert_eq!(status, 0, "{stderr}");
    let added = &calls(&scratch)[6..];
    assert_eq!(added.len(), 6);
    for request in added {
        let plan_budget = request["token_budgets"].as_array().unwrap();
        assert_eq!(plan_budget.len(), 1, "{request}");
    }

    // The report and the replay agree: verify recomputes every row and cell.
    let (status, printed) = scratch.verify_bare(&folder);
    assert_eq!(status, 0, "{printed}");
}

#[test]
fn a_reply_with_a_memory_too_few_is_a_failed_call_naming_the_compressor() {
    let scratch = Scratch::new();
    let ladder = experiment(&scratch, "short", "0.1, 0.3", true);
    scratch.write("experiments/short", "");
    let (status, folder, stderr) = scratch.run(&ladder, &[]);
    assert_eq!(status, 1, "{stderr}");
    assert!(stderr.contains("compressors.bm25"), "{stderr}");
    assert!(stderr.contains("1 for the 2 budgets"), "{stderr}");
    let report = read_json(&folder.join("report.json"));
    let failures = report["failures"].as_array().unwrap();
    assert!(!failures.is_empty());
    for failure in failures {
        assert_eq!(failure["stage"], "compress");
        assert!(
            failure["reason"]
                .as_str()
                .unwrap()
                .contains("`memories` holding one memory per budget")
        );
    }
    // Nothing was kept of it: the fixed compressor's run calls again, and passes.
    std::fs::remove_file(scratch.path("experiments/short")).unwrap();
    let (status, _, stderr) = scratch.run(&ladder, &[]);
    assert_eq!(status, 0, "{stderr}");
}

#[test]
fn a_ladder_is_refused_where_it_cannot_be_served() {
    let scratch = Scratch::new();
    let manifest = std::fs::read_to_string(scratch.path("experiments/fixture.toml"))
        .unwrap()
        .replace(
            "[reader]\nbuiltin = \"field-lookup\"",
            "[reader]\nbuiltin = \"field-lookup\"\nladder = true",
        );
    scratch.write("experiments/reader-ladder.toml", &manifest);
    let out = scratch
        .gacc()
        .args(["validate", "experiments/reader-ladder.toml"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("key `reader`") && stderr.contains("`ladder` is for compressors"),
        "{stderr}"
    );
}

#[test]
fn callback_check_sends_a_ladder_its_budgets_and_counts_its_memories() {
    let scratch = Scratch::new();
    let ladder = experiment(&scratch, "ladder", "0.1, 0.3", true);
    let checked = scratch.json(["callback", "check", &ladder, "bm25", "--json"]);
    let callback = &checked["callbacks"][0];
    assert_eq!(callback["works"], true, "{callback}");
    let asked: Vec<&str> = (callback["requests"].as_array().unwrap().iter())
        .map(|r| r["request"].as_str().unwrap())
        .collect();
    assert!(
        asked.contains(&"a ladder of three budgets, with a goal"),
        "{asked:?}"
    );
    let sent = calls(&scratch);
    assert!(
        sent.iter()
            .all(|r| r["token_budgets"].is_array() && r.get("token_budget").is_none())
    );

    // A reply a memory short: the check says so, naming the count.
    scratch.write("experiments/short", "");
    let output = scratch
        .gacc()
        .args(["callback", "check", &ladder, "bm25", "--json"])
        .output()
        .unwrap();
    let checked: Value = serde_json::from_slice(&output.stdout).unwrap();
    let callback = &checked["callbacks"][0];
    assert_eq!(callback["works"], false, "{callback}");
    let error = callback["requests"][0]["error"].as_str().unwrap();
    assert!(
        error.contains("answered 2 memories for the 3 budgets [10, 30, 60]"),
        "{error}"
    );
}

#[test]
fn two_runs_on_one_cache_call_each_ladder_once_between_them() {
    let scratch = Scratch::new();
    let ladder = experiment(&scratch, "ladder", "0.1, 0.3", true);
    scratch.write("experiments/slow", "");
    let start = || {
        (scratch.gacc_process())
            .args(["run", &ladder, "-q"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (first, second) = (start(), start());
    let (a, b) = (
        first.wait_with_output().unwrap(),
        second.wait_with_output().unwrap(),
    );
    assert!(a.status.success(), "{}", String::from_utf8_lossy(&a.stderr));
    assert!(b.status.success(), "{}", String::from_utf8_lossy(&b.stderr));
    // One call per (source, goal shown) between the two: the second waited for the first's.
    assert_eq!(calls(&scratch).len(), 6, "{:?}", calls(&scratch));
    let folder = |out: &std::process::Output| scratch.path(String::from_utf8_lossy(&out.stdout).trim());
    assert_eq!(
        std::fs::read(folder(&a).join("report.json")).unwrap(),
        std::fs::read(folder(&b).join("report.json")).unwrap()
    );
}
