//! The hold-out enforced, not trusted: compressors and readers run in a Landlock sandbox that
//! denies them the experiment's files and gacc's own process, and secrets passed through `env`
//! never reach the run folder.

use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use common::{Programs, Scratch, landlock_available, python3_on_path, read_json, read_lines};
use serde_json::Value;

/// Skips a test (with a message) on a kernel without Landlock.
macro_rules! require_landlock {
    () => {
        if !landlock_available() {
            eprintln!("skipped: this kernel has no Landlock");
            return;
        }
    };
}

/// `probe NAME ALLOWED|denied` lines a callback wrote to stderr, from the trace.
fn probe_outcomes(folder: &Path) -> BTreeMap<String, Vec<String>> {
    let mut found: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for event in read_lines(&folder.join("trace.jsonl")) {
        let Some(stderr) = event["stderr"].as_str() else {
            continue;
        };
        for line in stderr.lines() {
            let mut words = line.split_whitespace();
            if let (Some("probe"), Some(name), Some(outcome)) = (words.next(), words.next(), words.next()) {
                found.entry(name.to_owned()).or_default().push(outcome.to_owned());
            }
        }
    }
    found
}

/// The fixture with the plant source moved to a file (`data/sources/plant.txt`) and the
/// compressor replaced by `script`; returns the manifest's path relative to the scratch folder.
fn hostile_experiment(scratch: &Scratch, script: &str, compressor_settings: &str) -> &'static str {
    let mut lines = Vec::new();
    for line in std::fs::read_to_string(scratch.path("experiments/data/fixture.jsonl"))
        .unwrap()
        .lines()
    {
        let mut record: Value = serde_json::from_str(line).unwrap();
        if record["id"] == "plant" {
            let text = record["text"].as_str().unwrap().to_owned();
            scratch.write("experiments/data/sources/plant.txt", &text);
            let object = record.as_object_mut().unwrap();
            object.remove("text");
            object.insert("path".into(), "sources/plant.txt".into());
        }
        lines.push(record.to_string());
    }
    scratch.write("experiments/data/hostile.jsonl", &(lines.join("\n") + "\n"));
    scratch.script("experiments/hostile.sh", script);
    let manifest = std::fs::read_to_string(scratch.path("experiments/fixture.toml"))
        .unwrap()
        .replace("data/fixture.jsonl", "data/hostile.jsonl")
        .replace(
            "builtin = \"goal-line\"",
            &format!("command = [\"./hostile.sh\"]\n{compressor_settings}"),
        );
    scratch.write("experiments/hostile.toml", &manifest);
    "experiments/hostile.toml"
}

/// A shell function that runs a command and reports whether it worked, on stderr.
const PROBE: &str = r#"probe() { if sh -c "$2" >/dev/null 2>&1; then echo "probe $1 ALLOWED" >&2; else echo "probe $1 denied" >&2; fi; }
"#;

