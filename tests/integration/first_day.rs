//! What a researcher meets on the first day: a model server that is not there fails fast, and
//! the folder a run starts from does not decide its cache.

use crate::common;

use std::time::{Duration, Instant};

use common::mock_api::{Format, llm_manifest};

/// A key sharing no four characters with the URL (messages are scrubbed of any word that does).
const KEY: &str = "sk-zzzz-qqqq-wwww-xxxx";
use common::{Scratch, made, read_json};

/// A local port with nothing listening on it.
fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

#[test]
fn a_model_server_that_is_not_there_stops_its_endpoint_within_seconds() {
    let scratch = Scratch::new();
    let url = format!("http://127.0.0.1:{}/v1", closed_port());
    // The compressor is a rule built-in, the reader and judge the missing server.
    let manifest = llm_manifest(&url, Format::OpenAi, "", "")
        .replace(
            "[compressors.summarise]\nbuiltin = \"llm-compressor\"\nparams = { model = \"mock\", temperature = 0.0 }",
            "[compressors.goal-line]\nbuiltin = \"goal-line\"",
        );
    assert!(manifest.contains("goal-line"));
    scratch.write("experiments/missing.toml", &manifest);
    let started = Instant::now();
    let (status, folder, stderr) =
        scratch.run_with_env("experiments/missing.toml", &[], &[("MOCK_API_KEY", KEY)]);
    let took = started.elapsed();
    assert_eq!(status, 1, "{stderr}");
    // A liveness bound: it stops in about four seconds, where it took most of a minute.
    assert!(took < Duration::from_secs(30), "{took:?}");
    assert!(
        stderr.contains("could not connect to")
            && stderr.contains(&url)
            && stderr.contains("models.mock.base_url"),
        "{stderr}"
    );
    // The compressor's work is kept: the next run (still without the server) makes none.
    assert_eq!(made(&folder, "compressor"), 12, "{stderr}");
    let (status, again, stderr) =
        scratch.run_with_env("experiments/missing.toml", &[], &[("MOCK_API_KEY", KEY)]);
    assert_eq!(status, 1, "{stderr}");
    assert_eq!(made(&again, "compressor"), 0, "{stderr}");

    // `gacc callback check` says so as soon.
    let started = Instant::now();
    let output = scratch
        .gacc()
        .args(["callback", "check", "experiments/missing.toml", "reader"])
        .env("MOCK_API_KEY", KEY)
        .output()
        .unwrap();
    let said =
        String::from_utf8_lossy(&output.stdout).into_owned() + &String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{said}");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
    assert!(said.contains("could not connect to"), "{said}");
}

