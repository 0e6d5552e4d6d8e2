//! How sure a difference is (SPEC §13): every pair of compressors in a (condition, budget),
//! recounted here from `results.jsonl` by goal: the difference, the exact sign-flip p where few
//! goals differ, Holm over the report, and the rank intervals that follow.

use crate::common;

use std::collections::BTreeMap;

use common::{Scratch, read_json, read_lines};
use serde_json::Value;

/// Per (condition, budget, compressor), per goal, per seed: (right, scored).
type Scores = BTreeMap<(String, String, String), BTreeMap<String, BTreeMap<u64, (u32, u32)>>>;

fn scores(results: &[Value]) -> Scores {
    let mut scores = Scores::new();
    for row in results {
        let Some(correct) = row["correct"].as_bool() else {
            continue;
        };
        let cell = (
            row["condition"].as_str().unwrap().to_owned(),
            row["ratio"].to_string(),
            row["compressor"].as_str().unwrap().to_owned(),
        );
        let seed = scores
            .entry(cell)
            .or_default()
            .entry(row["goal_id"].as_str().unwrap().to_owned())
            .or_default()
            .entry(row["seed"].as_u64().unwrap())
            .or_default();
        seed.0 += u32::from(correct);
        seed.1 += 1;
    }
    scores
}

/// Per goal both scored: (weight, B − A), as docs/statistics.md defines them.
fn differences(
    a: &BTreeMap<String, BTreeMap<u64, (u32, u32)>>,
    b: &BTreeMap<String, BTreeMap<u64, (u32, u32)>>,
    metric: &str,
) -> Vec<(f64, f64)> {
    let mut out = Vec::new();
    for (goal, seeds_a) in a {
        let Some(seeds_b) = b.get(goal) else { continue };
        let mut x = 0.0;
        let mut weight = 0.0;
        let mut n = 0.0;
        for (seed, &(ra, na)) in seeds_a {
            let Some(&(rb, nb)) = seeds_b.get(seed) else {
                continue;
            };
            let score = |r: u32, n: u32| match metric {
                "micro" => f64::from(r) / f64::from(n),
                _ => f64::from(u8::from(r == n)),
            };
            x += score(rb, nb) - score(ra, na);
            weight += f64::from(na);
            n += 1.0;
        }
        if n > 0.0 {
            out.push((if metric == "micro" { weight / n } else { 1.0 }, x / n));
        }
    }
    out
}

