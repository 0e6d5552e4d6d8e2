//! The reference fixture end to end: the numbers, the integrity audit, the cache.

use crate::common;

use common::{Scratch, made, read_json, read_lines};

const FIXTURE: &str = "experiments/fixture.toml";

#[test]
fn the_fixture_reproduces_the_reference_numbers() {
    let scratch = Scratch::new();
    let (status, folder, stderr) = scratch.run(FIXTURE, &[]);
    assert_eq!(status, 0, "{stderr}");
    for file in [
        "manifest.toml",
        "plan.json.gz",
        "memory_texts.jsonl.gz",
        "memories.jsonl.gz",
        "results.jsonl.gz",
        "report.json",
        "report.md",
        "trace.jsonl",
        "run.json",
    ] {
        assert!(folder.join(file).is_file(), "{file} is written");
    }
    let report = read_json(&folder.join("report.json"));
    assert_eq!(report["schema"], "gacc.report/1");
    let cells = report["cells"].as_array().unwrap();
    assert_eq!(cells.len(), 1);
    let seeds = cells[0]["seeds"].as_array().unwrap();
    assert_eq!(
        seeds
            .iter()
            .map(|s| s["seed"].as_u64().unwrap())
            .collect::<Vec<_>>(),
        [42, 43, 44]
    );
    for seed in seeds {
        assert_eq!(
            (seed["correct"].as_u64(), seed["questions"].as_u64()),
            (Some(8), Some(12))
        );
        assert_eq!(seed["micro"].as_f64().unwrap(), 2.0 / 3.0);
        assert_eq!(seed["macro"].as_f64().unwrap(), 0.0);
        assert_eq!(
            (seed["goals"].as_u64(), seed["goals_all_correct"].as_u64()),
            (Some(4), Some(0))
        );
    }
    assert_eq!(
        report["integrity"],
        serde_json::json!({"exposure_violations": 0, "budget_violations": 0, "padding_tokens": 0, "count_errors": 0})
    );
    assert_eq!(report["tokenizer"]["identity_verified"], true);
    assert_eq!(report["tokenizer"]["name"], "cl100k_base");
    // The compressor is called once per goal and seed: 4 times per seed.
    assert_eq!(made(&folder, "compressor"), 12);
    assert_eq!(made(&folder, "reader"), 36);
    assert_eq!(made(&folder, "judge"), 36);

    let ledger = read_lines(&folder.join("memories.jsonl.gz"));
    assert_eq!(ledger.len(), 12);
    for row in &ledger {
        assert_eq!(row["truncated"], true, "each goal's line loses its last field");
        assert_eq!(row["retained_tokens"], row["budget"]);
        assert_eq!(row["padding_tokens"], 0);
        assert_eq!(row["unused_budget"], 0);
        assert_eq!(row["goal_id"], row["shown_goal_id"]);
    }
    let results = read_lines(&folder.join("results.jsonl.gz"));
    assert_eq!(results.len(), 36);
    let wrong: Vec<&str> = results
        .iter()
        .filter(|r| r["correct"] == false)
        .map(|r| r["question_id"].as_str().unwrap())
        .collect();
    assert_eq!(wrong.len(), 12);
    assert!(wrong.iter().all(|q| {
        ["status", "operator", "captain", "inspector"]
            .iter()
            .any(|f| q.ends_with(f))
    }));

    let plan = read_json(&folder.join("plan.json.gz"));
    assert_eq!(
        plan["stages"],
        serde_json::json!({"compress": 12, "read": 36, "judge": 36})
    );
    let latest = std::fs::canonicalize(scratch.path("runs/fixture/latest")).unwrap();
    assert_eq!(latest, std::fs::canonicalize(&folder).unwrap());
    let trace = read_lines(&folder.join("trace.jsonl"));
    let summaries: Vec<&serde_json::Value> = trace
        .iter()
        .filter(|e| e["message"] == "stage finished")
        .collect();
    let stages: Vec<&str> = summaries.iter().map(|e| e["stage"].as_str().unwrap()).collect();
    assert_eq!(stages, ["compress", "read", "judge"]);
    let sum = |field: &str| -> u64 { summaries.iter().map(|e| e[field].as_u64().unwrap()).sum() };
    assert_eq!((sum("planned"), sum("finished"), sum("failed")), (84, 84, 0));
    assert_eq!(sum("called") + sum("cached") + sum("skipped"), 84);
    // A line for each job that called, none for a job served without a call.
    let lines = trace.iter().filter(|e| e["message"] == "job finished").count() as u64;
    assert_eq!(lines, sum("called"));
    assert!(trace.iter().all(|e| e["cache_hit"] != true));
}

