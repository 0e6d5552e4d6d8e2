//! The Slurm executor on a real cluster: the same reports, failures and resumption as a local
//! run. CI starts a single-node Slurm (`.ci/slurm.sh`); elsewhere these tests need `sinfo` to
//! answer, and `GACC_REQUIRE_SLURM=1` makes a missing cluster an error instead of a skip.

use crate::common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{Programs, Scratch, read_json};

/// Whether a Slurm cluster answers; the tests share it, each looking only at its own tasks.
fn cluster() -> Option<()> {
    let answers = std::process::Command::new("sinfo")
        .arg("-h")
        .output()
        .is_ok_and(|o| o.status.success());
    if !answers {
        assert!(
            std::env::var_os("GACC_REQUIRE_SLURM").is_none(),
            "GACC_REQUIRE_SLURM is set but no Slurm cluster answers `sinfo` (is SLURM_CONF set?)"
        );
        eprintln!("skipped: no Slurm cluster answers `sinfo` (CI starts one with .ci/slurm.sh)");
        return None;
    }
    Some(())
}

/// `gacc run` arguments that send every call to Slurm, polling often.
const ON_SLURM: &[&str] = &[
    "--executor",
    "slurm",
    "--set",
    "run.concurrency=512",
    "--set",
    "run.slurm.poll=200ms",
    "--set",
    "run.slurm.gather=300ms",
];

fn with<'a>(base: &[&'a str], more: &[&'a str]) -> Vec<&'a str> {
    base.iter().chain(more).copied().collect()
}

fn report(folder: &Path) -> Vec<u8> {
    std::fs::read(folder.join("report.json")).unwrap()
}

/// The same manifest run locally and on Slurm, each with its own cache, its built-ins as
/// programs (`gacc callback NAME`: inside gacc they would not go to the cluster), which
/// `programs` writes.
fn same_report_as_local(manifest: &str, programs: Programs, slurm_extra: &[&str]) {
    let local = Scratch::new();
    let (status, local_run, stderr) = local.run(&programs(&local, manifest), &["-q"]);
    assert_eq!(status, 0, "{stderr}");
    let remote = Scratch::new();
    let (status, remote_run, stderr) = remote.run(&programs(&remote, manifest), &with(ON_SLURM, slurm_extra));
    assert_eq!(status, 0, "{stderr}");
    assert_eq!(
        String::from_utf8(report(&local_run)).unwrap(),
        String::from_utf8(report(&remote_run)).unwrap(),
        "report.json on Slurm is byte-identical to the local one"
    );
    let calls = read_json(&remote_run.join("run.json"))["calls"]["compressor"]["made"].clone();
    assert!(calls.as_u64().unwrap() > 0, "the compressors ran on Slurm");
    // Answered calls leave nothing behind in the work folder.
    let left = count_files(&remote.path(".gacc/slurm/calls"));
    assert_eq!(left, 0, "the work folder is emptied of answered calls");
}

fn count_files(folder: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(folder) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| {
            if e.file_type().unwrap().is_dir() {
                count_files(&e.path())
            } else {
                1
            }
        })
        .sum()
}

#[test]
fn the_fixture_on_slurm_reports_what_a_local_run_does() {
    let Some(()) = cluster() else { return };
    // A process per call, on the node as here.
    same_report_as_local("experiments/fixture.toml", Scratch::as_programs, &[]);
}

#[test]
fn the_baselines_on_slurm_report_what_a_local_run_does() {
    let Some(()) = cluster() else { return };
    // Each array task starts its program once and makes its 200 calls through it.
    same_report_as_local(
        "experiments/baselines.toml",
        Scratch::as_persistent_programs,
        &["--set", "run.slurm.calls_per_task=200"],
    );
}

#[test]
fn rule_built_ins_on_a_slurm_run_are_answered_by_gacc_and_submit_nothing() {
    let Some(()) = cluster() else { return };
    let local = Scratch::new();
    let (status, local_run, stderr) = local.run("experiments/fixture.toml", &["-q"]);
    assert_eq!(status, 0, "{stderr}");
    let remote = Scratch::new();
    // A partition that does not exist: any array submitted would fail its calls.
    let (status, remote_run, stderr) = remote.run(
        "experiments/fixture.toml",
        &with(ON_SLURM, &["--set", "run.slurm.partition=no-such-partition"]),
    );
    assert_eq!(status, 0, "{stderr}");
    assert_eq!(
        String::from_utf8(report(&local_run)).unwrap(),
        String::from_utf8(report(&remote_run)).unwrap()
    );
    // The work folder holds its format, and no call or array.
    assert_eq!(
        count_files(&remote.path(".gacc/slurm")),
        1,
        "nothing was submitted"
    );
    assert_eq!(
        std::fs::read_to_string(remote.path(".gacc/slurm/format")).unwrap(),
        "gacc.slurm/2\n"
    );
}