#[test]
fn every_pair_is_tested_over_goals_and_holm_adjusted_over_the_report() {
    let scratch = Scratch::new();
    let (status, folder, stderr) = scratch.run("experiments/baselines.toml", &["-q"]);
    assert_eq!(status, 0, "{stderr}");
    let report = read_json(&folder.join("report.json"));
    let results = read_lines(&folder.join("results.jsonl.gz"));
    let scores = scores(&results);
    let pairs = report["pairs"].as_array().unwrap();
    // 4 compressors: 6 pairs, in Micro and Macro, in each of 3 conditions × 4 ratios.
    assert_eq!(pairs.len(), 6 * 2 * 3 * 4);
    let mut exact = 0;
    for pair in pairs {
        let cell = |name: &str| {
            (
                pair["condition"].as_str().unwrap().to_owned(),
                pair["ratio"].to_string(),
                name.to_owned(),
            )
        };
        let (a, b) = (
            &scores[&cell(pair["a"].as_str().unwrap())],
            &scores[&cell(pair["b"].as_str().unwrap())],
        );
        let metric = pair["metric"].as_str().unwrap();
        let goals = differences(a, b, metric);
        assert_eq!(pair["goals"], goals.len(), "{pair}");
        let total: f64 = goals.iter().map(|(w, _)| w).sum();
        let diff = goals.iter().map(|(w, x)| w * x).sum::<f64>() / total;
        assert!(
            (pair["diff"].as_f64().unwrap() - diff).abs() < 1e-9,
            "{pair}: {diff}"
        );
        let (low, high) = (
            pair["ci95"]["low"].as_f64().unwrap(),
            pair["ci95"]["high"].as_f64().unwrap(),
        );
        assert!(low <= diff + 1e-9 && diff <= high + 1e-9, "{pair}");
        // Where few goals differ, every sign pattern, counted here.
        let values: Vec<f64> = goals.iter().map(|(w, x)| w * x).filter(|v| *v != 0.0).collect();
        if values.len() <= 16 {
            let observed = values.iter().sum::<f64>().abs();
            let patterns = 1u32 << values.len();
            let extreme = (0..patterns)
                .filter(|mask| {
                    let t: f64 = values
                        .iter()
                        .enumerate()
                        .map(|(i, v)| if mask >> i & 1 == 1 { -v } else { *v })
                        .sum();
                    t.abs() >= observed - 1e-9
                })
                .count();
            let p = extreme as f64 / f64::from(patterns);
            assert!((pair["p"].as_f64().unwrap() - p).abs() < 1e-12, "{pair}: {p}");
            exact += 1;
        }
    }
    assert!(exact > 0, "no pair with few goals that differ");
    // Holm over every pair of the report, recounted.
    let mut p: Vec<(f64, usize)> = pairs
        .iter()
        .enumerate()
        .map(|(i, x)| (x["p"].as_f64().unwrap(), i))
        .collect();
    p.sort_by(|x, y| x.0.total_cmp(&y.0));
    let m = p.len();
    let mut running: f64 = 0.0;
    for (j, (value, i)) in p.iter().enumerate() {
        running = running.max(((m - j) as f64 * value).min(1.0));
        let pair = &pairs[*i];
        assert!(
            (pair["p_holm"].as_f64().unwrap() - running).abs() < 1e-12,
            "{pair}"
        );
        assert_eq!(pair["separated"], running < 0.05, "{pair}");
    }
    assert!(
        pairs.iter().any(|p| p["separated"] == true),
        "identity and prefix differ somewhere"
    );
    // Each cell's rank: one more than the separated above it, the cells less those below.
    for cell in report["cells"].as_array().unwrap() {
        let peers: Vec<&Value> = report["cells"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["condition"] == cell["condition"] && c["ratio"] == cell["ratio"])
            .collect();
        let micro = |c: &Value| c["micro"]["mean"].as_f64().unwrap();
        let separated = |other: &Value| {
            pairs.iter().any(|p| {
                p["metric"] == "micro"
                    && p["separated"] == true
                    && p["condition"] == cell["condition"]
                    && p["ratio"] == cell["ratio"]
                    && ((p["a"] == cell["compressor"] && p["b"] == other["compressor"])
                        || (p["b"] == cell["compressor"] && p["a"] == other["compressor"]))
            })
        };
        let above = peers
            .iter()
            .filter(|o| micro(o) > micro(cell) && separated(o))
            .count();
        let below = peers
            .iter()
            .filter(|o| micro(o) < micro(cell) && separated(o))
            .count();
        assert_eq!(cell["rank"]["best"], 1 + above, "{cell}");
        assert_eq!(cell["rank"]["worst"], peers.len() - below, "{cell}");
    }
    // Each cell's noise: the standard deviation over goals of a goal's Micro, seeds averaged.
    for cell in report["cells"].as_array().unwrap() {
        let key = (
            cell["condition"].as_str().unwrap().to_owned(),
            cell["ratio"].to_string(),
            cell["compressor"].as_str().unwrap().to_owned(),
        );
        let goals: Vec<f64> = scores[&key]
            .values()
            .map(|seeds| {
                seeds
                    .values()
                    .map(|&(r, n)| f64::from(r) / f64::from(n))
                    .sum::<f64>()
                    / seeds.len() as f64
            })
            .collect();
        let mean = goals.iter().sum::<f64>() / goals.len() as f64;
        let sd = (goals.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / (goals.len() - 1) as f64).sqrt();
        assert!(
            (cell["noise"]["micro_goal_sd"].as_f64().unwrap() - sd).abs() < 1e-9,
            "{cell}"
        );
        assert_eq!(cell["noise"]["goals"], goals.len());
    }
    // `gacc plan --power`: from a worst case, then from this run as a pilot, its most variable
    // pair's per-goal differences recounted here.
    let manifest = "experiments/baselines.toml";
    let worst = &scratch.json(["plan", manifest, "--power", "--json"])["power"];
    assert_eq!(worst["basis"], "worst-case");
    assert_eq!(worst["goals"], 18);
    assert_eq!(worst["effect"], 0.02);
    // sd √(1/2), 18 goals: 2.8016 · 0.7071 / √18; (2.8016 · 0.7071 / 0.02)² goals for 0.02.
    assert!(
        (worst["micro_mde"].as_f64().unwrap() - 0.4669).abs() < 5e-4,
        "{worst}"
    );
    assert_eq!(worst["goals_needed"]["micro"], 9812);
    let pilot = &scratch.json([
        "plan",
        manifest,
        "--power",
        "--pilot",
        folder.to_str().unwrap(),
        "--effect",
        "0.05",
        "--json",
    ])["power"];
    assert_eq!(pilot["basis"], "pilot");
    let mut largest = [0.0f64; 2];
    for (cell, a) in &scores {
        for (other, b) in &scores {
            if other.0 != cell.0 || other.1 != cell.1 || other.2 <= cell.2 {
                continue;
            }
            for (k, metric) in ["micro", "macro"].iter().enumerate() {
                let x: Vec<f64> = differences(a, b, metric).iter().map(|(_, x)| *x).collect();
                let mean = x.iter().sum::<f64>() / x.len() as f64;
                let sd = (x.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (x.len() - 1) as f64).sqrt();
                largest[k] = largest[k].max(sd);
            }
        }
    }
    let z = 1.959_963_985 + 0.841_621_234;
    for (k, metric) in ["micro", "macro"].iter().enumerate() {
        let mde = pilot[format!("{metric}_mde")].as_f64().unwrap();
        assert!(
            (mde - z * largest[k] / 18f64.sqrt()).abs() < 1e-9,
            "{metric}: {pilot}"
        );
        let needed = (z * largest[k] / 0.05).powi(2).ceil();
        assert_eq!(pilot["goals_needed"][metric].as_f64().unwrap(), needed, "{pilot}");
    }
    // Unasked, the text of `gacc plan` sizes from the experiment's last run as its pilot; the
    // JSON keeps to what is asked.
    let text = scratch.gacc().args(["plan", manifest]).output().unwrap();
    let text = String::from_utf8(text.stdout).unwrap();
    let expected = format!("Micro {:.3}", z * largest[0] / 18f64.sqrt());
    assert!(text.contains("pilot run") && text.contains(&expected), "{text}");
    assert!(scratch.json(["plan", manifest, "--json"]).get("power").is_none());
    // `gacc export --pairs`: a row per pair, its interval in two columns.
    let csv = scratch
        .gacc()
        .args(["export", folder.to_str().unwrap(), "--pairs"])
        .output()
        .unwrap();
    let csv = String::from_utf8(csv.stdout).unwrap();
    let lines: Vec<&str> = csv.lines().collect();
    assert!(
        lines[0].starts_with("condition,ratio,budget_tokens,a,b,metric,diff,ci95_low,ci95_high,p,p_holm")
    );
    assert_eq!(lines.len(), pairs.len() + 1);
    paper_tables(&scratch, &folder, &report);
    let html = std::fs::read_to_string(folder.join("report.html")).unwrap();
    assert!(
        html.contains("<section id=\"pairs\">") && html.contains(">rank<"),
        "report.html has no pairs or ranks"
    );
    let markdown = std::fs::read_to_string(folder.join("report.md")).unwrap();
    assert!(
        markdown.contains("## Pairs") && markdown.contains("within noise") && markdown.contains("separated"),
        "report.md has no pairs"
    );
    // The top of each condition and ratio: in bold only where the ranks separate it from every
    // other compressor, else "within noise" with every compressor that may rank first.
    for cell in report["cells"].as_array().unwrap() {
        let (rank, name) = (&cell["rank"], cell["compressor"].as_str().unwrap());
        let place = format!("- {}, r={}: ", cell["condition"].as_str().unwrap(), cell["ratio"]);
        let line = markdown
            .lines()
            .find(|l| l.starts_with(&place))
            .unwrap_or_else(|| panic!("{place}"));
        match (rank["best"].as_u64(), rank["worst"].as_u64()) {
            (Some(1), Some(1)) => assert!(line.contains(&format!("**{name}**, separated")), "{line}"),
            (Some(1), _) => assert!(
                line.contains("within noise at the top") && line.contains(name),
                "{line}"
            ),
            _ => assert!(!line.contains(&format!("**{name}**")), "{line}"),
        }
    }
    // gacc verify recomputes the pairs as every other figure: one changed is named.
    let (status, printed) = scratch.verify_bare(&folder);
    assert_eq!(status, 0, "{printed}");
    let mut changed = report.clone();
    changed["pairs"][0]["p_holm"] = serde_json::json!(0.0001);
    changed["pairs"][0]["separated"] = serde_json::json!(true);
    std::fs::write(
        folder.join("report.json"),
        serde_json::to_string_pretty(&changed).unwrap(),
    )
    .unwrap();
    let (status, printed) = scratch.verify_bare(&folder);
    assert_eq!(status, 1, "{printed}");
    assert!(printed.contains("pairs[0].p_holm"), "{printed}");
}

