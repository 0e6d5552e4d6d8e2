//! A run in flight shows itself: `results.jsonl` and `memories.jsonl` grow as rows fold,
//! `run.json` carries the progress so far, and each row names the cache entries it rests on.

use crate::common;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{Scratch, read_json, read_lines};
use serde_json::Value;

/// The fixture with an audit judge and a reader (a shell script) that answers seeds 42 and 43
/// (the plan's first eight memories) at once and seed 44 (the last four) after eight seconds:
/// rows fold in plan order, so the first 24 reach the file while the run goes on, whatever
/// order the questions were answered in.
fn slow_fixture(scratch: &Scratch) -> &'static str {
    scratch.script(
        "experiments/slow-reader.sh",
        "#!/bin/sh\nrequest=$(cat)\ncase \"$request\" in\n  *'\"seed\":44'*) sleep 8 ;;\nesac\nprintf '{\"answer\":\"unknown\"}'\n",
    );
    let manifest = std::fs::read_to_string(scratch.path("experiments/fixture.toml"))
        .unwrap()
        .replace(
            "[reader]\nbuiltin = \"field-lookup\"",
            "[reader]\ncommand = [\"./slow-reader.sh\"]\nconcurrency = 16",
        )
        .replace("concurrency = 4", "concurrency = 16")
        + "\n[audit]\njudges = [\"contains\"]\n";
    scratch.write("experiments/slow.toml", &manifest);
    "experiments/slow.toml"
}

