//! Absolute budgets (`budgets = [64, 256]`): `L = min(b, N)`, cells beside the ratio cells in
//! every view, and calls shared with a ratio that gives the same `L`.

use crate::common;

use common::{Scratch, read_json, read_lines};
use serde_json::Value;

fn with_budgets(scratch: &Scratch, ratios: &str, budgets: &str) -> String {
    let manifest = std::fs::read_to_string(scratch.path("experiments/fixture.toml"))
        .unwrap()
        .replace(
            "ratios = [0.15]",
            &format!("ratios = {ratios}\nbudgets = {budgets}"),
        );
    assert!(manifest.contains("budgets ="), "the fixture's ratios line moved");
    scratch.write("experiments/budgets.toml", &manifest);
    "experiments/budgets.toml".into()
}

#[test]
fn budget_cells_stand_beside_ratio_cells_and_never_exceed_the_source() {
    let scratch = Scratch::new();
    let manifest = with_budgets(&scratch, "[0.5]", "[64, 256]");
    let (status, folder, stderr) = scratch.run(&manifest, &[]);
    assert_eq!(status, 0, "{stderr}");
    let report = read_json(&folder.join("report.json"));
    let cells = report["cells"].as_array().unwrap();
    let labels: Vec<String> = cells
        .iter()
        .map(|c| match c.get("budget_tokens") {
            Some(tokens) => format!("L={tokens}"),
            None => format!("r={}", c["ratio"]),
        })
        .collect();
    assert_eq!(labels, ["r=0.5", "L=64", "L=256"]);
    assert_eq!(report["experiment"]["budgets"], serde_json::json!([64, 256]));
    assert!(cells.iter().all(|c| c["complete"] == true));

    for row in read_lines(&folder.join("memories.jsonl.gz")) {
        let n = row["source_tokens"].as_u64().unwrap();
        let expected = match row.get("budget_tokens") {
            Some(tokens) => tokens.as_u64().unwrap().min(n),
            None => n / 2,
        };
        assert_eq!(row["budget"].as_u64().unwrap(), expected, "{row}");
        assert!(row["retained_tokens"].as_u64().unwrap() <= expected);
    }
    // L = 256 is every whole source here: each of its answers is the full-context one.
    let integrity = &report["integrity"];
    assert_eq!(
        (
            integrity["budget_violations"].as_u64(),
            integrity["count_errors"].as_u64()
        ),
        (Some(0), Some(0))
    );

    // Every view shows them: the terminal, report.md, the charts, report.html, diff, export.
    assert!(stderr.contains("L=64") && stderr.contains("r=0.5"), "{stderr}");
    let markdown = std::fs::read_to_string(folder.join("report.md")).unwrap();
    assert!(markdown.contains("| goal-line | own-goal | L=64 |"), "{markdown}");
    assert!(markdown.contains("budgets (tokens): 64, 256"), "{markdown}");
    assert!(folder.join("micro-tokens.svg").is_file() && folder.join("micro.svg").is_file());
    let page = std::fs::read_to_string(folder.join("report.html")).unwrap();
    assert!(page.contains("Micro against the budget in tokens"));
    let (status, _, stderr) = scratch.run(&manifest, &["-q"]);
    assert_eq!(status, 0, "{stderr}");
    let diff = scratch.json(["diff", "-2", "latest", "--format", "json"]);
    let named: Vec<&str> = diff["cells"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["ratio"].as_str().unwrap())
        .collect();
    assert_eq!(named, ["0.5", "L=64", "L=256"]);
    let csv = scratch.gacc().args(["export", "latest"]).output().unwrap();
    let csv = String::from_utf8(csv.stdout).unwrap();
    assert!(csv.lines().next().unwrap().contains(",ratio,budget_tokens,"));
    assert!(csv.lines().any(|l| l.contains(",own-goal,,64,")), "{csv}");
    // `run --json` names each cell as report.json does: a budget cell by its tokens.
    let summary = scratch.json(["run", &manifest, "-q", "--json"]);
    let named: Vec<String> = summary["cells"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| match (c.get("ratio"), c.get("budget_tokens")) {
            (Some(ratio), None) => format!("r={ratio}"),
            (None, Some(tokens)) => format!("L={tokens}"),
            _ => panic!("a cell named by both or neither: {c}"),
        })
        .collect();
    assert_eq!(named, ["r=0.5", "L=64", "L=256"]);
    assert!(
        summary["cells"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c["micro"]["mean"].is_number())
    );
}

#[test]
fn a_ratio_and_a_budget_with_the_same_budget_share_their_calls() {
    let scratch = Scratch::new();
    // r = 1 and b = 100000 both give L = N for every source.
    let manifest = with_budgets(&scratch, "[1]", "[100000]");
    let (status, folder, stderr) = scratch.run(&manifest, &[]);
    assert_eq!(status, 0, "{stderr}");
    let run = read_json(&folder.join("run.json"));
    // 4 goals × 3 seeds distinct compressor calls, however many cells ask for them.
    assert_eq!(run["calls"]["compressor"]["made"], 12, "{run}");
    let report = read_json(&folder.join("report.json"));
    let micro: Vec<&Value> = report["cells"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| &c["micro"]["mean"])
        .collect();
    assert_eq!(micro[0], micro[1]);
}

#[test]
fn a_manifest_needs_ratios_or_budgets() {
    let scratch = Scratch::new();
    let manifest = std::fs::read_to_string(scratch.path("experiments/fixture.toml"))
        .unwrap()
        .replace("ratios = [0.15]\n", "");
    scratch.write("experiments/none.toml", &manifest);
    let output = scratch
        .gacc()
        .args(["validate", "experiments/none.toml"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&output.stderr)
            .contains("key `ratios`: must list at least one value (or give `budgets`")
    );
    // Budgets alone are enough.
    let only = with_budgets(&scratch, "[]", "[32]");
    let (status, _, stderr) = scratch.run(&only, &["-q"]);
    assert_eq!(status, 0, "{stderr}");
}
