//! Goal conditions, the built-in baselines and what the protocol predicts of them.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};

use common::{Scratch, made, read_json, read_lines};
use gacc::inputs::tokenizer::{Cl100k, Tokenizer};
use proptest::prelude::*;
use serde_json::{Value, json};

const FIXTURE: &str = "experiments/fixture.toml";

#[test]
fn no_goal_makes_one_memory_per_source_shared_by_its_goals() {
    let scratch = Scratch::new();
    let (status, folder, stderr) = scratch.run(FIXTURE, &["--set", "conditions=[\"no-goal\"]"]);
    assert_eq!(status, 0, "{stderr}");
    // sources (2) × budgets (1) × seeds (3) × compressors (1), not goals (4) × …
    assert_eq!(made(&folder, "compressor"), 6);
    let plan = read_json(&folder.join("plan.json.gz"));
    assert_eq!(plan["stages"], json!({"compress": 6, "read": 36, "judge": 36}));
    let ledger = read_lines(&folder.join("memories.jsonl.gz"));
    assert_eq!(ledger.len(), 6);
    assert!(
        ledger
            .iter()
            .all(|row| row["goal_id"].is_null() && row["shown_goal_id"].is_null())
    );
    let results = read_lines(&folder.join("results.jsonl.gz"));
    let mut per_memory: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for row in &results {
        per_memory
            .entry(row["memory_key"].as_str().unwrap())
            .or_default()
            .insert(row["goal_id"].as_str().unwrap());
    }
    assert_eq!(per_memory.len(), 6);
    assert!(
        per_memory.values().all(|goals| goals.len() == 2),
        "both goals of a source read one memory"
    );
}

