//! `judge_audit` (SPEC §10): how far the scores depend on the judge. Each audit judge, and the
//! human labels, against the scoring judge over the answers both gave a verdict on (a call with
//! no verdict is an abstention, counted apart); per cell, the Micro and Macro each audit judge
//! gives the answers it audited; and the places where an audit judge reorders the compressors of
//! a (condition, budget) or moves a Micro beyond its 95% interval. Made from the result rows
//! alone: the scoring judge's Micro and Macro are never touched.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use super::Cell;
use super::stats::{Interval, REPORT_RESAMPLES, REPORT_SEED, interval, resample};
use crate::inputs::labels::Labels;
use crate::protocol::{BudgetRule, CellId, Condition};
use crate::store::ledger::ResultRow;

#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub(crate) struct JudgeAudit {
    /// Per audit judge, in `[audit] judges` order of names.
    pub(crate) judges: BTreeMap<String, AuditOfJudge>,
    /// The human labels against the scoring judge, and every judge's accuracy against them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) labels: Option<LabelAudit>,
    /// Where an audit judge reorders compressors or moves a Micro beyond its interval.
    pub(crate) ranking_changes: Vec<RankingChange>,
}

#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub(crate) struct AuditOfJudge {
    /// The share of answers it audits.
    pub(crate) fraction: f64,
    /// Answers in its sample.
    pub(crate) audited: usize,
    #[serde(flatten)]
    pub(crate) agreement: Agreement,
    pub(crate) cells: Vec<AuditedCell>,
}

/// Two judges' verdicts on the same answers: the scoring judge's, and the other's.
#[derive(Debug, Clone, Default, PartialEq, Serialize, schemars::JsonSchema)]
pub(crate) struct Agreement {
    /// Answers both gave a verdict on.
    pub(crate) compared: usize,
    /// The share of those with the same verdict (none when nothing was compared).
    pub(crate) agreement: Option<f64>,
    /// Cohen's κ: agreement beyond chance. None when chance agreement is 1 (each side gave
    /// a single verdict throughout).
    pub(crate) kappa: Option<f64>,
    /// 95% bootstrap interval of κ over the compared answers.
    pub(crate) kappa_95: Option<Interval>,
    pub(crate) both_correct: usize,
    pub(crate) scoring_only: usize,
    pub(crate) audit_only: usize,
    pub(crate) neither: usize,
    /// Answers the scoring judge gave no verdict on.
    pub(crate) scoring_abstained: usize,
    /// Answers the other side gave no verdict on.
    pub(crate) audit_abstained: usize,
}

/// One cell as an audit judge scores the answers it audited.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub(crate) struct AuditedCell {
    #[serde(flatten)]
    pub(crate) id: CellId,
    pub(crate) audited: usize,
    /// The share of its verdicts that say correct.
    pub(crate) micro: Option<f64>,
    /// The scoring judge's share over the same answers.
    pub(crate) scoring_micro: Option<f64>,
    /// The share of goals (per seed) whose every answer it audited and found correct, over the
    /// goals whose every answer it audited.
    #[serde(rename = "macro")]
    pub(crate) macro_: Option<f64>,
}

#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub(crate) struct LabelAudit {
    /// The labels file, as the manifest names it.
    pub(crate) file: String,
    pub(crate) labels: usize,
    /// Answers of the run a label applies to.
    pub(crate) labelled_answers: usize,
    /// The labels as the other side, against the scoring judge.
    #[serde(flatten)]
    pub(crate) agreement: Agreement,
    /// Per judge (`scoring`, then each audit judge): its verdicts against the labels.
    pub(crate) accuracy: BTreeMap<String, AgainstLabels>,
}

/// A judge's verdicts against the labels, "correct" being the positive class.
#[derive(Debug, Clone, Default, PartialEq, Serialize, schemars::JsonSchema)]
pub(crate) struct AgainstLabels {
    pub(crate) compared: usize,
    pub(crate) accuracy: Option<f64>,
    pub(crate) precision: Option<f64>,
    pub(crate) recall: Option<f64>,
}

#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub(crate) struct RankingChange {
    pub(crate) judge: String,
    pub(crate) condition: Condition,
    #[serde(flatten)]
    pub(crate) rule: BudgetRule,
    /// The compressor whose Micro moved; none for a reordering.
    pub(crate) compressor: Option<String>,
    /// What changed, in a sentence.
    pub(crate) sentence: String,
}

