//! Callbacks at the limits of the protocol (SPEC §3): flaky ones that ask for a retry, persistent
//! workers that die mid-stream, responses over the size limit or not UTF-8, grandchildren that
//! hold stdout open, callbacks that answer before reading or close stdout and linger, and two
//! gacc processes sharing one cache. Every manifest sets a short `timeout`, so a hang shows as a
//! timed-out call rather than a stuck test.

use crate::common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{Scratch, made, read_json, read_lines};
use serde_json::Value;

const READER: &str = "[reader]\nbuiltin = \"field-lookup\"";

/// Writes `experiments/NAME.toml`: the fixture with its reader replaced by `command` and
/// `settings` (e.g. `timeout = "2s"`), and its seeds replaced by `seeds`.
fn fixture_with_reader(scratch: &Scratch, name: &str, command: &str, settings: &str, seeds: &str) -> String {
    let manifest = std::fs::read_to_string(scratch.path("experiments/fixture.toml"))
        .unwrap()
        .replace(
            READER,
            &format!("[reader]\ncommand = [\"{command}\"]\nsandbox = false\n{settings}"),
        )
        .replace("seeds = [42, 43, 44]", &format!("seeds = {seeds}"));
    assert!(manifest.contains(command), "the fixture's reader section moved");
    let path = format!("experiments/{name}.toml");
    scratch.write(&path, &manifest);
    path
}

/// The failures of a finished run, from `report.json`.
fn failures(folder: &Path) -> Vec<Value> {
    read_json(&folder.join("report.json"))["failures"]
        .as_array()
        .unwrap()
        .clone()
}

/// Asserts the fixture's reference numbers: Micro 2/3 and Macro 0 on every seed, nothing failed.
fn assert_reference_numbers(folder: &Path, seeds: usize) {
    let report = read_json(&folder.join("report.json"));
    assert_eq!(report["complete"], true, "{report:#}");
    assert_eq!(report["failures"].as_array().map(Vec::len), Some(0));
    let cell = &report["cells"][0];
    let per_seed = cell["seeds"].as_array().unwrap();
    assert_eq!(per_seed.len(), seeds);
    for seed in per_seed {
        assert_eq!(seed["micro"].as_f64(), Some(2.0 / 3.0), "{seed}");
        assert_eq!(seed["macro"].as_f64(), Some(0.0), "{seed}");
        assert_eq!(
            (seed["correct"].as_u64(), seed["questions"].as_u64()),
            (Some(8), Some(12))
        );
        assert_eq!(seed["unscored_questions"], 0);
    }
    assert_eq!(cell["micro"]["mean"].as_f64(), Some(2.0 / 3.0));
}

/// True while a process exists and is not a zombie.
fn alive(pid: &str) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", pid.trim())).unwrap_or_default();
    !stat.is_empty() && !stat.contains(") Z ")
}

