//! What explains a score (SPEC §11), recounted from a run's rows: evidence kept or lost, the
//! floor and the ceiling, budget at target and the curves that dip, scores per tag.

use crate::common;

use std::collections::{BTreeMap, HashMap};

use common::mock_api::{Behaviour, Format, MockApi};
use common::{Scratch, read_json, read_lines};
use serde_json::Value;

/// SQuAD's normalisation, written out again: lowercase, no ASCII punctuation, no articles,
/// single spaces.
fn normalise(text: &str) -> String {
    let lower: String = text
        .to_lowercase()
        .chars()
        .filter(|c| !c.is_ascii_punctuation())
        .collect();
    let words: Vec<&str> = lower
        .split_whitespace()
        .filter(|w| !["a", "an", "the"].contains(w))
        .collect();
    words.join(" ")
}

/// Whether `memory` keeps `span`: its normalised text occurs in the memory's.
fn keeps(memory: &str, span: &str) -> bool {
    normalise(memory).contains(&normalise(span))
}

/// A question's spans as the dataset states them, or its reference; and whether stated.
fn spans(question: &Value) -> (Vec<String>, bool) {
    match &question["evidence"] {
        Value::String(span) => (vec![span.clone()], true),
        Value::Array(spans) => (
            spans.iter().map(|s| s.as_str().unwrap().to_owned()).collect(),
            true,
        ),
        _ => (vec![question["reference"].as_str().unwrap().to_owned()], false),
    }
}

fn cell_name(row: &Value) -> String {
    format!(
        "{}/{}/{}",
        row["compressor"].as_str().unwrap(),
        row["condition"].as_str().unwrap(),
        row["ratio"]
    )
}

fn mean(values: &[f64]) -> Option<f64> {
    (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64)
}

/// The share of `true` among the known verdicts, per seed, averaged over seeds.
fn per_seed_share(rows: &[&Value], verdict: impl Fn(&Value) -> Option<bool>) -> Option<f64> {
    let mut seeds: BTreeMap<u64, (usize, usize)> = BTreeMap::new();
    for row in rows {
        if let Some(v) = verdict(row) {
            let seed = seeds.entry(row["seed"].as_u64().unwrap()).or_default();
            seed.0 += usize::from(v);
            seed.1 += 1;
        }
    }
    let shares: Vec<f64> = seeds.values().map(|(r, n)| *r as f64 / *n as f64).collect();
    mean(&shares)
}

/// Macro over the goals (per seed) that pass `keep`, averaged over seeds.
fn per_seed_macro(rows: &[&Value], keep: impl Fn(&[&Value]) -> bool) -> Option<f64> {
    let mut goals: BTreeMap<(u64, String), Vec<&Value>> = BTreeMap::new();
    for row in rows {
        let key = (
            row["seed"].as_u64().unwrap(),
            row["goal_id"].as_str().unwrap().to_owned(),
        );
        goals.entry(key).or_default().push(row);
    }
    let mut seeds: BTreeMap<u64, (usize, usize)> = BTreeMap::new();
    for ((seed, _), rows) in &goals {
        if !keep(rows) {
            continue;
        }
        let entry = seeds.entry(*seed).or_default();
        entry.0 += usize::from(rows.iter().all(|r| r["correct"] == true));
        entry.1 += 1;
    }
    let shares: Vec<f64> = seeds.values().map(|(r, n)| *r as f64 / *n as f64).collect();
    mean(&shares)
}

fn close(a: Option<f64>, b: &Value, what: &str) {
    match (a, b.as_f64()) {
        (Some(a), Some(b)) => assert!((a - b).abs() < 1e-12, "{what}: recounted {a}, reported {b}"),
        (None, None) => {}
        (a, _) => panic!("{what}: recounted {a:?}, reported {b}"),
    }
}