/// The audit of a run's rows; None when nothing audited them.
pub(crate) fn audit(
    results: &[ResultRow],
    cells: &[Cell],
    fractions: &[(String, f64)],
    labels: Option<&Labels>,
) -> Option<JudgeAudit> {
    if fractions.is_empty() && labels.is_none() {
        return None;
    }
    let mut judges = BTreeMap::new();
    let mut ranking_changes = Vec::new();
    for (name, fraction) in fractions {
        let audited: Vec<(&ResultRow, Option<bool>)> = results
            .iter()
            .filter_map(|row| Some((row, *row.audits.get(name)?)))
            .collect();
        let pairs = audited.iter().map(|(row, verdict)| (row.correct, *verdict));
        let audited_cells = audited_cells(&audited);
        ranking_changes.extend(changes(name, cells, &audited_cells));
        judges.insert(
            name.clone(),
            AuditOfJudge {
                fraction: *fraction,
                audited: audited.len(),
                agreement: agreement(pairs),
                cells: audited_cells,
            },
        );
    }
    let labels = labels.map(|labels| label_audit(results, labels, fractions));
    Some(JudgeAudit {
        judges,
        labels,
        ranking_changes,
    })
}

/// The agreement of verdict pairs (scoring judge, other side).
pub(crate) fn agreement(pairs: impl Iterator<Item = (Option<bool>, Option<bool>)>) -> Agreement {
    let mut out = Agreement::default();
    let mut compared = Vec::new();
    for pair in pairs {
        match pair {
            (None, _) => out.scoring_abstained += 1,
            (_, None) => out.audit_abstained += 1,
            (Some(scoring), Some(other)) => compared.push((scoring, other)),
        }
    }
    for (scoring, other) in &compared {
        match (scoring, other) {
            (true, true) => out.both_correct += 1,
            (true, false) => out.scoring_only += 1,
            (false, true) => out.audit_only += 1,
            (false, false) => out.neither += 1,
        }
    }
    out.compared = compared.len();
    out.agreement = share(out.both_correct + out.neither, out.compared);
    out.kappa = kappa(compared.iter().copied());
    if out.kappa.is_some() {
        let values: Vec<f64> = resample(compared.len(), REPORT_RESAMPLES, REPORT_SEED, |draw| {
            kappa(draw.map(|i| compared[i]))
        })
        .into_iter()
        .flatten()
        .collect();
        out.kappa_95 = (!values.is_empty()).then(|| interval(values));
    }
    out
}

/// Cohen's κ of verdict pairs, from the four counts: 2(ad − bc) / ((a+b)(b+d) + (a+c)(c+d)),
/// which is (observed − chance agreement) / (1 − chance agreement) with no rounding on the way
/// (a judge that is never right beyond chance gets 0, not a trace of it).
fn kappa(pairs: impl Iterator<Item = (bool, bool)>) -> Option<f64> {
    let [mut a, mut b, mut c, mut d] = [0u64; 4];
    for pair in pairs {
        match pair {
            (true, true) => a += 1,
            (true, false) => b += 1,
            (false, true) => c += 1,
            (false, false) => d += 1,
        }
    }
    let (a, b, c, d) = (a as i128, b as i128, c as i128, d as i128);
    // A side that gave one verdict throughout has no agreement beyond chance to measure.
    if a + b == 0 || c + d == 0 || a + c == 0 || b + d == 0 {
        return None;
    }
    let denominator = (a + b) * (b + d) + (a + c) * (c + d);
    (denominator != 0).then(|| (2 * (a * d - b * c)) as f64 / denominator as f64)
}

fn share(part: usize, whole: usize) -> Option<f64> {
    (whole > 0).then(|| part as f64 / whole as f64)
}

