//! Budget at target and the curves that dip (SPEC §11): per compressor and condition, its
//! cells ordered by budget (ratios and token budgets apart).

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use crate::protocol::{BudgetRule, CellId, Condition};
use crate::report::Cell;
use crate::report::stats::{self, Interval};
use crate::store::ledger::ResultRow;

/// The smallest budget at which a compressor reaches `target` × its reference Micro.
#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
pub(crate) struct AtTarget {
    pub compressor: String,
    pub condition: Condition,
    pub target: f64,
    /// `ceiling` (the ceiling's Micro) or `best` (the compressor's highest Micro, without one).
    pub of: String,
    /// The Micro the target is a share of.
    pub reference_micro: Option<f64>,
    /// The smallest budget of the run whose Micro reaches `target × reference_micro`; null
    /// when none does.
    pub budget: Option<BudgetRule>,
    /// That budget's Micro.
    pub micro: Option<f64>,
}

/// A pair of budgets where the larger scores lower than the smaller beyond a paired 95%
/// bootstrap over goals.
#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
pub(crate) struct Dip {
    pub compressor: String,
    pub condition: Condition,
    pub smaller: BudgetRule,
    pub larger: BudgetRule,
    pub micro_smaller: f64,
    pub micro_larger: f64,
    /// 95% interval of Micro at the larger budget minus Micro at the smaller, over the goals
    /// (of each seed) both scored: wholly below 0.
    pub difference_ci95: Interval,
    pub shared_goals: usize,
}

/// Each (compressor, condition, kind of budget)'s cells, by budget.
fn curves(cells: &[Cell]) -> BTreeMap<(String, Condition, bool), Vec<&Cell>> {
    let mut curves: BTreeMap<(String, Condition, bool), Vec<&Cell>> = BTreeMap::new();
    for cell in cells {
        let id = &cell.id;
        let kind = id.rule.ratio().is_some();
        (curves
            .entry((id.compressor.clone(), id.condition, kind))
            .or_default())
        .push(cell);
    }
    for cells in curves.values_mut() {
        cells.sort_by_key(|c| c.id.rule);
    }
    curves
}

/// Budget at target for every curve and target.
pub(crate) fn at_target(cells: &[Cell], targets: &[f64]) -> Vec<AtTarget> {
    let mut out = Vec::new();
    for ((compressor, condition, _), curve) in curves(cells) {
        let micro = |cell: &Cell| cell.micro.map(|m| m.mean);
        let ceilings: Vec<f64> = (curve.iter())
            .filter_map(|c| c.anchors.as_ref()?.ceiling_micro.flatten())
            .collect();
        let (of, reference) = if ceilings.is_empty() {
            let best = curve.iter().filter_map(|c| micro(c)).reduce(f64::max);
            ("best", best)
        } else {
            (
                "ceiling",
                Some(ceilings.iter().sum::<f64>() / ceilings.len() as f64),
            )
        };
        for &target in targets {
            let reached = reference.and_then(|reference| {
                (curve.iter()).find(|c| micro(c).is_some_and(|m| m >= target * reference - 1e-12))
            });
            out.push(AtTarget {
                compressor: compressor.clone(),
                condition,
                target,
                of: of.to_owned(),
                reference_micro: reference,
                budget: reached.map(|c| c.id.rule),
                micro: reached.and_then(|c| micro(c)),
            });
        }
    }
    out
}

/// The pairs of budgets, on every curve, where the larger scores lower beyond chance. Each
/// pair whose Micro falls is resampled on a core of its own (a paper-scale run has hundreds,
/// each a thousand resamples of 500 goals, at the end of the run).
pub(crate) fn dips(cells: &[Cell], rows: &HashMap<CellId, Vec<&ResultRow>>) -> Vec<Dip> {
    let mut falls: Vec<(&Cell, &Cell)> = Vec::new();
    for curve in curves(cells).into_values() {
        for (at, smaller) in curve.iter().enumerate() {
            for larger in &curve[at + 1..] {
                if let (Some(low), Some(high)) = (smaller.micro, larger.micro)
                    && high.mean < low.mean
                {
                    falls.push((smaller, larger));
                }
            }
        }
    }
    // Each cell's goals are tallied once, however many pairs it is in.
    let needed: std::collections::HashSet<&CellId> = falls.iter().flat_map(|(a, b)| [&a.id, &b.id]).collect();
    let tallied: Vec<&Cell> = cells.iter().filter(|c| needed.contains(&c.id)).collect();
    let no_rows = Vec::new();
    let tallies =
        crate::parallel::map_in_parallel(&tallied, |cell| tally(rows.get(&cell.id).unwrap_or(&no_rows)));
    let tallies: HashMap<&CellId, Tally> = tallied.iter().map(|c| &c.id).zip(tallies).collect();
    let resampled = crate::parallel::map_in_parallel(&falls, |(smaller, larger)| {
        paired(tallies.get(&smaller.id)?, tallies.get(&larger.id)?)
    });
    (falls.iter().zip(resampled))
        .filter_map(|((smaller, larger), paired)| {
            let (interval, shared) = paired?;
            let (low, high) = (smaller.micro?, larger.micro?);
            (interval.high < 0.0).then(|| Dip {
                compressor: smaller.id.compressor.clone(),
                condition: smaller.id.condition,
                smaller: smaller.id.rule,
                larger: larger.id.rule,
                micro_smaller: low.mean,
                micro_larger: high.mean,
                difference_ci95: interval,
                shared_goals: shared,
            })
        })
        .collect()
}

/// A cell's questions right and scored, by (seed, goal).
type Tally<'r> = HashMap<(u64, &'r str), (usize, usize)>;

fn tally<'r>(rows: &[&'r ResultRow]) -> Tally<'r> {
    let mut goals: Tally = HashMap::new();
    for row in rows.iter().filter(|r| r.failure.is_none()) {
        let Some(correct) = row.correct else { continue };
        let goal = goals.entry((row.seed, row.goal_id.as_str())).or_default();
        goal.0 += usize::from(correct);
        goal.1 += 1;
    }
    goals
}

/// The 95% interval of Micro(b) − Micro(a) over the (seed, goal)s both scored, resampled as
/// the report's intervals are; None when they share none.
fn paired(a: &Tally, b: &Tally) -> Option<(Interval, usize)> {
    let mut units: Vec<(usize, usize, usize, usize)> = (a.iter())
        .filter_map(|(goal, &(ra, na))| {
            let &(rb, nb) = b.get(goal)?;
            (na > 0 && nb > 0).then_some((ra, na, rb, nb))
        })
        .collect();
    if units.is_empty() {
        return None;
    }
    units.sort_unstable();
    let differences = stats::resample(
        units.len(),
        stats::REPORT_RESAMPLES,
        stats::REPORT_SEED,
        |drawn| {
            let (mut ra, mut na, mut rb, mut nb) = (0, 0, 0, 0);
            for unit in drawn.map(|i| units[i]) {
                ra += unit.0;
                na += unit.1;
                rb += unit.2;
                nb += unit.3;
            }
            rb as f64 / nb as f64 - ra as f64 / na as f64
        },
    );
    Some((stats::interval(differences), units.len()))
}
