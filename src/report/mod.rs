//! `report.json` (schema `gacc.report/1`) and the reports rendered from it (SPEC §5).

pub(crate) mod audit;
mod cells;
pub(crate) mod charts;
mod conditions;
pub(crate) mod costs;
mod endpoints;
pub mod html;
pub(crate) mod markdown;
pub(crate) mod metrics;
pub(crate) mod pairs;
mod recount;
pub(crate) mod sequence;
pub(crate) mod stats;
pub(crate) mod stored;
pub(crate) mod tables;
pub(crate) mod trust;
pub(crate) use endpoints::{EndpointUsage, ModelCallbacks};
use endpoints::{calls_and_usage, endpoints};
pub(crate) mod view;
pub(crate) mod why;

pub(crate) use markdown::{load_template, render};
pub(crate) use recount::Recount;

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;
use serde_json::Value;

use crate::hash::sha256;
use crate::inputs::dataset::Dataset;
use crate::inputs::tokenizer::{Tokenizer, TokenizerIdentity};
use crate::protocol::Ratio;
use crate::protocol::Role;
use crate::protocol::{CellId, Condition};
use crate::runner::{Outcome, Usage};
use crate::store::ledger::{FailureRow, LedgerRow, ResultRow};
use metrics::Score;
use stats::Spread;

pub(crate) use conditions::ConditionRow;
use conditions::by_condition;

pub(crate) const SCHEMA: &str = "gacc.report/1";

#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub(crate) struct Report {
    pub(crate) schema: &'static str,
    pub(crate) experiment: Experiment,
    pub(crate) tokenizer: TokenizerIdentity,
    pub(crate) dataset: DatasetSummary,
    /// True when every job succeeded.
    pub(crate) complete: bool,
    /// Why and where `[run] stop` ended the run before every goal was read (SPEC §13).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) stopped_early: Option<sequence::StoppedEarly>,
    pub(crate) cells: Vec<Cell>,
    /// Per compressor and ratio, the conditions side by side and the goal-conditioning gaps.
    pub(crate) by_condition: Vec<ConditionRow>,
    /// Per condition and budget, every pair of compressors on the same goals and seeds: how
    /// sure their difference is (SPEC §13).
    pub(crate) pairs: Vec<pairs::Pair>,
    /// Per condition, every cell with a Micro as a point of cost per question against Micro,
    /// with its Pareto rank (SPEC §15).
    pub(crate) frontier: Vec<costs::FrontierPoint>,
    pub(crate) integrity: Integrity,
    /// Per role, whether the hold-out was enforced (callbacks sandboxed), set by the run.
    pub(crate) holdout: BTreeMap<Role, crate::exec::sandbox::HoldoutEnforcement>,
    pub(crate) calls: BTreeMap<Role, Calls>,
    /// Usage the callbacks reported for the calls these results rest on.
    pub(crate) usage: BTreeMap<Role, Usage>,
    /// The same for each compressor.
    pub(crate) usage_by_compressor: BTreeMap<String, Usage>,
    pub(crate) failures: Vec<FailureRow>,
    /// Jobs not run because the run stopped early (`--fail-fast`, the spending cap, a refused key).
    pub(crate) cancelled: usize,
    /// Per model endpoint: the usage and cost of the calls the results rest on, per role,
    /// and the models that served them (SPEC §8).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(crate) endpoints: BTreeMap<String, EndpointUsage>,
    /// How far the scores depend on the judge (SPEC §10): present when `[audit]` is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) judge_audit: Option<audit::JudgeAudit>,
    /// Why the scoring judge's verdicts are in doubt (one verdict or rationale throughout, an
    /// audit judge or the labels disagreeing): absent when nothing says so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) judge_doubt: Option<trust::JudgeDoubt>,
    /// Per compressor, condition and target, the smallest budget reaching it (SPEC §11).
    pub(crate) budget_at_target: Vec<why::AtTarget>,
    /// Pairs of budgets where the larger scores lower beyond a paired 95% bootstrap.
    pub(crate) monotonicity: Vec<why::Dip>,
    /// Scores per tag of the sources, goals and questions (absent when none has a tag).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) by_tag: Vec<why::TagScores>,
    /// How far the scores depend on the reader (SPEC §11): present with `[audit] readers`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) reader_panel: Option<why::ReaderPanel>,
}

