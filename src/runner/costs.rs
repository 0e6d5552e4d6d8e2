//! What each cell's memories and reads cost (SPEC §15), gathered as memories fold, in plan
//! order: so the same calls always sum to the same figures, in a run and in its replay.

use std::collections::{HashMap, HashSet};

use super::CallKey;
use crate::hash::DigestMap;
use crate::protocol::CellId;
use crate::store::usage::Usage;

/// A cell's compression calls and reads, each distinct call once.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct CellCost {
    /// Distinct compressor calls the cell's memories rest on (none for `L = 0`).
    pub calls: usize,
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// What those calls cost, as each reported (`price` or the callback's `usage`).
    pub usd: f64,
    /// Each call's wall time in milliseconds, where its entry records one, in plan order.
    pub wall_ms: Vec<u64>,
    /// Of `calls`, those this run found in the cache rather than made.
    pub cached: usize,
    /// What the cell's distinct reader calls cost.
    pub reader_usd: f64,
}

/// Adds a non-negative, finite cost to a sum (what a callback reports is anyone's number).
fn add_cost(sum: &mut f64, part: f64) {
    if part.is_finite() && part > 0.0 {
        *sum = (*sum + part).min(f64::MAX);
    }
}

/// Each cell's calls as they are gathered.
#[derive(Default)]
pub(super) struct CostGathering {
    cells: HashMap<CellId, Gathered>,
}

#[derive(Default)]
struct Gathered {
    compressor: HashSet<CallKey>,
    /// Only reader calls that cost anything are remembered: a free reader keeps no key.
    priced_reads: DigestMap<CallKey, ()>,
    cost: CellCost,
}

/// One compressor call a memory rests on.
pub(super) struct CompressorCall<'a> {
    pub key: CallKey,
    pub usage: &'a Usage,
    pub wall_ms: Option<u64>,
    /// This run found its memory in the cache.
    pub cached: bool,
}

impl CostGathering {
    /// Runs `update` on the cell's gathering; its id is cloned only the first time it is seen
    /// (the fold runs once per call of the run).
    fn with_cell(&mut self, cell: &CellId, update: impl FnOnce(&mut Gathered)) {
        if let Some(gathered) = self.cells.get_mut(cell) {
            return update(gathered);
        }
        update(self.cells.entry(cell.clone()).or_default());
    }

    /// A memory's compressor call, counted once per cell however many memories rest on it.
    pub(super) fn compressor(&mut self, cell: &CellId, call: CompressorCall) {
        self.with_cell(cell, |gathered| {
            if !gathered.compressor.insert(call.key) {
                return;
            }
            let cost = &mut gathered.cost;
            cost.calls += 1;
            cost.input_tokens = cost.input_tokens.saturating_add(call.usage.input_tokens);
            cost.output_tokens = cost.output_tokens.saturating_add(call.usage.output_tokens);
            add_cost(&mut cost.usd, call.usage.cost_usd);
            cost.wall_ms.extend(call.wall_ms);
            cost.cached += usize::from(call.cached);
        });
    }

    /// A question's reader call, counted once per cell.
    pub(super) fn read(&mut self, cell: &CellId, key: CallKey, usage: &Usage) {
        if !(usage.cost_usd.is_finite() && usage.cost_usd > 0.0) {
            return;
        }
        self.with_cell(cell, |gathered| {
            if gathered.priced_reads.insert(key, ()).is_none() {
                add_cost(&mut gathered.cost.reader_usd, usage.cost_usd);
            }
        });
    }

    pub(super) fn finish(self) -> HashMap<CellId, CellCost> {
        (self.cells.into_iter())
            .map(|(cell, gathered)| (cell, gathered.cost))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{BudgetRule, Condition, Ratio};

    fn usage(cost_usd: f64, input_tokens: u64) -> Usage {
        Usage {
            cost_usd,
            input_tokens,
            output_tokens: 7,
            ..Usage::default()
        }
    }

    #[test]
    fn each_distinct_call_is_counted_once_and_a_hostile_cost_not_at_all() {
        let cell = CellId {
            compressor: "c".into(),
            condition: Condition::OwnGoal,
            rule: BudgetRule::of(Some("0.1".parse::<Ratio>().unwrap()), None),
        };
        let mut gathering = CostGathering::default();
        let paid = usage(0.002, 100);
        for (key, cached) in [([1; 32], false), ([1; 32], true), ([2; 32], true)] {
            let call = CompressorCall {
                key,
                usage: &paid,
                wall_ms: Some(150),
                cached,
            };
            gathering.compressor(&cell, call);
        }
        gathering.read(&cell, [3; 32], &usage(0.01, 5));
        gathering.read(&cell, [3; 32], &usage(0.01, 5));
        gathering.read(&cell, [4; 32], &usage(f64::NAN, 5));
        gathering.read(&cell, [5; 32], &usage(-1.0, 5));
        let cost = &gathering.finish()[&cell];
        assert_eq!(
            (cost.calls, cost.cached, cost.input_tokens, cost.output_tokens),
            (2, 1, 200, 14)
        );
        assert!((cost.usd - 0.004).abs() < 1e-15);
        assert_eq!(cost.wall_ms, vec![150, 150]);
        assert!((cost.reader_usd - 0.01).abs() < 1e-15);
    }
}
