//! What compression costs (SPEC §15): per cell the compressor calls' cost and wall time (kept
//! with their cache entries, so a cached re-run reports the same), break-even questions against
//! a priced model reader, the cost–quality frontier with its Pareto ranks, and where each shows:
//! report.md, report.html, `gacc view`, `gacc diff`, the paper tables and `gacc verify`.

use std::collections::HashMap;

use serde_json::Value;

use crate::common;
use common::mock_api::{Behaviour, Format, MockApi, PRICE};
use common::{Scratch, made, read_json, read_lines};

/// What the paid compressor says each call cost.
const CALL_USD: f64 = 0.002;

/// The fixture's dataset with a paid compressor (`goal-line` behind a script that takes 0.15 s
/// and reports `usage` of `cost` USD a call), a free one (`prefix`), two ratios, and a model
/// reader at the mock with a price.
fn manifest(scratch: &Scratch, api: &MockApi, name: &str, cost: f64) -> String {
    let script = format!("experiments/{name}.sh");
    scratch.script(
        &script,
        &format!(
            "#!/bin/sh\nrequest=$(cat)\nsleep 0.15\nprintf '%s' \"$request\" | @GACC@ callback goal-line | sed 's/^{{/{{\"usage\":{{\"input_tokens\":100,\"output_tokens\":20,\"cost_usd\":{cost}}},/'\n"
        ),
    );
    let path = format!("experiments/{name}.toml");
    scratch.write(
        &path,
        &format!(
            r#"name = "{name}"
seeds = [42]
ratios = [0.15, 0.5]
conditions = ["own-goal"]

[dataset]
path = "data/fixture.jsonl"

[models.mock]
api = "openai-chat"
base_url = "{url}"
model = "mock-1"
api_key_env = "MOCK_API_KEY"
{PRICE}

[compressors.paid]
command = ["./{name}.sh"]
sandbox = false

[compressors.free]
builtin = "prefix"

[reader]
builtin = "llm-reader"
params = {{ model = "mock" }}

[judge]
builtin = "exact"
"#,
            url = api.url
        ),
    );
    path
}

/// The nearest-rank percentile of `values` (seconds from milliseconds), as docs/run-folder.md
/// defines `p50_s` and `p95_s`.
fn nearest_rank(values: &mut [u64], p: f64) -> f64 {
    values.sort_unstable();
    let rank = ((p * values.len() as f64).ceil() as usize).max(1);
    values[rank - 1] as f64 / 1000.0
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-12 * a.abs().max(b.abs()).max(1.0)
}