#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub(crate) struct Experiment {
    pub(crate) name: String,
    pub(crate) description: Option<String>,
    /// SHA-256 of the resolved manifest (`manifest.toml`) without its `[run]` table: what was
    /// run, whatever the executor, concurrency or cache place.
    pub(crate) manifest_sha256: String,
    pub(crate) gacc_version: &'static str,
    pub(crate) seeds: Vec<u64>,
    pub(crate) ratios: Vec<Ratio>,
    /// Absolute budgets in tokens (absent when the manifest gave none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) budgets: Vec<usize>,
    pub(crate) conditions: Vec<Condition>,
    /// Each callback's cache identity.
    pub(crate) callbacks: BTreeMap<String, Value>,
}

#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub(crate) struct DatasetSummary {
    /// SHA-256 over every source's id, text and goals, in order.
    pub(crate) sha256: String,
    pub(crate) sources: usize,
    pub(crate) goals: usize,
    pub(crate) questions: usize,
}

/// Calls the results rest on: `made` distinct calls, and `cached` jobs that reused one of
/// them. Both depend only on the experiment, not on what an earlier run left in the cache;
/// this run's own counts are in `run.json`.
#[derive(Debug, Clone, Serialize, PartialEq, schemars::JsonSchema)]
pub(crate) struct Calls {
    pub(crate) jobs: usize,
    pub(crate) made: usize,
    pub(crate) cached: usize,
    /// Of `cached`, the jobs of one seed that rest on a request another seed sent: a greedy
    /// model callback sends one request for every seed (SPEC §8).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(crate) shared_across_seeds: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub(crate) struct Cell {
    #[serde(flatten)]
    pub(crate) id: CellId,
    /// False when a job of this cell failed: its scores leave those questions out.
    pub(crate) complete: bool,
    pub(crate) seeds: Vec<SeedScore>,
    /// Over the seeds that scored a question; null when none did (nothing was measured).
    pub(crate) micro: Option<Spread>,
    /// Over the seeds that scored a whole goal; null when none did.
    #[serde(rename = "macro")]
    pub(crate) macro_: Option<Spread>,
    /// 95% bootstrap interval of Micro over goals (all seeds pooled, fixed resampling seed);
    /// null when no goal was scored whole.
    pub(crate) micro_ci95: Option<stats::Interval>,
    /// 95% bootstrap interval of Macro over goals.
    pub(crate) macro_ci95: Option<stats::Interval>,
    /// The best and worst rank its Micro can hold among its condition and budget's
    /// compressors, given those it is separated from (SPEC §13); null without a Micro.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) rank: Option<pairs::Rank>,
    /// Between-goal spread of its scores and the seeds' share of it (SPEC §13); absent with
    /// fewer than two goals scored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) noise: Option<pairs::Noise>,
    pub(crate) ledger: LedgerSums,
    /// What the cell's memories cost and took (SPEC §15).
    pub(crate) compression: costs::Compression,
    /// What reading its memories cost against reading the sources, and when a memory pays.
    pub(crate) read_cost: costs::ReadCost,
    /// Answers by whether the memory kept their evidence (SPEC §11).
    pub(crate) attribution: why::Attribution,
    /// The cell between its floor and ceiling (`[anchors]`).
    #[serde(flatten)]
    pub(crate) anchors: Option<why::CellAnchors>,
}

#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub(crate) struct SeedScore {
    pub(crate) seed: u64,
    #[serde(flatten)]
    pub(crate) score: Score,
}

/// Ledger totals over a cell's memories (all seeds).
#[derive(Debug, Clone, Default, Serialize, schemars::JsonSchema)]
pub(crate) struct LedgerSums {
    pub(crate) memories: usize,
    pub(crate) source_tokens: usize,
    pub(crate) budget: usize,
    pub(crate) generated_tokens: usize,
    pub(crate) retained_tokens: usize,
    pub(crate) unused_budget: usize,
    pub(crate) memory_tokens: usize,
    pub(crate) padding_tokens: usize,
    pub(crate) truncated: usize,
    pub(crate) utf8_split: usize,
    pub(crate) budget_violations: usize,
    /// Memories a budget ladder made (SPEC §14), and of those, the ones that are a token
    /// prefix of the next larger budget's memory of their call (absent without a ladder).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(crate) ladder_rows: usize,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(crate) nested: usize,
}