/// Per cell (in first-seen order), the audit judge's Micro and Macro over what it audited.
pub(crate) fn audited_cells(audited: &[(&ResultRow, Option<bool>)]) -> Vec<AuditedCell> {
    let mut order: Vec<CellId> = Vec::new();
    let mut rows: HashMap<CellId, Vec<(&ResultRow, Option<bool>)>> = HashMap::new();
    for (row, verdict) in audited {
        let id = row.cell();
        if !rows.contains_key(&id) {
            order.push(id.clone());
        }
        rows.entry(id).or_default().push((row, *verdict));
    }
    order
        .into_iter()
        .map(|id| {
            let rows = &rows[&id];
            let judged: Vec<bool> = rows.iter().filter_map(|(_, v)| *v).collect();
            let scored: Vec<bool> = rows.iter().filter_map(|(row, v)| v.and(row.correct)).collect();
            AuditedCell {
                audited: rows.len(),
                micro: share(judged.iter().filter(|v| **v).count(), judged.len()),
                scoring_micro: share(scored.iter().filter(|v| **v).count(), scored.len()),
                macro_: audited_macro(rows),
                id,
            }
        })
        .collect()
}

/// The share of goals (per seed) all of whose answers the audit judge found correct, over the
/// goals it gave a verdict on every answer of. A goal's answers are its rows in the cell; a goal
/// with an answer outside the sample is left out.
fn audited_macro(rows: &[(&ResultRow, Option<bool>)]) -> Option<f64> {
    let mut goals: BTreeMap<(u64, &str), Vec<Option<bool>>> = BTreeMap::new();
    for (row, verdict) in rows {
        goals
            .entry((row.seed, row.goal_id.as_str()))
            .or_default()
            .push(*verdict);
    }
    let whole: Vec<bool> = goals
        .values()
        .filter_map(|verdicts| verdicts.iter().copied().collect::<Option<Vec<bool>>>())
        .map(|verdicts| verdicts.iter().all(|v| *v))
        .collect();
    share(whole.iter().filter(|v| **v).count(), whole.len())
}

/// How a budget reads in a sentence: `r = 0.1` or `L = 128`.
pub(crate) fn budget_text(rule: BudgetRule) -> String {
    match rule {
        BudgetRule::Ratio(ratio) => format!("r = {ratio}"),
        BudgetRule::Tokens(tokens) => format!("L = {tokens}"),
    }
}

/// Each (condition, budget) of `cells`, in the order cells first name them.
pub(crate) fn groups(cells: &[Cell]) -> Vec<(Condition, BudgetRule)> {
    let mut groups: Vec<(Condition, BudgetRule)> = Vec::new();
    for cell in cells {
        let group = (cell.id.condition, cell.id.rule);
        if !groups.contains(&group) {
            groups.push(group);
        }
    }
    groups
}

/// Where two compressors (name, Micro one way, Micro the other) change places, both orders
/// (best first, names breaking ties), else None.
pub(crate) fn reordered(scored: &[(&str, f64, f64)]) -> Option<(String, String)> {
    let inverted = (scored.iter()).any(|a| scored.iter().any(|b| a.1 > b.1 && a.2 < b.2));
    let order = |by: fn(&(&str, f64, f64)) -> f64| {
        let mut names = scored.to_vec();
        names.sort_by(|a, b| by(b).total_cmp(&by(a)).then(a.0.cmp(b.0)));
        names.iter().map(|c| c.0).collect::<Vec<_>>().join(" > ")
    };
    inverted.then(|| (order(|c| c.1), order(|c| c.2)))
}

/// Where audit judge `judge` reorders two compressors of a (condition, budget) — one ahead of
/// the other by the scoring judge's Micro, behind it by the audit judge's — and each cell whose
/// Micro it puts outside the cell's 95% interval.
fn changes(judge: &str, cells: &[Cell], audited: &[AuditedCell]) -> Vec<RankingChange> {
    let audit_micro = |id: &CellId| audited.iter().find(|c| &c.id == id).and_then(|c| c.micro);
    let mut out = Vec::new();
    for (condition, rule) in groups(cells) {
        let scored: Vec<(&str, f64, f64)> = cells
            .iter()
            .filter(|c| c.id.condition == condition && c.id.rule == rule)
            .filter_map(|c| Some((c.id.compressor.as_str(), c.micro?.mean, audit_micro(&c.id)?)))
            .collect();
        if let Some((first, second)) = reordered(&scored) {
            out.push(RankingChange {
                judge: judge.to_owned(),
                condition,
                rule,
                compressor: None,
                sentence: format!(
                    "the ranking at {}, {condition}, depends on the judge: the scoring judge orders {}, `{judge}` orders {}",
                    budget_text(rule),
                    first,
                    second,
                ),
            });
        }
    }
    for cell in cells {
        let Some(micro) = audit_micro(&cell.id) else {
            continue;
        };
        let Some(Interval { low, high }) = cell.micro_ci95 else {
            continue;
        };
        if micro < low || micro > high {
            out.push(RankingChange {
                judge: judge.to_owned(),
                condition: cell.id.condition,
                rule: cell.id.rule,
                compressor: Some(cell.id.compressor.clone()),
                sentence: format!(
                    "`{judge}` puts the Micro of {} at {}, {} at {micro:.3}, outside its 95% interval [{low:.3}, {high:.3}]",
                    cell.id.compressor,
                    budget_text(cell.id.rule),
                    cell.id.condition,
                ),
            });
        }
    }
    out
}

