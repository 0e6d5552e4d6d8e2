//! A cell of two runs, tested over the goals both scored (SPEC §13): Micro's paired sign-flip
//! test over goals, and the verdict it and Macro's paired bootstrap give.

use std::collections::BTreeMap;

use serde::Serialize;

use super::{CellDiff, SIGNIFICANCE};
use crate::report::pairs::{GoalDiff, compare};
use crate::report::stats::Bootstrap;

/// Micro B − A, paired over the goals both runs scored (seeds of a goal averaged): a paired
/// bootstrap interval and a sign-flip permutation p over goals, and the smallest difference
/// those goals detect.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub(crate) struct GoalTest {
    pub goals: usize,
    pub diff: f64,
    pub ci95_low: f64,
    pub ci95_high: f64,
    pub p_value: f64,
    pub mde: f64,
}

impl CellDiff {
    /// The verdict as a sentence: `better`, `worse (regression)`, or why it is within noise.
    pub(crate) fn verdict_text(&self) -> String {
        match self.verdict {
            "worse" => "worse (regression)".into(),
            "better" => "better".into(),
            // k goals that differ give a p no lower than 2 / 2^k.
            _ if self.micro_test.goals < 6 => format!(
                "within noise ({} goals cannot show a difference at 0.05)",
                self.micro_test.goals
            ),
            _ => format!("within noise (MDE {:.3})", self.micro_test.mde),
        }
    }
}

/// `worse` where Micro's goal test says B is lower (p < 0.05) or Macro's interval lies below
/// zero, `better` the other way, else `within noise`.
pub(super) fn verdict(micro: &GoalTest, macro_: &Bootstrap) -> &'static str {
    let macro_worse = macro_.shared_goals > 0 && macro_.ci95_high < 0.0;
    let macro_better = macro_.shared_goals > 0 && macro_.ci95_low > 0.0;
    let significant = micro.p_value < SIGNIFICANCE;
    if (micro.diff < 0.0 && significant) || macro_worse {
        "worse"
    } else if (micro.diff > 0.0 && significant) || macro_better {
        "better"
    } else {
        "within noise"
    }
}

/// Micro B − A over goals, each goal's seeds averaged and weighted by its questions.
pub(super) fn goal_test(goals: &BTreeMap<&str, BTreeMap<u64, (usize, usize, usize)>>) -> GoalTest {
    let diffs: Vec<GoalDiff> = (goals.values())
        .map(|seeds| {
            let n = seeds.len() as f64;
            let share = |right: usize, of: usize| right as f64 / of as f64;
            GoalDiff {
                weight: seeds.values().map(|s| s.2 as f64).sum::<f64>() / n,
                x: seeds
                    .values()
                    .map(|&(a, b, of)| share(b, of) - share(a, of))
                    .sum::<f64>()
                    / n,
            }
        })
        .collect();
    match compare(&diffs) {
        Some(c) => GoalTest {
            goals: c.goals,
            diff: c.diff,
            ci95_low: c.ci95.low,
            ci95_high: c.ci95.high,
            p_value: c.p,
            mde: c.mde,
        },
        None => GoalTest {
            goals: 0,
            diff: 0.0,
            ci95_low: 0.0,
            ci95_high: 0.0,
            p_value: 1.0,
            mde: 0.0,
        },
    }
}
