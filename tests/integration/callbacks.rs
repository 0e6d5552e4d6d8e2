//! Callbacks that misbehave: each failure is reported with the callback's name, the reason
//! and its stderr; nothing is scored for it; a re-run after the fix repeats no finished call.

use crate::common;

use common::{Programs, Scratch, made, read_json, read_lines};

/// The fixture with its reader replaced by `experiments/reader.sh`.
fn fixture_with_script_reader(scratch: &Scratch, misbehaviour: &str) {
    scratch.script(
        "experiments/reader.sh",
        &format!(
            "#!/bin/sh\nrequest=$(cat)\necho call >> reader-calls.log\ncase \"$request\" in\n  *\"status of the reactor\"*) if [ -e broken ]; then {misbehaviour}; fi ;;\nesac\nprintf '%s' \"$request\" | exec @GACC@ callback field-lookup\n"
        ),
    );
    let manifest = std::fs::read_to_string(scratch.path("experiments/fixture.toml"))
        .unwrap()
        .replace(
            "[reader]\nbuiltin = \"field-lookup\"",
            "[reader]\ncommand = [\"./reader.sh\"]\nsandbox = false\nretries = 0",
        );
    scratch.write("experiments/scripted.toml", &manifest);
    scratch.write("experiments/broken", "");
}

fn fails_then_recovers(misbehaviour: &str, reason: &str) {
    let scratch = Scratch::new();
    fixture_with_script_reader(&scratch, misbehaviour);
    let (status, folder, stderr) = scratch.run("experiments/scripted.toml", &[]);
    assert_eq!(status, 1, "{stderr}");
    assert!(
        stderr.contains(
            "FAILED read reader, 3 calls (plant, plant-reactor-status; goal-line own-goal r=0.15 seed 42, …)"
        ),
        "{stderr}"
    );
    assert!(stderr.contains(reason), "expected {reason:?} in {stderr}");
    assert!(stderr.contains("run the same command again"), "{stderr}");
    let report = read_json(&folder.join("report.json"));
    let failures = report["failures"].as_array().unwrap();
    assert_eq!(failures.len(), 3, "one per seed");
    for failure in failures {
        assert_eq!(failure["callback"], "reader");
        assert_eq!(failure["stage"], "read");
        assert_eq!(failure["question_id"], "plant-reactor-status");
        assert!(failure["reason"].as_str().unwrap().contains(reason));
    }
    assert_eq!(report["complete"], false);
    let cell = &report["cells"][0];
    assert_eq!(cell["complete"], false);
    for seed in cell["seeds"].as_array().unwrap() {
        // A failure is not a wrong answer: the question is left out, not scored 0.
        assert_eq!(
            (seed["correct"].as_u64(), seed["questions"].as_u64()),
            (Some(8), Some(11))
        );
        assert_eq!(seed["unscored_questions"], 1);
    }
    let results = read_lines(&folder.join("results.jsonl.gz"));
    let failed: Vec<_> = results.iter().filter(|r| r["failure"].is_string()).collect();
    assert_eq!(failed.len(), 3);
    assert!(failed.iter().all(|r| r["correct"].is_null()));
    assert!(
        std::fs::read_to_string(folder.join("report.md"))
            .unwrap()
            .contains("## Failures")
    );
    assert_eq!(scratch.count_lines("experiments/reader-calls.log"), 36);

    std::fs::remove_file(scratch.path("experiments/broken")).unwrap();
    let (status, folder, stderr) = scratch.run("experiments/scripted.toml", &[]);
    assert_eq!(status, 0, "{stderr}");
    assert_eq!(
        scratch.count_lines("experiments/reader-calls.log"),
        39,
        "only the 3 failed reads are made again"
    );
    assert_eq!(made(&folder, "compressor"), 0);
    assert_eq!(made(&folder, "reader"), 3);
    assert_eq!(made(&folder, "judge"), 3);
    let report = read_json(&folder.join("report.json"));
    assert_eq!(report["complete"], true);
    assert_eq!(report["cells"][0]["micro"]["mean"].as_f64(), Some(2.0 / 3.0));
}

#[test]
fn a_callback_that_exits_non_zero() {
    fails_then_recovers("echo 'model server said no' >&2; exit 3", "exited with status 3");
}

#[test]
fn the_stderr_tail_is_kept() {
    let scratch = Scratch::new();
    fixture_with_script_reader(&scratch, "echo 'model server said no' >&2; exit 3");
    let (status, folder, stderr) = scratch.run("experiments/scripted.toml", &[]);
    assert_eq!(status, 1);
    assert!(stderr.contains("stderr: model server said no"), "{stderr}");
    let report = read_json(&folder.join("report.json"));
    assert!(
        report["failures"][0]["stderr_tail"]
            .as_str()
            .unwrap()
            .contains("model server said no")
    );
}

