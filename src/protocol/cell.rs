//! The identities the report and the rows are keyed by (SPEC §1): a cell is one compressor
//! under one condition at one ratio; a memory is one compressor call's worth of work in a cell.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::protocol::{BudgetRule, Condition};

/// One (compressor, condition, ratio) cell: what Micro and Macro are reported per.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
pub(crate) struct CellId {
    pub(crate) compressor: String,
    pub(crate) condition: Condition,
    #[serde(flatten)]
    pub(crate) rule: BudgetRule,
}

impl fmt::Display for CellId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} · {} · {}", self.compressor, self.condition, self.rule)
    }
}

/// One memory (SPEC §1): per seed and cell, a source and the goal whose questions it answers
/// (none under no-goal), and the goal its compressor was shown.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct MemoryId {
    pub(crate) seed: u64,
    #[serde(flatten)]
    pub(crate) cell: CellId,
    pub(crate) source_id: String,
    /// The goal whose questions this memory answers (none for no-goal).
    pub(crate) goal_id: Option<String>,
    /// The goal the compressor is shown (none for no-goal).
    pub(crate) shown_goal_id: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identities_serialise_as_flat_fields_in_the_spec_order() {
        let id = MemoryId {
            seed: 42,
            cell: CellId {
                compressor: "goal-line".into(),
                condition: Condition::OwnGoal,
                rule: BudgetRule::Ratio("0.15".parse().unwrap()),
            },
            source_id: "s1".into(),
            goal_id: Some("g1".into()),
            shown_goal_id: Some("g1".into()),
        };
        let text = serde_json::to_string(&id).unwrap();
        assert_eq!(
            text,
            r#"{"seed":42,"compressor":"goal-line","condition":"own-goal","ratio":0.15,"source_id":"s1","goal_id":"g1","shown_goal_id":"g1"}"#
        );
        assert_eq!(serde_json::from_str::<MemoryId>(&text).unwrap(), id);
        assert_eq!(id.cell.to_string(), "goal-line · own-goal · r=0.15");
        let tokens = MemoryId {
            cell: CellId {
                rule: BudgetRule::Tokens(128),
                ..id.cell.clone()
            },
            ..id.clone()
        };
        let text = serde_json::to_string(&tokens).unwrap();
        assert!(
            text.contains(r#""condition":"own-goal","budget_tokens":128,"source_id""#),
            "{text}"
        );
        assert_eq!(serde_json::from_str::<MemoryId>(&text).unwrap(), tokens);
    }
}