/// The labels against the scoring judge, and each judge against the labels.
fn label_audit(results: &[ResultRow], labels: &Labels, fractions: &[(String, f64)]) -> LabelAudit {
    let labelled: Vec<(&ResultRow, bool)> = results
        .iter()
        .filter_map(|row| Some((row, labels.verdict(&row.question_id, row.answer.as_deref()?)?)))
        .collect();
    let mut accuracy = BTreeMap::new();
    accuracy.insert(
        "scoring".to_owned(),
        against(labelled.iter().map(|(row, label)| (row.correct, *label))),
    );
    for (name, _) in fractions {
        let verdicts = labelled
            .iter()
            .filter_map(|(row, label)| Some((*row.audits.get(name)?, *label)));
        accuracy.insert(name.clone(), against(verdicts));
    }
    LabelAudit {
        file: labels.file.clone(),
        labels: labels.len(),
        labelled_answers: labelled.len(),
        agreement: agreement(labelled.iter().map(|(row, label)| (row.correct, Some(*label)))),
        accuracy,
    }
}

/// Verdicts against labels: (verdict, label) pairs, a missing verdict left out.
fn against(pairs: impl Iterator<Item = (Option<bool>, bool)>) -> AgainstLabels {
    let (mut compared, mut right, mut said_correct, mut true_correct, mut labelled_correct) = (0, 0, 0, 0, 0);
    for (verdict, label) in pairs {
        let Some(verdict) = verdict else { continue };
        compared += 1;
        right += usize::from(verdict == label);
        said_correct += usize::from(verdict);
        labelled_correct += usize::from(label);
        true_correct += usize::from(verdict && label);
    }
    AgainstLabels {
        compared,
        accuracy: share(right, compared),
        precision: share(true_correct, said_correct),
        recall: share(true_correct, labelled_correct),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agreement_counts_kappa_and_abstentions() {
        let pairs = [
            (Some(true), Some(true)),
            (Some(true), Some(true)),
            (Some(false), Some(false)),
            (Some(true), Some(false)),
            (None, Some(true)),
            (Some(false), None),
        ];
        let out = agreement(pairs.into_iter());
        assert_eq!(
            (
                out.compared,
                out.both_correct,
                out.neither,
                out.scoring_only,
                out.audit_only
            ),
            (4, 2, 1, 1, 0)
        );
        assert_eq!((out.scoring_abstained, out.audit_abstained), (1, 1));
        assert_eq!(out.agreement, Some(0.75));
        // p(scoring correct) = 3/4, p(other correct) = 2/4: chance = 3/8 + 1/8 = 1/2.
        assert!((out.kappa.unwrap() - 0.5).abs() < 1e-12);
        let interval = out.kappa_95.unwrap();
        assert!(interval.low <= interval.high);
        // One verdict on each side throughout: κ is undefined.
        let same = agreement([(Some(true), Some(true)); 3].into_iter());
        assert_eq!((same.agreement, same.kappa), (Some(1.0), None));
    }

    #[test]
    fn against_labels_gives_accuracy_precision_and_recall() {
        let pairs = [
            (Some(true), true),
            (Some(true), false),
            (Some(false), true),
            (None, true),
            (Some(false), false),
        ];
        let out = against(pairs.into_iter());
        assert_eq!(out.compared, 4);
        assert_eq!(out.accuracy, Some(0.5));
        assert_eq!(out.precision, Some(0.5));
        assert_eq!(out.recall, Some(0.5));
    }
}
