//! A report's cells: its rows grouped by cell, in the order the plan first names them, and
//! each cell scored and bootstrapped (on every core).

use std::collections::HashMap;

use super::{Cell, LedgerSums, SeedScore, costs, metrics, stats, why};
use crate::protocol::CellId;
use crate::store::ledger::{LedgerRow, ResultRow};

/// The result rows of each cell, in plan order, and the cells in the order rows first name them.
pub(super) fn rows_by_cell(results: &[ResultRow]) -> (HashMap<CellId, Vec<&ResultRow>>, Vec<CellId>) {
    let mut cells: HashMap<CellId, Vec<&ResultRow>> = HashMap::new();
    let mut order = Vec::new();
    // A memory's rows come together: each run of one cell's rows is looked up once.
    for run in results.chunk_by(|a, b| a.same_cell(b)) {
        let id = run[0].cell();
        let rows = cells.entry(id).or_insert_with_key(|id| {
            order.push(id.clone());
            Vec::new()
        });
        rows.extend(run);
    }
    (cells, order)
}

/// Per seed, each goal's verdicts, in first-seen order.
type SeedVerdicts = Vec<(u64, Vec<(String, Vec<Option<bool>>)>)>;

/// The entry of `key` in `list` (made at its end when there is none). Rows come in plan order,
/// so a row's seed or goal is nearly always the last one seen: looked at first, and a cell of
/// 500 goals is not searched from its start for each of its thousands of rows.
fn entry_of<'l, K, V: Default>(list: &'l mut Vec<(K::Owned, V)>, key: &K) -> &'l mut V
where
    K: PartialEq + ToOwned + ?Sized,
    K::Owned: std::borrow::Borrow<K>,
{
    use std::borrow::Borrow;
    let at = match list.last() {
        Some((last, _)) if last.borrow() == key => list.len() - 1,
        _ => match list.iter().position(|(have, _)| have.borrow() == key) {
            Some(at) => at,
            None => {
                list.push((key.to_owned(), V::default()));
                list.len() - 1
            }
        },
    };
    &mut list[at].1
}

/// Each cell of `order` from its rows (`rows_by_cell`), scored and bootstrapped on every core
/// (a paper-scale run has hundreds of cells of 2,500 rows, each resampled a thousand times, at
/// the end of the run).
pub(super) fn cells(
    ledger: &[LedgerRow],
    rows: &HashMap<CellId, Vec<&ResultRow>>,
    order: &[CellId],
) -> Vec<Cell> {
    let mut sums: HashMap<&CellId, LedgerSums> = HashMap::new();
    for row in ledger {
        sums.entry(&row.memory_id.cell).or_default().add(row);
    }
    let none = LedgerSums::default();
    crate::parallel::map_in_parallel(order, |id| {
        let rows = rows.get(id).map_or(&[][..], Vec::as_slice);
        cell(id, &Goals::of(rows), sums.get(id).unwrap_or(&none))
    })
}

/// A cell's verdicts by goal, every seed's goals one after another, and each seed's share.
struct Goals {
    verdicts: Vec<Vec<Option<bool>>>,
    seeds: Vec<(u64, std::ops::Range<usize>)>,
}

impl Goals {
    /// A cell's rows (in plan order) by seed, then goal, each in first-seen order.
    fn of(rows: &[&ResultRow]) -> Goals {
        // seed -> goal -> verdicts
        let mut seeds: SeedVerdicts = Vec::new();
        // A memory's rows come together: each run of one seed and goal is looked up once.
        for run in rows.chunk_by(|a, b| a.seed == b.seed && a.goal_id == b.goal_id) {
            let goals = entry_of(&mut seeds, &run[0].seed);
            let verdict = |row: &&ResultRow| if row.failure.is_some() { None } else { row.correct };
            entry_of(goals, run[0].goal_id.as_str()).extend(run.iter().map(verdict));
        }
        let mut goals = Goals {
            verdicts: Vec::new(),
            seeds: Vec::new(),
        };
        for (seed, verdicts) in seeds {
            let start = goals.verdicts.len();
            goals.verdicts.extend(verdicts.into_iter().map(|(_, v)| v));
            goals.seeds.push((seed, start..goals.verdicts.len()));
        }
        goals
    }
}

/// A cell's scores from its verdicts: per seed, and bootstrapped over every seed's goals.
fn cell(id: &CellId, goals: &Goals, ledger: &LedgerSums) -> Cell {
    let seeds: Vec<SeedScore> = (goals.seeds.iter())
        .map(|(seed, range)| SeedScore {
            seed: *seed,
            score: metrics::score(&goals.verdicts[range.clone()]),
        })
        .collect();
    let (micro_ci95, macro_ci95) =
        metrics::bootstrap(&goals.verdicts, stats::REPORT_RESAMPLES, stats::REPORT_SEED);
    let micro: Vec<f64> = seeds.iter().filter_map(|s| s.score.micro).collect();
    let macro_: Vec<f64> = seeds.iter().filter_map(|s| s.score.macro_).collect();
    let spread = |values: &[f64]| (!values.is_empty()).then(|| stats::spread(values));
    Cell {
        complete: seeds.iter().all(|s| s.score.unscored_questions == 0),
        id: id.clone(),
        micro: spread(&micro),
        macro_: spread(&macro_),
        micro_ci95,
        macro_ci95,
        rank: None,
        noise: None,
        seeds,
        ledger: ledger.clone(),
        compression: costs::Compression::default(),
        read_cost: costs::ReadCost::default(),
        attribution: why::Attribution::default(),
        anchors: None,
    }
}