/// Waits briefly for every pid listed in a file to be gone; returns those still alive.
fn survivors(pids_file: &Path) -> Vec<String> {
    let pids = std::fs::read_to_string(pids_file).unwrap_or_default();
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let left: Vec<String> = pids.lines().filter(|p| alive(p)).map(str::to_owned).collect();
        if left.is_empty() || Instant::now() > deadline {
            return left;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A reader that exits 75 (retry me) on its first two attempts at each request, told apart by
/// a checksum of the request, then answers as the built-in reader does.
const FLAKY_READER: &str = r#"#!/bin/sh
request=$(cat)
mkdir -p attempts
key=$(printf '%s' "$request" | cksum | cut -d' ' -f1)
n=$(cat "attempts/$key" 2>/dev/null || echo 0)
n=$((n + 1))
echo "$n" > "attempts/$key"
if [ "$n" -le 2 ]; then
  echo "model server busy (attempt $n)" >&2
  exit 75
fi
printf '%s' "$request" | exec @GACC@ callback field-lookup
"#;

#[test]
fn a_flaky_callback_succeeds_within_its_retries() {
    let scratch = Scratch::new();
    scratch.script("experiments/flaky.sh", FLAKY_READER);
    let manifest = fixture_with_reader(
        &scratch,
        "flaky",
        "./flaky.sh",
        "timeout = \"2s\"\nretries = 2",
        "[42, 43, 44]",
    );
    let (status, folder, stderr) = scratch.run(&manifest, &[]);
    assert_eq!(status, 0, "{stderr}");
    assert_reference_numbers(&folder, 3);
    assert_eq!(made(&folder, "reader"), 36);
    // Each of the 36 distinct requests was attempted exactly three times.
    let attempts = std::fs::read_dir(scratch.path("experiments/attempts")).unwrap();
    let counts: Vec<String> = attempts
        .map(|e| {
            std::fs::read_to_string(e.unwrap().path())
                .unwrap()
                .trim()
                .to_owned()
        })
        .collect();
    assert_eq!(counts.len(), 36);
    assert!(counts.iter().all(|c| c == "3"), "{counts:?}");
}

#[test]
fn a_flaky_callback_fails_when_its_retries_run_out() {
    let scratch = Scratch::new();
    scratch.script("experiments/flaky.sh", FLAKY_READER);
    let manifest = fixture_with_reader(
        &scratch,
        "flaky",
        "./flaky.sh",
        "timeout = \"2s\"\nretries = 1",
        "[42, 43, 44]",
    );
    let (status, folder, stderr) = scratch.run(&manifest, &[]);
    assert_eq!(status, 1, "{stderr}");
    assert!(stderr.contains("exited with status 75"), "{stderr}");
    let failures = failures(&folder);
    assert_eq!(failures.len(), 36, "every read failed twice");
    for failure in &failures {
        assert_eq!(failure["callback"], "reader");
        assert_eq!(failure["stage"], "read");
        assert!(
            failure["reason"]
                .as_str()
                .unwrap()
                .contains("exited with status 75"),
            "{failure}"
        );
        assert_eq!(failure["attempts"], 2, "{failure}");
        assert!(
            failure["stderr_tail"]
                .as_str()
                .unwrap()
                .contains("model server busy (attempt 2)"),
            "{failure}"
        );
    }
    let report = read_json(&folder.join("report.json"));
    assert_eq!(report["complete"], false);
    for seed in report["cells"][0]["seeds"].as_array().unwrap() {
        assert_eq!(seed["unscored_questions"], 12, "a failure is not a wrong answer");
    }
    assert_eq!(made(&folder, "judge"), 0);
}

/// A persistent reader: serves one request per line through the built-in reader and logs each
/// start; a worker kills itself after its third answer. `ONCE` is replaced by 1 (only the first
/// worker to get there crashes) or 0 (every worker does).
const CRASHING_WORKER: &str = r#"#!/bin/sh
echo $$ >> worker-starts.log
while IFS= read -r line; do
  printf '%s\n' "$line" | @GACC@ callback field-lookup
  n=$(cat "served.$$" 2>/dev/null || echo 0)
  n=$((n + 1))
  echo "$n" > "served.$$"
  if [ "$n" -ge 3 ] && { [ ONCE = 0 ] || mkdir crashed 2>/dev/null; }; then
    kill -9 $$
  fi
done
"#;

#[test]
fn a_persistent_worker_that_crashes_mid_stream_is_restarted() {
    let scratch = Scratch::new();
    scratch.script("experiments/worker.sh", &CRASHING_WORKER.replace("ONCE", "1"));
    // One worker at a time, so every start after the first is a restart.
    let manifest = fixture_with_reader(
        &scratch,
        "worker",
        "./worker.sh",
        "mode = \"persistent\"\ntimeout = \"2s\"\nconcurrency = 1",
        "[42, 43, 44]",
    );
    let (status, folder, stderr) = scratch.run(&manifest, &[]);
    assert_eq!(status, 0, "{stderr}");
    assert_reference_numbers(&folder, 3);
    assert_eq!(made(&folder, "reader"), 36);
    assert!(
        scratch.path("experiments/crashed").is_dir(),
        "the worker never crashed"
    );
    assert_eq!(
        scratch.count_lines("experiments/worker-starts.log"),
        2,
        "the crashed worker was replaced by exactly one new worker"
    );
}

#[test]
fn persistent_workers_that_each_crash_after_three_answers_still_finish_the_run() {
    let scratch = Scratch::new();
    scratch.script("experiments/worker.sh", &CRASHING_WORKER.replace("ONCE", "0"));
    let manifest = fixture_with_reader(
        &scratch,
        "worker",
        "./worker.sh",
        "mode = \"persistent\"\ntimeout = \"2s\"",
        "[42, 43, 44]",
    );
    // The failure depends on timing (about two runs in three fail), so try a few fresh caches.
    for round in 1..=4 {
        let _ = std::fs::remove_dir_all(scratch.path(".gacc"));
        let before = scratch.count_lines("experiments/worker-starts.log");
        let (status, folder, stderr) = scratch.run(&manifest, &[]);
        assert_eq!(status, 0, "round {round}: {stderr}");
        assert_reference_numbers(&folder, 3);
        assert_eq!(made(&folder, "reader"), 36);
        let starts = scratch.count_lines("experiments/worker-starts.log") - before;
        assert!(
            starts >= 12,
            "36 requests, 3 per worker, yet only {starts} starts"
        );
    }
}

#[test]
fn a_response_over_64_mib_fails_its_job_and_the_others_finish() {
    let scratch = Scratch::new();
    // About 70 MiB of answer for the reactor's status, the built-in reader for the rest.
    scratch.script(
        "experiments/huge.sh",
        r#"#!/bin/sh
request=$(cat)
case "$request" in
  *"status of the reactor"*)
    printf '{"answer": "'
    head -c 73400320 /dev/zero | tr '\0' 'a'
    printf '"}\n'
    exit 0 ;;
esac
printf '%s' "$request" | exec @GACC@ callback field-lookup
"#,
    );
    let manifest = fixture_with_reader(
        &scratch,
        "huge",
        "./huge.sh",
        // Long enough that a loaded machine still writes 64 MiB before it: the flood, not the
        // clock, must end this call (the process group is killed at the limit).
        "timeout = \"10s\"\nretries = 0",
        "[42]",
    );
    let started = Instant::now();
    let (status, folder, stderr) = scratch.run(&manifest, &[]);
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(status, 1, "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    let failures = failures(&folder);
    assert_eq!(failures.len(), 1, "{failures:?}");
    let reason = failures[0]["reason"].as_str().unwrap();
    assert!(
        reason.contains("more than") && reason.contains("bytes"),
        "{reason}"
    );
    assert!(!reason.contains("timed out"), "{reason}");
    assert_eq!(failures[0]["question_id"], "plant-reactor-status");
    assert!(stderr.contains("more than"), "{stderr}");
    let seed = &read_json(&folder.join("report.json"))["cells"][0]["seeds"][0];
    assert_eq!(
        (
            seed["correct"].as_u64(),
            seed["questions"].as_u64(),
            seed["unscored_questions"].as_u64()
        ),
        (Some(8), Some(11), Some(1)),
        "every other question was read and judged"
    );
}

#[test]
fn a_response_that_is_not_utf8_fails_its_job() {
    let scratch = Scratch::new();
    scratch.script(
        "experiments/bytes.sh",
        r#"#!/bin/sh
request=$(cat)
case "$request" in
  *"status of the reactor"*) printf '{"answer": "\377\376"}\n'; exit 0 ;;
esac
printf '%s' "$request" | exec @GACC@ callback field-lookup
"#,
    );
    let manifest = fixture_with_reader(
        &scratch,
        "bytes",
        "./bytes.sh",
        "timeout = \"2s\"\nretries = 0",
        "[42, 43, 44]",
    );
    let (status, folder, stderr) = scratch.run(&manifest, &[]);
    assert_eq!(status, 1, "{stderr}");
    assert!(stderr.contains("not valid UTF-8"), "{stderr}");
    let failures = failures(&folder);
    assert_eq!(failures.len(), 3, "one per seed");
    for failure in &failures {
        assert!(
            failure["reason"].as_str().unwrap().contains("not valid UTF-8"),
            "{failure}"
        );
        assert_eq!(failure["question_id"], "plant-reactor-status");
        assert_eq!(failure["attempts"], 1);
    }
    let results = read_lines(&folder.join("results.jsonl.gz"));
    assert_eq!(results.iter().filter(|r| r["failure"].is_string()).count(), 3);
}

#[test]
fn a_grandchild_holding_stdout_open_does_not_hold_up_the_call() {
    let scratch = Scratch::new();
    // The background sleep inherits the script's stdout, so the pipe stays open for 30 s.
    scratch.script(
        "experiments/grandchild.sh",
        r#"#!/bin/sh
request=$(cat)
sleep 30 &
echo $! >> sleepers.pid
printf '%s' "$request" | @GACC@ callback field-lookup
exit 0
"#,
    );
    let manifest = fixture_with_reader(
        &scratch,
        "grandchild",
        "./grandchild.sh",
        "timeout = \"2s\"\nretries = 0",
        "[42]",
    );
    let started = Instant::now();
    let (status, folder, stderr) = scratch.run(&manifest, &[]);
    let elapsed = started.elapsed();
    assert_eq!(status, 0, "{stderr}");
    assert!(
        elapsed < Duration::from_secs(20),
        "the run waited for the grandchild: {elapsed:?}"
    );
    assert_reference_numbers(&folder, 1);
    assert_eq!(scratch.count_lines("experiments/sleepers.pid"), 12);
    let left = survivors(&scratch.path("experiments/sleepers.pid"));
    assert!(left.is_empty(), "grandchildren outlived their calls: {left:?}");
}

#[test]
fn a_grandchild_that_leaves_the_process_group_does_not_discard_the_answer() {
    let scratch = Scratch::new();
    // `setsid` takes the sleeper out of the call's process group, so killing the group does not
    // close the pipe; the script itself answers in full and exits 0.
    scratch.script(
        "experiments/escape.sh",
        r#"#!/bin/sh
request=$(cat)
case "$request" in
  *"status of the reactor"*) setsid sleep 10 & echo $! >> escaped.pid; sleep 0.3 ;;
esac
printf '%s' "$request" | exec @GACC@ callback field-lookup
"#,
    );
    let manifest = fixture_with_reader(
        &scratch,
        "escape",
        "./escape.sh",
        "timeout = \"5s\"\nretries = 0",
        "[42]",
    );
    let (status, folder, stderr) = scratch.run(&manifest, &[]);
    for pid in std::fs::read_to_string(scratch.path("experiments/escaped.pid"))
        .unwrap_or_default()
        .lines()
    {
        // SAFETY: signals the sleeper this test's own script started.
        unsafe { libc::kill(pid.trim().parse().unwrap(), libc::SIGKILL) };
    }
    assert_eq!(status, 0, "{stderr}");
    assert_reference_numbers(&folder, 1);
}

