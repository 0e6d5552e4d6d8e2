//! Faults a cluster user meets, injected: a file system that fills during the run, a cache
//! whose entries were damaged or cut short, a preemption (SIGTERM) with a persistent worker,
//! and a run folder removed while the run goes. Each says what was kept, what was said, and
//! that the run after it makes no call twice.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{Scratch, read_json};

/// A command compressor that counts its invocations (one line each in `count`, outside the
/// cache's file system) and answers a memory of 32 KB, so that a few answers fill a small disk.
fn counting_fixture(scratch: &Scratch, name: &str, count: &Path, cache: Option<&Path>) -> String {
    scratch.script(
        "experiments/counting.sh",
        &format!(
            "#!/bin/sh\ncat > /dev/null\necho x >> '{}'\nprintf '{{\"memory\": \"'\nhead -c 32000 /dev/zero | tr '\\0' 'a'\nprintf '\"}}\\n'\n",
            count.display()
        ),
    );
    let mut manifest = std::fs::read_to_string(scratch.path("experiments/fixture.toml"))
        .unwrap()
        .replace(
            "[compressors.goal-line]\nbuiltin = \"goal-line\"",
            "[compressors.goal-line]\ncommand = [\"./counting.sh\"]\nsandbox = false",
        );
    if let Some(cache) = cache {
        manifest = manifest.replace("[run]\n", &format!("[run]\ncache = \"{}\"\n", cache.display()));
    }
    let path = format!("experiments/{name}.toml");
    scratch.write(&path, &manifest);
    path
}

/// `gacc run -q MANIFEST` started in the background, its output piped.
fn started(scratch: &Scratch, manifest: &str) -> std::process::Child {
    scratch
        .gacc_process()
        .args(["run", "-q", manifest])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

fn invocations(count: &Path) -> usize {
    std::fs::read_to_string(count).map_or(0, |text| text.lines().count())
}

/// How this machine makes a private mount namespace, where a test may mount a small file
/// system: as root, a mount namespace; else a user namespace mapped to root, where allowed.
fn namespace() -> Option<Vec<&'static str>> {
    let root = Command::new("id").arg("-u").output().ok()?.stdout == b"0\n";
    let flags: Vec<&'static str> = match root {
        true => vec!["--mount"],
        false => vec!["--user", "--map-root-user", "--mount"],
    };
    let works = Command::new("unshare")
        .args(&flags)
        .args([
            "sh",
            "-c",
            "mount -t tmpfs -o size=64k tmpfs /mnt 2>/dev/null || mount -t tmpfs -o size=64k tmpfs /tmp",
        ])
        .status()
        .is_ok_and(|status| status.success());
    match (works, root) {
        (true, _) => Some(flags),
        // CI runs as root, where this must work.
        (false, true) => panic!("as root, `unshare --mount` with a tmpfs should work"),
        (false, false) => None,
    }
}

