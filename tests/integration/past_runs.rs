//! The tool around a run: past runs listed and named (`latest`, `-N`), a run's rows exported
//! as one table, the final summary as JSON, and shell completions.

use crate::common;

use std::collections::HashMap;

use common::{Scratch, read_lines};
use serde_json::Value;

/// Three runs: the fixture, the baselines, the fixture again (from the cache).
fn three_runs(scratch: &Scratch) -> Vec<std::path::PathBuf> {
    ["fixture", "baselines", "fixture"]
        .iter()
        .map(|name| {
            let (status, folder, stderr) = scratch.run(&format!("experiments/{name}.toml"), &["-q"]);
            assert_eq!(status, 0, "{stderr}");
            folder
        })
        .collect()
}

#[test]
fn runs_lists_every_run_and_latest_and_minus_n_name_them() {
    let scratch = Scratch::new();
    let folders = three_runs(&scratch);
    let listed = scratch.json(["runs", "list", "--json"]);
    let listed = listed.as_array().unwrap();
    assert_eq!(listed.len(), 3);
    let names: Vec<&str> = listed.iter().map(|r| r["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["fixture", "baselines", "fixture"]);
    for (run, folder) in listed.iter().zip(&folders) {
        assert!(folder.ends_with(run["folder"].as_str().unwrap()), "{run}");
    }
    let first = &listed[0];
    assert_eq!(first["cells"], 1);
    assert_eq!(first["micro"][0].as_f64().unwrap(), 2.0 / 3.0);
    assert_eq!(first["failures"], 0);
    assert_eq!(
        (first["calls_made"].as_u64(), first["calls_cached"].as_u64()),
        (Some(84), Some(0))
    );
    assert_eq!(
        (
            listed[2]["calls_made"].as_u64(),
            listed[2]["calls_cached"].as_u64()
        ),
        (Some(0), Some(84))
    );
    assert_eq!(first["manifest_sha256"], listed[2]["manifest_sha256"]);
    assert_ne!(first["manifest_sha256"], listed[1]["manifest_sha256"]);

    let table = scratch.gacc().args(["runs"]).output().unwrap();
    let table = String::from_utf8(table.stdout).unwrap();
    assert_eq!(table.lines().filter(|l| l.starts_with('-')).count(), 3, "{table}");
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("-2 ") && l.contains("baselines")),
        "{table}"
    );

    // `gacc diff -3 latest`: the first fixture run against the last.
    let diff = scratch.json(["diff", "-3", "latest", "--format", "json"]);
    assert!(folders[0].ends_with(diff["a"].as_str().unwrap()), "{diff}");
    assert!(folders[2].ends_with(diff["b"].as_str().unwrap()), "{diff}");
    let shown = scratch.json(["runs", "show", "-2", "--json"]);
    assert_eq!(shown["name"], "baselines");
    let missing = scratch.gacc().args(["diff", "-4", "latest"]).output().unwrap();
    assert_eq!(missing.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("`-4` names a run that does not exist"));
}

#[test]
fn export_csv_reads_back_with_every_field_of_the_rows() {
    let scratch = Scratch::new();
    let (status, folder, stderr) = scratch.run("experiments/fixture.toml", &["-q"]);
    assert_eq!(status, 0, "{stderr}");
    let output = scratch
        .gacc()
        .args(["export", "latest", "--format", "csv"])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let mut reader = csv::Reader::from_reader(output.stdout.as_slice());
    let header: Vec<String> = reader.headers().unwrap().iter().map(str::to_owned).collect();
    let records: Vec<csv::StringRecord> = reader.records().map(Result::unwrap).collect();

    let results = read_lines(&folder.join("results.jsonl.gz"));
    let ledger: HashMap<String, Value> = read_lines(&folder.join("memories.jsonl.gz"))
        .into_iter()
        .map(|row| (row["key"].as_str().unwrap().to_owned(), row))
        .collect();
    assert_eq!(records.len(), results.len());
    assert_eq!(header.len(), 29, "{header:?}");
    let text = |value: &Value| match value {
        Value::Null => String::new(),
        Value::String(text) => text.clone(),
        other => other.to_string(),
    };
    for (record, result) in records.iter().zip(&results) {
        let memory = &ledger[result["memory_key"].as_str().unwrap()];
        for (column, field) in header.iter().zip(record) {
            let expected = match result.get(column) {
                Some(value) => text(value),
                None => text(&memory[column]),
            };
            assert_eq!(field, expected, "column {column} of {result}");
        }
    }
    // A field with a comma, quotes and a line break survives the round trip.
    let tricky = "one, \"two\"\nthree";
    let mut rows: Vec<Value> = results.clone();
    rows[0]["answer"] = Value::from(tricky);
    let lines: Vec<String> = rows.iter().map(Value::to_string).collect();
    std::fs::write(
        folder.join("results.jsonl.gz"),
        common::gzip((lines.join("\n") + "\n").as_bytes()),
    )
    .unwrap();
    let output = scratch
        .gacc()
        .args(["export", folder.to_str().unwrap(), "-o", "rows.csv"])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let mut reader = csv::Reader::from_path(scratch.path("rows.csv")).unwrap();
    let answer = header.iter().position(|c| c == "answer").unwrap();
    let first = reader.records().next().unwrap().unwrap();
    assert_eq!(&first[answer], tricky);
}