/// 60 sources of two goals, one question each: `goal-line` keeps the line that answers (always
/// right), `prefix` at r = 0.3 keeps only filler (never right).
fn stopping_experiment(scratch: &Scratch, stop: &str) {
    let mut lines = String::new();
    for s in 0..60 {
        let filler: String = (0..6)
            .map(|i| format!("Note {i}: the weather at site {s} was calm and the gate was quiet today.\n"))
            .collect();
        let text = format!(
            "{filler}gauge{s}a: reading={} status=ok\ngauge{s}b: reading={} status=ok\n",
            100 + s,
            500 + s
        );
        let goals: Vec<Value> = [("a", 100 + s), ("b", 500 + s)]
            .iter()
            .map(|(g, value)| {
                serde_json::json!({"id": format!("s{s}-{g}"), "text": format!("Know the reading of gauge{s}{g}"),
                    "questions": [{"id": format!("s{s}-{g}-q"), "question": format!("What is the reading of the gauge{s}{g}?"), "reference": value.to_string()}]})
            })
            .collect();
        lines.push_str(&serde_json::json!({"id": format!("s{s}"), "text": text, "goals": goals}).to_string());
        lines.push('\n');
    }
    scratch.write("experiments/data/goals.jsonl", &lines);
    let manifest = format!(
        "name = \"stopping\"\nseeds = [1]\nratios = [0.3]\nconditions = [\"own-goal\"]\n\n[dataset]\npath = \"data/goals.jsonl\"\n\n\
         [compressors.goal-line]\nbuiltin = \"goal-line\"\n\n[compressors.prefix]\nbuiltin = \"prefix\"\n\n\
         [reader]\nbuiltin = \"field-lookup\"\n\n[judge]\nbuiltin = \"exact\"\n\n[run]\n{stop}\n"
    );
    scratch.write("experiments/stopping.toml", &manifest);
}