#[test]
fn a_disk_that_fills_stops_the_spending_and_the_next_run_pays_for_nothing_twice() {
    let Some(flags) = namespace() else {
        eprintln!("skipped: no mount namespace for a small file system here (not root, no user namespaces)");
        return;
    };
    let scratch = Scratch::new();
    let disk = scratch.path("disk");
    std::fs::create_dir_all(&disk).unwrap();
    let count = scratch.path("invocations.log");
    let manifest = counting_fixture(&scratch, "full", &count, Some(&disk.join("cache")));
    let out = scratch.path("out");
    std::fs::create_dir_all(&out).unwrap();
    // Both runs in one namespace: the small disk holds the cache; between them it grows, as a
    // user frees space. What each run said is kept outside it.
    let script = format!(
        "set -u\nmount -t tmpfs -o size=160k tmpfs '{disk}'\ncd '{dir}'\n\
         '{gacc}' run '{manifest}' > '{out}/stdout1' 2> '{out}/stderr1'; echo $? > '{out}/status1'\n\
         cp '{count}' '{out}/count1' 2>/dev/null || : > '{out}/count1'\n\
         mount -o remount,size=64m '{disk}'\n\
         '{gacc}' run -q '{manifest}' > '{out}/stdout2' 2> '{out}/stderr2'; echo $? > '{out}/status2'\n",
        disk = disk.display(),
        dir = scratch.path("").display(),
        gacc = common::gacc_binary().display(),
        manifest = manifest,
        out = out.display(),
        count = count.display(),
    );
    let status = Command::new("unshare")
        .args(&flags)
        .args(["sh", "-c", &script])
        .status()
        .unwrap();
    assert!(status.success());
    let read = |name: &str| std::fs::read_to_string(out.join(name)).unwrap_or_default();
    let (status1, stderr1) = (read("status1"), read("stderr1"));
    assert_ne!(status1.trim(), "0", "the first run cannot finish: {stderr1}");
    let first = read("count1").lines().count();
    // 4 goals × 3 seeds; the run's concurrency is 4. The calls made are those whose answers
    // were kept and at most the calls in flight when the first write failed.
    let (planned, concurrency) = (12, 4);
    let kept: usize = stderr1
        .lines()
        .find_map(|l| l.strip_prefix("This run made "))
        .and_then(|rest| rest.split(": ").nth(1)?.split(' ').next()?.parse().ok())
        .expect("the run says how many answers it kept");
    assert!(
        first < planned,
        "the run went on calling: {first} of {planned}\n{stderr1}"
    );
    assert!(
        first <= kept + concurrency,
        "{first} calls, {kept} kept\n{stderr1}"
    );
    // One message, naming the path and what was kept: not a line per lost answer.
    assert!(
        stderr1.contains("the run stopped at its first lost write")
            && stderr1.contains(&disk.display().to_string())
            && stderr1.contains("kept in the cache")
            && stderr1.contains("run the same command again"),
        "{stderr1}"
    );
    let lost_lines = stderr1.lines().filter(|l| l.contains("No space left")).count();
    assert!(lost_lines <= 3, "{lost_lines} lines of lost writes:\n{stderr1}");
    // With space again, the same command finishes, and what the first kept is not made again.
    assert_eq!(read("status2").trim(), "0", "{}", read("stderr2"));
    let total = invocations(&count);
    assert!(
        total <= planned + concurrency,
        "{first} calls, then {} more: {total} for {planned} answers",
        total - first
    );
    let folder = scratch.path("").join(read("stdout2").trim());
    assert_eq!(read_json(&folder.join("report.json"))["complete"], true);
}

#[test]
fn a_place_that_cannot_be_written_fails_before_any_call() {
    let scratch = Scratch::new();
    let count = scratch.path("invocations.log");
    // A cache path under a file: nothing can be written there.
    std::fs::write(scratch.path("blocked"), "a file, not a folder").unwrap();
    let manifest = counting_fixture(&scratch, "blocked", &count, Some(&scratch.path("blocked/cache")));
    let started = Instant::now();
    let (status, _, stderr) = scratch.run(&manifest, &["-q"]);
    assert_ne!(status, 0);
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(stderr.contains("blocked"), "{stderr}");
    assert_eq!(invocations(&count), 0, "nothing called");

    // A read-only cache folder (as root, permissions do not stop a write: the probe is
    // checked through a file system mounted read-only instead, where one can be made).
    if let Some(flags) = namespace() {
        let disk = scratch.path("ro");
        std::fs::create_dir_all(disk.join("cache/segments")).unwrap();
        let manifest = counting_fixture(&scratch, "readonly", &count, Some(&disk.join("cache")));
        let script = format!(
            "mount --bind '{disk}' '{disk}' && mount -o remount,bind,ro '{disk}' && cd '{dir}' && '{gacc}' run -q '{manifest}' 2> '{dir}/ro.stderr'; echo $? > '{dir}/ro.status'",
            disk = disk.display(),
            dir = scratch.path("").display(),
            gacc = common::gacc_binary().display(),
        );
        Command::new("unshare")
            .args(&flags)
            .args(["sh", "-c", &script])
            .status()
            .unwrap();
        let stderr = std::fs::read_to_string(scratch.path("ro.stderr")).unwrap_or_default();
        assert_ne!(
            std::fs::read_to_string(scratch.path("ro.status")).unwrap().trim(),
            "0"
        );
        assert!(
            stderr.contains("cannot be written") && stderr.contains("nothing was called"),
            "{stderr}"
        );
        assert_eq!(invocations(&count), 0, "nothing called");
    }
}