#[test]
fn a_hostile_compressor_is_denied_everything_but_its_work() {
    require_landlock!();
    let scratch = Scratch::new();
    // A first run fills the cache and leaves a run folder to go after.
    let (status, first_run, stderr) = scratch.run("experiments/fixture.toml", &[]);
    assert_eq!(status, 0, "{stderr}");
    let segment = std::fs::read_dir(scratch.path(".gacc/cache/segments"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let escape = std::env::temp_dir().join(format!("gacc-escape-{}", std::process::id()));
    let experiments = scratch.path("experiments");
    let script = format!(
        "#!/bin/sh\nrequest=$(cat)\n{PROBE}{}\nprintf '%s' \"$request\" | exec @GACC@ callback goal-line\n",
        [
            "probe dataset 'cat data/hostile.jsonl'".to_owned(),
            format!(
                "probe dataset-absolute 'cat {}/data/hostile.jsonl'",
                experiments.display()
            ),
            "probe other-dataset 'cat data/fixture.jsonl'".into(),
            "probe source-file 'cat data/sources/plant.txt'".into(),
            "probe manifest 'cat hostile.toml'".into(),
            "probe experiment-folder 'ls .'".into(),
            format!("probe cache-segment 'cat {}'", segment.display()),
            format!(
                "probe cache-folder 'ls {}'",
                scratch.path(".gacc/cache").display()
            ),
            format!("probe run-folder 'ls {}'", scratch.path("runs").display()),
            format!(
                "probe run-report 'cat {}'",
                first_run.join("report.json").display()
            ),
            "probe gacc-cmdline \"cat /proc/$PPID/cmdline\"".into(),
            "probe gacc-environ \"cat /proc/$PPID/environ\"".into(),
            "probe gacc-memory \"cat /proc/$PPID/maps\"".into(),
            "probe gacc-fds \"ls /proc/$PPID/fd\"".into(),
            "probe gacc-signal \"kill -0 $PPID\"".into(),
            "probe write-experiment 'echo x > escaped.txt'".into(),
            format!("probe write-tmp 'echo x > {}'", escape.display()),
            format!(
                "probe write-cache 'echo x > {}/escaped'",
                scratch.path(".gacc/cache").display()
            ),
            "probe scratch 'echo x > \"$TMPDIR/note\" && cat \"$TMPDIR/note\"'".into(),
            "probe system 'cat /etc/passwd'".into(),
            "echo \"probe parent $PPID\" >&2".into(),
        ]
        .join("\n")
    );
    let manifest = hostile_experiment(&scratch, &script, "");
    let child = scratch
        .gacc_process()
        .args(["run", manifest, "-q"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let gacc_pid = child.id().to_string();
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    let folder = scratch.path(String::from_utf8_lossy(&output.stdout).trim());

    let probes = probe_outcomes(&folder);
    assert_eq!(
        probes.get("parent").map(|p| p[0].as_str()),
        Some(gacc_pid.as_str()),
        "$PPID is gacc"
    );
    assert_eq!(probes.len(), 21, "every probe reported: {probes:?}");
    assert!(
        probes.values().all(|o| o.len() == 12),
        "one of each per call: {probes:?}"
    );
    for (name, outcomes) in &probes {
        let expected = match name.as_str() {
            "parent" => continue,
            "scratch" | "system" => "ALLOWED",
            _ => "denied",
        };
        assert!(
            outcomes.iter().all(|o| o == expected),
            "{name}: expected {expected}, got {outcomes:?}"
        );
    }
    assert!(!scratch.path("experiments/escaped.txt").exists());
    assert!(!escape.exists());
    assert!(!scratch.path(".gacc/cache/escaped").exists());
    // Denied all that, it still did its work: the fixture's results.
    let report = read_json(&folder.join("report.json"));
    assert_eq!(report["complete"], true);
    assert_eq!(report["cells"][0]["micro"]["mean"].as_f64(), Some(2.0 / 3.0));
    assert_eq!(report["holdout"]["compressor"]["holdout_enforced"], true);
    assert_eq!(
        report["holdout"]["compressor"]["callbacks"]["compressors.goal-line"]["sandbox"],
        "landlock"
    );

    // The same script unsandboxed reads what it was denied: the probes can tell.
    let (status, folder, stderr) = scratch.run(
        manifest,
        &[
            "--set",
            "compressors.goal-line.sandbox=false",
            "--set",
            "run.cache=cache-off",
        ],
    );
    assert_eq!(status, 0, "{stderr}");
    let unsandboxed = probe_outcomes(&folder);
    for name in [
        "dataset",
        "source-file",
        "manifest",
        "cache-segment",
        "run-report",
        "gacc-cmdline",
        "write-experiment",
    ] {
        assert!(
            unsandboxed[name].iter().all(|o| o == "ALLOWED"),
            "{name} unsandboxed: {:?}",
            unsandboxed[name]
        );
    }
    let _ = std::fs::remove_file(&escape);
    let report = read_json(&folder.join("report.json"));
    assert_eq!(report["holdout"]["compressor"]["holdout_enforced"], false);
    assert_eq!(
        report["holdout"]["compressor"]["callbacks"]["compressors.goal-line"]["why"],
        "sandbox = false"
    );
    let markdown = std::fs::read_to_string(folder.join("report.md")).unwrap();
    assert!(
        markdown.contains(
            "**Hold-out NOT enforced:** compressors unsandboxed ✗ (compressors.goal-line: sandbox = false)"
        ),
        "{markdown}"
    );
}

/// Answers' `meta.probe` of one kind in a cache's segments (a persistent worker's stderr is
/// kept only when it fails).
fn cached_probes(cache: &Path, kind: &str) -> Vec<String> {
    let mut found = Vec::new();
    for segment in std::fs::read_dir(cache.join("segments")).unwrap().flatten() {
        for line in std::fs::read_to_string(segment.path()).unwrap().lines() {
            let fields: Vec<&str> = line.splitn(4, ' ').collect();
            if fields.len() == 4 && fields[1] == kind {
                let entry: Value = serde_json::from_str(fields[3]).unwrap();
                if let Some(probe) = entry.pointer("/response/meta/probe").and_then(Value::as_str) {
                    found.push(probe.to_owned());
                }
            }
        }
    }
    found
}

#[test]
fn a_hostile_persistent_reader_cannot_read_the_dataset() {
    require_landlock!();
    let scratch = Scratch::new();
    scratch.script(
        "experiments/reader.sh",
        r#"#!/bin/sh
while IFS= read -r request; do
  if cat data/fixture.jsonl >/dev/null 2>&1; then probe=ALLOWED; else probe=denied; fi
  printf '%s\n' "$request" | @GACC@ callback field-lookup | sed "s/^{/{\"meta\":{\"probe\":\"$probe\"},/"
done
"#,
    );
    let manifest = std::fs::read_to_string(scratch.path("experiments/fixture.toml"))
        .unwrap()
        .replace(
            "[reader]\nbuiltin = \"field-lookup\"",
            "[reader]\ncommand = [\"./reader.sh\"]\nmode = \"persistent\"",
        );
    scratch.write("experiments/reader.toml", &manifest);
    let (status, folder, stderr) = scratch.run("experiments/reader.toml", &[]);
    assert_eq!(status, 0, "{stderr}");
    let probes = cached_probes(&scratch.path(".gacc/cache"), "reader");
    assert_eq!(probes.len(), 36, "every read answered: {probes:?}");
    assert!(probes.iter().all(|p| p == "denied"), "{probes:?}");
    let report = read_json(&folder.join("report.json"));
    assert_eq!(report["cells"][0]["micro"]["mean"].as_f64(), Some(2.0 / 3.0));
    assert_eq!(report["holdout"]["reader"]["holdout_enforced"], true);

    // The same worker unsandboxed could read it.
    let (status, _, stderr) = scratch.run(
        "experiments/reader.toml",
        &["--set", "reader.sandbox=false", "--set", "run.cache=cache-off"],
    );
    assert_eq!(status, 0, "{stderr}");
    let probes = cached_probes(&scratch.path("experiments/cache-off"), "reader");
    assert!(
        !probes.is_empty() && probes.iter().all(|p| p == "ALLOWED"),
        "{probes:?}"
    );
}

/// A report with the hold-out record left out: what the sandbox must not change.
fn without_holdout(folder: &Path) -> Value {
    let mut report = read_json(&folder.join("report.json"));
    report.as_object_mut().unwrap().remove("holdout");
    report
}

/// Runs `manifest` with its built-ins as programs (`programs` writes it so), in the sandbox and
/// out of it.
fn same_results_with_the_sandbox_on_and_off(manifest: &str, programs: Programs) {
    // One seed: every built-in, condition and budget, at a third of the calls.
    let one_seed = ["--set", "seeds=[1]"];
    let on = Scratch::new();
    let (status, on_folder, stderr) = on.run(&programs(&on, manifest), &one_seed);
    assert_eq!(status, 0, "{stderr}");
    let off = Scratch::new();
    let (status, off_folder, stderr) =
        off.run_with_env(&programs(&off, manifest), &one_seed, &[("GACC_NO_LANDLOCK", "1")]);
    assert_eq!(status, 0, "{stderr}");
    assert!(stderr.contains("the hold-out is NOT enforced"), "{stderr}");

    let on_report = read_json(&on_folder.join("report.json"));
    let off_report = read_json(&off_folder.join("report.json"));
    for role in ["compressor", "reader"] {
        assert_eq!(on_report["holdout"][role]["holdout_enforced"], true);
        assert_eq!(off_report["holdout"][role]["holdout_enforced"], false);
    }
    // Everything else in report.json is the same, byte for byte once the record is left out
    // (the manifest hash included: turning the sandbox off this way leaves the manifest alone).
    assert_eq!(
        serde_json::to_string_pretty(&without_holdout(&on_folder)).unwrap(),
        serde_json::to_string_pretty(&without_holdout(&off_folder)).unwrap()
    );
    for file in [
        "results.jsonl.gz",
        "memories.jsonl.gz",
        "memory_texts.jsonl.gz",
        "plan.json.gz",
        "manifest.toml",
    ] {
        assert_eq!(
            common::read_bytes(&on_folder.join(file)),
            common::read_bytes(&off_folder.join(file)),
            "{file}"
        );
    }
}

#[test]
fn the_fixture_gives_the_same_report_with_the_sandbox_on_and_off() {
    require_landlock!();
    // A process per call: each is confined as it starts.
    same_results_with_the_sandbox_on_and_off("experiments/fixture.toml", Scratch::as_programs);
}

#[test]
fn the_baselines_give_the_same_report_with_the_sandbox_on_and_off() {
    require_landlock!();
    // Each program started once, confined for all the calls it serves.
    same_results_with_the_sandbox_on_and_off("experiments/baselines.toml", Scratch::as_persistent_programs);
}

/// Every file under `folder`, recursively.
fn files(folder: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(folder).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            found.extend(files(&path));
        } else {
            found.push(path);
        }
    }
    found
}

#[test]
fn a_secret_echoed_by_a_callback_appears_nowhere_in_the_run_folder() {
    let secret = format!("sk-test-{}-d41d8cd98f00b204e9800998ecf8427e", std::process::id());
    let scratch = Scratch::new();
    scratch.script(
        "experiments/compressor.sh",
        "#!/bin/sh\nrequest=$(cat)\necho \"calling the model with key $MODEL_API_KEY\" >&2\ncase \"$request\" in\n  *\"state of the turbine\"*) echo \"401 for key $MODEL_API_KEY\" >&2; printf '{\"error\": \"the key %s was refused\", \"retryable\": false}' \"$MODEL_API_KEY\"; exit 1 ;;\nesac\nprintf '%s' \"$request\" | exec @GACC@ callback goal-line\n",
    );
    let manifest = std::fs::read_to_string(scratch.path("experiments/fixture.toml"))
        .unwrap()
        .replace(
            "builtin = \"goal-line\"",
            "command = [\"./compressor.sh\"]\nenv = [\"MODEL_API_KEY\"]\nretries = 0",
        );
    scratch.write("experiments/secret.toml", &manifest);
    let (status, folder, stderr) =
        scratch.run_with_env("experiments/secret.toml", &["-vv"], &[("MODEL_API_KEY", &secret)]);
    assert_eq!(status, 1, "the turbine's memories fail: {stderr}");
    assert!(!stderr.contains(&secret), "{stderr}");
    let files = files(&folder);
    assert!(files.len() >= 8, "{files:?}");
    for file in &files {
        let bytes = common::read_bytes(file);
        assert!(
            !bytes.windows(secret.len()).any(|w| w == secret.as_bytes()),
            "{} holds the secret",
            file.display()
        );
    }
    // The echoes were there, and were redacted.
    let trace = std::fs::read_to_string(folder.join("trace.jsonl")).unwrap();
    assert!(
        trace.contains("calling the model with key [redacted:MODEL_API_KEY]"),
        "{trace}"
    );
    let report = read_json(&folder.join("report.json"));
    let failure = &report["failures"][0];
    assert_eq!(
        failure["reason"],
        "reported an error: the key [redacted:MODEL_API_KEY] was refused"
    );
    assert!(
        failure["stderr_tail"]
            .as_str()
            .unwrap()
            .contains("401 for key [redacted:MODEL_API_KEY]")
    );
}

#[test]
fn a_python_callback_with_standard_modules_reads_its_declared_folder() {
    require_landlock!();
    if !python3_on_path() {
        eprintln!("skipped: python3 is not on PATH");
        return;
    }
    let scratch = Scratch::new();
    scratch.write("experiments/models/keywords.txt", "reactor\nferry\n");
    scratch.write(
        "experiments/callbacks/keywords.py",
        r#"import collections, hashlib, json, pathlib, re, sys, tempfile

keywords = pathlib.Path("models/keywords.txt").read_text().split()
request = json.load(sys.stdin)
lines = [l for l in request["context"].splitlines() if set(re.findall(r"\w+", l)) & set(keywords)]
with tempfile.NamedTemporaryFile("w+") as note:  # in its scratch folder (TMPDIR)
    note.write("\n".join(lines))
    note.seek(0)
    memory = note.read()
counts = collections.Counter(memory.split())
print(f"kept {len(lines)} lines, {len(counts)} words", file=sys.stderr)
json.dump({"memory": memory, "meta": {"sha256": hashlib.sha256(memory.encode()).hexdigest()}}, sys.stdout)
"#,
    );
    let manifest = std::fs::read_to_string(scratch.path("experiments/fixture.toml"))
        .unwrap()
        .replace(
            "[compressors.goal-line]\nbuiltin = \"goal-line\"",
            "[compressors.keywords]\ncommand = [\"python3\", \"callbacks/keywords.py\"]\nsandbox = { read = [\"models/\"] }",
        );
    scratch.write("experiments/python.toml", &manifest);
    let (status, folder, stderr) = scratch.run("experiments/python.toml", &[]);
    assert_eq!(status, 0, "{stderr}");
    let report = read_json(&folder.join("report.json"));
    assert_eq!(report["complete"], true);
    assert_eq!(
        report["holdout"]["compressor"]["callbacks"]["compressors.keywords"]["sandbox"],
        "landlock"
    );
    let micro = report["cells"][0]["micro"]["mean"].as_f64().unwrap();
    assert!(micro > 0.0, "{micro}");
    assert!(probes_in_trace(&folder, "kept 1 lines"));

    // Without the declared folder the same script is denied its keywords.
    let (status, folder, stderr) = scratch.run(
        "experiments/python.toml",
        &[
            "--set",
            "compressors.keywords.sandbox.read=[]",
            "--set",
            "run.cache=cache-denied",
        ],
    );
    assert_eq!(status, 1, "{stderr}");
    // The terminal says the sandbox did it, names the file and the line that grants it.
    assert!(
        stderr.contains("sandbox: the sandbox denied `models/keywords.txt`")
            && stderr.contains(r#"add `sandbox = { read = ["models/"] }`"#),
        "{stderr}"
    );
    let report = read_json(&folder.join("report.json"));
    assert!(
        report["failures"][0]["stderr_tail"]
            .as_str()
            .unwrap()
            .contains("PermissionError"),
        "{}",
        report["failures"][0]
    );
}

fn probes_in_trace(folder: &Path, text: &str) -> bool {
    read_lines(&folder.join("trace.jsonl"))
        .iter()
        .any(|e| e["stderr"].as_str().is_some_and(|s| s.contains(text)))
}

#[test]
fn network_false_cuts_a_compressor_off_tcp() {
    require_landlock!();
    if !Path::new("/bin/bash").exists() {
        eprintln!("skipped: no /bin/bash for /dev/tcp");
        return;
    }
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let scratch = Scratch::new();
    let script = format!(
        "#!/bin/bash\nrequest=$(cat)\nif exec 3<>/dev/tcp/127.0.0.1/{port}; then echo 'probe tcp ALLOWED' >&2; exec 3>&-; else echo 'probe tcp denied' >&2; fi\nprintf '%s' \"$request\" | exec @GACC@ callback goal-line\n"
    );
    let manifest = hostile_experiment(&scratch, &script, "");
    let (status, folder, stderr) = scratch.run(manifest, &[]);
    assert_eq!(status, 0, "{stderr}");
    assert!(probe_outcomes(&folder)["tcp"].iter().all(|o| o == "ALLOWED"));

    let (status, folder, stderr) = scratch.run(
        manifest,
        &[
            "--set",
            "compressors.goal-line.sandbox={ network = false }",
            "--set",
            "run.cache=cache-offline",
        ],
    );
    assert_eq!(status, 0, "{stderr}");
    let tcp = &probe_outcomes(&folder)["tcp"];
    assert!(tcp.len() == 12 && tcp.iter().all(|o| o == "denied"), "{tcp:?}");
    let report = read_json(&folder.join("report.json"));
    assert_eq!(
        report["holdout"]["compressor"]["callbacks"]["compressors.goal-line"]["network"],
        false
    );
    drop(listener);
}

#[test]
fn without_landlock_gacc_says_so_once_and_require_sandbox_refuses() {
    let scratch = Scratch::new();
    let fixture = scratch.as_programs("experiments/fixture.toml");
    let (status, folder, stderr) = scratch.run_with_env(&fixture, &["-q"], &[("GACC_NO_LANDLOCK", "1")]);
    assert_eq!(status, 0, "{stderr}");
    assert_eq!(
        stderr.matches("the hold-out is NOT enforced").count(),
        1,
        "{stderr}"
    );
    let report = read_json(&folder.join("report.json"));
    assert_eq!(report["holdout"]["compressor"]["holdout_enforced"], false);
    assert_eq!(report["holdout"]["reader"]["holdout_enforced"], false);
    let markdown = std::fs::read_to_string(folder.join("report.md")).unwrap();
    assert!(
        markdown
            .lines()
            .nth(2)
            .unwrap()
            .starts_with("**Hold-out NOT enforced:**"),
        "{markdown}"
    );

    let (status, _, stderr) =
        scratch.run_with_env(&fixture, &["--require-sandbox"], &[("GACC_NO_LANDLOCK", "1")]);
    assert_eq!(status, 2, "{stderr}");
    assert!(
        stderr.contains("--require-sandbox: `compressors.goal-line` would run outside its sandbox"),
        "{stderr}"
    );
    // An explicit opt-out is refused too.
    if landlock_available() {
        let (status, _, stderr) =
            scratch.run(&fixture, &["--require-sandbox", "--set", "reader.sandbox=false"]);
        assert_eq!(status, 2, "{stderr}");
        assert!(
            stderr.contains("`reader` would run outside its sandbox: sandbox = false"),
            "{stderr}"
        );
        let (status, _, stderr) = scratch.run(&fixture, &["--require-sandbox"]);
        assert_eq!(status, 0, "{stderr}");
    }
}

#[test]
fn a_sandbox_setting_that_would_expose_the_experiment_is_refused() {
    let scratch = Scratch::new();
    std::fs::create_dir_all(scratch.path("experiments/models")).unwrap();
    // The built-in as a program: a sandbox is a process's.
    let fixture = scratch.as_programs("experiments/fixture.toml");
    let gacc = common::gacc_binary().display().to_string();
    let goal_line = format!("command = [\"{gacc}\", \"callback\", \"goal-line\"]");
    for (setting, message) in [
        (
            "sandbox = { read = [\"data\"] }",
            "`sandbox.read` path `data` would expose the dataset",
        ),
        (
            "sandbox = { write = [\".\"] }",
            "`sandbox.write` path `.` would expose the manifest",
        ),
        (
            "sandbox = { read = [\"missing/\"] }",
            "`sandbox.read` path `missing/` does not exist",
        ),
        ("sandbox = { reed = [\"models\"] }", "unknown field `reed`"),
    ] {
        let manifest = std::fs::read_to_string(scratch.path(&fixture))
            .unwrap()
            .replace(&goal_line, &format!("{goal_line}\n{setting}"));
        scratch.write("experiments/exposed.toml", &manifest);
        let output = scratch
            .gacc()
            .args(["validate", "experiments/exposed.toml"])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{setting}: {stderr}");
        assert!(stderr.contains(message), "{setting}: {stderr}");
    }
    // A folder that holds none of the experiment's files is fine.
    let manifest = std::fs::read_to_string(scratch.path(&fixture)).unwrap().replace(
        &goal_line,
        &format!("{goal_line}\nsandbox = {{ read = [\"models\"], network = false }}"),
    );
    scratch.write("experiments/fine.toml", &manifest);
    let (status, folder, stderr) = scratch.run("experiments/fine.toml", &[]);
    assert_eq!(status, 0, "{stderr}");
    let resolved = std::fs::read_to_string(folder.join("manifest.toml")).unwrap();
    assert!(resolved.contains("[compressors.goal-line.sandbox]"), "{resolved}");
}

#[test]
fn a_killed_runs_scratch_folders_are_swept_by_the_next_run() {
    require_landlock!();
    let scratch = Scratch::new();
    let tmp = scratch.path("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    scratch.script(
        "experiments/slow.sh",
        "#!/bin/sh\necho $$ > \"$TMPDIR/pid\"\nexec sleep 30\n",
    );
    let manifest = std::fs::read_to_string(scratch.path("experiments/fixture.toml"))
        .unwrap()
        .replace("builtin = \"goal-line\"", "command = [\"./slow.sh\"]");
    scratch.write("experiments/slow.toml", &manifest);
    let roots = || -> Vec<PathBuf> {
        std::fs::read_dir(&tmp)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.to_string_lossy().contains("/gacc-sandbox-"))
            .collect()
    };
    let pid_files = || -> Vec<PathBuf> {
        roots()
            .iter()
            .flat_map(|root| files(root))
            .filter(|f| f.ends_with("pid"))
            .collect()
    };
    let mut child = scratch
        .gacc_process()
        .args(["run", "experiments/slow.toml", "-q"])
        .env("TMPDIR", &tmp)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Wait for the calls to be in their scratch folders, then kill gacc before it can clean up.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while pid_files().len() < 4 {
        assert!(std::time::Instant::now() < deadline, "the calls did not start");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    // A SIGKILLed gacc cannot end its calls: end them here, by the pids they wrote.
    for file in pid_files() {
        if let Ok(pid) = std::fs::read_to_string(&file).unwrap().trim().parse::<i32>() {
            // SAFETY: kill(2) touches no memory.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
    assert_eq!(roots().len(), 1, "the killed run's scratch is left behind");

    let (status, _, stderr) = scratch.run_with_env(
        "experiments/fixture.toml",
        &[],
        &[("TMPDIR", tmp.to_str().unwrap())],
    );
    assert_eq!(status, 0, "{stderr}");
    assert!(roots().is_empty(), "swept: {:?}", roots());
}

#[test]
fn a_script_imports_the_modules_beside_it_but_not_the_experiments_files() {
    require_landlock!();
    if !python3_on_path() {
        eprintln!("skipped: python3 is not on PATH");
        return;
    }
    let scratch = Scratch::new();
    // In a folder of their own, as `gacc init` lays them out; the dataset is a folder up.
    scratch.write("experiments/callbacks/helpers.py", "def keep(context, goal):\n    return '\\n'.join(l for l in context.splitlines() if goal and goal.split()[-1] in l)\n");
    scratch.write(
        "experiments/callbacks/compress.py",
        "import json, sys\nimport helpers\nrequest = json.load(sys.stdin)\ntry:\n    open('data/fixture.jsonl').read()\n    print('the dataset was READABLE', file=sys.stderr)\nexcept PermissionError:\n    print('the dataset was denied', file=sys.stderr)\njson.dump({'memory': helpers.keep(request['context'], request['goal'])}, sys.stdout)\n",
    );
    let manifest = scratch.fixture_with("siblings", "command = [\"python3\", \"callbacks/compress.py\"]");
    let (status, folder, stderr) = scratch.run(&manifest, &[]);
    assert_eq!(status, 0, "{stderr}");
    let report = read_json(&folder.join("report.json"));
    assert_eq!(
        report["holdout"]["compressor"]["callbacks"]["compressors.goal-line"]["sandbox"],
        "landlock"
    );
    // The same memories as the built-in goal-line keeps, so the same Micro.
    assert_eq!(report["cells"][0]["micro"]["mean"].as_f64().unwrap(), 2.0 / 3.0);
    assert!(probes_in_trace(&folder, "the dataset was denied"));
    assert!(!probes_in_trace(&folder, "READABLE"));
}

#[test]
fn a_compressor_from_a_venv_beside_the_manifest_runs_sandboxed_with_no_read_line() {
    require_landlock!();
    let scratch = Scratch::new();
    let venv = std::process::Command::new("python3")
        .args(["-m", "venv", "--without-pip"])
        .arg(scratch.path("experiments/.venv"))
        .output();
    if !venv.is_ok_and(|o| o.status.success()) {
        eprintln!("skipped: python3 -m venv is not available");
        return;
    }
    scratch.copy_helper();
    let manifest = std::fs::read_to_string(scratch.path("experiments/python-example.toml"))
        .unwrap()
        .replace("command = [\"python3\",", "command = [\".venv/bin/python\",")
        .replace("sandbox = { read = [\"../python/\"] }", "");
    assert!(
        manifest.contains(".venv/bin/python") && !manifest.contains("read ="),
        "{manifest}"
    );
    sandboxed_like_unsandboxed(&scratch, "experiments/venv.toml", &manifest);
}

#[test]
fn a_shebang_script_runs_on_the_interpreter_its_first_line_finds() {
    require_landlock!();
    if !python3_on_path() {
        eprintln!("skipped: python3 is not on PATH");
        return;
    }
    let scratch = Scratch::new();
    scratch.copy_helper();
    // goal_sentences.py starts `#!/usr/bin/env python3`: run it as a program.
    let script = scratch.path("experiments/callbacks/goal_sentences.py");
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let manifest = std::fs::read_to_string(scratch.path("experiments/python-example.toml"))
        .unwrap()
        .replace(
            "command = [\"python3\", \"callbacks/goal_sentences.py\"]",
            "command = [\"callbacks/goal_sentences.py\"]",
        )
        .replace("sandbox = { read = [\"../python/\"] }", "");
    assert!(
        manifest.contains("command = [\"callbacks/goal_sentences.py\"]"),
        "{manifest}"
    );
    sandboxed_like_unsandboxed(&scratch, "experiments/shebang.toml", &manifest);
}

/// Runs `manifest` (a variant of python-example.toml) and checks that its compressor ran in
/// the sandbox and gave the cells of python-example's interpreter run unsandboxed.
fn sandboxed_like_unsandboxed(scratch: &Scratch, path: &str, manifest: &str) {
    scratch.write(path, manifest);
    let (status, folder, stderr) = scratch.run(path, &[]);
    assert_eq!(status, 0, "{stderr}");
    let report = read_json(&folder.join("report.json"));
    assert_eq!(
        report["holdout"]["compressor"]["callbacks"]["compressors.goal-sentences"]["sandbox"],
        "landlock"
    );
    let unsandboxed = [
        "--set",
        "compressors.goal-sentences.sandbox=false",
        "--set",
        "run.cache=\"cache-plain\"",
    ];
    let (status, plain, stderr) = scratch.run("experiments/python-example.toml", &unsandboxed);
    assert_eq!(status, 0, "{stderr}");
    assert_eq!(report["cells"], read_json(&plain.join("report.json"))["cells"]);
}

#[test]
fn python_m_of_a_package_installed_in_development_mode_runs_sandboxed() {
    require_landlock!();
    let scratch = Scratch::new();
    let venv = scratch.path("experiments/.venv");
    let made = std::process::Command::new("python3")
        .args(["-m", "venv", "--without-pip"])
        .arg(&venv)
        .output();
    if !made.is_ok_and(|o| o.status.success()) {
        eprintln!("skipped: python3 -m venv is not available");
        return;
    }
    // The package's source lives outside the venv and the experiment, found through a .pth
    // file in site-packages, as `pip install -e` leaves it.
    scratch.write(
        "src/keywords_pkg/__main__.py",
        "import json, sys\nrequest = json.load(sys.stdin)\nkeyword = request['goal'].split()[-1].lower()\njson.dump({'memory': '\\n'.join(l for l in request['context'].splitlines() if keyword in l.lower())}, sys.stdout)\n",
    );
    scratch.write("src/keywords_pkg/__init__.py", "");
    let lib = venv.join("lib");
    let python = std::fs::read_dir(&lib)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .file_name();
    let site = lib.join(python).join("site-packages");
    std::fs::write(
        site.join("keywords_pkg.pth"),
        format!("{}\n", scratch.path("src").display()),
    )
    .unwrap();
    let manifest = scratch.fixture_with(
        "editable",
        "command = [\".venv/bin/python\", \"-m\", \"keywords_pkg\"]",
    );
    let (status, folder, stderr) = scratch.run(&manifest, &[]);
    assert_eq!(status, 0, "{stderr}");
    let report = read_json(&folder.join("report.json"));
    assert_eq!(
        report["holdout"]["compressor"]["callbacks"]["compressors.goal-line"]["sandbox"],
        "landlock"
    );
    // The memories the built-in goal-line keeps: Micro 2/3.
    assert_eq!(report["cells"][0]["micro"]["mean"].as_f64().unwrap(), 2.0 / 3.0);
}

/// A Python installation outside the system folders, as pyenv, uv, conda, Homebrew or asdf
/// keep one: Debian's interpreter and standard library copied to `opt/python` in the scratch
/// folder. None when this machine's Python is not Debian's (the tests skip, saying so).
fn portable_python(scratch: &Scratch) -> Option<PathBuf> {
    let interpreter = std::fs::canonicalize("/usr/bin/python3").ok()?;
    let name = interpreter.file_name()?.to_str()?.to_owned();
    let stdlib = Path::new("/usr/lib").join(&name);
    if !stdlib.join("os.py").is_file() {
        return None;
    }
    let home = scratch.path("opt/python");
    std::fs::create_dir_all(home.join("bin")).unwrap();
    std::fs::copy(&interpreter, home.join("bin").join(&name)).unwrap();
    std::os::unix::fs::symlink(&name, home.join("bin/python3")).unwrap();
    copy_tree(&stdlib, &home.join("lib").join(&name));
    // It must run from there, on its own standard library, or the test means nothing.
    let prefix = std::process::Command::new(home.join("bin/python3"))
        .args([
            "-I",
            "-c",
            "import sys, os; print(sys.prefix); print(os.__file__)",
        ])
        .output()
        .ok()?;
    let printed = String::from_utf8_lossy(&prefix.stdout).into_owned();
    let home_text = home.display().to_string();
    (prefix.status.success() && printed.lines().all(|l| l.starts_with(&home_text))).then_some(home)
}

/// Copies a standard library, without its installed packages and byte-code caches.
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap().flatten() {
        let name = entry.file_name();
        if ["site-packages", "dist-packages", "__pycache__", "test"].contains(&name.to_str().unwrap_or("")) {
            continue;
        }
        let kind = entry.file_type().unwrap();
        if kind.is_dir() {
            copy_tree(&entry.path(), &to.join(&name));
        } else if kind.is_file() {
            std::fs::copy(entry.path(), to.join(&name)).unwrap();
        }
    }
}

/// Writes a virtual environment the way `python -m venv` (`tool = None`) or uv
/// (`tool = Some("uv = 0.5.11")`) lays one out: `bin/python` a symlink to the base
/// interpreter, `pyvenv.cfg` naming its `home`, an empty site-packages.
fn virtual_environment(at: &Path, base: &Path, tool: Option<&str>) {
    let bin = at.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let version = std::fs::read_dir(base.join("lib"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .file_name();
    std::fs::create_dir_all(at.join("lib").join(&version).join("site-packages")).unwrap();
    std::os::unix::fs::symlink(base.join("bin/python3"), bin.join("python")).unwrap();
    std::os::unix::fs::symlink("python", bin.join("python3")).unwrap();
    let config = match tool {
        None => format!(
            "home = {}\ninclude-system-site-packages = false\nversion = 3\n",
            base.join("bin").display()
        ),
        Some(tool) => format!(
            "home = {}\nimplementation = CPython\n{tool}\nversion_info = 3\ninclude-system-site-packages = false\n",
            base.join("bin").display()
        ),
    };
    std::fs::write(at.join("pyvenv.cfg"), config).unwrap();
}

/// python-example.toml with its compressor run by `interpreter` and no `read` line.
fn python_example_on(scratch: &Scratch, interpreter: &str) -> String {
    scratch.copy_helper();
    let manifest = std::fs::read_to_string(scratch.path("experiments/python-example.toml"))
        .unwrap()
        .replace(
            "command = [\"python3\",",
            &format!("command = [\"{interpreter}\","),
        )
        .replace("sandbox = { read = [\"../python/\"] }", "");
    assert!(
        manifest.contains(interpreter) && !manifest.contains("read ="),
        "{manifest}"
    );
    manifest
}

#[test]
fn pythons_installed_outside_the_system_folders_run_sandboxed_with_no_read_line() {
    require_landlock!();
    let scratch = Scratch::new();
    let Some(home) = portable_python(&scratch) else {
        eprintln!("skipped: needs Debian's /usr/bin/python3 to copy");
        return;
    };
    // A conda environment, a pyenv version, a uv-managed or Homebrew Python: the interpreter
    // of an installation of its own, run directly.
    let interpreter = home.join("bin/python3").display().to_string();
    let manifest = python_example_on(&scratch, &interpreter);
    sandboxed_like_unsandboxed(&scratch, "experiments/installation.toml", &manifest);

    // A venv and a uv venv on it, beside the manifest and elsewhere.
    for (venv, tool) in [
        ("experiments/.venv", None),
        ("envs/uv-venv", Some("uv = 0.5.11")),
        ("envs/virtualenv", Some("virtualenv = 20.28.0")),
    ] {
        virtual_environment(&scratch.path(venv), &home, tool);
        let interpreter = scratch.path(venv).join("bin/python").display().to_string();
        let manifest = python_example_on(&scratch, &interpreter);
        sandboxed_like_unsandboxed(&scratch, "experiments/in-venv.toml", &manifest);
    }
}

#[test]
fn only_secrets_are_taken_out_and_a_row_they_were_taken_from_is_marked() {
    let key = format!("sk-live-{}-0123456789abcdef", std::process::id());
    let scratch = Scratch::new();
    // The compressor writes both of its variables into its memory; the reader writes down
    // every request it receives (outside the sandbox, in a file of the test's).
    scratch.script(
        "experiments/compressor.sh",
        "#!/bin/sh\ncat > /dev/null\nprintf '{\"memory\": \"reactor: status=green mode=%s key=%s\"}' \"$DATA_MODE\" \"$MY_API_KEY\"\n",
    );
    let received = scratch.path("received.jsonl");
    scratch.script(
        "experiments/reader.sh",
        &format!(
            "#!/bin/sh\nrequest=$(cat)\nprintf '%s\\n' \"$request\" >> '{}'\nprintf '%s' \"$request\" | exec @GACC@ callback field-lookup\n",
            received.display()
        ),
    );
    let manifest = std::fs::read_to_string(scratch.path("experiments/fixture.toml"))
        .unwrap()
        .replace(
            "builtin = \"goal-line\"",
            "command = [\"./compressor.sh\"]\nenv = [\"DATA_MODE\", \"MY_API_KEY\"]",
        )
        .replace(
            "[reader]\nbuiltin = \"field-lookup\"",
            "[reader]\ncommand = [\"./reader.sh\"]\nsandbox = false",
        );
    scratch.write("experiments/secrets.toml", &manifest);
    let (status, folder, stderr) = scratch.run_with_env(
        "experiments/secrets.toml",
        &["-q", "--set", "ratios=[1.0]"],
        &[
            ("DATA_MODE", "/data/sets/alphabetical-mode"),
            ("MY_API_KEY", &key),
        ],
    );
    assert_eq!(status, 0, "{stderr}");
    let requests = std::fs::read_to_string(&received).unwrap();
    assert!(
        requests.contains("mode=/data/sets/alphabetical-mode key=[redacted:MY_API_KEY]"),
        "the reader receives the data verbatim and never the key:\n{requests}"
    );
    assert!(!requests.contains(&key));
    for file in files(&scratch.path("experiments"))
        .iter()
        .chain(&files(&scratch.path(".gacc")))
    {
        let bytes = common::read_bytes(file);
        assert!(
            !bytes.windows(key.len()).any(|w| w == key.as_bytes()),
            "{} holds the key",
            file.display()
        );
    }
    // Every memory had the key taken out, and says so.
    let memories = common::read_lines(&folder.join("memories.jsonl.gz"));
    assert!(!memories.is_empty());
    assert!(memories.iter().all(|row| row["redacted"] == true), "{memories:?}");
    let report = read_json(&folder.join("report.json"));
    assert_eq!(report["integrity"]["redacted_memories"], memories.len());
    let markdown = std::fs::read_to_string(folder.join("report.md")).unwrap();
    assert!(
        markdown.contains(&format!(
            "| memories with a secret taken out (marked `redacted`) | {} |",
            memories.len()
        )),
        "{markdown}"
    );
}