#[test]
fn a_callback_that_answers_before_reading_and_never_reads_does_not_deadlock() {
    let scratch = Scratch::empty();
    // One source far larger than a pipe's buffer, so the request cannot fit in the pipe.
    let mut text = String::from("reactor: status=green\n");
    for line in 0..12_000 {
        text.push_str(&format!("Log line {line}: the night was calm at the gate.\n"));
    }
    assert!(text.len() > 512 << 10);
    let source = serde_json::json!({"id": "plant", "text": text, "goals": [{
        "id": "plant-reactor", "text": "Understand the condition of the reactor", "questions": [
            {"id": "plant-reactor-status", "question": "What is the status of the reactor?",
             "reference": "green"}]}]});
    scratch.write("big/data.jsonl", &format!("{source}\n"));
    // Answers at once, never reads its request, and lingers a little before exiting.
    scratch.script(
        "big/compressor.sh",
        "#!/bin/sh\nprintf '{\"memory\": \"reactor: status=green\"}\\n'\nsleep 0.3\nexit 0\n",
    );
    scratch.write(
        "big/big.toml",
        r#"name = "big"
seeds = [1, 2]
ratios = [0.5]

[dataset]
path = "data.jsonl"

[compressors.eager]
command = ["./compressor.sh"]
revision = "1"
timeout = "2s"
retries = 0

[reader]
builtin = "field-lookup"
timeout = "2s"

[judge]
builtin = "exact"
timeout = "2s"
"#,
    );
    let started = Instant::now();
    let (status, folder, stderr) = scratch.run("big/big.toml", &[]);
    assert_eq!(status, 0, "{stderr}");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
    let report = read_json(&folder.join("report.json"));
    assert_eq!(report["complete"], true);
    assert_eq!(report["failures"].as_array().map(Vec::len), Some(0));
    assert_eq!(report["cells"][0]["micro"]["mean"].as_f64(), Some(1.0));
    assert_eq!(made(&folder, "compressor"), 2);
}