fn compressor_calls(folder: &std::path::Path) -> u64 {
    read_json(&folder.join("run.json"))["calls"]["compressor"]["made"]
        .as_u64()
        .unwrap()
}

#[test]
fn a_run_stops_once_its_pair_is_separated_and_its_resume_reports_as_a_full_run() {
    let scratch = Scratch::new();
    let stop =
        "stop = { when = \"separated\", pairs = [[\"prefix\", \"goal-line\"]], min_goals = 40, every = 20 }";
    stopping_experiment(&scratch, stop);
    let (status, stopped, stderr) = scratch.run("experiments/stopping.toml", &[]);
    assert_eq!(status, 0, "{stderr}");
    assert!(stderr.contains("stop check after 40 of 120 goals"), "{stderr}");
    assert!(
        stderr.contains("separated") && stderr.contains("stopped early"),
        "{stderr}"
    );
    // At 20 goals the sequence already excludes 0, but no check comes before min_goals.
    assert!(!stderr.contains("after 20 of 120"), "{stderr}");
    let report = read_json(&stopped.join("report.json"));
    let early = &report["stopped_early"];
    assert_eq!(
        (early["goals_read"].as_u64(), early["goals"].as_u64()),
        (Some(40), Some(120))
    );
    assert_eq!(early["memories_not_run"], 160);
    assert!(
        early["pairs"][0].as_str().unwrap().contains("[+0.522, +1.000]"),
        "{early}"
    );
    let made = compressor_calls(&stopped);
    assert!(made <= 240 / 2, "{made} of 240 compressor calls");
    assert_eq!(made, 80);
    let markdown = std::fs::read_to_string(stopped.join("report.md")).unwrap();
    assert!(
        markdown.contains("**Stopped early**") && markdown.contains("Not run: 160 memories"),
        "{markdown}"
    );
    let html = std::fs::read_to_string(stopped.join("report.html")).unwrap();
    assert!(html.contains("Stopped early") && html.contains("goal-line − prefix in [+0.522, +1.000]"));
    // The replay stops where the run did: every figure, the stop's included, follows.
    let (status, said) = scratch.verify_bare(&stopped);
    assert_eq!(status, 0, "{said}");

    // Resumed without `stop`: only what was skipped is called, and the report is a full run's.
    stopping_experiment(&scratch, "");
    let (status, resumed, stderr) = scratch.run("experiments/stopping.toml", &[]);
    assert_eq!(status, 0, "{stderr}");
    let fresh = Scratch::new();
    stopping_experiment(&fresh, "");
    let (status, full, stderr) = fresh.run("experiments/stopping.toml", &[]);
    assert_eq!(status, 0, "{stderr}");
    assert_eq!(made + compressor_calls(&resumed), compressor_calls(&full));
    assert_eq!(compressor_calls(&full), 240);
    let resumed_report = std::fs::read(resumed.join("report.json")).unwrap();
    assert!(resumed_report == std::fs::read(full.join("report.json")).unwrap());
    assert!(
        read_json(&resumed.join("report.json"))
            .get("stopped_early")
            .is_none()
    );

    // A pair that names no compressor is refused, naming the key.
    stopping_experiment(
        &scratch,
        "stop = { when = \"separated\", pairs = [[\"prefix\", \"nope\"]] }",
    );
    let (status, _, stderr) = scratch.run("experiments/stopping.toml", &[]);
    assert_eq!(status, 2, "{stderr}");
    assert!(
        stderr.contains("run.stop") && stderr.contains("`nope`"),
        "{stderr}"
    );
}