#[test]
fn each_cell_says_what_its_memories_cost_when_they_pay_and_which_settings_are_on_the_frontier() {
    let scratch = Scratch::new();
    let api = MockApi::start(Format::OpenAi, Behaviour::default());
    let env = [("MOCK_API_KEY", common::mock_api::KEY)];
    let path = manifest(&scratch, &api, "costs", CALL_USD);
    let (status, folder, stderr) = scratch.run_with_env(&path, &[], &env);
    assert_eq!(status, 0, "{stderr}");
    let report = read_json(&folder.join("report.json"));
    let memories = read_lines(&folder.join("memories.jsonl.gz"));

    // Each call's wall time, from the trace: the attempt that answered it, by its cache key.
    let wall: HashMap<String, u64> = read_lines(&folder.join("trace.jsonl"))
        .iter()
        .filter(|e| {
            e["message"] == "callback attempt" && e["callback"] == "compressors.paid" && e["ok"] == true
        })
        .map(|e| {
            (
                e["key"].as_str().unwrap().to_owned(),
                e["duration_ms"].as_u64().unwrap(),
            )
        })
        .collect();
    assert!(!wall.is_empty() && wall.values().all(|&ms| ms >= 150), "{wall:?}");

    let reader_price = 1.0 / 1e6;
    let cells = report["cells"].as_array().unwrap();
    // How long the calls took is run.json's, a cell each in report.json's order.
    let timed = read_json(&folder.join("run.json"))["compression"].clone();
    assert_eq!(timed.as_array().unwrap().len(), cells.len());
    let mut paid_calls = 0;
    for (at, cell) in cells.iter().enumerate() {
        let took = &timed[at];
        assert_eq!(
            (&took["compressor"], &took["ratio"]),
            (&cell["compressor"], &cell["ratio"])
        );
        let (compressor, ratio) = (cell["compressor"].as_str().unwrap(), &cell["ratio"]);
        let rows: Vec<&Value> = (memories.iter())
            .filter(|m| {
                m["compressor"] == compressor && m["ratio"] == *ratio && m["budget"].as_u64() > Some(0)
            })
            .collect();
        let compression = &cell["compression"];
        let read_cost = &cell["read_cost"];
        assert_eq!(compression["calls"], rows.len(), "{cell}");
        let saved: u64 = rows
            .iter()
            .map(|m| m["source_tokens"].as_u64().unwrap() - m["budget"].as_u64().unwrap())
            .sum();
        if compressor == "paid" {
            paid_calls += rows.len();
            let mut times: Vec<u64> = rows
                .iter()
                .map(|m| wall[m["cache_key"].as_str().unwrap()])
                .collect();
            assert_eq!(took["p50_s"], nearest_rank(&mut times, 0.5), "{took}");
            assert_eq!(took["p95_s"], nearest_rank(&mut times, 0.95), "{compression}");
            let usd = CALL_USD * rows.len() as f64;
            assert!(close(compression["usd"].as_f64().unwrap(), usd), "{compression}");
            assert_eq!(compression["input_tokens"], 100 * rows.len());
            let break_even = usd / (reader_price * saved as f64);
            let stated = read_cost["break_even_questions"].as_f64().unwrap();
            assert!(close(stated, break_even), "{stated} != {break_even}");
        } else {
            assert!(
                took["p50_s"].is_null(),
                "an in-process built-in's time is gacc's own"
            );
            assert_eq!(compression["usd"], 0.0);
            assert!(
                read_cost["break_even_questions"].is_null(),
                "a free compressor never needs to pay for itself"
            );
        }
        assert!(read_cost["reader_usd"].as_f64().unwrap() > 0.0, "{read_cost}");
        let questions = read_lines(&folder.join("results.jsonl.gz"))
            .iter()
            .filter(|r| r["compressor"] == compressor && r["ratio"] == *ratio)
            .count();
        assert_eq!(read_cost["questions"], questions);
    }
    assert_eq!(
        paid_calls,
        wall.len(),
        "one call per memory of the paid compressor"
    );
    // The reader's cost per cell: each distinct read once, together what the endpoint billed
    // for reading (no read is shared by two cells here: their memories all differ).
    let reader_total: f64 = cells
        .iter()
        .map(|c| c["read_cost"]["reader_usd"].as_f64().unwrap())
        .sum();
    let billed = report["endpoints"]["mock"]["by_role"]["reader"]["cost_usd"]
        .as_f64()
        .unwrap();
    assert!(close(reader_total, billed), "{reader_total} != {billed}");

    frontier_is_every_cell_ranked(&report);
    shown_everywhere(&scratch, &folder, &report);

    // A cached re-run: no call, the same cost and wall time (the same report.json, byte for
    // byte); its run.json says every call came from the cache, the first's that none did.
    let cached = |folder: &std::path::Path| -> Vec<(u64, u64)> {
        (read_json(&folder.join("run.json"))["compression"]
            .as_array()
            .unwrap()
            .iter())
        .map(|c| (c["calls"].as_u64().unwrap(), c["cached"].as_u64().unwrap()))
        .collect()
    };
    assert!(
        cached(&folder)
            .iter()
            .all(|&(calls, found)| calls > 0 && found == 0)
    );
    let (status, again, stderr) = scratch.run_with_env(&path, &[], &env);
    assert_eq!(status, 0, "{stderr}");
    assert_eq!(made(&again, "compressor"), 0);
    let rerun = read_json(&again.join("report.json"));
    for (first, second) in cells.iter().zip(rerun["cells"].as_array().unwrap()) {
        assert_eq!(first["compression"], second["compression"]);
        assert_eq!(first["read_cost"], second["read_cost"]);
    }
    assert_eq!(
        std::fs::read(folder.join("report.json")).unwrap(),
        std::fs::read(again.join("report.json")).unwrap()
    );
    assert!(cached(&again).iter().all(|&(calls, found)| calls == found));
    let times = |folder: &std::path::Path| -> Vec<(Value, Value)> {
        (read_json(&folder.join("run.json"))["compression"]
            .as_array()
            .unwrap()
            .iter())
        .map(|c| (c["p50_s"].clone(), c["p95_s"].clone()))
        .collect()
    };
    assert_eq!(
        times(&folder),
        times(&again),
        "the calls' own times, from their entries"
    );
    let markdown = std::fs::read_to_string(again.join("report.md")).unwrap();
    let calls: u64 = cached(&again).iter().map(|&(calls, _)| calls).sum();
    let line = format!("This run found {calls} of these {calls} compressor calls in the cache");
    assert!(markdown.contains(&line), "{markdown}");

    // The figures follow from the cache entries: verify recomputes them, and a forged one is
    // named.
    let (status, printed) = scratch.verify_bare(&folder);
    assert_eq!(status, 0, "{printed}");
    assert!(printed.contains("verified"), "{printed}");
    let forged = folder.parent().unwrap().join("forged");
    std::fs::create_dir_all(&forged).unwrap();
    for entry in std::fs::read_dir(&folder).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), forged.join(entry.file_name())).unwrap();
    }
    let mut lie = report.clone();
    lie["cells"][2]["compression"]["usd"] = 0.0.into();
    lie["cells"][2]["read_cost"]["break_even_questions"] = 1.0.into();
    lie["frontier"][0]["pareto_rank"] = 7.into();
    std::fs::write(
        forged.join("report.json"),
        serde_json::to_string_pretty(&lie).unwrap(),
    )
    .unwrap();
    let (status, printed) = scratch.verify_bare(&forged);
    assert_eq!(status, 1, "{printed}");
    for field in [
        "cells[2].compression.usd",
        "cells[2].read_cost.break_even_questions",
        "frontier[0].pareto_rank",
    ] {
        assert!(
            printed.contains(&format!("report.json: {field}: stated")),
            "{field}: {printed}"
        );
    }

    // Made free, the paid compressor's settings cost what the free one's do: those that score
    // higher join the frontier, and `gacc diff` says so.
    let free = manifest(&scratch, &api, "costs-free", 0.0);
    let (status, other, stderr) = scratch.run_with_env(&free, &[], &env);
    assert_eq!(status, 0, "{stderr}");
    let on = |report: &Value| -> Vec<String> {
        (report["frontier"].as_array().unwrap().iter())
            .filter(|p| p["pareto_rank"] == 1)
            .map(|p| format!("{} {}", p["compressor"].as_str().unwrap(), p["ratio"]))
            .collect()
    };
    let (before, after) = (on(&report), on(&read_json(&other.join("report.json"))));
    let (a, b) = (folder.to_str().unwrap(), other.to_str().unwrap());
    let diff = scratch.json(["diff", a, b, "--format", "json"]);
    let named = |list: &Value| -> Vec<String> {
        (list.as_array().unwrap().iter())
            .map(|c| {
                format!(
                    "{} {}",
                    c["compressor"].as_str().unwrap(),
                    c["ratio"].as_str().unwrap()
                )
            })
            .collect()
    };
    let joined: Vec<String> = after.iter().filter(|p| !before.contains(p)).cloned().collect();
    let left: Vec<String> = before.iter().filter(|p| !after.contains(p)).cloned().collect();
    assert!(!joined.is_empty() || !left.is_empty(), "{before:?} {after:?}");
    assert_eq!(named(&diff["frontier"]["joined"]), joined, "{diff}");
    assert_eq!(named(&diff["frontier"]["left"]), left, "{diff}");
    let text = scratch.stdout(["diff", a, b]);
    assert!(text.contains("## Frontier"), "{text}");
    for point in &joined {
        let (compressor, ratio) = point.split_once(' ').unwrap();
        assert!(
            text.contains(&format!(
                "- {compressor} · own-goal · {ratio}: joined the frontier"
            )),
            "{text}"
        );
    }
}