/// The fixture with a compressor script: it logs each call, sleeps `sleep` seconds (longer
/// for the reactor goal when `slow` is given), then answers as `goal-line` does.
fn scripted_fixture(scratch: &Scratch, slow: Option<u32>) -> &'static str {
    let slow = slow.map_or(String::new(), |seconds| {
        format!("case \"$request\" in *'of the reactor'*) [ -e ../slow-off ] || sleep {seconds};; esac\n")
    });
    scratch.script(
        "experiments/compressor.sh",
        &format!(
            "#!/bin/sh\nrequest=$(cat)\nprintf '%s' \"$request\" | cksum | cut -d' ' -f1 >> ../calls-compressor.log\n{slow}printf '%s' \"$request\" | @GACC@ callback goal-line\n"
        ),
    );
    let manifest = std::fs::read_to_string(scratch.path("experiments/fixture.toml"))
        .unwrap()
        .replace(
            "builtin = \"goal-line\"",
            "command = [\"./compressor.sh\"]\nsandbox = false",
        );
    scratch.write("experiments/scripted.toml", &manifest);
    "experiments/scripted.toml"
}

/// The fixture's reader fails (exit 3, with a message) for the reactor's questions until
/// the file `reader-fixed` exists; every call is logged.
fn failing_reader(scratch: &Scratch) -> &'static str {
    scratch.script(
        "experiments/reader.sh",
        "#!/bin/sh\nrequest=$(cat)\nprintf '%s' \"$request\" | cksum | cut -d' ' -f1 >> ../calls-reader.log\ncase \"$request\" in *'of the reactor?'*) [ -e ../reader-fixed ] || { echo 'reader: no model for reactors' >&2; exit 3; };; esac\nprintf '%s' \"$request\" | @GACC@ callback field-lookup\n",
    );
    let manifest = std::fs::read_to_string(scratch.path("experiments/fixture.toml"))
        .unwrap()
        .replace(
            "builtin = \"field-lookup\"",
            "command = [\"./reader.sh\"]\nsandbox = false",
        );
    scratch.write("experiments/failing.toml", &manifest);
    "experiments/failing.toml"
}

#[test]
fn a_failing_callback_fails_as_it_does_locally_and_only_it_is_submitted_again() {
    let Some(()) = cluster() else { return };
    let local = Scratch::new();
    let manifest = failing_reader(&local);
    let (status, local_run, _) = local.run(manifest, &["-q"]);
    assert_eq!(status, 1);
    let remote = Scratch::new();
    failing_reader(&remote);
    let (status, remote_run, stderr) = remote.run(manifest, ON_SLURM);
    assert_eq!(status, 1, "{stderr}");
    let failures = read_json(&remote_run.join("report.json"))["failures"].clone();
    assert!(!failures.as_array().unwrap().is_empty());
    assert!(
        failures.to_string().contains("exited with status 3"),
        "{failures}"
    );
    assert!(
        failures.to_string().contains("no model for reactors"),
        "{failures}"
    );
    assert_eq!(
        String::from_utf8(report(&local_run)).unwrap(),
        String::from_utf8(report(&remote_run)).unwrap(),
        "the same failures, cells and counts as the local run"
    );
    let failed = failures.as_array().unwrap().len();
    let fixed = rerun_after_fix(
        &remote,
        manifest,
        ON_SLURM,
        ("reader-fixed", "calls-reader.log"),
        failed,
    );
    assert_eq!(read_json(&fixed.join("report.json"))["complete"], true);
}

/// The file that makes the scripted compressor quick, and its call log.
const SLOW_OFF: (&str, &str) = ("slow-off", "calls-compressor.log");

