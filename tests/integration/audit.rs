//! Judging the judge (SPEC §10): audit judges re-judge the scoring judge's answers, human labels
//! are read back, and the report says where the ranking depends on the judge. Each figure is
//! recounted here from `results.jsonl`.

use crate::common;

use std::collections::BTreeMap;

use common::{Scratch, read_json, read_lines};
use serde_json::Value;

/// The baselines experiment scored by `normalized`, with `audit` appended (nothing if empty).
fn baselines(scratch: &Scratch, name: &str, audit: &str) -> String {
    let manifest = std::fs::read_to_string(scratch.path("experiments/baselines.toml"))
        .unwrap()
        .replace(
            "[judge]\nbuiltin = \"contains\"",
            "[judge]\nbuiltin = \"normalized\"",
        );
    assert!(manifest.contains("builtin = \"normalized\""));
    let path = format!("experiments/{name}.toml");
    scratch.write(&path, &format!("{manifest}\n{audit}"));
    path
}

/// Cohen's κ from the four counts, as a textbook writes it; none where either side gave one
/// verdict throughout (there is no agreement beyond chance to measure).
fn kappa(both: f64, scoring_only: f64, audit_only: f64, neither: f64) -> Option<f64> {
    let n = both + scoring_only + audit_only + neither;
    let observed = (both + neither) / n;
    let (p, q) = ((both + scoring_only) / n, (both + audit_only) / n);
    let chance = p * q + (1.0 - p) * (1.0 - q);
    let varied = |share: f64| share > 0.0 && share < 1.0;
    (varied(p) && varied(q)).then(|| (observed - chance) / (1.0 - chance))
}

#[test]
fn audit_judges_agree_as_the_results_recount_and_leave_the_scores_alone() {
    let scratch = Scratch::new();
    let plain = baselines(&scratch, "plain", "");
    let (status, without, stderr) = scratch.run(&plain, &["-q"]);
    assert_eq!(status, 0, "{stderr}");
    let audited = baselines(
        &scratch,
        "audited",
        "[audit]\njudges = [\"exact\", \"contains\", \"token-f1\"]\n",
    );
    let (status, with, stderr) = scratch.run(&audited, &["-q"]);
    assert_eq!(status, 0, "{stderr}");
    let (a, b) = (
        read_json(&without.join("report.json")),
        read_json(&with.join("report.json")),
    );
    // The scoring judge's Micro and Macro, to the byte.
    for key in ["cells", "by_condition"] {
        assert_eq!(a[key].to_string(), b[key].to_string(), "{key}");
    }
    assert!(a.get("judge_audit").is_none());
    let results = read_lines(&with.join("results.jsonl.gz"));
    // The audit's verdicts are counted apart from the judge's calls.
    let calls = |folder: &std::path::Path, role: &str| {
        let c = &read_json(&folder.join("run.json"))["calls"][role];
        ["made", "cached", "shared"]
            .iter()
            .map(|k| c[k].as_u64().unwrap_or(0))
            .sum::<u64>()
    };
    assert_eq!(calls(&with, "judge"), calls(&without, "judge"));
    assert_eq!(calls(&with, "audit"), 3 * results.len() as u64);
    assert_eq!(calls(&without, "audit"), 0);
    let audit = &b["judge_audit"]["judges"];
    for judge in ["exact", "contains", "token-f1"] {
        let mut counts = [0u64; 4];
        let mut abstained = [0u64; 2];
        for row in &results {
            let Some(verdict) = row["audits"].get(judge) else {
                continue;
            };
            match (row["correct"].as_bool(), verdict.as_bool()) {
                (None, _) => abstained[0] += 1,
                (_, None) => abstained[1] += 1,
                (Some(s), Some(o)) => counts[usize::from(!s) * 2 + usize::from(!o)] += 1,
            }
        }
        let got = &audit[judge];
        let [both, scoring_only, audit_only, neither] = counts;
        assert_eq!(
            got["audited"],
            results.len(),
            "{judge}: fraction 1 audits every answer"
        );
        assert_eq!(
            [
                &got["both_correct"],
                &got["scoring_only"],
                &got["audit_only"],
                &got["neither"]
            ],
            [both, scoring_only, audit_only, neither]
                .map(Value::from)
                .each_ref(),
            "{judge}"
        );
        assert_eq!(
            [&got["scoring_abstained"], &got["audit_abstained"]],
            abstained.map(Value::from).each_ref()
        );
        let compared = both + scoring_only + audit_only + neither;
        assert_eq!(got["compared"], compared);
        let agreement = (both + neither) as f64 / compared as f64;
        assert!(
            (got["agreement"].as_f64().unwrap() - agreement).abs() < 1e-12,
            "{judge}"
        );
        let expected = kappa(
            both as f64,
            scoring_only as f64,
            audit_only as f64,
            neither as f64,
        );
        match (got["kappa"].as_f64(), expected) {
            (Some(got), Some(expected)) => {
                assert!((got - expected).abs() < 1e-9, "{judge}: {got} {expected}")
            }
            (None, None) => {}
            other => panic!("{judge}: κ {other:?}"),
        }
    }
    // `contains` finds more answers right than `normalized` (a sentence holding the reference).
    assert!(audit["contains"]["audit_only"].as_u64().unwrap() > 0);
    let md = std::fs::read_to_string(with.join("report.md")).unwrap();
    assert!(md.contains("## Judge audit"), "{md}");
    assert!(md.contains("| `token-f1` | 1.0 |"), "{md}");
    // gacc diff sets each audit judge's agreement in A beside B's (none in A).
    let output = scratch
        .gacc()
        .args([
            "diff",
            &without.display().to_string(),
            &with.display().to_string(),
        ])
        .output()
        .unwrap();
    let diff = String::from_utf8(output.stdout).unwrap();
    assert!(diff.contains("## Judge audit"), "{diff}");
    let agreement = audit["exact"]["agreement"].as_f64().unwrap();
    assert!(
        diff.contains(&format!(
            "| `exact` | — | {} | — | {agreement:.3} |",
            audit["exact"]["compared"]
        )),
        "{diff}"
    );
    // The export carries each audit verdict as a column.
    let output = scratch
        .gacc()
        .args(["export", &with.display().to_string()])
        .output()
        .unwrap();
    let csv = String::from_utf8(output.stdout).unwrap();
    let header = csv.lines().next().unwrap();
    assert!(
        header.ends_with(",audit.contains,audit.exact,audit.token-f1"),
        "{header}"
    );
}

