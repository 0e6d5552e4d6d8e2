//! What explains a score (SPEC §11): per cell, whether the memory kept the evidence and how
//! the score sits between the floor and the ceiling; across cells, the budget at which a
//! compressor reaches its target, the curves that dip, and the scores per tag.

mod curves;
mod panel;
mod tags;

pub(crate) use curves::{AtTarget, Dip, at_target, dips};
pub(crate) use panel::{ReaderPanel, panel};
pub(crate) use tags::{TagScores, by_tag};

use std::collections::BTreeMap;

use serde::Serialize;

use crate::report::metrics;
use crate::store::ledger::{EvidenceBasis, ResultRow};

/// A cell's answered questions by whether the memory held every evidence span and whether the
/// answer was right; abstentions (no verdict) and failures apart.
#[derive(Debug, Clone, Default, PartialEq, Serialize, schemars::JsonSchema)]
pub(crate) struct Attribution {
    /// The memory held every span, and the answer was right.
    pub kept_right: usize,
    /// The memory held every span; the reader or the judge lost it.
    pub kept_wrong: usize,
    /// A span was lost, yet the answer was right (a paraphrase, the reader's own knowledge).
    pub lost_right: usize,
    /// A span was lost, and the answer was wrong: the compressor lost it.
    pub lost_wrong: usize,
    pub abstained: usize,
    pub failed: usize,
    /// The mean share of spans kept, over the rows that say.
    pub evidence_kept: Option<f64>,
    /// Rows whose question has no `evidence`: its reference stood for it.
    pub reference_as_evidence: usize,
    /// The cell's rows: the four counts, abstentions and failures.
    pub rows: usize,
}

impl Attribution {
    pub(crate) fn of<'r>(rows: impl Iterator<Item = &'r ResultRow>) -> Attribution {
        let mut counts = Attribution::default();
        let (mut kept_sum, mut said) = (0.0, 0usize);
        for row in rows {
            counts.rows += 1;
            if let Some(share) = row.evidence_kept {
                kept_sum += share;
                said += 1;
            }
            counts.reference_as_evidence += usize::from(row.evidence_basis == Some(EvidenceBasis::Reference));
            let slot = match (row.failure.is_some(), row.correct, row.kept_all()) {
                (true, ..) => &mut counts.failed,
                (false, None, _) => &mut counts.abstained,
                (false, Some(_), None) => continue,
                (false, Some(true), Some(true)) => &mut counts.kept_right,
                (false, Some(false), Some(true)) => &mut counts.kept_wrong,
                (false, Some(true), Some(false)) => &mut counts.lost_right,
                (false, Some(false), Some(false)) => &mut counts.lost_wrong,
            };
            *slot += 1;
        }
        counts.evidence_kept = (said > 0).then(|| kept_sum / said as f64);
        counts
    }
}

/// A cell between its anchors: each a mean over seeds, as Micro is.
#[derive(Debug, Clone, Default, PartialEq, Serialize, schemars::JsonSchema)]
pub(crate) struct CellAnchors {
    /// Micro of the same questions read with an empty memory (`[anchors] floor`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub floor_micro: Option<Option<f64>>,
    /// Micro of the same questions read with their whole source (`[anchors] ceiling`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ceiling_micro: Option<Option<f64>>,
    /// `(micro − floor_micro) / (ceiling_micro − floor_micro)`; null when the denominator is 0.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gap_closed: Option<Option<f64>>,
    /// Rows whose question was right with an empty memory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub closed_book: Option<usize>,
    /// Micro over the questions that are not closed-book.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub micro_open: Option<Option<f64>>,
    /// Macro over the goals not every question of which is closed-book.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub macro_open: Option<Option<f64>>,
}