#[test]
fn a_callback_that_closes_stdout_and_lingers_is_timed_out_and_killed() {
    let scratch = Scratch::new();
    // For the reactor's status: a valid answer, then stdout closed and 30 s of sleep.
    scratch.script(
        "experiments/linger.sh",
        r#"#!/bin/sh
request=$(cat)
case "$request" in
  *"status of the reactor"*)
    printf '%s' "$request" | @GACC@ callback field-lookup
    exec 1>&-
    echo $$ >> lingering.pid
    exec sleep 30 ;;
esac
printf '%s' "$request" | exec @GACC@ callback field-lookup
"#,
    );
    let manifest = fixture_with_reader(
        &scratch,
        "linger",
        "./linger.sh",
        "timeout = \"1s\"\nretries = 0",
        "[42, 43, 44]",
    );
    let started = Instant::now();
    let (status, folder, stderr) = scratch.run(&manifest, &[]);
    let elapsed = started.elapsed();
    assert_eq!(status, 1, "{stderr}");
    assert!(elapsed < Duration::from_secs(20), "{elapsed:?}");
    assert!(stderr.contains("timed out after 1s"), "{stderr}");
    let failures = failures(&folder);
    assert_eq!(failures.len(), 3, "one per seed: {failures:?}");
    for failure in &failures {
        assert_eq!(failure["question_id"], "plant-reactor-status");
        assert!(
            failure["reason"].as_str().unwrap().contains("timed out after 1s"),
            "{failure}"
        );
        assert_eq!(failure["attempts"], 1);
    }
    assert_eq!(scratch.count_lines("experiments/lingering.pid"), 3);
    let left = survivors(&scratch.path("experiments/lingering.pid"));
    assert!(left.is_empty(), "timed-out calls outlived the run: {left:?}");
}