#[test]
fn a_second_run_makes_no_calls_and_writes_the_same_report() {
    let scratch = Scratch::new();
    let (status, first, _) = scratch.run(FIXTURE, &[]);
    assert_eq!(status, 0);
    let (status, second, _) = scratch.run(FIXTURE, &[]);
    assert_eq!(status, 0);
    assert_ne!(first, second, "each run gets its own folder");
    for role in ["compressor", "reader", "judge"] {
        assert_eq!(made(&second, role), 0, "{role}");
    }
    assert_eq!(
        std::fs::read(first.join("report.json")).unwrap(),
        std::fs::read(second.join("report.json")).unwrap()
    );
    // A run that made no call writes no line per job: its stages' summaries say it all.
    let trace = read_lines(&second.join("trace.jsonl"));
    assert!(trace.len() < 20, "{} events", trace.len());
    assert!(trace.iter().all(|e| e["message"] != "job finished"));
    let cached: u64 = trace
        .iter()
        .filter(|e| e["message"] == "stage finished")
        .map(|e| e["cached"].as_u64().unwrap())
        .sum();
    assert_eq!(cached, 84);
    let plan = scratch.gacc().args(["plan", FIXTURE]).output().unwrap();
    let plan = String::from_utf8(plan.stdout).unwrap();
    assert!(plan.contains("compress         12       12        0"), "{plan}");
    assert!(plan.contains("judge            36       36        0"), "{plan}");
    assert!(!plan.contains("wait on reads"), "{plan}");
    // With a new reader, every judgement waits on a read: the plan says it counts possibles.
    let plan = scratch
        .gacc()
        .args(["plan", FIXTURE, "--set", "reader.revision=9"])
        .output()
        .unwrap();
    let plan = String::from_utf8(plan.stdout).unwrap();
    assert!(plan.contains("judge            36        0       36"), "{plan}");
    assert!(
        plan.contains("judge: 36 of 36 wait on reads not yet made"),
        "{plan}"
    );
}

#[test]
fn changing_the_reader_reruns_readers_and_no_compressor() {
    let scratch = Scratch::new();
    assert_eq!(scratch.run(FIXTURE, &[]).0, 0);
    let (status, folder, _) = scratch.run(FIXTURE, &["--set", "reader.revision=2"]);
    assert_eq!(status, 0);
    assert_eq!(made(&folder, "compressor"), 0);
    assert_eq!(made(&folder, "reader"), 36);
    // The new reader gave the same answers, and a judge call is keyed by its inputs: reused.
    assert_eq!(made(&folder, "judge"), 0);

    // A reader that answers differently sends every answer to the judge again.
    scratch.script(
        "experiments/constant-reader.sh",
        "#!/bin/sh\ncat >/dev/null\necho '{\"answer\": \"42\"}'\n",
    );
    let (status, _, stderr) = scratch.run(FIXTURE, &["--set", "reader.command=[\"./constant-reader.sh\"]"]);
    assert_eq!(status, 2, "builtin and command together are refused: {stderr}");
    assert!(stderr.contains("not both"), "{stderr}");
    let manifest = std::fs::read_to_string(scratch.path(FIXTURE)).unwrap().replace(
        "[reader]\nbuiltin = \"field-lookup\"",
        "[reader]\ncommand = [\"./constant-reader.sh\"]",
    );
    scratch.write("experiments/constant.toml", &manifest);
    let (status, folder2, stderr) = scratch.run("experiments/constant.toml", &[]);
    assert_eq!(status, 0, "{stderr}");
    assert_eq!(made(&folder2, "compressor"), 0);
    assert_eq!(made(&folder2, "reader"), 36);
    assert_eq!(made(&folder2, "judge"), 36);
}

#[test]
fn changing_one_source_reruns_only_that_sources_jobs() {
    let scratch = Scratch::new();
    let (status, first, _) = scratch.run(FIXTURE, &[]);
    assert_eq!(status, 0);
    let dataset = scratch.path("experiments/data/fixture.jsonl");
    let text = std::fs::read_to_string(&dataset).unwrap();
    let changed = text.replace(
        "The harbour master thanks all crews",
        "The harbour master warmly thanks all crews",
    );
    assert_ne!(text, changed);
    std::fs::write(&dataset, changed).unwrap();
    let (status, second, _) = scratch.run(FIXTURE, &[]);
    assert_eq!(status, 0);
    // The harbour source has 2 goals × 3 seeds memories and 6 × 3 questions.
    assert_eq!(made(&second, "compressor"), 6);
    assert_eq!(made(&second, "judge"), 18, "judges see the source");
    assert!(made(&second, "reader") <= 18);
    let old = read_lines(&first.join("memories.jsonl.gz"));
    let new = read_lines(&second.join("memories.jsonl.gz"));
    for row in &new {
        assert_eq!(row["cached"], row["source_id"] == "plant", "{row}");
    }
    assert_eq!(old.len(), new.len());
}