/// Every cell with a Micro is a point; its cost per question is its compression and reading
/// over its questions; rank 1 exactly where no other point costs no more and scores no less,
/// one strictly; rank k where only points of lower rank dominate it.
fn frontier_is_every_cell_ranked(report: &Value) {
    let points = report["frontier"].as_array().unwrap();
    let cells = report["cells"].as_array().unwrap();
    assert_eq!(points.len(), cells.len());
    let by_cell: HashMap<String, &Value> = (cells.iter())
        .map(|c| (format!("{} {}", c["compressor"], c["ratio"]), c))
        .collect();
    let at = |p: &Value| {
        (
            p["usd_per_question"].as_f64().unwrap(),
            p["micro"].as_f64().unwrap(),
        )
    };
    for point in points {
        let cell = by_cell[&format!("{} {}", point["compressor"], point["ratio"])];
        let usd =
            cell["compression"]["usd"].as_f64().unwrap() + cell["read_cost"]["reader_usd"].as_f64().unwrap();
        let questions = cell["read_cost"]["questions"].as_f64().unwrap();
        assert!(close(at(point).0, usd / questions), "{point}");
        assert_eq!(at(point).1, cell["micro"]["mean"].as_f64().unwrap());
    }
    let dominates = |a: (f64, f64), b: (f64, f64)| a.0 <= b.0 && a.1 >= b.1 && (a.0 < b.0 || a.1 > b.1);
    for point in points {
        let rank = point["pareto_rank"].as_u64().unwrap();
        let dominated_by: Vec<u64> = (points.iter())
            .filter(|other| dominates(at(other), at(point)))
            .map(|other| other["pareto_rank"].as_u64().unwrap())
            .collect();
        assert_eq!(rank == 1, dominated_by.is_empty(), "{point}");
        assert_eq!(rank, dominated_by.iter().max().map_or(1, |r| r + 1), "{point}");
    }
    let paid_dominated = points
        .iter()
        .any(|p| p["compressor"] == "paid" && p["pareto_rank"] != 1);
    let on_front = points.iter().filter(|p| p["pareto_rank"] == 1).count();
    assert!(on_front >= 1 && (paid_dominated || on_front == points.len()));
}