#[test]
fn two_runs_sharing_one_cache_at_once_agree_and_leave_it_whole() {
    let scratch = Scratch::new();
    let spawn = || {
        let mut command = Command::new(common::gacc_binary());
        command
            .args(["run", "experiments/fixture.toml"])
            .current_dir(scratch.dir.path())
            .env_remove("RUST_LOG")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (name, _) in std::env::vars().filter(|(name, _)| name.starts_with("GACC_")) {
            command.env_remove(name);
        }
        command.spawn().unwrap()
    };
    let (first, second) = (spawn(), spawn());
    let mut folders = Vec::new();
    for child in [first, second] {
        let output = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(0), "{stderr}");
        let stdout = String::from_utf8(output.stdout).unwrap();
        folders.push(scratch.path(stdout.lines().last().unwrap().trim()));
    }
    assert_ne!(folders[0], folders[1], "each run has its own folder");
    let reports: Vec<Vec<u8>> = folders
        .iter()
        .map(|f| std::fs::read(f.join("report.json")).unwrap())
        .collect();
    assert_eq!(reports[0], reports[1], "both runs wrote the same report.json");
    assert_reference_numbers(&folders[0], 3);

    // The shared cache answers everything: a third run calls nothing and agrees.
    let (status, third, stderr) = scratch.run("experiments/fixture.toml", &[]);
    assert_eq!(status, 0, "{stderr}");
    for role in ["compressor", "reader", "judge"] {
        assert_eq!(made(&third, role), 0, "{role} calls made by the third run");
    }
    assert_eq!(std::fs::read(third.join("report.json")).unwrap(), reports[0]);
}