#[test]
fn export_memories_and_json_lines_hold_each_row_once() {
    let scratch = Scratch::new();
    let (status, folder, stderr) = scratch.run("experiments/fixture.toml", &["-q"]);
    assert_eq!(status, 0, "{stderr}");
    let output = scratch
        .gacc()
        .args(["export", "-1", "--memories", "--format", "jsonl"])
        .output()
        .unwrap();
    assert!(output.status.success());
    let rows: Vec<Value> = String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let ledger = read_lines(&folder.join("memories.jsonl.gz"));
    assert_eq!(rows.len(), ledger.len());
    let texts: HashMap<String, String> = read_lines(&folder.join("memory_texts.jsonl.gz"))
        .into_iter()
        .map(|t| {
            (
                t["sha256"].as_str().unwrap().to_owned(),
                t["memory"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    for (row, memory) in rows.iter().zip(&ledger) {
        // The cache entries a row rests on are the run's own business (`gacc pack`), not a
        // table's.
        assert!(row.get("calls").is_none());
        for (name, value) in memory
            .as_object()
            .unwrap()
            .iter()
            .filter(|(name, _)| *name != "calls")
        {
            assert_eq!(&row[name], value, "{name}");
        }
        assert_eq!(
            row["memory"].as_str().unwrap(),
            texts[memory["memory_sha256"].as_str().unwrap()]
        );
    }
}

#[test]
fn run_json_prints_the_summary_as_one_object() {
    let scratch = Scratch::new();
    let summary = scratch.json(["run", "experiments/fixture.toml", "--json", "-q"]);
    assert!(
        scratch
            .path(summary["folder"].as_str().unwrap())
            .join("report.json")
            .is_file()
    );
    assert_eq!(summary["failures"], 0);
    assert_eq!(summary["cells"][0]["micro"]["mean"].as_f64().unwrap(), 2.0 / 3.0);
    assert_eq!(summary["calls"]["reader"]["made"], 36);
    assert_eq!(summary["integrity"]["budget_violations"], 0);
    assert_eq!(summary["identity_verified"], true);
}

#[test]
fn completions_cover_the_subcommands_for_every_shell() {
    let scratch = Scratch::empty();
    for shell in ["bash", "zsh", "fish"] {
        let output = scratch.gacc().args(["completions", shell]).output().unwrap();
        assert!(output.status.success(), "{shell}");
        let script = String::from_utf8(output.stdout).unwrap();
        for word in ["run", "diff", "export", "runs", "fail-fast", "memories"] {
            assert!(script.contains(word), "{shell} completion lacks {word}");
        }
    }
    let bad = scratch.gacc().args(["completions", "tcsh"]).output().unwrap();
    assert_eq!(bad.status.code(), Some(2));
}

#[test]
fn init_makes_an_experiment_that_runs_at_once_and_never_overwrites() {
    let scratch = Scratch::empty();
    let output = scratch.gacc().args(["init", "My Study"]).output().unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let manifest = scratch.path("My Study/experiment.toml");
    assert!(
        std::fs::read_to_string(&manifest)
            .unwrap()
            .contains("name = \"my-study\"")
    );
    let (status, folder, stderr) = scratch.run("My Study/experiment.toml", &["-q"]);
    assert_eq!(status, 0, "{stderr}");
    let report = common::read_json(&folder.join("report.json"));
    assert_eq!(report["cells"].as_array().unwrap().len(), 12);
    assert_eq!(report["failures"].as_array().unwrap().len(), 0);
    // Seeing its goal helps the example compressor where the budget is tight.
    let micro = |compressor: &str, condition: &str| {
        report["cells"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["compressor"] == compressor && c["condition"] == condition && c["ratio"] == 0.25)
            .map(|c| c["micro"]["mean"].as_f64().unwrap())
            .unwrap()
    };
    assert!(micro("keyword-sentences", "own-goal") > micro("keyword-sentences", "no-goal"));

    std::fs::write(scratch.path("My Study/callbacks/compress.py"), "# mine\n").unwrap();
    let again = scratch.gacc().args(["init", "My Study"]).output().unwrap();
    assert_eq!(again.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&again.stderr).contains("does not overwrite"));
    assert_eq!(
        std::fs::read_to_string(scratch.path("My Study/callbacks/compress.py")).unwrap(),
        "# mine\n"
    );
}

/// A venv with the helper installed in its site-packages, as gacc's wheel installs it; the
/// venv's `bin` first on the returned PATH.
fn venv_with_installed_helper(scratch: &Scratch) -> String {
    let venv = scratch.path("venv");
    let made = std::process::Command::new("python3")
        .args(["-m", "venv", "--without-pip"])
        .arg(&venv)
        .output()
        .unwrap();
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    let site = site_packages(&venv);
    let package = site.join("gacc_callback");
    std::fs::create_dir_all(&package).unwrap();
    for file in ["__init__.py", "__main__.py"] {
        let source = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("python/gacc_callback")
            .join(file);
        std::fs::copy(source, package.join(file)).unwrap();
    }
    format!(
        "{}:{}",
        venv.join("bin").display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

/// The venv's `lib/python3.X/site-packages`.
fn site_packages(venv: &std::path::Path) -> std::path::PathBuf {
    let pattern = venv.join("lib/python3*/site-packages");
    let found: Vec<_> = glob::glob(pattern.to_str().unwrap()).unwrap().flatten().collect();
    assert_eq!(found.len(), 1, "{found:?}");
    found.into_iter().next().unwrap()
}

#[test]
fn init_uses_the_installed_helper_and_copies_it_only_when_none_is_importable() {
    if !common::python3_on_path() {
        eprintln!("skipped: python3 is not on PATH");
        return;
    }
    let scratch = Scratch::empty();
    let path = venv_with_installed_helper(&scratch);
    // `gacc init FOLDER` with the venv first on PATH: its stderr.
    let init = |folder: &str| {
        let output = scratch
            .gacc()
            .args(["init", folder])
            .env("PATH", &path)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        assert!(output.status.success(), "{stderr}");
        stderr
    };
    let stderr = init("installed");
    assert!(
        stderr.contains("the compressor imports the installed helper"),
        "{stderr}"
    );
    assert!(
        stderr.contains("site-packages/gacc_callback/__init__.py"),
        "{stderr}"
    );
    assert!(!scratch.path("installed/callbacks/gacc_callback.py").exists());
    let script = std::fs::read_to_string(scratch.path("installed/callbacks/compress.py")).unwrap();
    assert!(script.contains("installed with gacc"), "{script}");
    // The manifest names the venv's interpreter by its absolute path.
    let manifest = std::fs::read_to_string(scratch.path("installed/experiment.toml")).unwrap();
    let venv_python = scratch.path("venv/bin/python3");
    assert!(
        manifest.contains(&format!("command = [\"{}", venv_python.display())),
        "{manifest}"
    );
    assert!(!script.contains("{{"), "{script}");
    // It runs, sandboxed, on the installed helper alone.
    let (status, folder, stderr) =
        scratch.run_with_env("installed/experiment.toml", &["-q"], &[("PATH", &path)]);
    assert_eq!(status, 0, "{stderr}");
    // Its runs are in its own folder, though it was run from the one above.
    assert!(
        folder.starts_with(scratch.path("installed/runs/installed")),
        "{}",
        folder.display()
    );
    // The venv no longer active: the run still finds the helper.
    let (status, _, stderr) =
        scratch.run_with_env("installed/experiment.toml", &["-q", "--set", "seeds=[9]"], &[]);
    assert_eq!(status, 0, "{stderr}");
    let report = common::read_json(&folder.join("report.json"));
    assert_eq!(report["failures"].as_array().unwrap().len(), 0);
    assert_eq!(report["cells"].as_array().unwrap().len(), 12);

    // A python3 that cannot import it (the venv's, with the package gone): a copy beside the script.
    let site = site_packages(&scratch.path("venv"));
    std::fs::remove_dir_all(site.join("gacc_callback")).unwrap();
    let stderr = init("copied");
    assert!(stderr.contains("the helper copied beside it"), "{stderr}");
    assert_eq!(
        std::fs::read_to_string(scratch.path("copied/callbacks/gacc_callback.py")).unwrap(),
        include_str!("../../python/gacc_callback/__init__.py")
    );
    let (status, _, stderr) = scratch.run_with_env("copied/experiment.toml", &["-q"], &[("PATH", &path)]);
    assert_eq!(status, 0, "{stderr}");
}

#[test]
fn the_experiment_init_makes_verifies_here_and_its_pack_in_a_bare_environment_elsewhere() {
    if !common::python3_on_path() {
        eprintln!("skipped: python3 is not on PATH");
        return;
    }
    let scratch = Scratch::empty();
    let output = scratch.gacc().args(["init", "s"]).output().unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let (status, folder, stderr) = scratch.run("s/experiment.toml", &["-q"]);
    assert_eq!(status, 0, "{stderr}");
    let verified = scratch.gacc().arg("verify").arg(&folder).output().unwrap();
    assert_eq!(
        (
            verified.status.code(),
            String::from_utf8_lossy(&verified.stdout).into_owned()
        ),
        (Some(0), "verified\n".to_owned()),
        "{}",
        String::from_utf8_lossy(&verified.stderr)
    );
    let pack = scratch.pack_run(&folder, "s.gacc.tar.gz");
    let elsewhere = Scratch::empty();
    assert_eq!(elsewhere.verify_bare(&pack), (0, "verified\n".to_owned()));
}

#[test]
fn a_labelled_run_is_listed_by_its_label_and_named_by_it() {
    let scratch = Scratch::new();
    let (status, first, stderr) = scratch.run("experiments/fixture.toml", &["-q", "--label", "v1"]);
    assert_eq!(status, 0, "{stderr}");
    let (status, second, stderr) = scratch.run(
        "experiments/fixture.toml",
        &["-q", "--label", "v2", "--set", "seeds=[1]"],
    );
    assert_eq!(status, 0, "{stderr}");
    // A failed try in between does not move the labels.
    let (status, _, _) = scratch.run("experiments/fixture.toml", &["-q", "--set", "seeds=[2]"]);
    assert_eq!(status, 0);
    let listed = scratch.gacc().args(["runs"]).output().unwrap();
    let listed = String::from_utf8_lossy(&listed.stdout);
    assert!(listed.contains(" v1 ") && listed.contains(" v2 "), "{listed}");
    let record = common::read_json(&second.join("run.json"));
    assert_eq!(record["label"], "v2");
    let exported = scratch.gacc().args(["export", "v2"]).output().unwrap();
    assert!(
        exported.status.success(),
        "{}",
        String::from_utf8_lossy(&exported.stderr)
    );
    let rows = String::from_utf8_lossy(&exported.stdout).lines().count();
    assert_eq!(rows, 13, "a header and the fixture's 12 rows of seed 1");
    let diff = scratch.gacc().args(["diff", "v1", "v2"]).output().unwrap();
    let printed = String::from_utf8_lossy(&diff.stdout);
    let name = |folder: &std::path::Path| folder.file_name().unwrap().to_string_lossy().into_owned();
    assert!(
        printed.contains(&format!("- A: `runs/fixture/{}`", name(&first))),
        "{printed}"
    );
    assert!(
        printed.contains(&format!("- B: `runs/fixture/{}`", name(&second))),
        "{printed}"
    );
    let markdown = std::fs::read_to_string(second.join("report.md")).unwrap();
    assert!(markdown.contains("Run label: **v2**"), "{markdown}");
    let missing = scratch.gacc().args(["export", "v9"]).output().unwrap();
    assert_eq!(missing.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("or a --label"));
}