/// Writes the file `fix.0` that cures a callback, runs again, and checks that exactly
/// `failed` calls were made (counted in the callback's log `fix.1`); the new run folder.
fn rerun_after_fix(
    scratch: &Scratch,
    manifest: &str,
    args: &[&str],
    (fix, log): (&str, &str),
    failed: usize,
) -> std::path::PathBuf {
    let before = scratch.count_lines(log);
    scratch.write(fix, "");
    let (status, folder, stderr) = scratch.run(manifest, args);
    assert_eq!(status, 0, "{stderr}");
    assert_eq!(
        scratch.count_lines(log) - before,
        failed,
        "only the failed calls are made again"
    );
    folder
}

/// Array tasks in `state` submitted by the gacc with process id `gacc`, as `JOB_INDEX` (its
/// arrays are named `gacc-<time>-<pid>-<n>`).
fn tasks_in(state: &str, gacc: u32) -> Vec<String> {
    let output = std::process::Command::new("squeue")
        .args(["-h", "-r", "-t", state, "-o", "%i|%j"])
        .output()
        .unwrap();
    let mark = format!("-{gacc}-");
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|l| l.trim().split_once('|'))
        .filter(|(_, name)| name.contains(&mark))
        .map(|(task, _)| task.to_owned())
        .collect()
}

/// `gacc run` on Slurm in the background, one call per task; its process and pid.
fn start_on_slurm(
    scratch: &Scratch,
    manifest: &str,
    stdout: std::process::Stdio,
) -> (std::process::Child, u32) {
    let gacc = scratch
        .gacc_process()
        .args(["run", manifest, "-q", "--set", "run.slurm.calls_per_task=1"])
        .args(ON_SLURM)
        .stdout(stdout)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = gacc.id();
    (gacc, pid)
}

fn wait_for(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < limit, "waited {limit:?} for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_cancelled_task_is_a_failure_and_only_its_calls_are_submitted_again() {
    let Some(()) = cluster() else { return };
    let scratch = Scratch::new();
    let manifest = scripted_fixture(&scratch, Some(600));
    let (gacc, pid) = start_on_slurm(&scratch, manifest, std::process::Stdio::piped());
    // Every quick call is done when only the slow ones still run.
    wait_for("the slow calls alone to run", Duration::from_secs(120), || {
        let running = tasks_in("RUNNING", pid);
        !running.is_empty() && tasks_in("PENDING", pid).is_empty() && running.len() <= 3 && {
            std::thread::sleep(Duration::from_secs(2));
            tasks_in("RUNNING", pid) == running
        }
    });
    let slow = tasks_in("RUNNING", pid);
    let status = std::process::Command::new("scancel")
        .args(&slow)
        .status()
        .unwrap();
    assert!(status.success());
    let output = gacc.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    let folder = scratch.path(String::from_utf8_lossy(&output.stdout).trim());
    let report = read_json(&folder.join("report.json"));
    let failures = report["failures"].as_array().unwrap().clone();
    assert_eq!(failures.len(), slow.len(), "{failures:?}");
    for failure in &failures {
        let text = failure.to_string();
        assert!(text.contains("CANCELLED without answering"), "{text}");
    }
    rerun_after_fix(&scratch, manifest, ON_SLURM, SLOW_OFF, slow.len());
}

#[test]
fn a_task_past_its_time_limit_is_a_timeout_and_only_it_is_submitted_again() {
    let Some(()) = cluster() else { return };
    let scratch = Scratch::new();
    let manifest = scripted_fixture(&scratch, Some(600));
    let limits = [
        "--set",
        "run.slurm.calls_per_task=1",
        "--set",
        "run.slurm.compressor.time=1m",
        // A timeout is retryable; one attempt keeps the test to one time limit.
        "--set",
        "compressors.goal-line.retries=0",
    ];
    let (status, folder, stderr) = scratch.run(manifest, &with(ON_SLURM, &limits));
    assert_eq!(status, 1, "{stderr}");
    let failures = read_json(&folder.join("report.json"))["failures"].clone();
    let failures = failures.as_array().unwrap();
    assert!(!failures.is_empty());
    for failure in failures {
        assert!(failure.to_string().contains("timed out after 60s"), "{failure}");
    }
    rerun_after_fix(
        &scratch,
        manifest,
        &with(ON_SLURM, &limits),
        SLOW_OFF,
        failures.len(),
    );
}