#[test]
fn a_callback_that_prints_invalid_json() {
    fails_then_recovers(
        "echo 'Sure! Here is the answer: green'; exit 0",
        "not one JSON object",
    );
}

#[test]
fn a_callback_that_omits_a_field() {
    fails_then_recovers(
        "echo '{\"answr\": \"green\"}'; exit 0",
        "answered without the field `answer`",
    );
}

#[test]
fn a_callback_that_explains_its_error() {
    fails_then_recovers(
        "echo '{\"error\": \"rate limited\", \"retryable\": false}'; exit 1",
        "reported an error: rate limited",
    );
}

#[test]
fn a_failed_compressor_leaves_its_questions_unscored() {
    let scratch = Scratch::new();
    scratch.script(
        "experiments/compressor.sh",
        "#!/bin/sh\nrequest=$(cat)\ncase \"$request\" in\n  *\"state of the turbine\"*) echo 'out of memory' >&2; exit 1 ;;\nesac\nprintf '%s' \"$request\" | exec @GACC@ callback goal-line\n",
    );
    let manifest = std::fs::read_to_string(scratch.path("experiments/fixture.toml"))
        .unwrap()
        .replace("builtin = \"goal-line\"", "command = [\"./compressor.sh\"]");
    scratch.write("experiments/scripted.toml", &manifest);
    let (status, folder, stderr) = scratch.run("experiments/scripted.toml", &[]);
    assert_eq!(status, 1, "{stderr}");
    assert!(
        stderr.contains(
            "FAILED compress compressors.goal-line, 3 calls (plant; goal-line own-goal r=0.15 seed "
        ),
        "{stderr}"
    );
    let report = read_json(&folder.join("report.json"));
    assert_eq!(report["failures"].as_array().unwrap().len(), 3);
    for seed in report["cells"][0]["seeds"].as_array().unwrap() {
        assert_eq!(
            (seed["questions"].as_u64(), seed["unscored_questions"].as_u64()),
            (Some(9), Some(3))
        );
        assert_eq!(seed["goals"], 3);
    }
    assert_eq!(
        read_lines(&folder.join("memories.jsonl.gz")).len(),
        9,
        "no ledger row for a memory never made"
    );
}

#[test]
fn a_hanging_callback_is_timed_out_and_its_process_group_killed() {
    let scratch = Scratch::new();
    scratch.script(
        "experiments/reader.sh",
        "#!/bin/sh\ncat >/dev/null\nsleep 300 &\necho $! >> grandchildren.pid\nsleep 300\n",
    );
    let manifest = std::fs::read_to_string(scratch.path("experiments/fixture.toml"))
        .unwrap()
        .replace(
            "[reader]\nbuiltin = \"field-lookup\"",
            "[reader]\ncommand = [\"./reader.sh\"]\nsandbox = false\ntimeout = \"300ms\"\nretries = 1",
        )
        .replace("seeds = [42, 43, 44]", "seeds = [42]");
    scratch.write("experiments/hang.toml", &manifest);
    let (status, folder, stderr) = scratch.run("experiments/hang.toml", &[]);
    assert_eq!(status, 1, "{stderr}");
    let report = read_json(&folder.join("report.json"));
    let failures = report["failures"].as_array().unwrap();
    assert_eq!(failures.len(), 12);
    assert!(
        failures
            .iter()
            .all(|f| f["reason"].as_str().unwrap().contains("timed out") && f["attempts"] == 2)
    );
    let pids = std::fs::read_to_string(scratch.path("experiments/grandchildren.pid")).unwrap();
    assert_eq!(pids.lines().count(), 24, "12 questions, 2 attempts each");
    for pid in pids.lines() {
        let alive = std::path::Path::new(&format!("/proc/{}", pid.trim())).exists()
            && !std::fs::read_to_string(format!("/proc/{}/stat", pid.trim()))
                .unwrap_or_default()
                .contains(") Z ");
        assert!(!alive, "grandchild {pid} outlived its call");
    }
}