#[test]
fn every_cells_evidence_floor_and_ceiling_recount_from_the_rows_alone() {
    let scratch = Scratch::new();
    let (status, folder, stderr) = scratch.run("experiments/baselines.toml", &["-q"]);
    assert_eq!(status, 0, "{stderr}");
    let results = read_lines(&folder.join("results.jsonl.gz"));
    let memories = read_lines(&folder.join("memories.jsonl.gz"));
    let texts: HashMap<String, String> = read_lines(&folder.join("memory_texts.jsonl.gz"))
        .into_iter()
        .map(|t| {
            (
                t["sha256"].as_str().unwrap().to_owned(),
                t["memory"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let memory_of: HashMap<&str, &str> = memories
        .iter()
        .map(|m| {
            (
                m["key"].as_str().unwrap(),
                texts[m["memory_sha256"].as_str().unwrap()].as_str(),
            )
        })
        .collect();
    let dataset = read_lines(&folder.join("dataset.jsonl"));
    let questions: HashMap<&str, &Value> = dataset
        .iter()
        .flat_map(|s| s["goals"].as_array().unwrap())
        .flat_map(|g| g["questions"].as_array().unwrap())
        .map(|q| (q["id"].as_str().unwrap(), q))
        .collect();

    // Each row's evidence_kept, recounted from its memory's text and its question's spans.
    let mut kept_any = (0, 0);
    for row in &results {
        let memory = memory_of[row["memory_key"].as_str().unwrap()];
        let (spans, stated) = spans(questions[row["question_id"].as_str().unwrap()]);
        let kept = spans.iter().filter(|s| keeps(memory, s)).count();
        assert_eq!(
            row["evidence_kept"].as_f64().unwrap(),
            kept as f64 / spans.len() as f64,
            "{row}"
        );
        assert_eq!(
            row["evidence_basis"],
            if stated { "evidence" } else { "reference" }
        );
        kept_any.0 += usize::from(kept == spans.len());
        kept_any.1 += usize::from(kept < spans.len());
    }
    assert!(
        kept_any.0 > 0 && kept_any.1 > 0,
        "memories both keep and lose evidence: {kept_any:?}"
    );

    // Each cell's counts and anchors, recounted from its rows.
    let mut by_cell: BTreeMap<String, Vec<&Value>> = BTreeMap::new();
    for row in &results {
        by_cell.entry(cell_name(row)).or_default().push(row);
    }
    let report = read_json(&folder.join("report.json"));
    let cells = report["cells"].as_array().unwrap();
    assert_eq!(cells.len(), by_cell.len());
    let mut seen = [0usize; 4];
    for cell in cells {
        let rows = &by_cell[&cell_name(cell)];
        let mut counts = [0usize; 4];
        for row in rows {
            assert!(row["failure"].is_null() && row["correct"].is_boolean());
            let kept = row["evidence_kept"].as_f64().unwrap() == 1.0;
            let right = row["correct"] == true;
            counts[usize::from(!kept) * 2 + usize::from(!right)] += 1;
        }
        let a = &cell["attribution"];
        let reported =
            ["kept_right", "kept_wrong", "lost_right", "lost_wrong"].map(|k| a[k].as_u64().unwrap() as usize);
        assert_eq!(reported, counts, "{}", cell_name(cell));
        for (total, count) in seen.iter_mut().zip(counts) {
            *total += count;
        }
        let floor = per_seed_share(rows, |r| r["floor_correct"].as_bool());
        let ceiling = per_seed_share(rows, |r| r["ceiling_correct"].as_bool());
        let micro = cell["micro"]["mean"].as_f64();
        close(floor, &cell["floor_micro"], "floor_micro");
        close(ceiling, &cell["ceiling_micro"], "ceiling_micro");
        let gap = match (micro, floor, ceiling) {
            (Some(m), Some(f), Some(c)) if c != f => Some((m - f) / (c - f)),
            _ => None,
        };
        close(gap, &cell["gap_closed"], "gap_closed");
        let closed_book = rows.iter().filter(|r| r["floor_correct"] == true).count();
        assert_eq!(cell["closed_book"], closed_book);
        let open: Vec<&Value> = rows
            .iter()
            .copied()
            .filter(|r| r["floor_correct"] == false)
            .collect();
        close(
            per_seed_share(&open, |r| r["correct"].as_bool()),
            &cell["micro_open"],
            "micro_open",
        );
        let macro_open = per_seed_macro(rows, |goal| !goal.iter().all(|r| r["floor_correct"] == true));
        close(macro_open, &cell["macro_open"], "macro_open");
    }
    assert!(
        seen[0] > 0 && seen[3] > 0,
        "cells keep right and lose wrong: {seen:?}"
    );

    // Budget at target, recounted: the smallest ratio whose Micro reaches 0.9 × the ceiling.
    for target in report["budget_at_target"].as_array().unwrap() {
        let mut curve: Vec<&Value> = cells
            .iter()
            .filter(|c| c["compressor"] == target["compressor"] && c["condition"] == target["condition"])
            .collect();
        curve.sort_by(|a, b| {
            a["ratio"]
                .as_f64()
                .unwrap()
                .total_cmp(&b["ratio"].as_f64().unwrap())
        });
        let ceiling = curve[0]["ceiling_micro"].as_f64().unwrap();
        assert_eq!(target["of"], "ceiling");
        let reached = curve
            .iter()
            .find(|c| c["micro"]["mean"].as_f64().unwrap() >= 0.9 * ceiling - 1e-12);
        assert_eq!(
            target["budget"]["ratio"],
            reached.map_or(Value::Null, |c| c["ratio"].clone()),
            "{target}"
        );
    }

    // Scores per tag: Micro of the rows whose question carries it, per seed, averaged.
    let tag_of: HashMap<&str, Vec<&str>> = questions
        .iter()
        .map(|(id, q)| {
            (
                *id,
                q["tags"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|t| t.as_str().unwrap())
                    .collect(),
            )
        })
        .collect();
    let by_tag = report["by_tag"].as_array().unwrap();
    let number = by_tag
        .iter()
        .find(|t| t["on"] == "question" && t["tag"] == "number")
        .unwrap();
    for (cell, scored) in cells.iter().zip(number["cells"].as_array().unwrap()) {
        let rows: Vec<&Value> = by_cell[&cell_name(cell)]
            .iter()
            .copied()
            .filter(|r| tag_of[r["question_id"].as_str().unwrap()].contains(&"number"))
            .collect();
        close(
            per_seed_share(&rows, |r| r["correct"].as_bool()),
            &scored["micro"],
            "by_tag micro",
        );
        assert_eq!(scored["rows"], rows.len());
    }
    let genre = by_tag.iter().find(|t| t["on"] == "source").unwrap();
    assert!(genre["cells"][0]["macro"].is_number(), "a source tag has Macro");

    // Micro and Macro are those of the same run without evidence, tags or anchors.
    let plain_data: Vec<String> = dataset
        .iter()
        .map(|source| {
            let mut source = source.clone();
            source.as_object_mut().unwrap().remove("tags");
            for goal in source["goals"].as_array_mut().unwrap() {
                for question in goal["questions"].as_array_mut().unwrap() {
                    let question = question.as_object_mut().unwrap();
                    question.remove("evidence");
                    question.remove("tags");
                }
            }
            source.to_string()
        })
        .collect();
    scratch.write("experiments/data/plain.jsonl", &(plain_data.join("\n") + "\n"));
    let manifest = std::fs::read_to_string(scratch.path("experiments/baselines.toml")).unwrap();
    let anchors = manifest.find("[anchors]").unwrap();
    let end = anchors + manifest[anchors..].find("\n\n").unwrap();
    let plain = format!("{}{}", &manifest[..anchors], &manifest[end..])
        .replace("data/baselines/baselines.jsonl", "data/plain.jsonl");
    scratch.write("experiments/plain.toml", &plain);
    let (status, plain_folder, stderr) = scratch.run("experiments/plain.toml", &["-q"]);
    assert_eq!(status, 0, "{stderr}");
    let plain_report = read_json(&plain_folder.join("report.json"));
    let plain_cells = plain_report["cells"].as_array().unwrap();
    for (a, b) in cells.iter().zip(plain_cells) {
        for field in ["micro", "macro", "micro_ci95", "macro_ci95", "seeds"] {
            assert_eq!(
                a[field].to_string(),
                b[field].to_string(),
                "{field} of {}",
                cell_name(a)
            );
        }
        assert!(b.get("floor_micro").is_none(), "no anchors without [anchors]");
        assert_eq!(
            b["attribution"]["reference_as_evidence"],
            b["attribution"]["rows"]
        );
    }
    let markdown = std::fs::read_to_string(plain_folder.join("report.md")).unwrap();
    assert!(
        markdown.contains("rows are of questions with no `evidence`: their reference stood for it"),
        "the report says the reference stood for the evidence"
    );
    assert!(!markdown.contains("### Floor and ceiling"));
    // `gacc diff` puts each cell's attribution and gap closed side by side.
    let (a, b) = (folder.to_str().unwrap(), plain_folder.to_str().unwrap());
    let diff = scratch.json(["diff", a, b, "--format", "json"]);
    let why = diff["why"].as_array().unwrap();
    assert_eq!(why.len(), cells.len());
    for (entry, cell) in why.iter().zip(cells) {
        assert_eq!(
            entry["attribution_a"]["kept_right"],
            cell["attribution"]["kept_right"]
        );
        assert_eq!(
            entry["attribution_a"]["lost_wrong"],
            cell["attribution"]["lost_wrong"]
        );
        assert_eq!(entry["gap_closed_a"], cell["gap_closed"]);
        assert!(entry["gap_closed_b"].is_null(), "no anchors in B");
    }
    let text = scratch.gacc().args(["diff", a, b]).output().unwrap();
    assert!(String::from_utf8_lossy(&text.stdout).contains("## Why"));
    let markdown = std::fs::read_to_string(folder.join("report.md")).unwrap();
    for part in [
        "## Why",
        "### Floor and ceiling",
        "### Budget at target",
        "### By tag",
        "No curve dips",
    ] {
        assert!(markdown.contains(part), "report.md lacks {part}");
    }
}

#[test]
fn a_span_not_in_its_source_stops_the_run_before_any_call() {
    let scratch = Scratch::new();
    let data = std::fs::read_to_string(scratch.path("experiments/data/fixture.jsonl")).unwrap();
    let mut lines: Vec<Value> = data.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let question = &mut lines[1]["goals"][0]["questions"][1];
    question["evidence"] = serde_json::json!(["a line of the source", "a span from nowhere"]);
    let id = question["id"].as_str().unwrap().to_owned();
    let first_line = lines[1]["text"]
        .as_str()
        .unwrap()
        .lines()
        .next()
        .unwrap()
        .to_owned();
    lines[1]["goals"][0]["questions"][1]["evidence"][0] = Value::String(first_line);
    let text: Vec<String> = lines.iter().map(Value::to_string).collect();
    scratch.write("experiments/data/fixture.jsonl", &(text.join("\n") + "\n"));
    let (status, _, stderr) = scratch.run("experiments/fixture.toml", &[]);
    assert_eq!(status, 2, "{stderr}");
    assert!(stderr.contains(&format!("question `{id}`")), "{stderr}");
    assert!(
        stderr.contains("\"a span from nowhere\" is not in the source"),
        "{stderr}"
    );
    assert_eq!(
        stderr.matches("is not in the source").count(),
        1,
        "the first span is found: {stderr}"
    );
    assert!(!scratch.path("runs").exists(), "no run folder was made");
    assert!(!scratch.path(".gacc").exists(), "nothing was called or cached");
}

/// `experiments/dip.toml`: twelve one-question goals whose sources open with the answer and end
/// with a sentence that says more of the question's words without it. `prefix` keeps the
/// answer at r = 0.3; at r = 1 the extractive reader picks the longer sentence, and is wrong.
fn dip(scratch: &Scratch, anchors: &str) -> String {
    let mut lines = Vec::new();
    for i in 0..12 {
        let code = 4000 + 37 * i;
        let text = format!(
            "The vault code is {code}. The weather in the valley was mild and the river ran clear all week. \
             Nobody could recall what the vault code was, and the vault code question about the vault code stayed open."
        );
        let question = serde_json::json!({"id": format!("q{i}"), "question": "What is the vault code?",
            "reference": code.to_string(), "evidence": format!("The vault code is {code}")});
        let goal = serde_json::json!({"id": format!("g{i}"), "text": "Remember the vault code", "questions": [question]});
        lines.push(serde_json::json!({"id": format!("s{i}"), "text": text, "goals": [goal]}).to_string());
    }
    scratch.write("experiments/data/dip.jsonl", &(lines.join("\n") + "\n"));
    let manifest = format!(
        "name = \"dip\"\nseeds = [1, 2]\nratios = [0.1, 0.3, 1.0]\n\n[dataset]\npath = \"data/dip.jsonl\"\n\n\
         [compressors.prefix]\nbuiltin = \"prefix\"\n\n[reader]\nbuiltin = \"extractive\"\n\n\
         [judge]\nbuiltin = \"contains\"\n\n{anchors}\n"
    );
    scratch.write("experiments/dip.toml", &manifest);
    "experiments/dip.toml".to_owned()
}

#[test]
fn a_curve_that_dips_is_listed_and_budget_at_target_recounts() {
    let scratch = Scratch::new();
    let manifest = dip(&scratch, "[anchors]\ntargets = [0.5, 0.9]\n");
    let (status, folder, stderr) = scratch.run(&manifest, &[]);
    assert_eq!(status, 0, "{stderr}");
    let report = read_json(&folder.join("report.json"));
    let micro: Vec<(f64, f64)> = report["cells"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["ratio"].as_f64().unwrap(), c["micro"]["mean"].as_f64().unwrap()))
        .collect();
    assert_eq!(micro, vec![(0.1, 0.0), (0.3, 1.0), (1.0, 0.0)]);
    // Only 0.3 → 1.0 dips: 0.1 → 0.3 rises, 0.1 → 1.0 is flat.
    let dips = report["monotonicity"].as_array().unwrap();
    assert_eq!(dips.len(), 1, "{dips:?}");
    assert_eq!(dips[0]["smaller"]["ratio"], 0.3);
    assert_eq!(dips[0]["larger"]["ratio"], 1.0);
    assert_eq!(dips[0]["shared_goals"], 24, "twelve goals of two seeds");
    assert!(dips[0]["difference_ci95"]["high"].as_f64().unwrap() < 0.0);
    assert!(
        stderr.contains("warning: prefix own-goal: Micro falls from 1.000 at r=0.3 to 0.000 at r=1"),
        "{stderr}"
    );
    let markdown = std::fs::read_to_string(folder.join("report.md")).unwrap();
    assert!(markdown.contains("**Curves that dip:**"), "{markdown}");
    // Without a ceiling, the target is a share of the best Micro (1.0): first reached at 0.3.
    let targets = report["budget_at_target"].as_array().unwrap();
    assert_eq!(targets.len(), 2);
    for target in targets {
        assert_eq!(target["of"], "best");
        assert_eq!(target["reference_micro"], 1.0);
        assert_eq!(target["budget"]["ratio"], 0.3, "{target}");
    }

    // With a ceiling the target is a share of its Micro: here 0 (the reader is misled by the
    // whole source too), so the smallest ratio reaches it.
    let manifest = dip(&scratch, "[anchors]\nceiling = true\n");
    let (status, folder, stderr) = scratch.run(&manifest, &["-q"]);
    assert_eq!(status, 0, "{stderr}");
    let report = read_json(&folder.join("report.json"));
    let target = &report["budget_at_target"][0];
    assert_eq!(target["of"], "ceiling");
    assert_eq!(target["reference_micro"], 0.0);
    assert_eq!(target["budget"]["ratio"], 0.1);
    assert_eq!(target["target"], 0.9);
}

#[test]
fn anchors_cost_nothing_twice_and_the_ceiling_is_identity_at_r_1() {
    let api = MockApi::start(Format::OpenAi, Behaviour::default());
    let key = ("MOCK_API_KEY", "sk-test-anchors-0123456789");
    let scratch = Scratch::new();
    let base = std::fs::read_to_string(scratch.path("experiments/baselines.toml")).unwrap();
    let model = format!(
        "[reader]\nbuiltin = \"llm-reader\"\nparams = {{ model = \"mock\" }}\n\n\
         [models.mock]\napi = \"openai-chat\"\nbase_url = \"{}\"\nmodel = \"mock-1\"\napi_key_env = \"MOCK_API_KEY\"\n",
        api.url
    );
    let on_mock = base
        .replace("[reader]\nbuiltin = \"extractive\"\n", &model)
        .replace("seeds = [1, 2, 3]", "seeds = [1]")
        .replace("ratios = [0.1, 0.25, 0.5, 1.0]", "ratios = [0.25, 1.0]");
    assert!(on_mock.contains("llm-reader") && on_mock.contains("seeds = [1]\n"));
    let anchors = on_mock.find("[anchors]").unwrap();
    let end = anchors + on_mock[anchors..].find("\n\n").unwrap();
    let with = |anchors_table: &str, cache: &str| {
        format!("{}{anchors_table}{}", &on_mock[..anchors], &on_mock[end..])
            .replace("[run]\n", &format!("[run]\ncache = \"{cache}\"\n"))
    };

    // Without anchors; then, on a cache of its own, with the ceiling: identity at r = 1 reads
    // every source whole, so the ceiling asks nothing more.
    scratch.write("experiments/none.toml", &with("", "cache-none"));
    let (status, _, stderr) = scratch.run_with_env("experiments/none.toml", &["-q"], &[key]);
    assert_eq!(status, 0, "{stderr}");
    let without = api.requests();
    assert!(without > 0);
    scratch.write(
        "experiments/ceiling.toml",
        &with("[anchors]\nceiling = true", "cache-ceiling"),
    );
    let (status, folder, stderr) = scratch.run_with_env("experiments/ceiling.toml", &["-q"], &[key]);
    assert_eq!(status, 0, "{stderr}");
    assert_eq!(api.requests() - without, without, "the ceiling added a request");
    assert_eq!(
        api.repeated(),
        without,
        "on its own cache, the same requests again"
    );
    let results = read_lines(&folder.join("results.jsonl.gz"));
    let identity: HashMap<String, &str> = results
        .iter()
        .filter(|r| r["compressor"] == "identity" && r["ratio"] == 1.0)
        .map(|r| {
            (
                r["question_id"].as_str().unwrap().to_owned(),
                r["calls"]["reader"].as_str().unwrap(),
            )
        })
        .collect();
    for row in &results {
        assert_eq!(
            row["calls"]["ceiling.reader"].as_str().unwrap(),
            identity[row["question_id"].as_str().unwrap()],
            "the ceiling read is identity's at r = 1"
        );
    }

    // With the floor too: `gacc plan` bounds the floor's reads before the run (one per
    // question: a greedy reader sends one request for every seed), the run makes them, and a
    // second run makes none.
    scratch.write(
        "experiments/both.toml",
        &with("[anchors]\nfloor = true\nceiling = true", "cache-ceiling"),
    );
    let plan = scratch.json_with_env(["plan", "experiments/both.toml", "--json"], &[key]);
    let bound = plan["endpoints"]["mock"]["calls"].as_u64().unwrap();
    let before = api.requests();
    let (status, folder, stderr) = scratch.run_with_env("experiments/both.toml", &["-q"], &[key]);
    assert_eq!(status, 0, "{stderr}");
    let questions = read_json(&folder.join("report.json"))["dataset"]["questions"]
        .as_u64()
        .unwrap();
    assert_eq!(api.requests() - before, questions, "one floor read per question");
    assert!(
        bound >= questions,
        "the plan bounds {bound} calls, the run made {questions}"
    );
    assert_eq!(api.repeated(), without, "no floor request twice");
    let made = api.requests();
    let (status, _, stderr) = scratch.run_with_env("experiments/both.toml", &["-q"], &[key]);
    assert_eq!(status, 0, "{stderr}");
    assert_eq!(api.requests(), made, "a second run called again");
    let plan = scratch.json_with_env(["plan", "experiments/both.toml", "--json"], &[key]);
    assert_eq!(
        plan["endpoints"]["mock"]["calls"].as_u64().unwrap_or(0),
        0,
        "{plan}"
    );
    let rows = read_lines(&folder.join("results.jsonl.gz"));
    assert!(
        rows.iter()
            .all(|r| r["floor_correct"].is_boolean() && r["ceiling_correct"].is_boolean())
    );
}

/// Kendall's τ-b, counted out pair by pair.
fn kendall(values: &[(f64, f64)]) -> Option<f64> {
    let n = values.len();
    let (mut c, mut d, mut tx, mut ty) = (0.0, 0.0, 0.0, 0.0);
    for i in 0..n {
        for j in i + 1..n {
            let (x, y) = (values[i].0 - values[j].0, values[i].1 - values[j].1);
            if x == 0.0 {
                tx += 1.0;
            }
            if y == 0.0 {
                ty += 1.0;
            }
            if x != 0.0 && y != 0.0 {
                if (x > 0.0) == (y > 0.0) {
                    c += 1.0
                } else {
                    d += 1.0
                }
            }
        }
    }
    let pairs = (n * n.saturating_sub(1) / 2) as f64;
    let denominator = ((pairs - tx) * (pairs - ty)).sqrt();
    (denominator > 0.0).then(|| (c - d) / denominator)
}

fn in_sample(seed: u64, question_id: &str, memory_sha256: &str, fraction: f64) -> bool {
    use sha2::{Digest, Sha256};
    let text = serde_json::json!([seed, question_id, memory_sha256]).to_string();
    let digest = Sha256::digest(text.as_bytes());
    let head = u64::from_be_bytes(digest[..8].try_into().unwrap());
    (head as f64 / 2f64.powi(64)) < fraction
}

/// `experiments/vault.toml`: twelve sources that say the vault code first as prose and last as
/// a `code=…` field among the goal's words. `prefix` keeps the prose, which the extractive
/// reader finds and `field-lookup` cannot; `goal-bm25` keeps the field line, which the
/// extractive reader answers with whole (the `contains` judge wants the code as a word) and
/// `field-lookup` reads. The two readers order the two compressors the opposite ways.
fn vault(scratch: &Scratch, url: &str, audit: &str) -> String {
    let mut lines = Vec::new();
    for i in 0..12 {
        let code = 4000 + 37 * i;
        let text = format!(
            "The vault code is {code}. Rain fell on valley farms for many weeks while rivers rose and roads closed. \
             Farmers moved sheep to high pastures and mended fences after every storm. Traders waited at bridges \
             for water to fall and sold bread to travellers. Records list code={code} for our vault, and a vault \
             code question about that vault code stayed open."
        );
        let question = serde_json::json!({"id": format!("q{i}"), "question": "What is the vault code?",
            "reference": code.to_string()});
        let goal = serde_json::json!({"id": format!("g{i}"), "text": "Remember the vault code", "questions": [question]});
        lines.push(serde_json::json!({"id": format!("s{i}"), "text": text, "goals": [goal]}).to_string());
    }
    scratch.write("experiments/data/vault.jsonl", &(lines.join("\n") + "\n"));
    let manifest = format!(
        "name = \"vault\"\nseeds = [1, 2]\nratios = [0.3]\n\n[dataset]\npath = \"data/vault.jsonl\"\n\n\
         [compressors.prefix]\nbuiltin = \"prefix\"\n\n[compressors.goal-bm25]\nbuiltin = \"goal-bm25\"\n\n\
         [reader]\nbuiltin = \"extractive\"\n\n[judge]\nbuiltin = \"contains\"\n\n\
         [readers.flat]\nbuiltin = \"extractive\"\nparams = {{ k1 = 0.5, b = 0.2 }}\n\n\
         [readers.model]\nbuiltin = \"llm-reader\"\nparams = {{ model = \"mock\", temperature = 0.0 }}\n\n\
         [models.mock]\napi = \"openai-chat\"\nbase_url = \"{url}\"\nmodel = \"mock-1\"\napi_key_env = \"MOCK_API_KEY\"\n\n\
         {audit}\n"
    );
    scratch.write("experiments/vault.toml", &manifest);
    "experiments/vault.toml".to_owned()
}

#[test]
fn a_reader_panel_recounts_and_says_where_a_reader_reverses_the_ranking() {
    let api = MockApi::start(Format::OpenAi, Behaviour::default());
    let key = ("MOCK_API_KEY", "sk-test-panel-0123456789");
    let scratch = Scratch::new();
    let audit = "[audit]\nreaders = [\"field-lookup\", \"flat\", \"model\"]\n";
    let manifest = vault(&scratch, &api.url, audit);
    let plan = scratch.json_with_env(["plan", &manifest, "--json"], &[key]);
    let bound = plan["endpoints"]["mock"]["calls"].as_u64().unwrap();
    assert_eq!(api.requests(), 0, "gacc plan made a call");
    let (status, folder, stderr) = scratch.run_with_env(&manifest, &["-q"], &[key]);
    assert_eq!(status, 0, "{stderr}");
    let results = read_lines(&folder.join("results.jsonl.gz"));
    let report = read_json(&folder.join("report.json"));
    let panel = &report["reader_panel"];

    // The model reader's greedy requests are one per distinct memory and question (both seeds
    // send the same), none twice, within the plan's bound.
    let memories: std::collections::HashSet<&str> = results
        .iter()
        .map(|r| r["memory_key"].as_str().unwrap())
        .collect();
    assert_eq!(memories.len(), 48, "two compressors, twelve goals, two seeds");
    assert_eq!(api.requests(), 24, "one request per memory text and question");
    assert_eq!(api.repeated(), 0);
    assert!(bound >= 24, "the plan bounds {bound} calls");

    // Micro per cell under each reader, recounted from the rows; τ-b from them.
    let cells = report["cells"].as_array().unwrap();
    for reader in ["field-lookup", "flat", "model"] {
        assert_eq!(
            panel["readers"][reader]["read"],
            results.len(),
            "{reader} reads every pair"
        );
        let pairs: Vec<(f64, f64)> = cells
            .iter()
            .map(|cell| {
                let rows: Vec<&Value> = results
                    .iter()
                    .filter(|r| cell_name(r) == cell_name(cell))
                    .collect();
                let right = rows.iter().filter(|r| r["panel"][reader] == true).count();
                (
                    cell["micro"]["mean"].as_f64().unwrap(),
                    right as f64 / rows.len() as f64,
                )
            })
            .collect();
        let reported = panel["tau_b"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["reader"] == reader)
            .unwrap();
        assert_eq!(reported["compressors"], 2);
        close(kendall(&pairs), &reported["tau_b"], reader);
    }
    let tau = |reader: &str| {
        let all = panel["tau_b"].as_array().unwrap();
        all.iter().find(|t| t["reader"] == reader).unwrap()["tau_b"]
            .as_f64()
            .unwrap()
    };
    assert_eq!(
        (tau("field-lookup"), tau("flat"), tau("model")),
        (-1.0, 1.0, -1.0)
    );
    let changes: Vec<&str> = panel["ranking_changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["sentence"].as_str().unwrap())
        .collect();
    assert_eq!(
        changes,
        [
            "the ranking at r = 0.3, own-goal, depends on the reader: the run's reader orders prefix > goal-bm25, `field-lookup` orders goal-bm25 > prefix",
            "the ranking at r = 0.3, own-goal, depends on the reader: the run's reader orders prefix > goal-bm25, `model` orders goal-bm25 > prefix",
        ]
    );
    let markdown = std::fs::read_to_string(folder.join("report.md")).unwrap();
    assert!(
        markdown.contains("### Reader panel") && markdown.contains("**The ranking depends on the reader:**")
    );
    // The panel changes no score, and a second run calls nothing.
    assert_eq!(cells[0]["micro"]["mean"], 0.0, "goal-bm25 under the run's reader");
    assert_eq!(cells[1]["micro"]["mean"], 1.0, "prefix under the run's reader");
    let (status, _, stderr) = scratch.run_with_env(&manifest, &["-q"], &[key]);
    assert_eq!(status, 0, "{stderr}");
    assert_eq!(api.requests(), 24);

    // A share of the pairs: those whose SHA-256 of [seed, question, memory] falls below it.
    let memory_sha: HashMap<String, String> = read_lines(&folder.join("memories.jsonl.gz"))
        .iter()
        .map(|m| {
            (
                m["key"].as_str().unwrap().to_owned(),
                m["memory_sha256"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let half = vault(&scratch, &api.url, &format!("{audit}reader_fraction = 0.5\n"));
    let (status, folder, stderr) = scratch.run_with_env(&half, &["-q"], &[key]);
    assert_eq!(status, 0, "{stderr}");
    let rows = read_lines(&folder.join("results.jsonl.gz"));
    let mut read = 0;
    for row in &rows {
        let sha = &memory_sha[row["memory_key"].as_str().unwrap()];
        let sampled = in_sample(
            row["seed"].as_u64().unwrap(),
            row["question_id"].as_str().unwrap(),
            sha,
            0.5,
        );
        assert_eq!(row["panel"].get("flat").is_some(), sampled, "{row}");
        read += usize::from(sampled);
    }
    assert!(read > 0 && read < rows.len(), "{read} of {}", rows.len());
    assert_eq!(api.requests(), 24, "the half sample was read already");
    common::mock_api::assert_no_key(&scratch, &stderr);
}

/// Runs `gacc callback NAME` on one judge request; its verdict and score.
fn judged(scratch: &Scratch, judge: &str, answer: &str, reference: &str) -> (bool, Option<f64>) {
    let request = serde_json::json!({
        "protocol": "gacc/1", "role": "judge", "source": "s", "question": "q",
        "reference": reference, "answer": answer, "seed": 0, "params": {},
    });
    let output = scratch
        .gacc()
        .args(["callback", judge])
        .write_stdin(request.to_string())
        .output()
        .unwrap();
    let reply: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    (reply["correct"] == true, reply["score"].as_f64())
}

#[test]
fn the_judges_score_chinese_as_cmrc_and_english_as_squad() {
    let scratch = Scratch::empty();
    // CMRC 2018's mixed segmentation: each Han character a token, punctuation of both scripts gone.
    assert!(judged(&scratch, "contains", "渡轮从三号码头出发。", "三号码头").0);
    let (_, f1) = judged(&scratch, "token-f1", "渡轮从三号码头出发。", "三号码头");
    assert!((f1.unwrap() - 8.0 / 13.0).abs() < 1e-12, "{f1:?}");
    assert!(judged(&scratch, "normalized", "下午五点。", "下午五点").0);
    assert!(
        judged(&scratch, "normalized", "Ｐｉｅｒ　３！", "pier 3").0,
        "full width folded"
    );
    assert!(!judged(&scratch, "contains", "渡轮从三号码头出发。", "四号码头").0);
    // English as before.
    assert!(judged(&scratch, "contains", "The ferry leaves from pier 3.", "pier 3").0);
    assert!(!judged(&scratch, "contains", "It cost 14 dollars", "4").0);
    let (_, f1) = judged(&scratch, "token-f1", "The ferry leaves from pier 3.", "pier 3");
    assert!((f1.unwrap() - 4.0 / 7.0).abs() < 1e-12, "{f1:?}");
    assert!(!judged(&scratch, "normalized", "The ferry leaves from pier 3.", "pier 3").0);
    // Japanese and Korean: kana and Hangul characters are tokens too.
    assert!(
        judged(
            &scratch,
            "contains",
            "東京タワーは三百三十三メートルです。",
            "三百三十三メートル"
        )
        .0
    );
    assert!(judged(&scratch, "contains", "회의는 오후 세 시에 시작합니다.", "세 시").0);
    // Mixed text: apple 发 布 了 iphone 15 against iphone 15: P = 2/6, R = 1, F1 = 1/2.
    let (_, f1) = judged(&scratch, "token-f1", "Apple发布了iPhone 15。", "iPhone 15");
    assert_eq!(f1, Some(0.5), "mixed text");
}

/// A Chinese run read back: the whole source scores 1.0 (`identity` at r = 1), and at r = 0.3
/// `goal-bm25` keeps more of the evidence than `prefix`.
fn reads_chinese(scratch: &Scratch, manifest: &str) {
    let (status, folder, stderr) = scratch.run(manifest, &["-q"]);
    assert_eq!(status, 0, "{stderr}");
    let report = read_json(&folder.join("report.json"));
    let cell = |compressor: &str, ratio: f64| -> serde_json::Value {
        report["cells"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["compressor"] == compressor && c["condition"] == "own-goal" && c["ratio"] == ratio)
            .unwrap()
            .clone()
    };
    assert_eq!(cell("identity", 1.0)["micro"]["mean"], 1.0, "{manifest}");
    let kept = |compressor: &str| {
        cell(compressor, 0.3)["attribution"]["evidence_kept"]
            .as_f64()
            .unwrap()
    };
    assert!(
        kept("goal-bm25") > kept("prefix"),
        "{manifest}: {} vs {}",
        kept("goal-bm25"),
        kept("prefix")
    );
}

#[test]
fn the_bundled_chinese_experiment_and_a_chinese_dataset_of_other_text() {
    let scratch = Scratch::new();
    reads_chinese(&scratch, "experiments/chinese.toml");
    // Another passage, goals and questions, written apart from the bundled one.
    let source = serde_json::json!({
        "id": "clinic",
        "text": "社区诊所发布了上个月的工作简报。诊所共接待病人八百六十名。流感疫苗于十月二日开始接种。周末门诊由赵医生负责。诊所新购置了一台心电图机，价格为三万元。药房的营业时间延长到晚上九点。候诊区的电视已经修好了。",
        "goals": [
            {"id": "clinic-care", "text": "了解疫苗接种和周末门诊的安排", "questions": [
                {"id": "clinic-care-q1", "question": "流感疫苗什么时候开始接种？", "reference": "十月二日", "evidence": "流感疫苗于十月二日开始接种"},
                {"id": "clinic-care-q2", "question": "周末门诊由谁负责？", "reference": "赵医生", "evidence": "周末门诊由赵医生负责"}]},
            {"id": "clinic-equipment", "text": "了解新设备的价格和药房时间", "questions": [
                {"id": "clinic-equipment-q1", "question": "心电图机的价格是多少？", "reference": "三万元", "evidence": "价格为三万元"},
                {"id": "clinic-equipment-q2", "question": "药房营业到几点？", "reference": "晚上九点", "evidence": "药房的营业时间延长到晚上九点"}]}]
    });
    scratch.write("experiments/data/clinic.jsonl", &format!("{source}\n"));
    let manifest = std::fs::read_to_string(scratch.path("experiments/chinese.toml"))
        .unwrap()
        .replace("data/chinese/chinese.jsonl", "data/clinic.jsonl");
    scratch.write("experiments/clinic.toml", &manifest);
    reads_chinese(&scratch, "experiments/clinic.toml");
}

#[test]
fn the_bundled_english_experiment_scores_as_before_the_text_rules_knew_other_scripts() {
    let scratch = Scratch::new();
    let (status, folder, stderr) = scratch.run("experiments/baselines.toml", &["-q"]);
    assert_eq!(status, 0, "{stderr}");
    let report = read_json(&folder.join("report.json"));
    let cells: Vec<serde_json::Value> = report["cells"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            serde_json::json!({
                "compressor": c["compressor"], "condition": c["condition"], "ratio": c["ratio"],
                "micro": c["micro"], "macro": c["macro"], "attribution": c["attribution"], "ledger": c["ledger"],
            })
        })
        .collect();
    let before: Vec<serde_json::Value> = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/data/baselines-cells.json"
        ))
        .unwrap(),
    )
    .unwrap();
    assert_eq!(cells, before);
}

#[test]
fn dataset_stats_says_which_sources_hold_cjk_text() {
    let scratch = Scratch::new();
    let stats = scratch.json(["dataset", "stats", "--json", "experiments/chinese.toml"]);
    let shares: Vec<f64> = stats["cjk_share"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["share"].as_f64().unwrap())
        .collect();
    assert_eq!(shares, [1.0, 1.0]);
    let english = scratch.json(["dataset", "stats", "--json", "experiments/fixture.toml"]);
    assert!(
        english["cjk_share"]
            .as_array()
            .unwrap()
            .iter()
            .all(|s| s["share"] == 0.0)
    );
    let output = scratch
        .gacc()
        .args(["dataset", "stats", "experiments/chinese.toml"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        text.contains("2 of 2 sources have Chinese, Japanese or Korean text"),
        "{text}"
    );
}