/// The 12-goal example of docs/statistics.md: 12 sources of one goal and 8 questions; `prefix`
/// (at r = 0.5) keeps a source's data line only where it comes first, `goal-line` only where the
/// goal's last word is `readings`. Prefix is right on 3 goals goal-line is not, goal-line on 1
/// goal prefix is not, both on the other 8: 24 questions gained, 8 lost, inside 4 goals.
fn twelve_goals(scratch: &Scratch) {
    let fields = [
        "alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta",
    ];
    let mut lines = String::new();
    for g in 0..12 {
        let data = format!(
            "site{g} readings: {}\n",
            fields
                .iter()
                .map(|f| format!("{f}={f}{g}"))
                .collect::<Vec<_>>()
                .join(" ")
        );
        let filler: String = (0..12)
            .map(|i| format!("Note {i}: the weather at site {g} was calm and the gate was quiet.\n"))
            .collect();
        // Goals 0–2: prefix right, goal-line wrong; 3: the reverse; 4–11: both right.
        let text = if g == 3 {
            format!("{filler}{data}")
        } else {
            format!("{data}{filler}")
        };
        let goal = if g < 3 {
            "Know the weather"
        } else {
            "Know the readings"
        };
        let questions: Vec<Value> = (fields.iter())
            .map(|f| serde_json::json!({"id": format!("g{g}-{f}"), "question": format!("What is the {f} here?"), "reference": format!("{f}{g}")}))
            .collect();
        let goals = serde_json::json!([{"id": format!("g{g}"), "text": goal, "questions": questions}]);
        lines.push_str(&serde_json::json!({"id": format!("s{g}"), "text": text, "goals": goals}).to_string());
        lines.push('\n');
    }
    scratch.write("experiments/data/twelve.jsonl", &lines);
    let manifest = |compressors: &str| {
        format!(
            "name = \"twelve\"\nseeds = [1]\nratios = [0.5]\nconditions = [\"own-goal\"]\n\n[dataset]\npath = \"data/twelve.jsonl\"\n\n\
             {compressors}\n[reader]\nbuiltin = \"field-lookup\"\n\n[judge]\nbuiltin = \"exact\"\n"
        )
    };
    let both =
        "[compressors.goal-line]\nbuiltin = \"goal-line\"\n\n[compressors.prefix]\nbuiltin = \"prefix\"\n";
    scratch.write("experiments/twelve.toml", &manifest(both));
    // One compressor name, two behaviours: what `gacc diff` compares.
    scratch.write(
        "experiments/keep-prefix.toml",
        &manifest("[compressors.keep]\nbuiltin = \"prefix\"\n"),
    );
    scratch.write(
        "experiments/keep-goal-line.toml",
        &manifest("[compressors.keep]\nbuiltin = \"goal-line\"\n"),
    );
}