#[test]
fn ctrl_c_kills_calls_in_flight_keeps_finished_work_and_says_how_to_resume() {
    let scratch = Scratch::new();
    scratch.script(
        "experiments/reader.sh",
        "#!/bin/sh\nrequest=$(cat)\ncase \"$request\" in\n  *status*) echo $$ >> slow.pid; exec sleep 300 ;;\nesac\nprintf '%s' \"$request\" | exec @GACC@ callback field-lookup\n",
    );
    let manifest = std::fs::read_to_string(scratch.path("experiments/fixture.toml"))
        .unwrap()
        .replace(
            "[reader]\nbuiltin = \"field-lookup\"",
            "[reader]\ncommand = [\"./reader.sh\"]\nsandbox = false",
        );
    scratch.write("experiments/slow.toml", &manifest);
    let child = std::process::Command::new(common::gacc_binary())
        .args(["run", "experiments/slow.toml"])
        .current_dir(scratch.dir.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while scratch.count_lines("experiments/slow.pid") < 3 {
        assert!(
            std::time::Instant::now() < deadline,
            "the slow calls never started"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    // SAFETY: signals our own child process.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert_eq!(output.status.code(), Some(130), "{stderr}");
    assert!(
        stderr.contains("run `gacc run experiments/slow.toml` again to resume"),
        "{stderr}"
    );
    for pid in std::fs::read_to_string(scratch.path("experiments/slow.pid"))
        .unwrap()
        .lines()
    {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        assert!(
            stat.is_empty() || stat.contains(") Z "),
            "call {pid} outlived the interrupted run"
        );
    }
    // Compressor calls that finished before the interrupt are cached and not made again.
    let cached = scratch.cached("compressor");
    assert!(cached > 0);
    let manifest = manifest.replace("command = [\"./reader.sh\"]", "builtin = \"field-lookup\"");
    scratch.write("experiments/slow.toml", &manifest);
    let (status, folder, _) = scratch.run("experiments/slow.toml", &[]);
    assert_eq!(status, 0);
    assert_eq!(made(&folder, "compressor") as usize, 12 - cached);
}

#[test]
fn fail_fast_stops_starting_calls_and_keeps_what_finished() {
    let scratch = Scratch::new();
    fixture_with_script_reader(
        &scratch,
        "echo failed >> reader-calls.log; echo 'model server said no' >&2; exit 3",
    );
    let (status, folder, stderr) = scratch.run(
        "experiments/scripted.toml",
        &["--fail-fast", "--set", "run.concurrency=1", "--set", "seeds=[42]"],
    );
    assert_eq!(status, 1, "{stderr}");
    let report = read_json(&folder.join("report.json"));
    assert_eq!(report["failures"].as_array().unwrap().len(), 1, "one failure");
    assert_eq!(report["complete"], false);
    // One call at a time, so the call log is in order: nothing started after the failure.
    let log = std::fs::read_to_string(scratch.path("experiments/reader-calls.log")).unwrap();
    assert_eq!(log.lines().last(), Some("failed"), "{log}");
    let before = log.lines().filter(|l| *l == "call").count();
    let cancelled = report["cancelled"].as_u64().unwrap();
    if before < 12 {
        // Calls waiting for a slot were cancelled rather than started (their downstream
        // jobs were never planned to run, and are not counted).
        assert!(cancelled > 0, "{report}");
        assert!(stderr.contains("jobs not run: the run stopped early"), "{stderr}");
    }

    std::fs::remove_file(scratch.path("experiments/broken")).unwrap();
    let (status, folder, _) = scratch.run("experiments/scripted.toml", &["--set", "seeds=[42]"]);
    assert_eq!(status, 0);
    let after = std::fs::read_to_string(scratch.path("experiments/reader-calls.log"))
        .unwrap()
        .lines()
        .filter(|l| *l == "call")
        .count();
    assert_eq!(
        after - before,
        12 - (before - 1),
        "the reads that finished are not made again"
    );
    assert_eq!(read_json(&folder.join("report.json"))["complete"], true);
}

#[test]
fn every_callback_is_told_its_role_protocol_and_mode() {
    for mode in ["oneshot", "persistent"] {
        let scratch = Scratch::new();
        scratch.script(
            "experiments/reader.sh",
            "#!/bin/sh\necho \"$GACC_PROTOCOL $GACC_ROLE $GACC_MODE\" >> environment.log\nexec @GACC@ callback field-lookup\n",
        );
        let manifest = std::fs::read_to_string(scratch.path("experiments/fixture.toml"))
            .unwrap()
            .replace(
                "[reader]\nbuiltin = \"field-lookup\"",
                &format!("[reader]\ncommand = [\"./reader.sh\"]\nsandbox = false\nmode = \"{mode}\""),
            );
        scratch.write("experiments/modes.toml", &manifest);
        let (status, _, stderr) = scratch.run("experiments/modes.toml", &["-q"]);
        assert_eq!(status, 0, "{stderr}");
        let log = std::fs::read_to_string(scratch.path("experiments/environment.log")).unwrap();
        assert!(!log.is_empty());
        assert!(
            log.lines().all(|l| l == format!("gacc/1 reader {mode}")),
            "{mode}: {log}"
        );
    }
}

/// Rows without the fields that name a call's key (a program's identity differs from the
/// built-in's), for comparing what two runs found.
fn without_keys(rows: Vec<serde_json::Value>) -> Vec<serde_json::Value> {
    rows.into_iter()
        .map(|mut row| {
            let fields = row.as_object_mut().unwrap();
            for key in ["memory_key", "key", "cache_key", "cached", "calls"] {
                fields.remove(key);
            }
            row
        })
        .collect()
}

#[test]
fn rule_built_ins_run_inside_gacc_and_answer_as_their_programs_do() {
    // One seed: every built-in, condition and budget, at a third of the calls. The fixture's
    // programs answer a call each; the baselines' are started once and answer many.
    let one_seed = ["--set", "seeds=[1]"];
    let manifests: [(&str, Programs); 2] = [
        ("experiments/fixture.toml", Scratch::as_programs),
        ("experiments/baselines.toml", Scratch::as_persistent_programs),
    ];
    for (manifest, as_programs) in manifests {
        let scratch = Scratch::new();
        let (status, inside, stderr) = scratch.run(manifest, &one_seed);
        assert_eq!(status, 0, "{stderr}");
        let programs = as_programs(&scratch, manifest);
        let cache = ["--set", "run.cache=\"cache-programs\""];
        let (status, outside, stderr) = scratch.run(&programs, &[&one_seed[..], &cache].concat());
        assert_eq!(status, 0, "{stderr}");
        let report = read_json(&inside.join("report.json"));
        for role in ["compressor", "reader", "judge"] {
            let holdout = &report["holdout"][role];
            assert_eq!(holdout["holdout_enforced"], true, "{manifest} {role}");
            for (name, how) in holdout["callbacks"].as_object().unwrap() {
                assert_eq!(how["sandbox"], "in-process", "{manifest} {name}");
                assert_eq!(how["network"], false, "{manifest} {name}");
            }
        }
        let markdown = std::fs::read_to_string(inside.join("report.md")).unwrap();
        assert!(
            markdown.contains("compressors in process ✓ · reader in process ✓ · judge in process ✓"),
            "{markdown}"
        );
        // The programs' report says they ran as processes.
        let theirs = read_json(&outside.join("report.json"));
        assert_ne!(
            theirs["holdout"]["judge"]["callbacks"]["judge"]["sandbox"],
            "in-process"
        );
        // The same answers, memories and scores, to the last digit.
        assert_eq!(report["cells"], theirs["cells"], "{manifest}");
        for rows in ["results.jsonl.gz", "memories.jsonl.gz"] {
            assert_eq!(
                without_keys(read_lines(&inside.join(rows))),
                without_keys(read_lines(&outside.join(rows))),
                "{manifest} {rows}"
            );
        }
    }
}

#[test]
fn a_process_setting_on_a_rule_built_in_is_warned_about() {
    let scratch = Scratch::new();
    let manifest = scratch.fixture_with("persistent", "builtin = \"goal-line\"\nmode = \"persistent\"");
    let (status, _, stderr) = scratch.run(&manifest, &["-q"]);
    assert_eq!(status, 0, "{stderr}");
    assert!(
        stderr.contains(
            "key `compressors.goal-line.mode` has no effect: the rule built-in `goal-line` runs inside gacc"
        ),
        "{stderr}"
    );
    assert!(stderr.contains("\"callback\", \"goal-line\"]"), "{stderr}");
}

#[test]
fn report_md_groups_failures_by_callback_and_reason_with_where_they_happened() {
    let scratch = Scratch::new();
    scratch.script(
        "experiments/crash.sh",
        "#!/bin/sh\nrequest=$(cat)\ncase \"$request\" in\n  *'\"goal\":null'*) echo 'no goal, no memory' >&2; exit 1 ;;\nesac\nprintf '%s' \"$request\" | exec @GACC@ callback goal-line\n",
    );
    let manifest = scratch.fixture_with("crashy", "command = [\"./crash.sh\"]\nretries = 0");
    let (status, folder, stderr) = scratch.run(
        &manifest,
        &["-q", "--set", "conditions=[\"own-goal\", \"no-goal\"]"],
    );
    assert_eq!(status, 1, "{stderr}");
    let markdown = std::fs::read_to_string(folder.join("report.md")).unwrap();
    assert!(
        markdown.contains(
            "| compressors.goal-line | compress | exited with status 1 | 6 | no-goal | r=0.15 | 42, 43, 44 |"
        ),
        "{markdown}"
    );
}
