//! `kill -9` at any moment loses no finished call: each resume repeats none of them, and the
//! run ends with the same `report.json` as one that was never interrupted.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use common::{Scratch, read_json};

/// The fixture with every callback wrapped by a script that logs each call's request hash
/// (counted by the callbacks themselves) and returns it in `meta`.
fn logging_fixture(scratch: &Scratch) -> &'static str {
    for (role, builtin) in [
        ("compressor", "goal-line"),
        ("reader", "field-lookup"),
        ("judge", "exact"),
    ] {
        scratch.script(
            &format!("experiments/{role}.sh"),
            &format!(
                "#!/bin/sh\nrequest=$(cat)\nhash=$(printf '%s' \"$request\" | cksum | cut -d' ' -f1)\necho \"$hash\" >> calls-{role}.log\nsleep 0.03\nprintf '%s' \"$request\" | @GACC@ callback {builtin} | sed \"s/^{{/{{\\\"meta\\\":{{\\\"request\\\":\\\"$hash\\\"}},/\"\n"
            ),
        );
    }
    let manifest = std::fs::read_to_string(scratch.path("experiments/fixture.toml"))
        .unwrap()
        .replace(
            "builtin = \"goal-line\"",
            "command = [\"./compressor.sh\"]\nsandbox = false",
        )
        .replace(
            "builtin = \"field-lookup\"",
            "command = [\"./reader.sh\"]\nsandbox = false",
        )
        .replace("builtin = \"exact\"", "command = [\"./judge.sh\"]");
    scratch.write("experiments/logged.toml", &manifest);
    "experiments/logged.toml"
}

/// Request hashes of every call whose answer is in the cache, per kind (reads the segment
/// format: `<key> <kind> <checksum> <payload>` per line).
fn finished_calls(scratch: &Scratch) -> BTreeMap<String, BTreeSet<String>> {
    let mut finished: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let Ok(segments) = std::fs::read_dir(scratch.path(".gacc/cache/segments")) else {
        return finished;
    };
    for segment in segments.flatten() {
        let text = std::fs::read_to_string(segment.path()).unwrap_or_default();
        for line in text.lines() {
            let mut fields = line.splitn(4, ' ');
            let (Some(_), Some(kind), Some(_), Some(payload)) =
                (fields.next(), fields.next(), fields.next(), fields.next())
            else {
                continue;
            };
            let Ok(entry) = serde_json::from_str::<serde_json::Value>(payload) else {
                continue;
            };
            if let Some(hash) = entry.pointer("/response/meta/request").and_then(|h| h.as_str()) {
                finished
                    .entry(kind.to_owned())
                    .or_default()
                    .insert(hash.to_owned());
            }
        }
    }
    finished
}