#[test]
fn the_twelve_goal_example_is_within_noise_in_the_report_and_in_diff() {
    let scratch = Scratch::new();
    twelve_goals(&scratch);
    let (status, folder, stderr) = scratch.run("experiments/twelve.toml", &["-q"]);
    assert_eq!(status, 0, "{stderr}");
    let report = read_json(&folder.join("report.json"));
    let pairs = report["pairs"].as_array().unwrap();
    assert_eq!(pairs.len(), 2, "{pairs:?}");
    for pair in pairs {
        assert_eq!(
            (pair["a"].as_str(), pair["b"].as_str()),
            (Some("goal-line"), Some("prefix"))
        );
        assert!(
            (pair["diff"].as_f64().unwrap() - 2.0 / 12.0).abs() < 1e-12,
            "{pair}"
        );
        assert_eq!(pair["p"], 0.625, "{pair}");
        // Holm over the report's two pairs (Micro and Macro): min(1, 2 · 0.625).
        assert_eq!(pair["p_holm"], 1.0, "{pair}");
        assert_eq!(pair["separated"], false);
        assert_eq!(pair["goals"], 12);
    }
    let results = read_lines(&folder.join("results.jsonl.gz"));
    let right = |compressor: &str| {
        (results.iter())
            .filter(|r| r["compressor"] == compressor && r["correct"] == true)
            .count()
    };
    assert_eq!((right("goal-line"), right("prefix")), (72, 88));
    let markdown = std::fs::read_to_string(folder.join("report.md")).unwrap();
    assert!(markdown.contains("within noise"), "{markdown}");

    let (status, prefix, _) = scratch.run("experiments/keep-prefix.toml", &["-q"]);
    assert_eq!(status, 0);
    let (status, goal_line, _) = scratch.run("experiments/keep-goal-line.toml", &["-q"]);
    assert_eq!(status, 0);
    let diff = scratch
        .gacc()
        .arg("diff")
        .arg(&prefix)
        .arg(&goal_line)
        .arg("--fail-on-regression")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&diff.stdout);
    assert_eq!(diff.status.code(), Some(0), "{said}");
    assert!(said.contains("within noise"), "{said}");
    let diff = scratch.json([
        std::ffi::OsStr::new("diff"),
        prefix.as_os_str(),
        goal_line.as_os_str(),
        "--format".as_ref(),
        "json".as_ref(),
    ]);
    let cell = &diff["cells"][0];
    let mcnemar = &cell["mcnemar"];
    assert_eq!(
        (
            mcnemar["right_to_wrong"].as_u64(),
            mcnemar["wrong_to_right"].as_u64()
        ),
        (Some(24), Some(8))
    );
    // McNemar over questions (0.007) decides nothing; the test over goals gives 0.625.
    assert!(mcnemar["p_value"].as_f64().unwrap() < 0.01, "{cell}");
    assert_eq!(cell["micro_test"]["p_value"], 0.625, "{cell}");
    assert_eq!(cell["verdict"], "within noise", "{cell}");
    assert_eq!(diff["regressions"], 0);
}