/// A judge (Python, persistent) that says the opposite of `contains`.
const CONTRARY: &str = r#"#!/usr/bin/env python3
import json, os, re, sys

def words(text):
    return re.sub(r"[^a-z0-9 ]", " ", text.lower()).split()

def contrary(request):
    answer, reference = words(request["answer"]), words(request["reference"])
    n = len(reference)
    found = n > 0 and any(answer[i:i + n] == reference for i in range(len(answer) - n + 1))
    return {"correct": not found}

if os.environ.get("GACC_MODE") == "persistent":
    for line in sys.stdin:
        print(json.dumps(contrary(json.loads(line))), flush=True)
else:
    print(json.dumps(contrary(json.load(sys.stdin))))
"#;

#[test]
fn a_judge_that_disagrees_makes_the_report_say_the_ranking_depends_on_it() {
    if !common::python3_on_path() {
        eprintln!("skipped: no python3");
        return;
    }
    let scratch = Scratch::new();
    scratch.script("experiments/contrary.py", CONTRARY);
    let manifest = std::fs::read_to_string(scratch.path("experiments/baselines.toml")).unwrap();
    let manifest = format!(
        "{manifest}\n[judges.contrary]\ncommand = [\"python3\", \"contrary.py\"]\nmode = \"persistent\"\n\n[audit]\njudges = [\"contrary\"]\n"
    );
    scratch.write("experiments/contrary.toml", &manifest);
    let sets = ["-q", "--set", "seeds=[1]", "--set", "conditions=[\"own-goal\"]"];
    let (status, folder, stderr) = scratch.run("experiments/contrary.toml", &sets);
    assert_eq!(status, 0, "{stderr}");
    let report = read_json(&folder.join("report.json"));
    let audit = &report["judge_audit"];
    // It disagrees on every answer.
    let judge = &audit["judges"]["contrary"];
    assert_eq!(judge["both_correct"], 0);
    assert_eq!(judge["neither"], 0);
    assert_eq!(judge["agreement"], 0.0);
    let sentences: Vec<&str> = audit["ranking_changes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["sentence"].as_str())
        .collect();
    assert!(
        sentences
            .iter()
            .any(|s| s.starts_with("the ranking at r = 0.1, own-goal, depends on the judge")),
        "{sentences:?}"
    );
    let md = std::fs::read_to_string(folder.join("report.md")).unwrap();
    assert!(md.contains("depends on the judge"), "{md}");
}

#[test]
fn labels_round_trip_through_an_export_and_bad_labels_name_their_line() {
    let scratch = Scratch::new();
    let audited = baselines(&scratch, "labelled", "[audit]\njudges = [\"contains\"]\n");
    let sets = ["-q", "--set", "seeds=[1]"];
    let (status, folder, stderr) = scratch.run(&audited, &sets);
    assert_eq!(status, 0, "{stderr}");
    let run = folder.display().to_string();
    let exported = scratch.path("experiments/labels.csv");
    let output = scratch
        .gacc()
        .args(["export", &run, "--for-labelling", "20", "-o"])
        .arg(&exported)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    // The same sample again.
    let again = scratch
        .gacc()
        .args(["export", &run, "--for-labelling", "20"])
        .output()
        .unwrap();
    assert_eq!(std::fs::read(&exported).unwrap(), again.stdout);
    // Labelled by a person who finds an answer right when it holds the reference's text.
    let mut reader = csv::Reader::from_path(&exported).unwrap();
    let header = reader.headers().unwrap().clone();
    assert_eq!(
        header.iter().collect::<Vec<_>>(),
        [
            "question_id",
            "answer",
            "correct",
            "source_id",
            "goal_id",
            "question",
            "reference"
        ]
    );
    let mut labels: BTreeMap<(String, String), bool> = BTreeMap::new();
    let mut writer = csv::Writer::from_path(scratch.path("experiments/filled.csv")).unwrap();
    writer.write_record(&header).unwrap();
    for record in reader.records() {
        let record = record.unwrap();
        let (question, answer, reference) = (&record[0], &record[1], &record[6]);
        let correct = answer.to_lowercase().contains(&reference.to_lowercase());
        labels.insert((question.to_owned(), answer.to_owned()), correct);
        let mut fields: Vec<String> = record.iter().map(str::to_owned).collect();
        fields[2] = correct.to_string();
        writer.write_record(&fields).unwrap();
    }
    writer.flush().unwrap();
    assert_eq!(labels.len(), 20);
    let with_labels = baselines(
        &scratch,
        "labelled",
        "[audit]\njudges = [\"contains\"]\nlabels = \"filled.csv\"\n",
    );
    let (status, folder, stderr) = scratch.run(&with_labels, &sets);
    assert_eq!(status, 0, "{stderr}");
    let report = read_json(&folder.join("report.json"));
    let got = &report["judge_audit"]["labels"];
    // Recount: each judge's verdicts on the labelled answers against the labels.
    let results = read_lines(&folder.join("results.jsonl.gz"));
    let labelled: Vec<(&Value, bool)> = results
        .iter()
        .filter_map(|row| {
            let key = (
                row["question_id"].as_str()?.to_owned(),
                row["answer"].as_str()?.to_owned(),
            );
            Some((row, *labels.get(&key)?))
        })
        .collect();
    assert_eq!(got["labelled_answers"], labelled.len());
    assert!(
        labelled.len() >= 20,
        "each label applies to every answer with its text"
    );
    for (name, verdict) in [("scoring", "correct"), ("contains", "contains")] {
        let verdicts: Vec<(bool, bool)> = labelled
            .iter()
            .filter_map(|(row, label)| {
                let v = if verdict == "correct" {
                    &row["correct"]
                } else {
                    &row["audits"][verdict]
                };
                Some((v.as_bool()?, *label))
            })
            .collect();
        let right = verdicts.iter().filter(|(v, l)| v == l).count();
        let accuracy = right as f64 / verdicts.len() as f64;
        let figures = &got["accuracy"][name];
        assert_eq!(figures["compared"], verdicts.len(), "{name}");
        assert!(
            (figures["accuracy"].as_f64().unwrap() - accuracy).abs() < 1e-12,
            "{name}"
        );
    }
    // `contains` agrees with these labels everywhere a sentence holds the reference verbatim.
    assert!(got["accuracy"]["contains"]["accuracy"].as_f64().unwrap() > 0.9);

    // A bad file: exit 2, the line named, nothing called.
    scratch.write(
        "experiments/bad.csv",
        "question_id,answer,correct\nq1,a,true\nq2,b,maybe\n",
    );
    let bad = baselines(
        &scratch,
        "labelled",
        "[audit]\njudges = [\"contains\"]\nlabels = \"bad.csv\"\n",
    );
    let (status, _, stderr) = scratch.run(&bad, &sets);
    assert_eq!(status, 2, "{stderr}");
    assert!(stderr.contains("bad.csv:3"), "{stderr}");
    assert!(stderr.contains("`maybe`"), "{stderr}");
    // A label that matches no answer of the run: named by its line, the run's work kept.
    scratch.write(
        "experiments/stray.csv",
        "question_id,answer,correct\nno-such-question,a,true\n",
    );
    let stray = baselines(
        &scratch,
        "labelled",
        "[audit]\njudges = [\"contains\"]\nlabels = \"stray.csv\"\n",
    );
    let (status, _, stderr) = scratch.run(&stray, &sets);
    assert_eq!(status, 2, "{stderr}");
    assert!(stderr.contains("stray.csv:2"), "{stderr}");
    assert!(stderr.contains("matches no answer"), "{stderr}");
}

#[test]
fn a_bad_audit_table_is_an_error_naming_its_key() {
    let scratch = Scratch::new();
    let manifest = baselines(
        &scratch,
        "bad-audit",
        "[judges.unused]\nbuiltin = \"exact\"\n\n[audit]\njudges = [\"nonsense\"]\nfraction = 0\n",
    );
    let (status, _, stderr) = scratch.run(&manifest, &["-q"]);
    assert_eq!(status, 2, "{stderr}");
    assert!(
        stderr.contains("`nonsense` is neither a `[judges.nonsense]` table nor a built-in rule judge"),
        "{stderr}"
    );
    assert!(stderr.contains("key `audit.fraction`"), "{stderr}");
    assert!(stderr.contains("key `judges.unused`"), "{stderr}");
}

/// Whether an answer is in the sample of an audit judge at `fraction`, as SPEC §10 says:
/// the SHA-256 of `[seed, question id, answer]`, read as a number in [0, 1), below `fraction`.
fn in_sample(seed: u64, question_id: &str, answer: &str, fraction: f64) -> bool {
    use sha2::{Digest, Sha256};
    let text = serde_json::json!([seed, question_id, answer]).to_string();
    let digest = Sha256::digest(text.as_bytes());
    let head = u64::from_be_bytes(digest[..8].try_into().unwrap());
    (head as f64 / 2f64.powi(64)) < fraction
}

#[test]
fn a_model_audit_judge_judges_its_seeded_sample_once_and_keeps_to_the_spending_cap() {
    use common::mock_api::{Behaviour, Format, MockApi, PRICE};
    let key = ("MOCK_API_KEY", "sk-test-audit-0123456789");
    let api = MockApi::start(Format::OpenAi, Behaviour::default());
    let audit = format!(
        "[models.mock]\napi = \"openai-chat\"\nbase_url = \"{}\"\nmodel = \"mock-1\"\napi_key_env = \"MOCK_API_KEY\"\n{PRICE}\n\n\
         [judges.second]\nbuiltin = \"llm-judge\"\nparams = {{ model = \"mock\", temperature = 0.0 }}\n\n\
         [audit]\njudges = [\"contains\", \"second\"]\nfractions = {{ second = 0.1 }}\n",
        api.url
    );
    let scratch = Scratch::new();
    let manifest = baselines(&scratch, "model-audit", &audit);
    let sets = ["-q", "--set", "seeds=[1]"];
    // The cost preview counts audit calls: before the answers exist, at most one per question.
    let plan = |scratch: &Scratch| {
        scratch.json_with_env(["plan", &manifest, "--set", "seeds=[1]", "--json"], &[key])
    };
    let before = plan(&scratch)["endpoints"]["mock"]["calls"].as_u64().unwrap();
    assert!(before > 0);
    assert_eq!(api.requests(), 0, "gacc plan made a call");
    let (status, folder, stderr) = scratch.run_with_env(&manifest, &sets, &[key]);
    assert_eq!(status, 0, "{stderr}");
    let after = plan(&scratch);
    assert!(
        after["endpoints"]["mock"]["calls"].as_u64().unwrap_or(0) == 0,
        "{after}"
    );
    let results = read_lines(&folder.join("results.jsonl.gz"));
    // Exactly the seeded sample is audited by `second`, and every answer by `contains`.
    let mut distinct = std::collections::BTreeSet::new();
    for row in &results {
        let answer = row["answer"].as_str().unwrap();
        let question = row["question_id"].as_str().unwrap();
        let sampled = in_sample(row["seed"].as_u64().unwrap(), question, answer, 0.1);
        assert_eq!(row["audits"].get("second").is_some(), sampled, "{row}");
        assert!(row["audits"].get("contains").is_some());
        if sampled {
            distinct.insert((question.to_owned(), answer.to_owned()));
        }
    }
    // About a tenth (answers repeat across cells, and a repeated answer is in or out whole).
    let sampled = results
        .iter()
        .filter(|r| r["audits"].get("second").is_some())
        .count();
    let share = sampled as f64 / results.len() as f64;
    assert!(share > 0.03 && share < 0.25, "{share}");
    // One request per distinct judged answer, none twice; a second run makes none.
    assert_eq!(api.requests(), distinct.len() as u64);
    assert!(
        before >= distinct.len() as u64,
        "the bound is below what was called"
    );
    assert_eq!(api.repeated(), 0);
    let report = read_json(&folder.join("report.json"));
    let second = &report["judge_audit"]["judges"]["second"];
    assert_eq!(second["fraction"], 0.1);
    assert_eq!(second["audited"], sampled);
    let (status, _, stderr) = scratch.run_with_env(&manifest, &sets, &[key]);
    assert_eq!(status, 0, "{stderr}");
    assert_eq!(
        api.requests(),
        distinct.len() as u64,
        "the second run called again"
    );

    // Like any call, an audit call keeps to `max_cost_usd`.
    let capped = MockApi::start(Format::OpenAi, Behaviour::default());
    let scratch = Scratch::new();
    let manifest = baselines(&scratch, "model-audit", &audit.replace(&api.url, &capped.url));
    let mut sets = sets.to_vec();
    sets.extend(["--set", "run.max_cost_usd=0.02"]);
    let (status, _, stderr) = scratch.run_with_env(&manifest, &sets, &[key]);
    assert_eq!(status, 3, "{stderr}");
    assert!(stderr.contains("max_cost_usd"), "{stderr}");
    let made = capped.requests();
    assert!(
        made > 0 && made < distinct.len() as u64,
        "{made} of {}",
        distinct.len()
    );
}

#[test]
fn a_judge_that_says_correct_to_everything_is_flagged_at_the_head_of_every_view() {
    let scratch = Scratch::new();
    // A judge that decides nothing: `{"correct": true}` to any request.
    let manifest = std::fs::read_to_string(scratch.path("experiments/fixture.toml"))
        .unwrap()
        .replace(
            "[judge]\nbuiltin = \"exact\"\nrevision = \"1\"",
            "[judge]\ncommand = [\"sh\", \"-c\", \"cat > /dev/null; echo '{\\\"correct\\\": true, \\\"rationale\\\": \\\"one sentence\\\"}'\"]\nrevision = \"1\"\n\n[audit]\njudges = [\"contains\"]",
        );
    assert!(manifest.contains("[audit]"), "{manifest}");
    scratch.write("experiments/yes.toml", &manifest);
    let (status, folder, stderr) = scratch.run("experiments/yes.toml", &[]);
    assert_eq!(status, 0, "{stderr}");
    let report = read_json(&folder.join("report.json"));
    let agreement = report["judge_audit"]["judges"]["contains"]["agreement"]
        .as_f64()
        .unwrap();
    let doubt = report["judge_doubt"]["sentence"].as_str().unwrap();
    let figure = format!("`contains` agrees with it on {agreement:.2} of 36 answers");
    for words in [
        "The judge `sh -c`",
        "it said correct to every answer (36 of 36)",
        &figure,
    ] {
        assert!(doubt.contains(words), "{words:?} in {doubt}");
    }
    // κ is undefined where one side gave one verdict throughout.
    assert!(report["judge_audit"]["judges"]["contains"]["kappa"].is_null());

    // The terminal summary: the line first, each Micro marked.
    let summary = &stderr[stderr.find("‡ warning").expect(&stderr)..];
    assert!(summary.starts_with(&format!("‡ warning: {doubt}")), "{summary}");
    assert!(summary.contains("Micro 1.000 ± 0.000 ‡"), "{summary}");
    // report.md: before Results, and each Micro marked.
    let markdown = std::fs::read_to_string(folder.join("report.md")).unwrap();
    let line = markdown.find("**‡ Judge in doubt:**").expect(&markdown);
    assert!(line < markdown.find("## Results").unwrap());
    assert!(markdown[line..].contains(&figure), "{markdown}");
    assert!(markdown.contains("| 1.000 ± 0.000 ‡ |"), "{markdown}");
    // report.html (and so `gacc view`'s run page), and `gacc runs`.
    let html = std::fs::read_to_string(folder.join("report.html")).unwrap();
    assert!(html.contains("Judge in doubt:"));
    let runs = scratch.gacc().args(["runs", "list"]).output().unwrap();
    assert!(String::from_utf8_lossy(&runs.stdout).contains("‡"));
}