impl LedgerSums {
    fn add(&mut self, row: &LedgerRow) {
        self.memories += 1;
        self.source_tokens += row.source_tokens;
        self.budget += row.budget;
        self.generated_tokens += row.generated_tokens;
        self.retained_tokens += row.retained_tokens;
        self.unused_budget += row.unused_budget;
        self.memory_tokens += row.memory_tokens;
        self.padding_tokens += row.padding_tokens;
        self.truncated += usize::from(row.truncated);
        self.utf8_split += usize::from(row.utf8_split);
        self.budget_violations += usize::from(row.budget_violation);
        self.ladder_rows += usize::from(row.ladder_call.is_some());
        self.nested += usize::from(row.nested == Some(true));
    }
}

#[derive(Debug, Clone, Serialize, PartialEq, schemars::JsonSchema)]
pub(crate) struct Integrity {
    pub(crate) exposure_violations: usize,
    pub(crate) budget_violations: usize,
    pub(crate) padding_tokens: usize,
    pub(crate) count_errors: usize,
    /// Memories and answers a secret's value was taken out of (rows marked `redacted`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(crate) redacted_memories: usize,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(crate) redacted_answers: usize,
}

/// What goes into a report besides the run's outcome.
pub(crate) struct Inputs<'a> {
    pub(crate) name: &'a str,
    pub(crate) description: Option<&'a str>,
    pub(crate) manifest_sha256: &'a str,
    pub(crate) seeds: &'a [u64],
    pub(crate) ratios: &'a [Ratio],
    pub(crate) budgets: &'a [usize],
    pub(crate) conditions: &'a [Condition],
    pub(crate) callbacks: BTreeMap<String, Value>,
    pub(crate) dataset: &'a Dataset,
    pub(crate) tokenizer: &'a dyn Tokenizer,
    pub(crate) model_callbacks: ModelCallbacks,
    /// The audit judges and the share each audits (SPEC §10).
    pub(crate) audits: Vec<(String, f64)>,
    /// The anchor reads the rows carry, and budget at target's shares (SPEC §11).
    pub(crate) anchors: crate::plan::Anchors,
    pub(crate) targets: Vec<f64>,
    /// The panel readers and the share each re-reads (SPEC §11).
    pub(crate) panel: Vec<(String, f64)>,
    pub(crate) labels: Option<&'a crate::inputs::labels::Labels>,
    /// The reader's input price in USD per token (its batch price through a batch API), where
    /// it has one: what a memory saves in reading (SPEC §15).
    pub(crate) reader_price: Option<f64>,
    /// Where the pair tests are kept once made (a run's cache; none in a replay, which makes
    /// every test again).
    pub(crate) memo: pairs::Memo<'a>,
}

pub(crate) fn dataset_sha256(dataset: &Dataset) -> String {
    sha256(serde_json::to_string(dataset).unwrap_or_default())
}

