//! `gacc diff RUN_A RUN_B`: what changed between two runs — settings, per-cell metrics with
//! paired tests over the shared questions and goals, and the questions that flipped.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::Value;

use crate::error::Error;
use crate::inputs::records::Source;
use crate::report::stats::{Bootstrap, DIFF_RESAMPLES, DIFF_SEED, mcnemar_p, paired_bootstrap};
use crate::report::stored::{StoredCell, StoredReport, text};
use crate::store::ledger::ResultRow;
use crate::store::run_folder::{DATASET, MANIFEST, REPORT_JSON, RESULTS, RunFolder};

pub(crate) const SCHEMA: &str = "gacc.diff/1";
/// A cell regresses when B is worse with p (or the interval's upper end) below this.
pub(crate) const SIGNIFICANCE: f64 = 0.05;

/// One finished run, as read from its folder.
struct Run {
    folder: PathBuf,
    report: StoredReport,
    manifest: Option<toml::Value>,
    results: Vec<ResultRow>,
    questions: HashMap<String, String>,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct Diff {
    pub schema: &'static str,
    pub a: String,
    pub b: String,
    pub settings: Vec<SettingChange>,
    pub cells: Vec<CellDiff>,
    pub only_in_a: Vec<CellLabel>,
    pub only_in_b: Vec<CellLabel>,
    pub flipped: Vec<Flip>,
    /// Cells where B is significantly worse than A.
    pub regressions: usize,
    /// Each audit judge of either run: how it agreed with the scoring judge in A and in B.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub judge_audit: Vec<AuditDiff>,
}

/// An audit judge's agreement with the scoring judge in each run (SPEC §10).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub(crate) struct AuditDiff {
    pub judge: String,
    pub compared_a: Option<u64>,
    pub compared_b: Option<u64>,
    pub agreement_a: Option<f64>,
    pub agreement_b: Option<f64>,
    pub kappa_a: Option<f64>,
    pub kappa_b: Option<f64>,
}

