//! What compression costs (SPEC §15): per cell, what its memories cost and when a
//! memory pays for itself against reading the source; per condition, the cost–quality frontier.

use serde::Serialize;

use super::{Cell, LedgerSums};
use crate::protocol::CellId;
use crate::runner::CellCost;

/// A cell's compressor calls: each distinct call once, with what its own record says it cost
/// (kept with its cache entry, so a cached run reports what the memories originally cost). How
/// long they took and how many this run found in the cache are the run's, not the answers':
/// run.json's `compression` (`store::usage::CallTimes`), so report.json stays the same bytes for the same
/// answers, whatever the cache held, the machine or the executor (SPEC §12).
#[derive(Debug, Clone, Default, Serialize, PartialEq, schemars::JsonSchema)]
pub(crate) struct Compression {
    pub(crate) calls: usize,
    pub(crate) input_tokens: u64,
    pub(crate) output_tokens: u64,
    /// What the calls cost, from the compressor's `price` or its `usage`.
    pub(crate) usd: f64,
}

/// What reading the cell's memories cost against reading the whole sources.
#[derive(Debug, Clone, Default, Serialize, PartialEq, schemars::JsonSchema)]
pub(crate) struct ReadCost {
    /// Questions read from the cell's memories.
    pub(crate) questions: usize,
    /// Mean tokens of a memory (≈ `L`) and of its whole source (`N`): a read's input without
    /// and with compression, the question aside.
    pub(crate) memory_tokens: f64,
    pub(crate) source_tokens: f64,
    /// What the cell's distinct reader calls cost.
    pub(crate) reader_usd: f64,
    /// `Σ compression USD / (reader input price per token × Σ (N − L))` over the cell's
    /// memories: a memory asked fewer questions costs more than reading its source. Null when
    /// the compressor is free, the reader has no price, or no memory is shorter than its source.
    pub(crate) break_even_questions: Option<f64>,
}

/// One (compressor, budget) of a condition as a point of cost against quality.
#[derive(Debug, Clone, Serialize, PartialEq, schemars::JsonSchema)]
pub(crate) struct FrontierPoint {
    #[serde(flatten)]
    pub(crate) cell: CellId,
    /// (The cell's compression USD + its reader USD) / its questions.
    pub(crate) usd_per_question: f64,
    pub(crate) micro: f64,
    /// 1 on the frontier (no other point of the condition costs no more and scores no less,
    /// one of the two strictly); k once the points of ranks below k are removed.
    pub(crate) pareto_rank: usize,
}

impl Compression {
    pub(crate) fn of(cost: &CellCost) -> Compression {
        Compression {
            calls: cost.calls,
            input_tokens: cost.input_tokens,
            output_tokens: cost.output_tokens,
            usd: cost.usd,
        }
    }
}

impl ReadCost {
    /// `reader_price`: the reader's input price in USD per token, where it has one.
    pub(crate) fn of(
        cost: &CellCost,
        ledger: &LedgerSums,
        questions: usize,
        reader_price: Option<f64>,
    ) -> ReadCost {
        let mean = |sum: usize| match ledger.memories {
            0 => 0.0,
            n => sum as f64 / n as f64,
        };
        let saved = ledger.source_tokens.saturating_sub(ledger.budget) as f64;
        let break_even_questions = match reader_price {
            Some(price) if cost.usd > 0.0 && price > 0.0 && saved > 0.0 => {
                Some(cost.usd / (price * saved)).filter(|q| q.is_finite())
            }
            _ => None,
        };
        ReadCost {
            questions,
            memory_tokens: mean(ledger.memory_tokens),
            source_tokens: mean(ledger.source_tokens),
            reader_usd: cost.reader_usd,
            break_even_questions,
        }
    }
}

/// `a` dominates `b`: it costs no more and scores no less, one of the two strictly.
fn dominates(a: &FrontierPoint, b: &FrontierPoint) -> bool {
    a.usd_per_question <= b.usd_per_question
        && a.micro >= b.micro
        && (a.usd_per_question < b.usd_per_question || a.micro > b.micro)
}