/// A scratch folder where the counting fixture ran once, whole: (scratch, the invocation
/// count, the manifest, the run folder).
fn ran_once(name: &str) -> (Scratch, PathBuf, String, PathBuf) {
    let scratch = Scratch::new();
    let count = scratch.path("invocations.log");
    let manifest = counting_fixture(&scratch, name, &count, None);
    let (status, folder, stderr) = scratch.run(&manifest, &["-q"]);
    assert_eq!(status, 0, "{stderr}");
    (scratch, count, manifest, folder)
}

/// The cache's segment files, oldest first.
fn segments(cache: &Path) -> Vec<PathBuf> {
    let mut segments: Vec<PathBuf> = std::fs::read_dir(cache.join("segments"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    segments.sort();
    segments
}

/// Changes one byte inside the payload of each of the first `n` entries small enough to be
/// checked when the cache is opened (answers and verdicts), whatever segment holds them.
fn damage(cache: &Path, n: usize) -> usize {
    let mut damaged = 0;
    for segment in &segments(cache) {
        let mut bytes = std::fs::read(segment).unwrap();
        let mut at = 0;
        while at < bytes.len() && damaged < n {
            let end = at + bytes[at..].iter().position(|b| *b == b'\n').unwrap();
            // `<key> <kind> <checksum> <payload>`: a letter of a short payload, changed.
            let line = &bytes[at..end];
            let payload = line
                .iter()
                .enumerate()
                .filter(|(_, b)| **b == b' ')
                .nth(2)
                .map(|(i, _)| i + 1);
            if let Some(start) = payload
                && end - at - start < 1024
                && let Some(offset) = bytes[at + start..end].iter().position(|b| b.is_ascii_lowercase())
            {
                let byte = &mut bytes[at + start + offset];
                *byte = if *byte == b'z' { b'y' } else { *byte + 1 };
                damaged += 1;
            }
            at = end + 1;
        }
        std::fs::write(segment, &bytes).unwrap();
        // A sidecar index holds its own copy of short payloads: gone, the segment is read.
        let _ = std::fs::remove_file(segment.with_extension("idx"));
    }
    damaged
}

#[test]
fn damaged_cache_entries_are_said_and_made_again_and_the_report_is_unchanged() {
    let (scratch, count, manifest, clean) = ran_once("damaged");
    let before = invocations(&count);
    let damaged = damage(&scratch.path(".gacc/cache"), 20);
    assert_eq!(damaged, 20, "entries damaged");
    let (status, again, stderr) = scratch.run(&manifest, &[]);
    assert_eq!(status, 0, "{stderr}");
    // Said once, with the number, in the summary and in run.json.
    let said: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("failed their checksum") || l.contains("failed its checksum"))
        .collect();
    assert_eq!(said.len(), 1, "{stderr}");
    assert!(said[0].contains(&format!("{damaged} entr")), "{}", said[0]);
    assert_eq!(read_json(&again.join("run.json"))["cache_damaged"], damaged);
    // No compressor answer was damaged: none was made again.
    assert_eq!(invocations(&count), before);
    assert_eq!(
        std::fs::read(clean.join("report.json")).unwrap(),
        std::fs::read(again.join("report.json")).unwrap(),
        "the same report, to the byte"
    );
}

#[test]
fn a_line_cut_short_by_a_kill_is_a_miss_made_again_not_damage() {
    let (scratch, count, manifest, clean) = ran_once("torn");
    // The segment's first compressor entry (32 KB) cut in half and made its last line, as a
    // `kill -9` in the middle of its write leaves it.
    let segments = segments(&scratch.path(".gacc/cache"));
    assert_eq!(segments.len(), 1);
    let bytes = std::fs::read(&segments[0]).unwrap();
    let long = bytes
        .split(|b| *b == b'\n')
        .position(|line| line.len() > 16_000)
        .unwrap();
    let start: usize = bytes.split(|b| *b == b'\n').take(long).map(|l| l.len() + 1).sum();
    std::fs::write(&segments[0], &bytes[..start + 8_000]).unwrap();
    let _ = std::fs::remove_file(segments[0].with_extension("idx"));
    let before = invocations(&count);
    let (status, again, stderr) = scratch.run(&manifest, &[]);
    assert_eq!(status, 0, "{stderr}");
    assert!(!stderr.contains("checksum"), "a cut line is no damage: {stderr}");
    // The cut entry and those after it were made again; the report is the same.
    assert!(invocations(&count) > before);
    assert_eq!(
        std::fs::read(clean.join("report.json")).unwrap(),
        std::fs::read(again.join("report.json")).unwrap()
    );
}

#[test]
fn a_run_folder_removed_mid_run_stops_the_run_with_its_answers_kept() {
    let scratch = Scratch::new();
    let count = scratch.path("invocations.log");
    let manifest = counting_fixture(&scratch, "removed", &count, None);
    // Slow calls, so the folder goes while the run does.
    let script = std::fs::read_to_string(scratch.path("experiments/counting.sh")).unwrap();
    scratch.script(
        "experiments/counting.sh",
        &script.replace("cat > /dev/null\n", "cat > /dev/null\nsleep 0.3\n"),
    );
    let child = started(&scratch, &manifest);
    // The run folder appears as the run starts; removed after the first call.
    let runs = scratch.path("runs/fixture");
    let deadline = Instant::now() + Duration::from_secs(30);
    let folder = loop {
        let found = std::fs::read_dir(&runs).ok().and_then(|entries| {
            entries.flatten().map(|e| e.path()).find(|p| {
                let name = p
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default();
                p.is_dir() && name != "latest" && !name.starts_with('.')
            })
        });
        if let Some(folder) = found
            && invocations(&count) > 0
        {
            break folder;
        }
        assert!(Instant::now() < deadline, "the run folder never appeared");
        std::thread::sleep(Duration::from_millis(20));
    };
    std::fs::remove_dir_all(&folder).unwrap();
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_ne!(
        output.status.code(),
        Some(0),
        "{stderr}\n{stdout}\n{}",
        folder.display()
    );
    assert!(stderr.contains("was removed while the run wrote it"), "{stderr}");
    let first = invocations(&count);
    // The next run finishes and repeats at most the calls that were in flight.
    let (status, _, stderr) = scratch.run(&manifest, &["-q"]);
    assert_eq!(status, 0, "{stderr}");
    assert!(
        invocations(&count) <= 12 + 4,
        "{first} then {}",
        invocations(&count)
    );
}

#[test]
fn sigterm_with_a_persistent_worker_stops_within_seconds_and_the_next_run_repeats_nothing_finished() {
    if !common::python3_on_path() {
        eprintln!("skipped: python3 is not on PATH");
        return;
    }
    let scratch = Scratch::new();
    scratch.copy_helper();
    let count = scratch.path("invocations.log");
    scratch.write(
        "experiments/callbacks/slow.py",
        &format!(
            "import time\nfrom gacc_callback import compressor, serve\n\n\n@compressor\ndef slow(context, **_):\n    with open('{}', 'a') as f:\n        f.write('x\\n')\n    time.sleep(0.2)\n    return context[:200]\n\n\nif __name__ == \"__main__\":\n    serve()\n",
            count.display()
        ),
    );
    let manifest = scratch.fixture_with(
        "slow",
        "command = [\"python3\", \"callbacks/slow.py\"]\nmode = \"persistent\"\nsandbox = false",
    );
    let child = started(&scratch, &manifest);
    let deadline = Instant::now() + Duration::from_secs(30);
    while invocations(&count) < 2 {
        assert!(Instant::now() < deadline, "no call started");
        std::thread::sleep(Duration::from_millis(20));
    }
    let stopped = Instant::now();
    // SAFETY: a signal to the child this test started.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
    let output = child.wait_with_output().unwrap();
    assert!(
        stopped.elapsed() < Duration::from_secs(5),
        "{:?}",
        stopped.elapsed()
    );
    assert_ne!(output.status.code(), Some(0));
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(said.contains("again"), "the resume is said: {said}");
    // No worker outlives the run: the invocation count stays still.
    let first = invocations(&count);
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(
        invocations(&count),
        first,
        "a worker went on after the run stopped"
    );
    let (status, _, stderr) = scratch.run(&manifest, &["-q"]);
    assert_eq!(status, 0, "{stderr}");
    // 4 goals × 3 seeds; at most the calls in flight (the run's concurrency) are repeated.
    assert!(
        invocations(&count) <= 12 + 4,
        "{first} then {}",
        invocations(&count)
    );
}
