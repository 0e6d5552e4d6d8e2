//! `gacc diff`: settings, per-cell deltas with paired tests, flipped questions.

use crate::common;

use common::Scratch;
use serde_json::Value;

fn diff_json(scratch: &Scratch, a: &std::path::Path, b: &std::path::Path) -> Value {
    scratch.json([
        std::ffi::OsStr::new("diff"),
        a.as_os_str(),
        b.as_os_str(),
        "--format".as_ref(),
        "json".as_ref(),
    ])
}

#[test]
fn two_baseline_runs_that_differ_in_one_compressors_params() {
    let scratch = Scratch::new();
    let (status, a, _) = scratch.run("experiments/baselines.toml", &[]);
    assert_eq!(status, 0);
    let (status, b, _) = scratch.run(
        "experiments/baselines.toml",
        &[
            "--set",
            "compressors.goal-bm25.params.k1=0.1",
            "--set",
            "compressors.goal-bm25.params.b=0.0",
        ],
    );
    assert_eq!(status, 0);
    let diff = diff_json(&scratch, &a, &b);
    let keys: Vec<&str> = diff["settings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["key"].as_str().unwrap())
        .collect();
    assert_eq!(
        keys,
        [
            "compressors.goal-bm25.params.b",
            "compressors.goal-bm25.params.k1"
        ]
    );
    let cells = diff["cells"].as_array().unwrap();
    assert_eq!(cells.len(), 48);
    for cell in cells {
        let p = cell["mcnemar"]["p_value"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&p));
        if cell["compressor"] != "goal-bm25" {
            assert_eq!(cell["micro_delta"], 0.0, "only goal-bm25 changed");
            assert_eq!(p, 1.0);
        }
    }
    let flipped = diff["flipped"].as_array().unwrap();
    assert!(!flipped.is_empty(), "some questions flipped");
    for flip in flipped {
        assert_eq!(flip["compressor"], "goal-bm25");
        assert!(!flip["question"].as_str().unwrap().is_empty());
        assert_ne!(flip["answer_a"], flip["answer_b"]);
    }
    // The same run against itself: nothing changed.
    let same = diff_json(&scratch, &a, &a);
    assert!(same["settings"].as_array().unwrap().is_empty());
    assert!(same["flipped"].as_array().unwrap().is_empty());
}

#[test]
fn a_regression_fails_only_when_asked_and_is_tested_over_goals() {
    let scratch = Scratch::new();
    scratch.script(
        "experiments/blank.sh",
        "#!/bin/sh\ncat >/dev/null\necho '{\"answer\": \"\"}'\n",
    );
    // The fixture's 4 goals, every answer lost: McNemar over its 36 questions calls it
    // certain, but 4 goals all one way happen 2 times in 16 by chance: within noise.
    let (_, a, _) = scratch.run("experiments/fixture.toml", &[]);
    let manifest = std::fs::read_to_string(scratch.path("experiments/fixture.toml"))
        .unwrap()
        .replace(
            "[reader]\nbuiltin = \"field-lookup\"",
            "[reader]\ncommand = [\"./blank.sh\"]",
        );
    scratch.write("experiments/blank.toml", &manifest);
    let (status, b, _) = scratch.run("experiments/blank.toml", &[]);
    assert_eq!(status, 0);
    let diff = diff_json(&scratch, &a, &b);
    let cell = &diff["cells"][0];
    assert_eq!(
        (
            cell["mcnemar"]["right_to_wrong"].as_u64(),
            cell["mcnemar"]["wrong_to_right"].as_u64()
        ),
        (Some(24), Some(0))
    );
    // 2 · (1/2)^24, shown, deciding nothing.
    assert!((cell["mcnemar"]["p_value"].as_f64().unwrap() - 2.0f64.powi(-23)).abs() < 1e-15);
    assert_eq!(cell["micro_test"]["goals"], 4);
    assert_eq!(cell["micro_test"]["p_value"], 0.125);
    assert_eq!(cell["verdict"], "within noise");
    assert_eq!(diff["regressions"], 0);
    let fail_on_regression = |a: &std::path::Path, b: &std::path::Path| {
        scratch
            .gacc()
            .arg("diff")
            .arg(a)
            .arg(b)
            .arg("--fail-on-regression")
            .output()
            .unwrap()
    };
    assert_eq!(fail_on_regression(&a, &b).status.code(), Some(0));
    let text = scratch.gacc().arg("diff").arg(&a).arg(&b).output().unwrap();
    assert!(
        String::from_utf8_lossy(&text.stdout)
            .contains("within noise (4 goals cannot show a difference at 0.05)")
    );

    // The baselines' 18 goals, every answer lost: each cell that scored is worse.
    let sets = ["--set", "ratios=[1.0]", "--set", "conditions=[\"own-goal\"]"];
    let (_, a, _) = scratch.run("experiments/baselines.toml", &sets);
    let manifest = std::fs::read_to_string(scratch.path("experiments/baselines.toml"))
        .unwrap()
        .replace(
            "[reader]\nbuiltin = \"extractive\"",
            "[reader]\ncommand = [\"./blank.sh\"]",
        )
        .replace("name = \"baselines\"", "name = \"blank-baselines\"");
    scratch.write("experiments/blank-baselines.toml", &manifest);
    let (status, b, stderr) = scratch.run("experiments/blank-baselines.toml", &sets);
    assert_eq!(status, 0, "{stderr}");
    let diff = diff_json(&scratch, &a, &b);
    let scored = diff["cells"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["micro_a"].as_f64().unwrap() > 0.0)
        .count();
    assert!(scored > 0);
    assert_eq!(diff["regressions"], scored, "{diff}");
    for cell in diff["cells"].as_array().unwrap() {
        if cell["micro_a"].as_f64().unwrap() > 0.0 {
            assert_eq!(cell["verdict"], "worse", "{cell}");
            assert!(cell["micro_test"]["p_value"].as_f64().unwrap() < 0.05, "{cell}");
        }
    }
    let output = scratch.gacc().arg("diff").arg(&a).arg(&b).output().unwrap();
    assert_eq!(output.status.code(), Some(0), "a report, not a test");
    let output = fail_on_regression(&a, &b);
    assert_eq!(output.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&output.stderr).contains(&format!("{scored} cell(s) regressed")));
    // report.json files and `latest` links work as well as folders.
    let latest = scratch.path("runs/blank-baselines/latest");
    let output = scratch
        .gacc()
        .arg("diff")
        .arg(a.join("report.json"))
        .arg(&latest)
        .output()
        .unwrap();
    assert!(output.status.success());
}