fn log(scratch: &Scratch, role: &str) -> Vec<String> {
    std::fs::read_to_string(scratch.path(&format!("experiments/calls-{role}.log")))
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

#[test]
fn sigkill_at_several_points_repeats_no_finished_call() {
    let reference = Scratch::new();
    let manifest = logging_fixture(&reference);
    let (status, uninterrupted, stderr) = reference.run(manifest, &[]);
    assert_eq!(status, 0, "{stderr}");

    let scratch = Scratch::new();
    logging_fixture(&scratch);
    let roles = ["compressor", "reader", "judge"];
    // After each kill: what had finished (was cached), and how long each call log was.
    let mut checkpoints = Vec::new();
    let mut kills = 0;
    for delay in [300, 300, 300, 300, 300] {
        let mut child = std::process::Command::new(common::gacc_binary())
            .args(["run", manifest, "-q"])
            .current_dir(scratch.dir.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(delay));
        if child.try_wait().unwrap().is_some() {
            break;
        }
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        kills += 1;
        // Calls in flight at the kill may still finish on their own; let them, then look.
        std::thread::sleep(Duration::from_millis(300));
        let logged: BTreeMap<&str, usize> = roles.iter().map(|r| (*r, log(&scratch, r).len())).collect();
        checkpoints.push((finished_calls(&scratch), logged));
    }
    assert!(kills >= 2, "gacc was killed mid-run at least twice");
    let (status, resumed, stderr) = scratch.run(manifest, &[]);
    assert_eq!(status, 0, "{stderr}");
    assert_eq!(
        std::fs::read(uninterrupted.join("report.json")).unwrap(),
        std::fs::read(resumed.join("report.json")).unwrap(),
        "the same report as a run that was never interrupted"
    );
    assert_eq!(read_json(&resumed.join("report.json"))["complete"], true);
    for (k, (finished, logged)) in checkpoints.iter().enumerate() {
        for role in roles {
            let later = &log(&scratch, role)[logged[role]..];
            let repeated: Vec<&String> = later
                .iter()
                .filter(|h| finished.get(role).is_some_and(|f| f.contains(*h)))
                .collect();
            assert!(
                repeated.is_empty(),
                "after kill {}: finished {role} calls made again: {repeated:?}",
                k + 1
            );
        }
    }
    let total: usize = roles.iter().map(|r| log(&scratch, r).len()).sum();
    let reference_total: usize = roles.iter().map(|r| log(&reference, r).len()).sum();
    assert!(total >= reference_total, "every call was made at least once");
}

#[test]
fn sigkill_mid_run_leaves_the_trace_of_what_happened_up_to_its_last_second() {
    let scratch = Scratch::new();
    let manifest = logging_fixture(&scratch);
    // Calls of half a second, so that the kill comes mid-run.
    for role in ["compressor", "reader", "judge"] {
        let path = scratch.path(&format!("experiments/{role}.sh"));
        let text = std::fs::read_to_string(&path)
            .unwrap()
            .replace("sleep 0.03", "sleep 0.5");
        std::fs::write(&path, text).unwrap();
    }
    let mut child = std::process::Command::new(common::gacc_binary())
        .args(["run", manifest, "-q"])
        .current_dir(scratch.dir.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Wait until eight compressor calls have started, then a second more: those eight have
    // answered by the kill.
    let started = std::time::Instant::now();
    while log(&scratch, "compressor").len() < 8 && started.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let finished_before = log(&scratch, "compressor").len();
    std::thread::sleep(Duration::from_millis(1200));
    assert!(
        child.try_wait().unwrap().is_none(),
        "the run ended before the kill"
    );
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let runs = std::fs::read_dir(scratch.path("runs/fixture")).unwrap();
    let folder = runs
        .flatten()
        .map(|e| e.path())
        .find(|p| p.join("trace.jsonl").exists())
        .expect("the run folder");
    let trace = std::fs::read_to_string(folder.join("trace.jsonl")).unwrap();
    let events: Vec<serde_json::Value> = trace
        .lines()
        .map(|line| serde_json::from_str(line).expect("every line of the trace is whole"))
        .collect();
    let compressed = events
        .iter()
        .filter(|e| e["message"] == "job finished" && e["stage"] == "compress")
        .count();
    assert!(compressed > 0, "the trace holds no finished job: {trace}");
    // Every compressor call that had answered a second before the kill is in it.
    assert!(
        compressed >= finished_before,
        "{compressed} compress jobs in the trace, {finished_before} calls made"
    );
    // Its record still says it is running; the next run on this machine says it stopped.
    let state = |folder: &std::path::Path| read_json(&folder.join("run.json"))["progress"]["state"].clone();
    assert_eq!(state(&folder), "running");
    for role in ["compressor", "reader", "judge"] {
        let path = scratch.path(&format!("experiments/{role}.sh"));
        let text = std::fs::read_to_string(&path)
            .unwrap()
            .replace("sleep 0.5", "sleep 0.03");
        std::fs::write(&path, text).unwrap();
    }
    let (status, resumed, stderr) = scratch.run(manifest, &[]);
    assert_eq!(status, 0, "{stderr}");
    assert_eq!(state(&folder), "stopped");
    assert!(stderr.contains("stopped without finishing"), "{stderr}");
    assert!(read_json(&resumed.join("run.json"))["progress"].is_null());
}
