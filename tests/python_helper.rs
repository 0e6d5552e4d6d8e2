//! The Python helper (`python/gacc_callback/`) under gacc: one script serves oneshot and
//! persistent mode with the same results, and output on fd 1 never corrupts the protocol.

mod common;

use common::{Scratch, python3_on_path, read_json};
use serde_json::Value;

/// A compressor on the helper that keeps the goal's keyword lines, and writes to stdout both
/// through print() and straight to fd 1.
const NOISY: &str = r#"import os, sys
from gacc_callback import compressor, serve, setup

@setup
def load():
    print("loading")
    os.write(1, b"a C library says hello on fd 1\n")

@compressor
def keep(context, goal, **_):
    print("compressing for", goal)
    os.write(1, b'{"memory": "not the reply"}\n')
    keyword = goal.split()[-1].lower()
    return "\n".join(line for line in context.splitlines() if keyword in line.lower())

if __name__ == "__main__":
    sys.exit(serve())
"#;

fn report_without_manifest_hash(folder: &std::path::Path) -> Value {
    let mut report = read_json(&folder.join("report.json"));
    report["experiment"]["manifest_sha256"] = Value::Null;
    report
}

#[test]
fn the_helper_gives_the_same_report_in_both_modes_whatever_it_prints() {
    if !python3_on_path() {
        eprintln!("skipped: python3 is not on PATH");
        return;
    }
    let scratch = Scratch::new();
    scratch.copy_helper();
    scratch.write("experiments/callbacks/noisy.py", NOISY);
    let manifest = scratch.fixture_with("helper", "command = [\"python3\", \"callbacks/noisy.py\"]");
    let mut reports = Vec::new();
    for mode in ["oneshot", "persistent"] {
        let set = format!("compressors.goal-line.mode=\"{mode}\"");
        let cache = format!("run.cache=\"cache-{mode}\"");
        let (status, folder, stderr) = scratch.run(&manifest, &["--set", &set, "--set", &cache]);
        assert_eq!(status, 0, "{mode}: {stderr}");
        let run = read_json(&folder.join("run.json"));
        assert_eq!(run["calls"]["compressor"]["made"], 12, "{mode}");
        let report = read_json(&folder.join("report.json"));
        assert_eq!(
            report["holdout"]["compressor"]["holdout_enforced"], true,
            "{mode}: sandboxed"
        );
        reports.push(report_without_manifest_hash(&folder));
    }
    assert_eq!(reports[0], reports[1], "the same results in both modes");
    // The same memories the built-in goal-line keeps: Micro 2/3 on every seed.
    assert_eq!(
        reports[0]["cells"][0]["micro"]["mean"].as_f64().unwrap(),
        2.0 / 3.0
    );
}