#[test]
fn a_zero_budget_calls_no_compressor_and_keeps_an_empty_memory() {
    let scratch = Scratch::new();
    let (status, folder, stderr) = scratch.run(FIXTURE, &["--set", "ratios=[0]"]);
    assert_eq!(status, 0, "{stderr}");
    assert_eq!(
        made(&folder, "compressor"),
        0,
        "whatever it wrote would be cut away"
    );
    for row in read_lines(&folder.join("memories.jsonl.gz")) {
        assert_eq!(row["budget"], 0);
        assert_eq!(
            row["memory_sha256"],
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(row["generated_tokens"], 0);
        assert_eq!(row["memory_tokens"], 0);
    }
    let report = read_json(&folder.join("report.json"));
    assert_eq!(report["cells"][0]["micro"]["mean"], 0.0);
    assert_eq!(report["calls"]["compressor"]["jobs"], 0);
}

#[test]
fn the_markdown_report() {
    let scratch = Scratch::new();
    let (status, folder, _) = scratch.run(FIXTURE, &[]);
    assert_eq!(status, 0);
    let markdown = std::fs::read_to_string(folder.join("report.md")).unwrap();
    insta::assert_snapshot!(markdown);
}

#[test]
fn gacc_report_rerenders_and_takes_other_templates() {
    let scratch = Scratch::new();
    let (status, folder, _) = scratch.run(FIXTURE, &[]);
    assert_eq!(status, 0);
    let original = std::fs::read_to_string(folder.join("report.md")).unwrap();
    std::fs::remove_file(folder.join("report.md")).unwrap();
    let output = scratch.gacc().arg("report").arg(&folder).output().unwrap();
    assert!(output.status.success());
    assert_eq!(
        std::fs::read_to_string(folder.join("report.md")).unwrap(),
        original
    );

    scratch.write(
        "cells.csv.j2",
        "compressor,condition,ratio,micro,macro\n{% for c in cells %}{{ c.compressor }},{{ c.condition }},{{ c.ratio }},{{ c.micro.mean | fixed(4) }},{{ c.macro.mean | fixed(4) }}\n{% endfor %}",
    );
    let output = scratch
        .gacc()
        .arg("report")
        .arg(&folder)
        .args(["--template", "cells.csv.j2"])
        .output()
        .unwrap();
    assert!(output.status.success());
    assert_eq!(
        String::from_utf8(output.stdout).unwrap(),
        "compressor,condition,ratio,micro,macro\ngoal-line,own-goal,0.15,0.6667,0.0000\n"
    );

    scratch.write("broken.j2", "line one\n{{ cells[0].no_such_field }}\n");
    let output = scratch
        .gacc()
        .arg("report")
        .arg(&folder)
        .args(["--template", "broken.j2"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(
        stderr.contains("broken.j2:2") && stderr.contains("undefined"),
        "{stderr}"
    );
}

#[test]
fn usage_and_cost_are_summed_and_what_the_cache_saved_is_shown() {
    let scratch = Scratch::new();
    scratch.script(
        "experiments/paid-reader.sh",
        "#!/bin/sh\nrequest=$(cat)\nprintf '%s' \"$request\" | @GACC@ callback field-lookup | sed 's/^{/{\"usage\":{\"input_tokens\":10,\"output_tokens\":2,\"cost_usd\":0.001},/'\n",
    );
    let manifest = std::fs::read_to_string(scratch.path(FIXTURE)).unwrap().replace(
        "[reader]\nbuiltin = \"field-lookup\"",
        "[reader]\ncommand = [\"./paid-reader.sh\"]",
    );
    scratch.write("experiments/paid.toml", &manifest);
    let (status, first, stderr) = scratch.run("experiments/paid.toml", &[]);
    assert_eq!(status, 0, "{stderr}");
    let report = read_json(&first.join("report.json"));
    assert_eq!(report["usage"]["reader"]["input_tokens"], 360);
    assert_eq!(report["usage"]["reader"]["output_tokens"], 72);
    assert!((report["usage"]["reader"]["cost_usd"].as_f64().unwrap() - 0.036).abs() < 1e-9);
    assert_eq!(report["usage"]["compressor"]["cost_usd"], 0.0);
    assert!(report["usage_by_compressor"]["goal-line"].is_object());
    let markdown = std::fs::read_to_string(first.join("report.md")).unwrap();
    assert!(
        markdown.contains("This run paid 0.0360 USD; the cache saved 0.0000 USD."),
        "{markdown}"
    );
    let (_, second, _) = scratch.run("experiments/paid.toml", &[]);
    let markdown = std::fs::read_to_string(second.join("report.md")).unwrap();
    assert!(
        markdown.contains("This run paid 0.0000 USD; the cache saved 0.0360 USD."),
        "{markdown}"
    );
    assert_eq!(
        std::fs::read(first.join("report.json")).unwrap(),
        std::fs::read(second.join("report.json")).unwrap()
    );
}

#[test]
fn every_cell_has_bootstrap_intervals() {
    let scratch = Scratch::new();
    let (_, folder, _) = scratch.run("experiments/baselines.toml", &[]);
    let report = read_json(&folder.join("report.json"));
    for cell in report["cells"].as_array().unwrap() {
        for (metric, interval) in [("micro", "micro_ci95"), ("macro", "macro_ci95")] {
            let (low, high) = (
                cell[interval]["low"].as_f64().unwrap(),
                cell[interval]["high"].as_f64().unwrap(),
            );
            let mean = cell[metric]["mean"].as_f64().unwrap();
            assert!(low <= high && (0.0..=1.0).contains(&low) && high <= 1.0, "{cell}");
            assert!(
                low <= mean + 1e-9 && mean <= high + 1e-9,
                "{metric} {mean} outside [{low}, {high}]"
            );
        }
    }
    let goal_bm25 = report["cells"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["compressor"] == "goal-bm25" && c["ratio"] == 0.1 && c["condition"] == "own-goal")
        .unwrap();
    assert!(
        goal_bm25["micro_ci95"]["low"].as_f64().unwrap() < goal_bm25["micro_ci95"]["high"].as_f64().unwrap()
    );
}

/// Rewrites the first cache entry of `kind` whose payload contains `from` so that it holds `to`
/// instead, with a checksum that matches: a forged entry, not a torn one.
fn forge_cache_entry(scratch: &Scratch, kind: &str, from: &str, to: &str) {
    use sha2::Digest;
    let segments = scratch.path(".gacc/cache/segments");
    for segment in std::fs::read_dir(&segments).unwrap() {
        let path = segment.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        let mut forged = false;
        let lines: Vec<String> = text
            .lines()
            .map(|line| {
                let fields: Vec<&str> = line.splitn(4, ' ').collect();
                if forged || fields[1] != kind || !fields[3].contains(from) {
                    return line.to_owned();
                }
                forged = true;
                let payload = fields[3].replacen(from, to, 1);
                let checksum: String = sha2::Sha256::digest(payload.as_bytes())
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect();
                format!("{} {} {checksum} {payload}", fields[0], fields[1])
            })
            .collect();
        if forged {
            std::fs::write(&path, lines.join("\n") + "\n").unwrap();
            return;
        }
    }
    panic!("no {kind} entry holds {from}");
}

#[test]
fn a_forged_count_in_the_cache_is_caught_by_the_recount_on_a_re_run() {
    let scratch = Scratch::new();
    let (status, first, _) = scratch.run(FIXTURE, &[]);
    assert_eq!(status, 0);
    // The first run proved its counts (one per distinct text, sources included).
    assert!(scratch.cached("count") >= 3, "{}", scratch.cached("count"));
    let memory_tokens = read_lines(&first.join("memories.jsonl.gz"))[0]["memory_tokens"]
        .as_u64()
        .unwrap();
    forge_cache_entry(
        &scratch,
        "memory",
        &format!("\"memory_tokens\":{memory_tokens},"),
        &format!("\"memory_tokens\":{},", memory_tokens + 1),
    );
    let (status, second, stderr) = scratch.run(FIXTURE, &[]);
    assert_eq!(
        made(&second, "compressor"),
        0,
        "the forged entry is served: {stderr}"
    );
    let report = read_json(&second.join("report.json"));
    assert_eq!(report["integrity"]["count_errors"], 1, "{stderr}");
    assert_eq!(status, 0, "{stderr}");
    assert!(
        stderr.contains("count errors 1"),
        "the summary shows it: {stderr}"
    );
}

#[test]
fn re_runs_share_their_derived_files_by_content() {
    use std::os::unix::fs::MetadataExt;
    let scratch = Scratch::new();
    let (_, first, _) = scratch.run(FIXTURE, &[]);
    let (_, second, _) = scratch.run(FIXTURE, &[]);
    let inode = |folder: &std::path::Path, file: &str| std::fs::metadata(folder.join(file)).unwrap().ino();
    // The page too: its ledger rows differ only in `cached`, which it does not show.
    for file in ["plan.json.gz", "memory_texts.jsonl.gz", "report.html"] {
        assert_eq!(
            inode(&first, file),
            inode(&second, file),
            "{file}: one copy for both runs"
        );
    }
    // Files users read and edit stay each run's own.
    for file in ["results.jsonl.gz", "memories.jsonl.gz", "report.json"] {
        assert_ne!(inode(&first, file), inode(&second, file), "{file}");
    }
    // Another budget: other memories and another plan, each written anew.
    let (status, third, _) = scratch.run(FIXTURE, &["--set", "ratios=[0.3]"]);
    assert_eq!(status, 0);
    for file in ["plan.json.gz", "memory_texts.jsonl.gz", "report.html"] {
        assert_ne!(inode(&first, file), inode(&third, file), "{file}");
    }
    let shared = scratch.path("runs/fixture/.shared");
    assert_eq!(std::fs::read_dir(&shared).unwrap().count(), 6);
    // `gacc report` makes the page again in that run's folder alone.
    let page = std::fs::read(second.join("report.html")).unwrap();
    let shared_page = inode(&second, "report.html");
    assert_eq!(
        scratch
            .gacc()
            .arg("report")
            .arg(&second)
            .output()
            .unwrap()
            .status
            .code(),
        Some(0)
    );
    assert_ne!(inode(&second, "report.html"), shared_page);
    assert_eq!(
        std::fs::read(second.join("report.html")).unwrap(),
        page,
        "the same page either way"
    );
    // A shared file is a whole file: the run reads back from it, and a deleted run leaves the
    // others theirs.
    std::fs::remove_dir_all(&first).unwrap();
    let plan = read_json(&second.join("plan.json.gz"));
    assert_eq!(plan["stages"]["compress"], 12);
    let runs = scratch.json(["runs", "list", "--json"]);
    assert_eq!(runs.as_array().map(Vec::len), Some(2), "{runs}");
}

#[test]
fn a_run_whose_shared_folder_cannot_be_made_writes_its_own_files() {
    use std::os::unix::fs::MetadataExt;
    let scratch = Scratch::new();
    std::fs::create_dir_all(scratch.path("runs/fixture")).unwrap();
    scratch.write("runs/fixture/.shared", "not a folder");
    let (status, folder, stderr) = scratch.run(FIXTURE, &[]);
    assert_eq!(status, 0, "{stderr}");
    for file in ["plan.json.gz", "memory_texts.jsonl.gz", "report.html"] {
        assert_eq!(std::fs::metadata(folder.join(file)).unwrap().nlink(), 1, "{file}");
    }
    assert_eq!(read_json(&folder.join("plan.json.gz"))["stages"]["compress"], 12);
}

#[test]
fn shared_files_no_run_links_are_removed_after_a_run_and_those_it_reuses_are_kept() {
    use std::os::unix::fs::MetadataExt;
    let scratch = Scratch::new();
    let shared = scratch.path("runs/fixture/.shared");
    let inode = |folder: &std::path::Path, file: &str| std::fs::metadata(folder.join(file)).unwrap().ino();
    // Every shared file as if written two minutes ago.
    let age = || {
        let then = std::time::SystemTime::now() - std::time::Duration::from_secs(120);
        for entry in std::fs::read_dir(&shared).unwrap() {
            let file = std::fs::File::options()
                .write(true)
                .open(entry.unwrap().path())
                .unwrap();
            file.set_modified(then).unwrap();
        }
    };
    let (_, first, _) = scratch.run(FIXTURE, &[]);
    let (_, other, _) = scratch.run(FIXTURE, &["--set", "ratios=[0.3]"]);
    let files = ["plan.json.gz", "memory_texts.jsonl.gz", "report.html"];
    let before: Vec<u64> = files.iter().map(|f| inode(&first, f)).collect();
    std::fs::remove_dir_all(&first).unwrap();
    age();
    // A re-run of the first experiment, its run deleted: its shared files are taken up again.
    let (_, again, _) = scratch.run(FIXTURE, &[]);
    let after: Vec<u64> = files.iter().map(|f| inode(&again, f)).collect();
    assert_eq!(before, after);
    assert_eq!(
        std::fs::read_dir(&shared).unwrap().count(),
        6,
        "the other run's are kept"
    );
    // Once the other run is deleted, the next run removes what only it used.
    std::fs::remove_dir_all(&other).unwrap();
    age();
    scratch.run(FIXTURE, &[]);
    assert_eq!(std::fs::read_dir(&shared).unwrap().count(), 3);
}
