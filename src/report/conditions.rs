//! `by_condition` in report.json: per compressor and budget, the conditions side by side and
//! how much seeing its own goal helps.

use serde::Serialize;

use super::Cell;
use crate::protocol::{BudgetRule, Condition};

/// Mean Micro or Macro of one compressor and ratio under each condition run.
#[derive(Debug, Clone, Default, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub(crate) struct ByCondition {
    pub(crate) own_goal: Option<f64>,
    pub(crate) no_goal: Option<f64>,
    pub(crate) cross_goal: Option<f64>,
}

impl ByCondition {
    fn set(&mut self, condition: Condition, value: f64) {
        match condition {
            Condition::OwnGoal => self.own_goal = Some(value),
            Condition::NoGoal => self.no_goal = Some(value),
            Condition::CrossGoal => self.cross_goal = Some(value),
        }
    }

    /// own-goal minus `other`, when both were run.
    fn gap(&self, other: Option<f64>) -> Option<f64> {
        Some(self.own_goal? - other?)
    }
}

/// How much seeing its own goal helps a compressor at one budget.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub(crate) struct ConditionRow {
    pub(crate) compressor: String,
    #[serde(flatten)]
    pub(crate) rule: BudgetRule,
    pub(crate) micro: ByCondition,
    #[serde(rename = "macro")]
    pub(crate) macro_: ByCondition,
    /// own-goal minus no-goal, Micro and Macro.
    pub(crate) gap_no_goal: Option<Gap>,
    /// own-goal minus cross-goal, Micro and Macro.
    pub(crate) gap_cross_goal: Option<Gap>,
}

#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub(crate) struct Gap {
    pub(crate) micro: f64,
    #[serde(rename = "macro")]
    pub(crate) macro_: f64,
}

/// Pivots cells into one row per (compressor, budget), sorted.
pub(super) fn by_condition(cells: &[Cell]) -> Vec<ConditionRow> {
    let mut rows: Vec<ConditionRow> = Vec::new();
    for cell in cells {
        let position = rows
            .iter()
            .position(|r| r.compressor == cell.id.compressor && r.rule == cell.id.rule)
            .unwrap_or_else(|| {
                rows.push(ConditionRow {
                    compressor: cell.id.compressor.clone(),
                    rule: cell.id.rule,
                    micro: ByCondition::default(),
                    macro_: ByCondition::default(),
                    gap_no_goal: None,
                    gap_cross_goal: None,
                });
                rows.len() - 1
            });
        if let Some(micro) = cell.micro {
            rows[position].micro.set(cell.id.condition, micro.mean);
        }
        if let Some(macro_) = cell.macro_ {
            rows[position].macro_.set(cell.id.condition, macro_.mean);
        }
    }
    for row in &mut rows {
        let gap = |micro: Option<f64>, macro_: Option<f64>| {
            Some(Gap {
                micro: micro?,
                macro_: macro_?,
            })
        };
        row.gap_no_goal = gap(
            row.micro.gap(row.micro.no_goal),
            row.macro_.gap(row.macro_.no_goal),
        );
        row.gap_cross_goal = gap(
            row.micro.gap(row.micro.cross_goal),
            row.macro_.gap(row.macro_.cross_goal),
        );
    }
    rows.sort_by(|a, b| a.compressor.cmp(&b.compressor).then(a.rule.cmp(&b.rule)));
    rows
}