/// gacc run in the scratch's `experiments/` folder, the manifests' own.
fn in_experiments(scratch: &Scratch, args: &[&str]) -> std::process::Output {
    scratch
        .gacc()
        .current_dir(scratch.path("experiments"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn a_run_from_the_manifests_folder_and_one_from_its_parent_share_a_cache_and_runs() {
    let scratch = Scratch::new();
    // From the parent, as `gacc init` says; then from inside, as its README says.
    let (status, first, stderr) = scratch.run("experiments/fixture.toml", &["-q"]);
    assert_eq!(status, 0, "{stderr}");
    assert!(first.starts_with(scratch.path("runs/fixture")), "{first:?}");
    let output = in_experiments(&scratch, &["run", "fixture.toml", "-q"]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let printed = String::from_utf8(output.stdout).unwrap();
    let second = scratch.path("experiments").join(printed.trim());
    let second = second.canonicalize().unwrap();
    assert!(
        second.starts_with(scratch.path("runs/fixture").canonicalize().unwrap()),
        "{second:?}"
    );
    assert_eq!(made(&second, "compressor") + made(&second, "reader"), 0);
    assert!(!scratch.path("experiments/.gacc").exists() && !scratch.path("experiments/runs").exists());
    // `gacc runs` from inside finds both.
    let output = in_experiments(&scratch, &["runs", "list", "--json"]);
    let listed: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(listed.as_array().map(Vec::len), Some(2), "{listed}");

    // The other order: first from inside a study's folder, then from its parent.
    let scratch = Scratch::new();
    let output = in_experiments(&scratch, &["run", "fixture.toml", "-q"]);
    assert!(output.status.success());
    let (status, from_parent, stderr) = scratch.run("experiments/fixture.toml", &["-q"]);
    assert_eq!(status, 0, "{stderr}");
    assert!(
        from_parent.starts_with(scratch.path("experiments/runs/fixture")),
        "{from_parent:?}"
    );
    assert_eq!(
        read_json(&from_parent.join("run.json"))["calls"]["compressor"]["made"],
        0
    );
    assert!(!scratch.path(".gacc").exists());
}

#[test]
fn a_cell_that_scored_no_question_is_no_measurement_anywhere() {
    let scratch = Scratch::new();
    scratch.script("experiments/reader.sh", "#!/bin/sh\ncat > /dev/null\nexit 1\n");
    let manifest = std::fs::read_to_string(scratch.path("experiments/fixture.toml"))
        .unwrap()
        .replace(
            "[reader]\nbuiltin = \"field-lookup\"",
            "[reader]\ncommand = [\"./reader.sh\"]\nsandbox = false\nretries = 0",
        );
    scratch.write("experiments/failing.toml", &manifest);
    let (status, folder, stderr) = scratch.run("experiments/failing.toml", &[]);
    assert_eq!(status, 1, "{stderr}");
    let report = read_json(&folder.join("report.json"));
    let cell = &report["cells"][0];
    for key in ["micro", "macro", "micro_ci95", "macro_ci95"] {
        assert!(cell[key].is_null(), "{key}: {cell}");
    }
    assert!(
        cell["seeds"]
            .as_array()
            .unwrap()
            .iter()
            .all(|s| s["micro"].is_null()),
        "{cell}"
    );
    assert!(stderr.contains("Micro n/a  Macro n/a"), "{stderr}");
    let markdown = std::fs::read_to_string(folder.join("report.md")).unwrap();
    assert!(
        markdown.contains("| goal-line | own-goal | 0.15 | n/a | n/a | n/a | n/a | n/a | 0 / 0 |"),
        "{markdown}"
    );
    // The charts have no point for it: no polyline, where a measured cell draws one.
    let chart = std::fs::read_to_string(folder.join("micro.svg")).unwrap();
    assert!(!chart.contains("<polyline"), "{chart}");
    let (status, measured, _) = scratch.run("experiments/fixture.toml", &["-q"]);
    assert_eq!(status, 0);
    let chart = std::fs::read_to_string(measured.join("micro.svg")).unwrap();
    assert!(
        chart.contains("<polyline") || chart.contains("<circle"),
        "{chart}"
    );
    // `gacc runs show` and `gacc diff` say n/a too.
    let output = scratch
        .gacc()
        .args(["runs", "show", &folder.display().to_string()])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&output.stdout).contains("Micro n/a"),
        "{output:?}"
    );
    let output = scratch
        .gacc()
        .args([
            "diff",
            &folder.display().to_string(),
            &measured.display().to_string(),
        ])
        .output()
        .unwrap();
    let diff = String::from_utf8_lossy(&output.stdout);
    assert!(diff.contains("| n/a | 0.667 | n/a |"), "{diff}");
}

#[test]
fn an_edited_script_or_module_reruns_exactly_its_calls_unless_a_revision_is_pinned() {
    let scratch = Scratch::new();
    scratch.write(
        "experiments/callbacks/study.py",
        "import json, sys\nimport words\n\nrequest = json.load(sys.stdin)\nprint(json.dumps({\"memory\": words.keep(request[\"context\"], request[\"goal\"] or \"\")}))\n",
    );
    scratch.write(
        "experiments/callbacks/words.py",
        "def keep(context, goal):\n    wanted = set(goal.lower().split())\n    return \"\\n\".join(l for l in context.splitlines() if wanted & set(l.lower().replace(':', ' ').split()))\n",
    );
    let manifest = scratch.fixture_with(
        "study",
        "command = [\"python3\", \"callbacks/study.py\"]\nsandbox = false",
    );
    // Without the fixture's pinned revision.
    let text = std::fs::read_to_string(scratch.path(&manifest))
        .unwrap()
        .replacen("sandbox = false\nrevision = \"1\"\n", "sandbox = false\n", 1);
    assert!(!text.contains("sandbox = false\nrevision"), "{text}");
    scratch.write(&manifest, &text);
    let run = |scratch: &Scratch| {
        let (status, folder, stderr) = scratch.run(&manifest, &[]);
        assert_eq!(status, 0, "{stderr}");
        (made(&folder, "compressor"), made(&folder, "reader"), stderr)
    };
    let (first, _, _) = run(&scratch);
    assert_eq!(first, 12);
    assert_eq!(run(&scratch).0, 0);
    // An edit to the script: its calls run again (the memories are the same, so no reader
    // call), and the run says why.
    let script = std::fs::read_to_string(scratch.path("experiments/callbacks/study.py")).unwrap();
    scratch.write("experiments/callbacks/study.py", &format!("{script}# an edit\n"));
    let (compressor, reader, stderr) = run(&scratch);
    assert_eq!((compressor, reader), (12, 0), "{stderr}");
    assert!(
        stderr.contains("`compressors.goal-line`: callbacks/study.py changed since the last run"),
        "{stderr}"
    );
    // Undone: the cache answers again.
    scratch.write("experiments/callbacks/study.py", &script);
    assert_eq!(run(&scratch).0, 0);
    // An edit to the module it imports.
    let module = std::fs::read_to_string(scratch.path("experiments/callbacks/words.py")).unwrap();
    scratch.write("experiments/callbacks/words.py", &format!("{module}# an edit\n"));
    let (compressor, _, stderr) = run(&scratch);
    assert_eq!(compressor, 12, "{stderr}");
    assert!(stderr.contains("callbacks/words.py changed"), "{stderr}");
    // A pinned revision: the files are not part of the identity, and an edit re-runs nothing.
    let pinned = std::fs::read_to_string(scratch.path(&manifest))
        .unwrap()
        .replace("sandbox = false", "sandbox = false\nrevision = \"1\"");
    scratch.write(&manifest, &pinned);
    assert_eq!(run(&scratch).0, 12, "a new revision is a new identity");
    scratch.write(
        "experiments/callbacks/study.py",
        &format!("{script}# another edit\n"),
    );
    let (compressor, _, stderr) = run(&scratch);
    assert_eq!(compressor, 0, "{stderr}");
    // Its cached answers are kept, as asked, but the run names the script that changed.
    assert!(
        stderr.contains(
            "warning: `compressors.goal-line`: callbacks/study.py changed since the last run, but `revision = \"1\"` is pinned, so its cached answers are kept and may be stale"
        ),
        "{stderr}"
    );
    // Said once: the next run under the same files is quiet.
    let (compressor, _, stderr) = run(&scratch);
    assert_eq!(compressor, 0, "{stderr}");
    assert!(!stderr.contains("changed since the last run"), "{stderr}");
}

#[test]
fn a_persistent_or_pipelined_callbacks_traceback_and_setup_prints_are_kept() {
    for (mode, extra) in [("persistent", ""), ("pipelined", "max_inflight = 4\n")] {
        let scratch = Scratch::new();
        scratch.copy_helper();
        scratch.write(
            "experiments/callbacks/broken.py",
            "import sys\nfrom gacc_callback import compressor, serve, setup\n\n\n@setup\ndef load():\n    print(\"loading the broken model\")\n\n\n@compressor\ndef broken(context, goal, **_):\n    if goal and \"reactor\" in goal:\n        return None.upper()\n    return context\n\n\nif __name__ == \"__main__\":\n    sys.exit(serve())\n",
        );
        let manifest = scratch.fixture_with(
            "broken",
            &format!(
                "command = [\"python3\", \"callbacks/broken.py\"]\nmode = \"persistent\"\n{extra}retries = 0"
            ),
        );
        let (status, folder, stderr) = scratch.run(&manifest, &["-v"]);
        assert_eq!(status, 1, "{mode}: {stderr}");
        // The file and line of the raise, on the terminal, in report.md and in gacc trace.
        let line = "broken.py\", line 13, in broken";
        assert!(stderr.contains(line), "{mode}: {stderr}");
        let markdown = std::fs::read_to_string(folder.join("report.md")).unwrap();
        assert!(markdown.contains(line), "{mode}: {markdown}");
        let trace = std::fs::read_to_string(folder.join("trace.jsonl")).unwrap();
        assert!(
            trace.contains("line 13, in broken"),
            "{mode}: the traceback is in the trace"
        );
        assert!(
            trace.contains("loading the broken model"),
            "{mode}: the setup's print is in the trace"
        );
        let failed = read_json(&folder.join("report.json"))["failures"][0]["job"]
            .as_str()
            .unwrap()
            .to_owned();
        let told = scratch
            .gacc()
            .args(["trace", "latest", "--job", &failed])
            .output()
            .unwrap();
        let told = String::from_utf8_lossy(&told.stdout);
        assert!(told.contains("line 13"), "{mode}: {told}");
    }
}