/// A cell's anchors from its rows (in plan order) and its Micro; None when neither anchor ran.
pub(crate) fn anchors(
    rows: &[&ResultRow],
    micro: Option<f64>,
    floor: bool,
    ceiling: bool,
) -> Option<CellAnchors> {
    if !floor && !ceiling {
        return None;
    }
    let by_seed = by_seed(rows);
    let share = |verdict: fn(&ResultRow) -> Option<bool>| {
        mean(by_seed.values().filter_map(|rows| {
            let known: Vec<bool> = rows.iter().filter_map(|r| verdict(r)).collect();
            (!known.is_empty()).then(|| known.iter().filter(|v| **v).count() as f64 / known.len() as f64)
        }))
    };
    let mut cell = CellAnchors::default();
    let floor_micro = floor.then(|| share(|r| r.floor_correct));
    let ceiling_micro = ceiling.then(|| share(|r| r.ceiling_correct));
    if let (Some(low), Some(high)) = (floor_micro, ceiling_micro) {
        cell.gap_closed = Some(gap_closed(micro, low, high));
    }
    if floor {
        cell.closed_book = Some(rows.iter().filter(|r| r.floor_correct == Some(true)).count());
        let open = open_scores(&by_seed);
        cell.micro_open = Some(mean(open.iter().filter_map(|s| s.0)));
        cell.macro_open = Some(mean(open.iter().filter_map(|s| s.1)));
    }
    cell.floor_micro = floor_micro;
    cell.ceiling_micro = ceiling_micro;
    Some(cell)
}

/// `(micro − floor) / (ceiling − floor)`, or None where a term is missing or the ceiling is
/// no higher than the floor.
pub(crate) fn gap_closed(micro: Option<f64>, floor: Option<f64>, ceiling: Option<f64>) -> Option<f64> {
    let (micro, floor, ceiling) = (micro?, floor?, ceiling?);
    let span = ceiling - floor;
    (span != 0.0).then(|| (micro - floor) / span)
}

/// Per seed, Micro over the questions whose floor read was wrong and Macro over the goals
/// with such a question (a goal every question of which is closed-book is left out).
fn open_scores(by_seed: &BTreeMap<u64, Vec<&ResultRow>>) -> Vec<(Option<f64>, Option<f64>)> {
    by_seed
        .values()
        .map(|rows| {
            let goals = grouped_by_goal(rows);
            let verdict = |r: &ResultRow| if r.failure.is_some() { None } else { r.correct };
            let open_questions: Vec<Vec<Option<bool>>> = goals
                .iter()
                .map(|g| {
                    g.iter()
                        .filter(|r| r.floor_correct == Some(false))
                        .map(|r| verdict(r))
                        .collect()
                })
                .collect();
            let open_goals: Vec<Vec<Option<bool>>> = goals
                .iter()
                .filter(|g| !g.iter().all(|r| r.floor_correct == Some(true)))
                .map(|g| g.iter().map(|r| verdict(r)).collect())
                .collect();
            (
                metrics::score(&open_questions).micro,
                metrics::score(&open_goals).macro_,
            )
        })
        .collect()
}

/// Rows by seed, each seed's in plan order.
pub(crate) fn by_seed<'r>(rows: &[&'r ResultRow]) -> BTreeMap<u64, Vec<&'r ResultRow>> {
    let mut seeds: BTreeMap<u64, Vec<&ResultRow>> = BTreeMap::new();
    for row in rows {
        seeds.entry(row.seed).or_default().push(row);
    }
    seeds
}

/// Rows grouped by goal, in the order goals first appear.
pub(crate) fn grouped_by_goal<'r>(rows: &[&'r ResultRow]) -> Vec<Vec<&'r ResultRow>> {
    let mut at: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    let mut goals: Vec<Vec<&ResultRow>> = Vec::new();
    for row in rows {
        let next = goals.len();
        let index = *at.entry(&row.goal_id).or_insert(next);
        if index == next {
            goals.push(Vec::new());
        }
        goals[index].push(row);
    }
    goals
}

fn mean(values: impl Iterator<Item = f64>) -> Option<f64> {
    let (sum, n) = values.fold((0.0, 0usize), |(s, n), v| (s + v, n + 1));
    (n > 0).then(|| sum / n as f64)
}
