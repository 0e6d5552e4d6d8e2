//! The reader panel (SPEC §11): how far the scores depend on the reader. Each panel reader
//! re-read its seeded share of (memory, question) pairs and the scoring judge judged its
//! answers; per (condition, budget), Kendall's τ-b between the compressors' order by Micro
//! under the run's reader and under the panel reader, and a sentence where the order changes.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::protocol::{BudgetRule, Condition};
use crate::report::Cell;
use crate::report::audit::{AuditedCell, audited_cells, budget_text, groups, reordered};
use crate::store::ledger::ResultRow;

#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub(crate) struct ReaderPanel {
    /// Per panel reader, what it read and its scores per cell.
    pub readers: BTreeMap<String, PanelReader>,
    /// Per panel reader, condition and budget: τ-b of the two orders of compressors.
    pub tau_b: Vec<TauB>,
    /// Each (condition, budget) whose order of compressors by Micro differs under a reader.
    pub ranking_changes: Vec<PanelChange>,
}

#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub(crate) struct PanelReader {
    /// The share of (memory, question) pairs it re-reads.
    pub fraction: f64,
    /// The pairs it read.
    pub read: usize,
    /// Per cell: the pairs it read (`audited`), the share the scoring judge found right
    /// (`micro`), the run reader's share over the same pairs (`scoring_micro`), and `macro`
    /// over the goals whose every pair it read.
    pub cells: Vec<AuditedCell>,
}

#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub(crate) struct TauB {
    pub reader: String,
    pub condition: Condition,
    #[serde(flatten)]
    pub rule: BudgetRule,
    /// The compressors ordered (those with a Micro under both readers).
    pub compressors: usize,
    /// Null when either order is all ties (or fewer than two compressors).
    pub tau_b: Option<f64>,
}

#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub(crate) struct PanelChange {
    pub reader: String,
    pub condition: Condition,
    #[serde(flatten)]
    pub rule: BudgetRule,
    pub sentence: String,
}

/// The panel of a run's rows; None without panel readers.
pub(crate) fn panel(results: &[ResultRow], cells: &[Cell], shares: &[(String, f64)]) -> Option<ReaderPanel> {
    if shares.is_empty() {
        return None;
    }
    let mut out = ReaderPanel {
        readers: BTreeMap::new(),
        tau_b: Vec::new(),
        ranking_changes: Vec::new(),
    };
    for (name, fraction) in shares {
        let read: Vec<(&ResultRow, Option<bool>)> = (results.iter())
            .filter_map(|row| Some((row, *row.panel.get(name)?)))
            .collect();
        let panel_cells = audited_cells(&read);
        compare(name, cells, &panel_cells, &mut out);
        let reader = PanelReader {
            fraction: *fraction,
            read: read.len(),
            cells: panel_cells,
        };
        out.readers.insert(name.clone(), reader);
    }
    Some(out)
}

/// τ-b per (condition, budget) of reader `name`, and the sentence where the order changes.
fn compare(name: &str, cells: &[Cell], panel_cells: &[AuditedCell], out: &mut ReaderPanel) {
    let panel_micro = |cell: &Cell| (panel_cells.iter().find(|c| c.id == cell.id))?.micro;
    for (condition, rule) in groups(cells) {
        let scored: Vec<(&str, f64, f64)> = (cells.iter())
            .filter(|c| c.id.condition == condition && c.id.rule == rule)
            .filter_map(|c| Some((c.id.compressor.as_str(), c.micro?.mean, panel_micro(c)?)))
            .collect();
        let pairs: Vec<(f64, f64)> = scored.iter().map(|(_, x, y)| (*x, *y)).collect();
        out.tau_b.push(TauB {
            reader: name.to_owned(),
            condition,
            rule,
            compressors: scored.len(),
            tau_b: tau_b(&pairs),
        });
        if let Some((first, second)) = reordered(&scored) {
            out.ranking_changes.push(PanelChange {
                reader: name.to_owned(),
                condition,
                rule,
                sentence: format!(
                    "the ranking at {}, {condition}, depends on the reader: the run's reader orders {}, `{name}` orders {}",
                    budget_text(rule),
                    first,
                    second,
                ),
            });
        }
    }
}

/// Kendall's τ-b of paired values: (concordant − discordant) / √((n₀ − n₁)(n₀ − n₂)), where
/// n₀ counts the pairs, n₁ those tied in x and n₂ those tied in y; None when a factor is 0.
pub(crate) fn tau_b(values: &[(f64, f64)]) -> Option<f64> {
    let (mut concordant, mut discordant, mut tied_x, mut tied_y) = (0i64, 0i64, 0i64, 0i64);
    for (i, a) in values.iter().enumerate() {
        for b in &values[i + 1..] {
            let (dx, dy) = ((a.0 - b.0).signum(), (a.1 - b.1).signum());
            let (x_tied, y_tied) = (a.0 == b.0, a.1 == b.1);
            tied_x += i64::from(x_tied);
            tied_y += i64::from(y_tied);
            if !x_tied && !y_tied {
                if dx == dy {
                    concordant += 1;
                } else {
                    discordant += 1;
                }
            }
        }
    }
    let n = values.len() as i64;
    let pairs = n * (n - 1) / 2;
    let denominator = (((pairs - tied_x) * (pairs - tied_y)) as f64).sqrt();
    (denominator > 0.0).then(|| (concordant - discordant) as f64 / denominator)
}

#[cfg(test)]
mod tests {
    use super::tau_b;

    #[test]
    fn kendalls_tau_b_with_and_without_ties() {
        assert_eq!(tau_b(&[(1.0, 1.0), (2.0, 2.0), (3.0, 3.0)]), Some(1.0));
        assert_eq!(tau_b(&[(1.0, 3.0), (2.0, 2.0), (3.0, 1.0)]), Some(-1.0));
        // x = (1, 2, 2, 3), y = (1, 3, 2, 4): 4 concordant, 1 discordant... by hand:
        // pairs (12: C) (13: C) (14: C) (23: tied x) (24: C) (34: C): (5 − 0) / √(5 · 6).
        let t = tau_b(&[(1.0, 1.0), (2.0, 3.0), (2.0, 2.0), (3.0, 4.0)]).unwrap();
        assert!((t - 5.0 / 30f64.sqrt()).abs() < 1e-12, "{t}");
        assert_eq!(tau_b(&[(1.0, 1.0), (1.0, 2.0)]), None, "x all tied");
        assert_eq!(tau_b(&[(1.0, 1.0)]), None);
    }
}