/// Every cell with a Micro as a point of its condition, with its Pareto rank among them; in
/// the order of the cells.
pub(crate) fn frontier(cells: &[Cell]) -> Vec<FrontierPoint> {
    let mut points: Vec<FrontierPoint> = (cells.iter())
        .filter_map(|cell| {
            let micro = cell.micro.as_ref()?.mean;
            let questions = cell.read_cost.questions;
            let usd = cell.compression.usd + cell.read_cost.reader_usd;
            Some(FrontierPoint {
                cell: cell.id.clone(),
                usd_per_question: if questions == 0 {
                    0.0
                } else {
                    usd / questions as f64
                },
                micro,
                pareto_rank: 0,
            })
        })
        .collect();
    rank(&mut points);
    points
}

/// Gives each point its Pareto rank among the points of its condition: the points no other
/// dominates are rank 1; removed, those no other of the rest dominates are rank 2; and so on.
fn rank(points: &mut [FrontierPoint]) {
    let mut conditions: Vec<_> = points.iter().map(|p| p.cell.condition).collect();
    conditions.sort_unstable();
    conditions.dedup();
    for condition in conditions {
        let mut rank = 0;
        loop {
            let left: Vec<usize> = (0..points.len())
                .filter(|&i| points[i].cell.condition == condition && points[i].pareto_rank == 0)
                .collect();
            if left.is_empty() {
                break;
            }
            rank += 1;
            let front: Vec<usize> = (left.iter().copied())
                .filter(|&i| !left.iter().any(|&j| dominates(&points[j], &points[i])))
                .collect();
            for i in front {
                points[i].pareto_rank = rank;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{BudgetRule, Condition, Ratio};

    fn point(compressor: &str, condition: Condition, usd: f64, micro: f64) -> FrontierPoint {
        FrontierPoint {
            cell: CellId {
                compressor: compressor.into(),
                condition,
                rule: BudgetRule::of(Some("0.1".parse::<Ratio>().unwrap()), None),
            },
            usd_per_question: usd,
            micro,
            pareto_rank: 0,
        }
    }

    fn ranked(mut points: Vec<FrontierPoint>) -> Vec<usize> {
        rank(&mut points);
        points.iter().map(|p| p.pareto_rank).collect()
    }

    #[test]
    fn rank_one_is_exactly_the_points_nothing_dominates() {
        let own = Condition::OwnGoal;
        let points = vec![
            point("free-bad", own, 0.0, 0.2),
            point("free-good", own, 0.0, 0.5),
            point("dear-best", own, 0.01, 0.9),
            point("dear-worse", own, 0.02, 0.8),
            point("tie-a", own, 0.005, 0.7),
            point("tie-b", own, 0.005, 0.7),
            point("dearest-worst", own, 0.03, 0.1),
            // Another condition's points are ranked apart: this one would be dominated.
            point("elsewhere", Condition::NoGoal, 0.5, 0.0),
        ];
        // free-bad is beaten by free-good (same cost, higher); dear-worse by dear-best; the
        // two ties dominate neither each other nor are dominated.
        assert_eq!(ranked(points), vec![2, 1, 1, 2, 1, 1, 3, 1]);
    }

    #[test]
    fn break_even_is_the_compression_cost_over_what_the_memories_save_in_reading() {
        let cost = CellCost {
            calls: 4,
            usd: 0.008,
            ..CellCost::default()
        };
        let ledger = LedgerSums {
            memories: 4,
            source_tokens: 4000,
            budget: 400,
            memory_tokens: 380,
            ..LedgerSums::default()
        };
        // 0.008 / (1e-6 × 3600) = 2.222… questions.
        let read = ReadCost::of(&cost, &ledger, 12, Some(1e-6));
        assert!((read.break_even_questions.unwrap() - 0.008 / 0.0036).abs() < 1e-12);
        assert_eq!((read.memory_tokens, read.source_tokens), (95.0, 1000.0));
        assert_eq!(ReadCost::of(&cost, &ledger, 12, None).break_even_questions, None);
        let free = CellCost::default();
        assert_eq!(
            ReadCost::of(&free, &ledger, 12, Some(1e-6)).break_even_questions,
            None
        );
    }
}