#[test]
fn cross_goal_shows_a_goal_of_another_source_deterministically() {
    let scratch = Scratch::new();
    let set = ["--set", "conditions=[\"cross-goal\"]"];
    let (status, first, stderr) = scratch.run(FIXTURE, &set);
    assert_eq!(status, 0, "{stderr}");
    let ledger = read_lines(&first.join("memories.jsonl.gz"));
    let mut shown_per_seed: BTreeMap<u64, Vec<(String, String)>> = BTreeMap::new();
    for row in &ledger {
        let own = row["goal_id"].as_str().unwrap();
        let shown = row["shown_goal_id"].as_str().unwrap();
        let source = row["source_id"].as_str().unwrap();
        assert!(own.starts_with(source));
        assert!(
            !shown.starts_with(source),
            "{own} was shown {shown}, a goal of its own source"
        );
        shown_per_seed
            .entry(row["seed"].as_u64().unwrap())
            .or_default()
            .push((own.into(), shown.into()));
    }
    let choices: BTreeSet<_> = shown_per_seed.values().collect();
    assert!(
        choices.len() > 1,
        "seeds change the derangement: {shown_per_seed:?}"
    );

    let (status, second, _) = scratch.run(FIXTURE, &set);
    assert_eq!(status, 0);
    assert_eq!(
        made(&second, "compressor"),
        0,
        "the same choice again, so every call is cached"
    );
    let again: Vec<Value> = read_lines(&second.join("memories.jsonl.gz"));
    let pairs = |rows: &[Value]| {
        rows.iter()
            .map(|r| r["shown_goal_id"].clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(pairs(&ledger), pairs(&again));
}

#[test]
fn utf8_safe_truncation_is_recorded() {
    let scratch = Scratch::new();
    let (status, folder, _) = scratch.run(FIXTURE, &["--set", "truncation=\"utf8-safe\""]);
    assert_eq!(status, 0);
    assert!(
        read_lines(&folder.join("memories.jsonl.gz"))
            .iter()
            .all(|r| r["truncation"] == "utf8-safe")
    );
}

fn micro(report: &Value, compressor: &str, ratio: f64, condition: &str) -> f64 {
    report["by_condition"]
        .as_array()
        .unwrap()
        .iter()
        .find(|row| row["compressor"] == compressor && row["ratio"].as_f64() == Some(ratio))
        .unwrap()["micro"][condition]
        .as_f64()
        .unwrap()
}

#[test]
fn the_baselines_behave_as_the_protocol_predicts() {
    let scratch = Scratch::new();
    let (status, folder, stderr) = scratch.run("experiments/baselines.toml", &[]);
    assert_eq!(status, 0, "{stderr}");
    let report = read_json(&folder.join("report.json"));
    assert_eq!(
        report["dataset"],
        json!({"sha256": report["dataset"]["sha256"], "sources": 6, "goals": 18, "questions": 54})
    );
    assert_eq!(report["cells"].as_array().unwrap().len(), 4 * 4 * 3);
    assert_eq!(
        report["integrity"],
        json!({"exposure_violations": 0, "budget_violations": 0, "padding_tokens": 0, "count_errors": 0})
    );
    // At r = 1 the identity compressor hands the reader the whole source: the reader's ceiling.
    let ceiling = micro(&report, "identity", 1.0, "own-goal");
    assert_eq!(ceiling, 1.0);
    for cell in report["cells"].as_array().unwrap() {
        assert!(cell["micro"]["mean"].as_f64().unwrap() <= ceiling);
    }
    // Seeing its own goal helps goal-bm25 at small budgets.
    for ratio in [0.1, 0.25] {
        let own = micro(&report, "goal-bm25", ratio, "own-goal");
        assert!(own > micro(&report, "goal-bm25", ratio, "no-goal"), "r = {ratio}");
        assert!(
            own > micro(&report, "goal-bm25", ratio, "cross-goal"),
            "r = {ratio}"
        );
    }
    let markdown = std::fs::read_to_string(folder.join("report.md")).unwrap();
    assert!(markdown.contains("## Goal conditioning"));
    assert!(markdown.contains("| goal-bm25 | 0.1 |"));
}

#[test]
fn judges_over_the_protocol() {
    let scratch = Scratch::empty();
    let judge = |name: &str, answer: &str, reference: &str, params: Value| -> Value {
        let request = json!({"protocol": "gacc/1", "role": "judge", "source": "s", "question": "q",
            "reference": reference, "answer": answer, "seed": 0, "params": params});
        let output = scratch
            .gacc()
            .args(["callback", name])
            .write_stdin(request.to_string())
            .output()
            .unwrap();
        assert!(output.status.success());
        serde_json::from_slice(&output.stdout).unwrap()
    };
    assert_eq!(judge("exact", " Paris\n", "Paris", json!({}))["correct"], true);
    assert_eq!(judge("exact", "paris", "Paris", json!({}))["correct"], false);
    assert_eq!(
        judge("normalized", "The Paris!", "paris", json!({}))["correct"],
        true
    );
    assert_eq!(
        judge("normalized", "Paris, France", "paris", json!({}))["correct"],
        false
    );
    assert_eq!(
        judge("contains", "It is Paris, France.", "the paris", json!({}))["correct"],
        true
    );
    assert_eq!(
        judge("contains", "Parisian", "paris", json!({}))["correct"],
        false
    );
    let f1 = judge("token-f1", "Paris France", "Paris", json!({"threshold": 0.6}));
    assert_eq!(f1["correct"], true);
    assert!((f1["score"].as_f64().unwrap() - 2.0 / 3.0).abs() < 1e-12);
    assert_eq!(
        judge("token-f1", "Paris France", "Paris", json!({"threshold": 0.7}))["correct"],
        false
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn goal_bm25_never_exceeds_its_budget(
        sentences in prop::collection::vec("[a-z]{1,8}( [a-z]{1,8}){0,12}[.!?]", 1..30),
        goal in "[a-z]{1,8}( [a-z]{1,8}){0,4}",
        budget in 0usize..120,
    ) {
        let tokenizer = Cl100k::new();
        let context = sentences.join(" ");
        for goal in [Value::String(goal.clone()), Value::Null] {
            let request = json!({"context": context, "goal": goal, "token_budget": budget, "seed": 1});
            let memory = gacc::builtin::respond("goal-bm25", &request).unwrap()["memory"].as_str().unwrap().to_owned();
            prop_assert!(tokenizer.count(&memory).unwrap() <= budget, "{} > {budget}", tokenizer.count(&memory).unwrap());
            let cut = gacc::inputs::budget::truncate_to_budget(&tokenizer, &memory, budget, Default::default()).unwrap();
            prop_assert!(!cut.truncated, "the selection fits without truncation");
        }
    }
}

#[test]
fn gacc_callback_lists_every_builtin() {
    let scratch = Scratch::empty();
    let output = scratch.gacc().arg("callback").output().unwrap();
    assert!(output.status.success());
    let list = String::from_utf8(output.stdout).unwrap();
    for name in [
        "identity",
        "prefix",
        "goal-line",
        "goal-bm25",
        "random-sentences",
        "field-lookup",
        "extractive",
        "exact",
        "normalized",
        "contains",
        "token-f1",
        "cl100k_base",
    ] {
        assert!(
            list.lines().any(|l| l.starts_with(&format!("{name} "))),
            "{name} in:\n{list}"
        );
    }
}