/// report.md lists the frontier and break-even; report.html and `gacc view` plot it; the LaTeX
/// tables carry it.
fn shown_everywhere(scratch: &Scratch, folder: &std::path::Path, report: &Value) {
    let markdown = std::fs::read_to_string(folder.join("report.md")).unwrap();
    for needle in [
        "## What compression costs",
        "**The frontier**",
        "break-even",
        "- own-goal: ",
    ] {
        assert!(markdown.contains(needle), "report.md lacks {needle:?}");
    }
    for point in report["frontier"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["pareto_rank"] == 1)
    {
        let shown = format!("{} r={}", point["compressor"].as_str().unwrap(), point["ratio"]);
        assert!(markdown.contains(&shown), "report.md lacks {shown}");
    }
    let html = std::fs::read_to_string(folder.join("report.html")).unwrap();
    assert!(html.contains("Micro against cost per question, the frontier marked"));
    assert!(
        html.contains("frontier · own-goal"),
        "the chart's panel is inlined"
    );
    let latex = scratch.stdout(["report", folder.to_str().unwrap(), "--format", "latex"]);
    let frontier = latex
        .split("\\begin{table}")
        .find(|t| t.contains("Pareto rank"))
        .unwrap();
    let starred = frontier.matches("$\\star$ ").count() - 1; // one is the caption's
    let on_front = (report["frontier"].as_array().unwrap().iter())
        .filter(|p| p["pareto_rank"] == 1)
        .count();
    assert_eq!(starred, on_front, "{frontier}");
    for rule in ["\\toprule", "\\midrule", "\\bottomrule"] {
        assert_eq!(frontier.matches(rule).count(), 1);
    }
}