/// Builds the report; deterministic in its inputs.
pub(crate) fn build(inputs: &Inputs, outcome: &Outcome, recount: Recount) -> Report {
    let dataset = inputs.dataset;
    let count_errors = recount.errors(dataset, &outcome.ledger);
    let budget_violations = outcome.ledger.iter().filter(|r| r.budget_violation).count();
    let padding_tokens = outcome.ledger.iter().map(|r| r.padding_tokens).sum();

    let (calls, usage) = calls_and_usage(outcome);

    let (rows, ids) = cells::rows_by_cell(&outcome.results);
    // The pairs (on every core) beside the rest: what they read of the cells is their ids and
    // rows, so they start before the cells are made.
    let (pairs, (mut cells, rest)) = std::thread::scope(|scope| {
        let pairs = scope.spawn(|| pairs::pairs(&ids, &rows, inputs.memo));
        let mut cells = cells::cells(&outcome.ledger, &rows, &ids);
        let rest = beside_pairs(inputs, outcome, &mut cells, &rows);
        let pairs = pairs
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        (pairs, (cells, rest))
    });
    let Beside {
        frontier,
        monotonicity,
        by_tag,
        reader_panel,
        endpoints,
        judge_audit,
        judge_doubt,
    } = rest;
    let ranks = pairs::ranks(&cells, &pairs);
    for cell in &mut cells {
        cell.rank = ranks.get(&cell.id).copied();
    }
    let budget_at_target = why::at_target(&cells, &inputs.targets);
    Report {
        schema: SCHEMA,
        experiment: Experiment {
            name: inputs.name.to_owned(),
            description: inputs.description.map(str::to_owned),
            manifest_sha256: inputs.manifest_sha256.to_owned(),
            gacc_version: env!("CARGO_PKG_VERSION"),
            seeds: inputs.seeds.to_vec(),
            ratios: inputs.ratios.to_vec(),
            budgets: inputs.budgets.to_vec(),
            conditions: inputs.conditions.to_vec(),
            callbacks: inputs.callbacks.clone(),
        },
        tokenizer: inputs.tokenizer.identity().clone(),
        dataset: DatasetSummary {
            sha256: dataset_sha256(dataset),
            sources: dataset.sources.len(),
            goals: dataset.goals().count(),
            questions: dataset.question_count(),
        },
        complete: outcome.failures.is_empty() && outcome.cancelled == 0,
        stopped_early: None,
        by_condition: by_condition(&cells),
        cells,
        pairs,
        frontier,
        integrity: Integrity {
            exposure_violations: outcome.exposure_violations,
            budget_violations,
            padding_tokens,
            count_errors,
            redacted_memories: outcome.ledger.iter().filter(|r| r.redacted).count(),
            redacted_answers: outcome.results.iter().filter(|r| r.redacted).count(),
        },
        holdout: BTreeMap::new(),
        calls,
        usage,
        failures: outcome.failures.clone(),
        cancelled: outcome.cancelled,
        usage_by_compressor: outcome
            .compressor_calls
            .iter()
            .map(|(name, calls)| {
                let mut sum = Usage::default();
                calls.usage.iter().for_each(|usage| sum.plus(usage));
                (name.clone(), sum)
            })
            .collect(),
        endpoints,
        judge_audit,
        judge_doubt,
        budget_at_target,
        monotonicity,
        by_tag,
        reader_panel,
    }
}

/// What the report makes beside its pairs.
struct Beside {
    frontier: Vec<costs::FrontierPoint>,
    monotonicity: Vec<why::Dip>,
    by_tag: Vec<why::TagScores>,
    reader_panel: Option<why::ReaderPanel>,
    endpoints: BTreeMap<String, EndpointUsage>,
    judge_audit: Option<audit::JudgeAudit>,
    judge_doubt: Option<trust::JudgeDoubt>,
}

/// Each cell's attribution, noise, anchors and costs, and what the report reads of the cells
/// and rows but not of the pairs.
fn beside_pairs(
    inputs: &Inputs,
    outcome: &Outcome,
    cells: &mut [Cell],
    rows: &HashMap<CellId, Vec<&ResultRow>>,
) -> Beside {
    for cell in cells.iter_mut() {
        let rows = rows.get(&cell.id).map_or(&[][..], Vec::as_slice);
        cell.attribution = why::Attribution::of(rows.iter().copied());
        cell.noise = pairs::noise(rows);
        let micro = cell.micro.map(|m| m.mean);
        cell.anchors = why::anchors(rows, micro, inputs.anchors.floor, inputs.anchors.ceiling);
        let none = crate::runner::CellCost::default();
        let cost = outcome.cell_costs.get(&cell.id).unwrap_or(&none);
        cell.compression = costs::Compression::of(cost);
        cell.read_cost = costs::ReadCost::of(cost, &cell.ledger, rows.len(), inputs.reader_price);
    }
    let judge_audit = audit::audit(&outcome.results, cells, &inputs.audits, inputs.labels);
    Beside {
        frontier: costs::frontier(cells),
        monotonicity: why::dips(cells, rows),
        by_tag: why::by_tag(inputs.dataset, cells, rows),
        reader_panel: why::panel(&outcome.results, cells, &inputs.panel),
        endpoints: endpoints(&inputs.model_callbacks, outcome),
        judge_doubt: trust::doubt(
            &trust::judge_name(inputs.callbacks.get("judge")),
            &outcome.results,
            judge_audit.as_ref(),
        ),
        judge_audit,
    }
}
