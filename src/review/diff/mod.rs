//! `gacc diff RUN_A RUN_B`: what changed between two runs — settings, per-cell metrics with
//! paired tests over the shared questions and goals, and the questions that flipped.

mod goals;
mod render;

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

pub(crate) use goals::GoalTest;
use goals::{goal_test, verdict};
pub(crate) use render::render;

mod why;
use why::WhyDiff;

pub(crate) const SCHEMA: &str = "gacc.diff/1";
/// A cell regresses when B is worse with p (or the interval's upper end) below this.
pub(crate) const SIGNIFICANCE: f64 = 0.05;

/// One finished run, as read from its folder.
struct Run {
    folder: PathBuf,
    report: StoredReport,
    manifest: Option<toml::Value>,
    /// Per callback, the files its command runs and their SHA-256, as run.json recorded them.
    scripts: BTreeMap<String, BTreeMap<String, String>>,
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
    /// Per shared cell, its attribution and gap closed in both runs (SPEC §11).
    pub why: Vec<WhyDiff>,
    /// The points that joined or left the cost–quality frontier (SPEC §15).
    pub frontier: why::FrontierDiff,
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
    /// Micro B − A over the goals both scored, tested by goal (SPEC §13): the verdict's test.
    pub micro_test: GoalTest,
    /// McNemar over questions, which counts the questions of a goal as independent: shown
    /// beside the goal test, never the verdict.
    pub mcnemar: McNemar,
    pub macro_bootstrap: Bootstrap,
    /// `better`, `worse` or `within noise`.
    pub verdict: &'static str,
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
    pub direction: Direction,
}

/// Which way a question's verdict flipped from A to B; written `right→wrong` or `wrong→right`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub(crate) enum Direction {
    #[serde(rename = "right→wrong")]
    Lost,
    #[serde(rename = "wrong→right")]
    Gained,
}

impl Direction {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Direction::Lost => "right→wrong",
            Direction::Gained => "wrong→right",
        }
    }
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
    let scripts = (folder.read_text(crate::store::run_folder::RUN).ok())
        .and_then(|text| crate::store::run_record::RunRecord::parse(&text))
        .map(|record| record.scripts)
        .unwrap_or_default();
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
        scripts,
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
        // A callback's identity is its files too: an edit to its script is a changed setting.
        for (callback, files) in &run.scripts {
            for (file, sha256) in files {
                let shown = sha256.get(..12).unwrap_or(sha256);
                map.insert(format!("{callback} script {file}"), format!("sha256 {shown}…"));
            }
        }
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
    pub(super) fn new(
        compressor: &Value,
        condition: &Value,
        ratio: &Value,
        budget_tokens: Option<&Value>,
    ) -> Self {
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

    pub(crate) fn of(cell: &StoredCell) -> Self {
        CellLabel::new(
            &cell.compressor,
            &cell.condition,
            &cell.ratio,
            cell.budget_tokens.as_ref(),
        )
    }
}

/// A results row's cell, named as its report cell is (the same fields, as written).
pub(crate) fn cell_of(row: &ResultRow) -> CellLabel {
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
    let mut why = Vec::new();
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
        why.push(WhyDiff::of(id.clone(), cell_a, cell_b));
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
        frontier: why::FrontierDiff::of(&a.report, &b.report),
        why,
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
    // goal → seed → (right in A, right in B, questions)
    let mut micro: BTreeMap<&str, BTreeMap<u64, (usize, usize, usize)>> = BTreeMap::new();
    for key in &shared {
        let ((ra, answer_a), (rb, answer_b)) = (&va[*key], &vb[*key]);
        let goal = goals.entry((key.0, key.1.as_str())).or_insert((true, true));
        goal.0 &= *ra;
        goal.1 &= *rb;
        let seed = micro.entry(key.1.as_str()).or_default().entry(key.0).or_default();
        seed.0 += usize::from(*ra);
        seed.1 += usize::from(*rb);
        seed.2 += 1;
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
                direction: if *ra { Direction::Lost } else { Direction::Gained },
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
    let micro_test = goal_test(&micro);
    let verdict = verdict(&micro_test, &macro_bootstrap);
    let regression = verdict == "worse";
    let cell = CellDiff {
        cell: id,
        micro_a,
        micro_b,
        micro_delta: micro_b.zip(micro_a).map(|(b, a)| b - a),
        macro_a,
        macro_b,
        macro_delta: macro_b.zip(macro_a).map(|(b, a)| b - a),
        micro_test,
        mcnemar,
        macro_bootstrap,
        verdict,
        regression,
    };
    (cell, flipped)
}