#[test]
fn a_killed_gacc_adopts_its_running_tasks_and_repeats_no_call() {
    let Some(()) = cluster() else { return };
    let reference = Scratch::new();
    let manifest = scripted_fixture(&reference, None);
    let (status, uninterrupted, stderr) = reference.run(manifest, &["-q"]);
    assert_eq!(status, 0, "{stderr}");

    let scratch = Scratch::new();
    scripted_fixture(&scratch, Some(4));
    let (mut gacc, pid) = start_on_slurm(&scratch, manifest, std::process::Stdio::null());
    wait_for("a slow call to start", Duration::from_secs(120), || {
        scratch.count_lines("calls-compressor.log") >= 1 && !tasks_in("RUNNING", pid).is_empty()
    });
    gacc.kill().unwrap(); // SIGKILL: the tasks run on without it
    gacc.wait().unwrap();
    assert!(
        !tasks_in("RUNNING", pid).is_empty(),
        "tasks outlive the gacc that submitted them"
    );
    let (status, resumed, stderr) = scratch.run(manifest, ON_SLURM);
    assert_eq!(status, 0, "{stderr}");
    assert_eq!(
        String::from_utf8(report(&uninterrupted)).unwrap(),
        String::from_utf8(report(&resumed)).unwrap(),
        "the same report as an uninterrupted run"
    );
    let trace = std::fs::read_to_string(resumed.join("trace.jsonl")).unwrap();
    assert!(
        trace.contains("waiting for a task submitted by an earlier run"),
        "the restarted gacc adopted running tasks"
    );
    let calls = std::fs::read_to_string(scratch.path("calls-compressor.log")).unwrap();
    let mut seen = std::collections::BTreeSet::new();
    let repeated: Vec<&str> = calls.lines().filter(|call| !seen.insert(*call)).collect();
    assert!(repeated.is_empty(), "compressor calls made twice: {repeated:?}");
    assert_eq!(
        seen.len(),
        reference.count_lines("calls-compressor.log"),
        "every call was made once"
    );
}

#[test]
fn without_slurm_commands_a_slurm_run_stops_before_any_call() {
    let scratch = Scratch::new();
    let (status, _, stderr) = scratch.run_with_env(
        "experiments/fixture.toml",
        &["--executor", "slurm"],
        &[("PATH", "/nonexistent")],
    );
    assert_eq!(status, 2, "{stderr}");
    assert!(stderr.contains("key `run.executor`"), "{stderr}");
    assert!(stderr.contains("cannot run `sbatch`"), "{stderr}");
    assert_eq!(scratch.cached("compressor"), 0);
}

#[test]
fn ctrl_c_cancels_every_array_gacc_submitted() {
    let Some(()) = cluster() else { return };
    let scratch = Scratch::new();
    let manifest = scripted_fixture(&scratch, Some(600));
    let (gacc, pid) = start_on_slurm(&scratch, manifest, std::process::Stdio::null());
    wait_for("the slow calls to run", Duration::from_secs(120), || {
        !tasks_in("RUNNING", pid).is_empty()
    });
    // SAFETY: kill(2) sends SIGINT to the child gacc; it touches no memory.
    unsafe {
        libc::kill(pid as i32, libc::SIGINT);
    }
    let output = gacc.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(130), "{stderr}");
    assert!(
        stderr.contains("gacc run"),
        "the command to resume is printed: {stderr}"
    );
    wait_for("every task to end", Duration::from_secs(30), || {
        tasks_in("PENDING,RUNNING,COMPLETING", pid).is_empty()
    });
    assert!(
        !tasks_in("CANCELLED", pid).is_empty(),
        "the running tasks were cancelled"
    );
}

#[test]
fn an_array_sbatch_refuses_fails_its_calls_with_sbatch_s_reason() {
    let Some(()) = cluster() else { return };
    let scratch = Scratch::new();
    let (status, folder, stderr) = scratch.run(
        &scratch.as_programs("experiments/fixture.toml"),
        &with(ON_SLURM, &["--set", "run.slurm.partition=no-such-partition"]),
    );
    assert_eq!(status, 1, "{stderr}");
    let failures = read_json(&folder.join("report.json"))["failures"].clone();
    let failures = failures.as_array().unwrap();
    assert_eq!(failures.len(), 12, "every compressor call: {failures:?}");
    let text = failures[0].to_string();
    assert!(text.contains("sbatch failed"), "{text}");
    assert!(text.to_lowercase().contains("partition"), "{text}");
}