#[test]
fn the_markdown_diff() {
    let scratch = Scratch::new();
    let (_, a, _) = scratch.run("experiments/fixture.toml", &[]);
    let (_, b, _) = scratch.run(
        "experiments/fixture.toml",
        &["--set", "compressors.goal-line.builtin=\"identity\""],
    );
    let output = scratch.gacc().arg("diff").arg(&a).arg(&b).output().unwrap();
    let text = String::from_utf8(output.stdout)
        .unwrap()
        .replace(&a.display().to_string(), "RUN_A")
        .replace(&b.display().to_string(), "RUN_B");
    insta::assert_snapshot!(text);
}

#[test]
fn a_folder_that_is_not_a_run_is_a_clear_error() {
    let scratch = Scratch::new();
    let output = scratch
        .gacc()
        .args(["diff", "experiments", "experiments"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(
        stderr.contains("report.json") && stderr.contains("cannot read"),
        "{stderr}"
    );
}

#[test]
fn a_run_of_another_schema_or_none_at_all_is_named_with_exit_status_2() {
    let scratch = Scratch::new();
    let (status, folder, stderr) = scratch.run("experiments/fixture.toml", &["-q"]);
    assert_eq!(status, 0, "{stderr}");
    // A report.json from a gacc of another schema.
    let report = folder.join("report.json");
    let mut value: Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    let ours = value["schema"].clone();
    value["schema"] = Value::String("gacc-report/0".into());
    std::fs::write(&report, value.to_string()).unwrap();
    let output = scratch
        .gacc()
        .args(["diff", folder.to_str().unwrap(), folder.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8(output.stderr).unwrap();
    let ours = ours.as_str().unwrap();
    assert!(
        stderr.contains(&format!(
            "report.json: expected schema {ours}, found gacc-report/0"
        )),
        "{stderr}"
    );
    // A run named that is not there.
    let output = scratch.gacc().args(["diff", "-9", "latest"]).output().unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(
        stderr.contains("`-9` names a run that does not exist"),
        "{stderr}"
    );
}

#[test]
fn a_diff_around_an_edit_of_a_script_names_the_script_and_opens_with_a_summary() {
    let scratch = Scratch::new();
    scratch.script(
        "experiments/callbacks/keep.sh",
        "#!/bin/sh\nexec @GACC@ callback goal-line\n",
    );
    let manifest = scratch.fixture_with("edited", "command = [\"sh\", \"callbacks/keep.sh\"]");
    let (status, a, stderr) = scratch.run(&manifest, &["-q"]);
    assert_eq!(status, 0, "{stderr}");
    // The edit changes what the compressor keeps: it now returns the whole source.
    scratch.script(
        "experiments/callbacks/keep.sh",
        "#!/bin/sh\nexec @GACC@ callback identity\n",
    );
    let (status, b, stderr) = scratch.run(&manifest, &["-q"]);
    assert_eq!(status, 0, "{stderr}");
    let output = scratch
        .gacc()
        .args(["diff", a.to_str().unwrap(), b.to_str().unwrap()])
        .output()
        .unwrap();
    let printed = String::from_utf8_lossy(&output.stdout);
    assert!(
        printed.contains("| compressors.goal-line script callbacks/keep.sh | sha256 "),
        "{printed}"
    );
    let summary = printed
        .lines()
        .find(|line| line.starts_with("**"))
        .unwrap_or_else(|| panic!("no summary line:\n{printed}"));
    assert!(summary.contains("of 1 cell(s) changed"), "{summary}");
    assert!(summary.contains("setting(s) changed"), "{summary}");
    assert!(printed.contains("| 95% interval | verdict |"), "{printed}");
}