/// `gacc report RUN --format latex|csv`: a booktabs table per condition holding every cell's
/// Micro, bold exactly where a cell's rank is 1–1 (separated from every other compressor of its
/// column), and the same cells flat in CSV; `-o FILE` writes what stdout shows.
fn paper_tables(scratch: &Scratch, folder: &std::path::Path, report: &Value) {
    let run = folder.to_str().unwrap();
    let tables = |format: &str| scratch.stdout(["report", run, "--format", format]);
    let latex = tables("latex");
    let cells = report["cells"].as_array().unwrap();
    let separated_best = |cell: &Value| cell["rank"]["best"] == 1 && cell["rank"]["worst"] == 1;
    let conditions: std::collections::BTreeSet<&str> =
        cells.iter().map(|c| c["condition"].as_str().unwrap()).collect();
    // Per condition, a table of its cells and one of its frontier (SPEC §15).
    assert_eq!(
        latex.matches("\\begin{table}").count(),
        2 * conditions.len(),
        "{latex}"
    );
    for rule in ["\\toprule", "\\midrule", "\\bottomrule"] {
        assert_eq!(latex.matches(rule).count(), 2 * conditions.len(), "{rule}");
    }
    let (frontiers, results): (Vec<&str>, Vec<&str>) =
        (latex.split("\\begin{table}").skip(1)).partition(|table| table.contains("Pareto rank"));
    assert_eq!(frontiers.len(), conditions.len());
    for table in results {
        let condition = conditions
            .iter()
            .find(|c| table.contains(&format!("condition {c}:")))
            .expect("each table names its condition");
        for cell in cells.iter().filter(|c| c["condition"] == *condition) {
            let row = (table.lines())
                .find(|line| line.starts_with(&format!("{} & ", cell["compressor"].as_str().unwrap())))
                .unwrap();
            let micro = format!("{:.3}", cell["micro"]["mean"].as_f64().unwrap());
            assert!(row.contains(&micro), "{row} lacks {micro}");
            if separated_best(cell) {
                assert!(row.contains(&format!("\\textbf{{{micro}}}")), "{row}");
            }
        }
    }
    let bold = cells.iter().filter(|c| separated_best(c)).count();
    assert_eq!(latex.matches("\\textbf{").count(), bold, "{latex}");
    let csv = tables("csv");
    let lines: Vec<&str> = csv.lines().collect();
    assert!(lines[0].starts_with("condition,compressor,ratio,budget_tokens,micro,micro_low,micro_high"));
    assert_eq!(lines.len(), cells.len() + 1);
    let separated_column = (csv.lines().skip(1))
        .filter(|line| line.split(',').nth(12) == Some("true"))
        .count();
    assert_eq!(separated_column, bold, "{csv}");
    let written = scratch.path("tables.tex");
    let to = written.to_str().unwrap();
    assert_eq!(scratch.stdout(["report", run, "--format", "latex", "-o", to]), "");
    assert_eq!(std::fs::read_to_string(&written).unwrap(), latex);
}