/// The run folder under `runs/fixture` once it has appeared.
fn folder_of(scratch: &Scratch, deadline: Instant) -> Option<PathBuf> {
    while Instant::now() < deadline {
        let found = std::fs::read_dir(scratch.path("runs/fixture"))
            .into_iter()
            .flatten()
            .flatten()
            .map(|entry| entry.path())
            .find(|path| {
                let name = path.file_name().unwrap_or_default().to_string_lossy();
                path.is_dir() && name != "latest" && !name.starts_with('.')
            });
        if found.is_some() {
            return found;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

/// The rows in a row file a run may still be writing (its last gzip member cut short).
fn lines_in(path: &Path) -> usize {
    let Ok(file) = std::fs::File::open(path) else {
        return 0;
    };
    let mut decoder = flate2::read::MultiGzDecoder::new(file);
    let (mut rows, mut block) = (0, vec![0u8; 1 << 16]);
    while let Ok(read @ 1..) = std::io::Read::read(&mut decoder, &mut block) {
        rows += block[..read].iter().filter(|&&b| b == b'\n').count();
    }
    rows
}

/// Every (kind, key) in the cache's segment logs (`<key> <kind> <checksum> <entry>` lines).
fn cache_entries(scratch: &Scratch) -> HashSet<(String, String)> {
    let mut entries = HashSet::new();
    for segment in std::fs::read_dir(scratch.path(".gacc/cache/segments")).unwrap() {
        let path = segment.unwrap().path();
        if path.extension().is_some_and(|e| e == "log") {
            for line in std::fs::read_to_string(&path).unwrap().lines() {
                let mut words = line.splitn(4, ' ');
                let (key, kind) = (words.next(), words.next());
                if let (Some(kind), Some(key)) = (kind, key) {
                    entries.insert((kind.to_owned(), key.to_owned()));
                }
            }
        }
    }
    entries
}

/// The kind of entry a row's `calls` name stands for (an audit judge's is a judge's).
fn kind_of(name: &str) -> &str {
    if name.starts_with("judges.") {
        "judge"
    } else {
        name
    }
}

/// Starts the slow fixture's run: its scratch, process, run folder and the test's deadline.
fn start_slow_run() -> (Scratch, std::process::Child, PathBuf, Instant) {
    let scratch = Scratch::new();
    let manifest = slow_fixture(&scratch);
    let child = scratch
        .gacc_process()
        .args(["run", manifest, "-q"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    let folder = folder_of(&scratch, deadline).expect("the run folder appears");
    (scratch, child, folder, deadline)
}

#[test]
fn rows_and_progress_are_written_as_the_run_goes_and_rows_name_their_cache_entries() {
    let (scratch, mut child, folder, deadline) = start_slow_run();
    // (results rows, read jobs finished by run.json) seen while the run went on.
    let mut seen: Vec<(usize, u64)> = Vec::new();
    while child.try_wait().unwrap().is_none() && Instant::now() < deadline {
        let rows = lines_in(&folder.join("results.jsonl.gz"));
        let finished = std::fs::read_to_string(folder.join("run.json"))
            .ok()
            .and_then(|text| serde_json::from_str::<Value>(&text).ok())
            .and_then(|run| run.pointer("/progress/stages/read/finished")?.as_u64());
        if let Some(finished) = finished {
            seen.push((rows, finished));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let status = child.wait_with_output().unwrap();
    assert!(
        status.status.success(),
        "{}",
        String::from_utf8_lossy(&status.stderr)
    );

    let partial: HashSet<usize> = (seen.iter())
        .map(|(rows, _)| *rows)
        .filter(|rows| (1..36).contains(rows))
        .collect();
    assert!(
        partial.contains(&24),
        "the first memories' rows were written while the run went: {seen:?}"
    );
    let progress: HashSet<u64> = seen.iter().map(|(_, finished)| *finished).collect();
    assert!(progress.len() >= 2, "run.json's progress moved: {seen:?}");
    assert!(
        seen.windows(2).all(|w| w[0].0 <= w[1].0 && w[0].1 <= w[1].1),
        "rows and progress only go forward: {seen:?}"
    );

    // The finished record has no progress; the rows are all there, in full.
    let run = read_json(&folder.join("run.json"));
    assert!(run.get("progress").is_none(), "{run}");
    let results = read_lines(&folder.join("results.jsonl.gz"));
    let ledger = read_lines(&folder.join("memories.jsonl.gz"));
    assert_eq!((results.len(), ledger.len()), (36, 12));

    // Every row names the entries it rests on, and the cache holds each one.
    let cache = cache_entries(&scratch);
    let mut named = HashSet::new();
    for row in results.iter().chain(&ledger) {
        let calls = row["calls"]
            .as_object()
            .unwrap_or_else(|| panic!("no calls: {row}"));
        for (name, key) in calls {
            let entry = (kind_of(name).to_owned(), key.as_str().unwrap().to_owned());
            assert!(
                cache.contains(&entry),
                "{name} {key} of {row} is not in the cache"
            );
            named.insert(name.clone());
        }
    }
    let mut named: Vec<String> = named.into_iter().collect();
    named.sort();
    assert_eq!(
        named,
        [
            "compressor",
            "count",
            "judge",
            "judges.contains",
            "memory",
            "reader",
            "text"
        ]
    );
    for row in &results {
        assert_eq!(row["calls"]["reader"].as_str().map(str::len), Some(64), "{row}");
        assert!(row["calls"]["judge"].is_string(), "{row}");
    }
    for row in &ledger {
        assert_eq!(row["calls"]["compressor"], row["cache_key"]);
        assert_eq!(row["calls"]["text"], row["memory_sha256"]);
    }
}

#[test]
fn an_interrupted_run_keeps_its_rows_and_says_where_it_stopped() {
    let (_scratch, child, folder, deadline) = start_slow_run();
    while lines_in(&folder.join("results.jsonl.gz")) < 24 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    // kill(1) sends the interrupt Ctrl-C would.
    let pid = child.id().to_string();
    let sent = std::process::Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .unwrap();
    assert!(sent.success());
    let status = child.wait_with_output().unwrap();
    assert_eq!(
        status.status.code(),
        Some(130),
        "an interrupted run exits 130: {}",
        String::from_utf8_lossy(&status.stderr)
    );
    let run = read_json(&folder.join("run.json"));
    assert_eq!(run["progress"]["state"], "interrupted", "{run}");
    let rows = read_lines(&folder.join("results.jsonl.gz"));
    assert_eq!(rows.len(), 24, "every row folded is kept");
    assert_eq!(
        lines_in(&folder.join("memories.jsonl.gz")),
        rows.len() / 3,
        "a memory's row with its questions'"
    );
    let finished = run["progress"]["stages"]["read"]["finished"].as_u64().unwrap();
    assert!(finished as usize >= rows.len(), "{run}");
}