fn audit_diff(a: &StoredReport, b: &StoredReport) -> Vec<AuditDiff> {
    let (a, b) = (&a.judge_audit.judges, &b.judge_audit.judges);
    let names: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    names
        .into_iter()
        .map(|judge| {
            let (x, y) = (a.get(judge), b.get(judge));
            AuditDiff {
                judge: judge.clone(),
                compared_a: x.map(|x| x.compared),
                compared_b: y.map(|y| y.compared),
                agreement_a: x.and_then(|x| x.agreement),
                agreement_b: y.and_then(|y| y.agreement),
                kappa_a: x.and_then(|x| x.kappa),
                kappa_b: y.and_then(|y| y.kappa),
            }
        })
        .collect()
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub(crate) struct SettingChange {
    pub key: String,
    pub a: Option<String>,
    pub b: Option<String>,
}

/// A cell as two `report.json` files name it, compared as text: the runs may come from
/// different versions of gacc, so the typed `CellId` of the rows is not assumed.
#[derive(Debug, Clone, Serialize, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct CellLabel {
    pub compressor: String,
    pub condition: String,
    pub ratio: String,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct CellDiff {
    #[serde(flatten)]
    pub cell: CellLabel,
    /// Null where a run measured nothing in the cell (no question scored).
    pub micro_a: Option<f64>,
    pub micro_b: Option<f64>,
    pub micro_delta: Option<f64>,
    pub macro_a: Option<f64>,
    pub macro_b: Option<f64>,
    pub macro_delta: Option<f64>,
    pub mcnemar: McNemar,
    pub macro_bootstrap: Bootstrap,
    pub regression: bool,
}

/// The exact McNemar test over questions scored in both runs.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub(crate) struct McNemar {
    pub shared_questions: usize,
    pub right_to_wrong: usize,
    pub wrong_to_right: usize,
    pub p_value: f64,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct Flip {
    #[serde(flatten)]
    pub cell: CellLabel,
    pub seed: u64,
    pub goal_id: String,
    pub question_id: String,
    pub question: String,
    pub answer_a: String,
    pub answer_b: String,
    /// `right→wrong` or `wrong→right`.
    pub direction: &'static str,
}

/// Reads a run from its folder, a `latest` link, or its `report.json`.
fn load(path: &Path) -> Result<Run, Error> {
    let folder = RunFolder::open(path);
    let report = StoredReport::of(&folder.read_json(REPORT_JSON)?);
    if report.schema != crate::report::SCHEMA {
        return Err(Error::Schema {
            path: folder.file(REPORT_JSON),
            expected: crate::report::SCHEMA.to_string(),
            found: text(&report.schema),
        });
    }
    let manifest = folder
        .read_text(MANIFEST)
        .ok()
        .and_then(|text| toml::from_str(&text).ok());
    let mut questions = HashMap::new();
    for source in folder.read_rows::<Source>(DATASET)? {
        for goal in source.goals {
            for question in goal.questions {
                questions.insert(question.id, question.question);
            }
        }
    }
    Ok(Run {
        results: folder.read_rows(RESULTS)?,
        folder: folder.path().to_path_buf(),
        report,
        manifest,
        questions,
    })
}

fn flatten(prefix: &str, value: &toml::Value, out: &mut BTreeMap<String, String>) {
    match value {
        toml::Value::Table(table) => {
            for (key, value) in table {
                let path = if prefix.is_empty() {
                    key.clone()
                } else {
                    format!("{prefix}.{key}")
                };
                flatten(&path, value, out);
            }
        }
        other => {
            out.insert(prefix.to_owned(), other.to_string());
        }
    }
}

fn settings(a: &Run, b: &Run) -> Vec<SettingChange> {
    let mut left = BTreeMap::new();
    let mut right = BTreeMap::new();
    if let Some(manifest) = &a.manifest {
        flatten("", manifest, &mut left);
    }
    if let Some(manifest) = &b.manifest {
        flatten("", manifest, &mut right);
    }
    for (run, map) in [(a, &mut left), (b, &mut right)] {
        map.insert("(dataset sha256)".into(), run.report.dataset.sha256.to_string());
        map.insert(
            "(tokenizer)".into(),
            format!("{} {}", run.report.tokenizer.name, run.report.tokenizer.revision),
        );
        map.insert(
            "(gacc version)".into(),
            run.report.experiment.gacc_version.to_string(),
        );
    }
    let keys: std::collections::BTreeSet<&String> = left.keys().chain(right.keys()).collect();
    keys.into_iter()
        .filter(|k| left.get(*k) != right.get(*k))
        .map(|k| SettingChange {
            key: k.clone(),
            a: left.get(k).cloned(),
            b: right.get(k).cloned(),
        })
        .collect()
}

impl CellLabel {
    /// A cell by the fields that name it, in a report's cell or a results row.
    fn new(compressor: &Value, condition: &Value, ratio: &Value, budget_tokens: Option<&Value>) -> Self {
        CellLabel {
            compressor: text(compressor),
            condition: text(condition),
            // A token budget's cell is named by its L.
            ratio: match budget_tokens {
                Some(tokens) => format!("L={tokens}"),
                None => text(ratio),
            },
        }
    }

    fn of(cell: &StoredCell) -> Self {
        CellLabel::new(
            &cell.compressor,
            &cell.condition,
            &cell.ratio,
            cell.budget_tokens.as_ref(),
        )
    }
}

/// A results row's cell, named as its report cell is (the same fields, as written).
fn cell_of(row: &ResultRow) -> CellLabel {
    let written = |value: serde_json::Result<Value>| value.unwrap_or(Value::Null);
    CellLabel::new(
        &Value::String(row.compressor.clone()),
        &written(serde_json::to_value(row.condition)),
        &written(serde_json::to_value(row.ratio)),
        row.budget_tokens.map(Value::from).as_ref(),
    )
}

/// A scored question: (seed, goal, question) → (correct, answer).
type Verdicts = HashMap<(u64, String, String), (bool, String)>;

fn verdicts(run: &Run) -> HashMap<CellLabel, Verdicts> {
    let mut out: HashMap<CellLabel, Verdicts> = HashMap::new();
    for row in &run.results {
        let Some(correct) = row.correct else {
            continue;
        };
        let key = (row.seed, row.goal_id.clone(), row.question_id.clone());
        let answer = row.answer.clone().unwrap_or_default();
        out.entry(cell_of(row))
            .or_default()
            .insert(key, (correct, answer));
    }
    out
}

/// Compares two finished runs.
pub(crate) fn diff(path_a: &Path, path_b: &Path) -> Result<Diff, Error> {
    let (a, b) = (load(path_a)?, load(path_b)?);
    let (cells_a, cells_b) = (&a.report.cells, &b.report.cells);
    let (verdicts_a, verdicts_b) = (verdicts(&a), verdicts(&b));
    let empty = Verdicts::new();
    let mut cells = Vec::new();
    let mut flipped = Vec::new();
    let mut only_in_a = Vec::new();
    for cell_a in cells_a {
        let id = CellLabel::of(cell_a);
        let Some(cell_b) = cells_b.iter().find(|c| CellLabel::of(c) == id) else {
            only_in_a.push(id);
            continue;
        };
        let (va, vb) = (
            verdicts_a.get(&id).unwrap_or(&empty),
            verdicts_b.get(&id).unwrap_or(&empty),
        );
        let means = [
            cell_a.micro.map(|s| s.mean),
            cell_b.micro.map(|s| s.mean),
            cell_a.macro_.map(|s| s.mean),
            cell_b.macro_.map(|s| s.mean),
        ];
        let (cell, flips) = compare_cell(id, (va, vb), means, (&a, &b));
        cells.push(cell);
        flipped.extend(flips);
    }
    let only_in_b = cells_b
        .iter()
        .map(CellLabel::of)
        .filter(|id| !cells_a.iter().any(|c| CellLabel::of(c) == *id))
        .collect();
    Ok(Diff {
        schema: SCHEMA,
        a: a.folder.display().to_string(),
        b: b.folder.display().to_string(),
        settings: settings(&a, &b),
        regressions: cells.iter().filter(|c| c.regression).count(),
        cells,
        only_in_a,
        only_in_b,
        flipped,
        judge_audit: audit_diff(&a.report, &b.report),
    })
}

/// One cell of both runs: the questions whose verdict flipped, McNemar's test over them, and
/// the paired bootstrap of Macro over the goals both judged. `means` are Micro and Macro of A and
/// B as the reports give them.
fn compare_cell(
    id: CellLabel,
    (va, vb): (&Verdicts, &Verdicts),
    means: [Option<f64>; 4],
    (a, b): (&Run, &Run),
) -> (CellDiff, Vec<Flip>) {
    let mut flipped = Vec::new();
    let mut shared: Vec<&(u64, String, String)> = va.keys().filter(|k| vb.contains_key(*k)).collect();
    shared.sort();
    let (mut right_to_wrong, mut wrong_to_right) = (0, 0);
    // goal → (all right in A, all right in B)
    let mut goals: BTreeMap<(u64, &str), (bool, bool)> = BTreeMap::new();
    for key in &shared {
        let ((ra, answer_a), (rb, answer_b)) = (&va[*key], &vb[*key]);
        let goal = goals.entry((key.0, key.1.as_str())).or_insert((true, true));
        goal.0 &= *ra;
        goal.1 &= *rb;
        if ra != rb {
            if *ra {
                right_to_wrong += 1;
            } else {
                wrong_to_right += 1;
            }
            flipped.push(Flip {
                cell: id.clone(),
                seed: key.0,
                goal_id: key.1.clone(),
                question_id: key.2.clone(),
                question: b
                    .questions
                    .get(&key.2)
                    .or_else(|| a.questions.get(&key.2))
                    .cloned()
                    .unwrap_or_default(),
                answer_a: answer_a.clone(),
                answer_b: answer_b.clone(),
                direction: if *ra { "right→wrong" } else { "wrong→right" },
            });
        }
    }
    let mcnemar = McNemar {
        shared_questions: shared.len(),
        right_to_wrong,
        wrong_to_right,
        p_value: mcnemar_p(right_to_wrong, wrong_to_right),
    };
    let pairs: Vec<(bool, bool)> = goals.values().copied().collect();
    let macro_bootstrap = paired_bootstrap(&pairs, DIFF_RESAMPLES, DIFF_SEED);
    let [micro_a, micro_b, macro_a, macro_b] = means;
    let regression = (right_to_wrong > wrong_to_right && mcnemar.p_value < SIGNIFICANCE)
        || (macro_bootstrap.shared_goals > 0 && macro_bootstrap.ci95_high < 0.0);
    let cell = CellDiff {
        cell: id,
        micro_a,
        micro_b,
        micro_delta: micro_b.zip(micro_a).map(|(b, a)| b - a),
        macro_a,
        macro_b,
        macro_delta: macro_b.zip(macro_a).map(|(b, a)| b - a),
        mcnemar,
        macro_bootstrap,
        regression,
    };
    (cell, flipped)
}

/// The settings that differ, as a Markdown table.
fn settings_table(settings: &[SettingChange]) -> String {
    let mut out = String::new();
    if settings.is_empty() {
        out.push_str("No setting changed.\n\n");
    } else {
        out.push_str("| key | A | B |\n|---|---|---|\n");
        for s in settings {
            let show = |v: &Option<String>| v.clone().unwrap_or_else(|| "—".into()).replace('|', "\\|");
            out.push_str(&format!("| {} | {} | {} |\n", s.key, show(&s.a), show(&s.b)));
        }
        out.push('\n');
    }
    out
}

/// The audit judges' agreement in both runs, as a Markdown section (nothing without one).
fn audit_table(audits: &[AuditDiff]) -> String {
    let mut out = String::new();
    if !audits.is_empty() {
        let number = |v: Option<f64>| v.map_or("—".to_owned(), |v| format!("{v:.3}"));
        let count = |v: Option<u64>| v.map_or("—".to_owned(), |v| v.to_string());
        out.push_str("\n## Judge audit\n\nEach audit judge against the scoring judge, in A and in B.\n\n| audit judge | compared A | compared B | agreement A | agreement B | κ A | κ B |\n|---|---:|---:|---:|---:|---:|---:|\n");
        for j in audits {
            out.push_str(&format!(
                "| `{}` | {} | {} | {} | {} | {} | {} |\n",
                j.judge,
                count(j.compared_a),
                count(j.compared_b),
                number(j.agreement_a),
                number(j.agreement_b),
                number(j.kappa_a),
                number(j.kappa_b),
            ));
        }
    }
    out
}

/// The diff as Markdown; with `colour`, gains green and losses red (ANSI).
pub(crate) fn render(diff: &Diff, colour: bool) -> String {
    let paint = |value: f64, text: String| match (colour, value) {
        (true, v) if v > 0.0 => format!("\x1b[32m{text}\x1b[0m"),
        (true, v) if v < 0.0 => format!("\x1b[31m{text}\x1b[0m"),
        _ => text,
    };
    let cell = |c: &CellLabel| format!("{} | {} | {}", c.compressor, c.condition, c.ratio);
    // Nothing measured is `n/a`, never a number.
    let number = |v: Option<f64>| v.map_or("n/a".to_owned(), |v| format!("{v:.3}"));
    let delta = |v: Option<f64>| v.map_or("n/a".to_owned(), |v| paint(v, format!("{v:+.3}")));
    let mut out = format!(
        "# gacc diff\n\n- A: `{}`\n- B: `{}`\n\n## Settings\n\n",
        diff.a, diff.b
    );
    out.push_str(&settings_table(&diff.settings));
    out.push_str("## Cells\n\nMicro: exact McNemar test over the questions scored in both runs. Macro: paired bootstrap over goals (10,000 resamples), 95% interval of B − A.\n\n");
    out.push_str("| compressor | condition | ratio | Micro A | Micro B | Δ Micro | right→wrong | wrong→right | McNemar p | Macro A | Macro B | Δ Macro | 95% interval | |\n");
    out.push_str("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|\n");
    for c in &diff.cells {
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | [{:+.3}, {:+.3}] | {} |\n",
            cell(&c.cell),
            number(c.micro_a),
            number(c.micro_b),
            delta(c.micro_delta),
            c.mcnemar.right_to_wrong,
            c.mcnemar.wrong_to_right,
            if c.mcnemar.p_value < 1e-4 {
                format!("{:.1e}", c.mcnemar.p_value)
            } else {
                format!("{:.4}", c.mcnemar.p_value)
            },
            number(c.macro_a),
            number(c.macro_b),
            delta(c.macro_delta),
            c.macro_bootstrap.ci95_low,
            c.macro_bootstrap.ci95_high,
            if c.regression {
                paint(-1.0, "regression".into())
            } else {
                String::new()
            },
        ));
    }
    for (title, cells) in [("Only in A", &diff.only_in_a), ("Only in B", &diff.only_in_b)] {
        if !cells.is_empty() {
            out.push_str(&format!("\n## {title}\n\n"));
            for c in cells.iter() {
                out.push_str(&format!("- {}\n", cell(c).replace(" | ", " · ")));
            }
        }
    }
    out.push_str(&audit_table(&diff.judge_audit));
    let count = |d: &str| diff.flipped.iter().filter(|f| f.direction == d).count();
    out.push_str(&format!(
        "\n## Flipped questions\n\n{} right→wrong, {} wrong→right.\n",
        count("right→wrong"),
        count("wrong→right")
    ));
    if !diff.flipped.is_empty() {
        out.push_str("\n| compressor | condition | ratio | seed | question | | answer A | answer B |\n|---|---|---:|---:|---|---|---|---|\n");
        for f in &diff.flipped {
            let clip = |s: &str| {
                let s: String = s.chars().take(80).collect();
                s.replace('|', "\\|").replace('\n', " ")
            };
            out.push_str(&format!(
                "| {} | {} | {} `{}` | {} | {} | {} |\n",
                cell(&f.cell),
                f.seed,
                clip(&f.question),
                f.question_id,
                paint(
                    if f.direction == "wrong→right" { 1.0 } else { -1.0 },
                    f.direction.to_owned()
                ),
                clip(&f.answer_a),
                clip(&f.answer_b),
            ));
        }
    }
    out
}