/// The cache's `segments/` folder under `root`, wherever the project keeps it.
fn segments_under(root: &std::path::Path) -> Option<std::path::PathBuf> {
    for entry in std::fs::read_dir(root).ok()?.flatten() {
        let path = entry.path();
        if path.is_dir() {
            if path.file_name().is_some_and(|n| n == "segments") {
                return Some(path);
            }
            if let Some(found) = segments_under(&path) {
                return Some(found);
            }
        }
    }
    None
}

#[test]
fn a_pair_test_is_kept_once_made_read_back_by_a_rerun_and_made_again_by_verify() {
    use sha2::Digest;
    let scratch = Scratch::new();
    let one_seed = ["-q", "--set", "seeds=[1]"];
    let (status, first, stderr) = scratch.run("experiments/baselines.toml", &one_seed);
    assert_eq!(status, 0, "{stderr}");
    let report = read_json(&first.join("report.json"));
    let tests = report["pairs"].as_array().unwrap().len();
    let kept = scratch.cached("pair");
    // Pairs that scored alike share a test; none is kept twice.
    assert!(kept > 0 && kept <= tests, "{kept} of {tests}");

    // Each kept test planted again, later in the cache, with p = 0.5: a re-run reads the
    // planted tests (so it made none), and verify, which makes every test again, catches them.
    let segments = segments_under(&scratch.path("")).expect("the cache's segments");
    let mut planted = String::new();
    for entry in std::fs::read_dir(&segments).unwrap().flatten() {
        if entry.path().extension().is_none_or(|e| e != "log") {
            continue;
        }
        for line in std::fs::read_to_string(entry.path()).unwrap().lines() {
            let fields: Vec<&str> = line.splitn(4, ' ').collect();
            if fields[1] != "pair" {
                continue;
            }
            let mut payload: Value = serde_json::from_str(fields[3]).unwrap();
            payload["response"]["p"] = serde_json::json!(0.5);
            let payload = payload.to_string();
            let checksum = sha2::Sha256::digest(payload.as_bytes());
            let hex: String = checksum.iter().map(|b| format!("{b:02x}")).collect();
            planted += &format!("{} pair {hex} {payload}\n", fields[0]);
        }
    }
    assert_eq!(planted.lines().count(), kept);
    std::fs::write(segments.join("999999999999999-planted.log"), planted).unwrap();
    let (status, second, stderr) = scratch.run("experiments/baselines.toml", &one_seed);
    assert_eq!(status, 0, "{stderr}");
    let read = read_json(&second.join("report.json"));
    let pairs = read["pairs"].as_array().unwrap();
    assert_eq!(pairs.len(), tests);
    assert!(
        pairs.iter().all(|p| p["p"] == 0.5),
        "every test read back as planted"
    );
    assert_eq!(scratch.cached("pair"), kept, "a re-run keeps no new test");

    let (status, printed) = scratch.verify_bare(&first);
    assert_eq!(status, 0, "the honest run verifies: {printed}");
    let (status, printed) = scratch.verify_bare(&second);
    assert_eq!(status, 1, "{printed}");
    assert!(printed.contains("pairs[0].p"), "{printed}");
}
