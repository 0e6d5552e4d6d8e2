//! Pipelined persistent workers (`max_inflight = N`): requests carry an `id` their replies
//! echo, in any order; the results are those of one request at a time; a worker that dies with
//! requests in flight loses none of them; the Python helper's `batch_size` serves batches.

use crate::common;

use common::{Scratch, python3_on_path, read_json};

/// A scratch folder and the built-in fixture's run in it, when python3 runs here.
fn python_and_the_fixture() -> Option<(Scratch, std::path::PathBuf)> {
    if !python3_on_path() {
        return None;
    }
    let scratch = Scratch::new();
    let (status, plain, stderr) = scratch.run("experiments/fixture.toml", &[]);
    assert_eq!(status, 0, "{stderr}");
    Some((scratch, plain))
}

#[test]
fn pipelined_built_ins_give_the_report_of_one_request_at_a_time() {
    let scratch = Scratch::new();
    // The built-ins as programs (`gacc callback NAME`): inside gacc they have no workers.
    let fixture = scratch.as_programs("experiments/fixture.toml");
    let (status, plain, stderr) = scratch.run(&fixture, &[]);
    assert_eq!(status, 0, "{stderr}");
    let goal_line = format!(
        "command = [\"{}\", \"callback\", \"goal-line\"]",
        common::gacc_binary().display()
    );
    let manifest = std::fs::read_to_string(scratch.path(&fixture)).unwrap().replace(
        &goal_line,
        &format!("{goal_line}\nmode = \"persistent\"\nmax_inflight = 8\nconcurrency = 8"),
    );
    scratch.write("experiments/pipelined.toml", &manifest);
    let (status, folder, stderr) = scratch.run(
        "experiments/pipelined.toml",
        &["--set", "run.cache=\"cache-pipelined\""],
    );
    assert_eq!(status, 0, "{stderr}");
    // How a callback is called (mode, concurrency, max_inflight) is not what was run.
    assert!(
        std::fs::read(folder.join("report.json")).unwrap()
            == std::fs::read(plain.join("report.json")).unwrap(),
        "report.json differs"
    );
}

#[test]
fn max_inflight_needs_a_persistent_callback() {
    let scratch = Scratch::new();
    let manifest = scratch.fixture_with("bad", "builtin = \"goal-line\"\nmax_inflight = 4");
    let (status, _, stderr) = scratch.run(&manifest, &[]);
    assert_eq!(status, 2, "{stderr}");
    assert!(
        stderr.contains("max_inflight = 4") && stderr.contains("mode = \"persistent\""),
        "{stderr}"
    );
}

/// A worker that answers each group of requests that have arrived in reverse order.
const REVERSING: &str = r#"import json, select, sys
def memory(request):
    keyword = request["goal"].split()[-1].lower()
    return "\n".join(line for line in request["context"].splitlines() if keyword in line.lower())
while True:
    line = sys.stdin.readline()
    if not line:
        break
    batch = [json.loads(line)]
    while len(batch) < 8 and select.select([sys.stdin], [], [], 0.02)[0]:
        more = sys.stdin.readline()
        if not more:
            break
        batch.append(json.loads(more))
    for request in reversed(batch):
        sys.stdout.write(json.dumps({"id": request["id"], "memory": memory(request)}) + "\n")
    sys.stdout.flush()
"#;

#[test]
fn replies_in_any_order_are_matched_by_their_id() {
    let Some((scratch, plain)) = python_and_the_fixture() else {
        eprintln!("skipped: python3 is not on PATH");
        return;
    };
    scratch.write("experiments/callbacks/reversing.py", REVERSING);
    let manifest = scratch.fixture_with("reversing",
        "command = [\"python3\", \"callbacks/reversing.py\"]\nmode = \"persistent\"\nmax_inflight = 8\nconcurrency = 8",
    );
    let (status, folder, stderr) = scratch.run(&manifest, &["--set", "run.cache=\"cache-reversing\""]);
    assert_eq!(status, 0, "{stderr}");
    assert_eq!(
        read_json(&folder.join("report.json"))["cells"],
        read_json(&plain.join("report.json"))["cells"]
    );
}

/// A compressor on the helper with `batch_size`; it notes each batch's size in `batches.log`,
/// and the first time it gets a batch of two or more it dies with them in flight.
const BATCHING: &str = r#"import os, sys
from gacc_callback import compressor, serve

@compressor(batch_size=8)
def compress(requests):
    with open("batches.log", "a") as log:
        log.write(f"{len(requests)}\n")
    if len(requests) > 1 and not os.path.exists("died"):
        open("died", "w").close()
        os._exit(3)
    replies = []
    for request in requests:
        keyword = request["goal"].split()[-1].lower()
        replies.append("\n".join(l for l in request["context"].splitlines() if keyword in l.lower()))
    return replies

if __name__ == "__main__":
    sys.exit(serve())
"#;

#[test]
fn the_helper_serves_batches_and_a_worker_killed_with_requests_in_flight_loses_none() {
    let Some((scratch, plain)) = python_and_the_fixture() else {
        eprintln!("skipped: python3 is not on PATH");
        return;
    };
    scratch.copy_helper();
    scratch.write("experiments/callbacks/batching.py", BATCHING);
    // Unsandboxed: it writes its log and marker beside the manifest.
    let manifest = scratch.fixture_with("batching",
        "command = [\"python3\", \"callbacks/batching.py\"]\nmode = \"persistent\"\nmax_inflight = 8\nconcurrency = 8\nsandbox = false",
    );
    let (status, folder, stderr) = scratch.run(&manifest, &["--set", "run.cache=\"cache-batching\""]);
    assert_eq!(status, 0, "{stderr}");
    assert!(
        scratch.path("experiments/died").exists(),
        "the worker never died with a batch in flight"
    );
    let report = read_json(&folder.join("report.json"));
    assert!(
        report["failures"].as_array().unwrap().is_empty(),
        "{}",
        report["failures"]
    );
    assert_eq!(report["cells"], read_json(&plain.join("report.json"))["cells"]);
    let sizes: Vec<usize> = std::fs::read_to_string(scratch.path("experiments/batches.log"))
        .unwrap()
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    assert!(
        sizes.iter().any(|n| *n > 1) && sizes.iter().all(|n| *n <= 8),
        "{sizes:?}"
    );
}
