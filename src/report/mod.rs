//! `report.json` (schema `gacc.report/1`) and the reports rendered from it (SPEC §5).

pub(crate) mod charts;
pub mod html;
pub(crate) mod metrics;
pub(crate) mod stats;
pub(crate) mod view;

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex, mpsc};

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

pub(crate) const SCHEMA: &str = "gacc.report/1";
/// The default `report.md` template, compiled in.
pub(crate) const DEFAULT_TEMPLATE: &str = include_str!("../../templates/report.md.j2");

#[derive(Debug, Clone, Serialize)]
pub(crate) struct Report {
    pub(crate) schema: &'static str,
    pub(crate) experiment: Experiment,
    pub(crate) tokenizer: TokenizerIdentity,
    pub(crate) dataset: DatasetSummary,
    /// True when every job succeeded.
    pub(crate) complete: bool,
    pub(crate) cells: Vec<Cell>,
    /// Per compressor and ratio, the conditions side by side and the goal-conditioning gaps.
    pub(crate) by_condition: Vec<ConditionRow>,
    pub(crate) integrity: Integrity,
    /// Per role, whether the hold-out was enforced (callbacks sandboxed), set by the run.
    pub(crate) holdout: BTreeMap<Role, crate::exec::sandbox::Holdout>,
    pub(crate) calls: BTreeMap<Role, Calls>,
    /// Usage the callbacks reported for the calls these results rest on.
    pub(crate) usage: BTreeMap<Role, Usage>,
    /// The same for each compressor.
    pub(crate) usage_by_compressor: BTreeMap<String, Usage>,
    pub(crate) failures: Vec<FailureRow>,
    /// Jobs not run because `--fail-fast` stopped the run after a failure.
    pub(crate) cancelled: usize,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct Experiment {
    pub(crate) name: String,
    pub(crate) description: Option<String>,
    /// SHA-256 of the resolved manifest (`manifest.toml`) without its `[run]` table: what was
    /// run, whatever the executor, concurrency or cache place.
    pub(crate) manifest_sha256: String,
    pub(crate) gacc_version: &'static str,
    pub(crate) seeds: Vec<u64>,
    pub(crate) ratios: Vec<Ratio>,
    pub(crate) conditions: Vec<Condition>,
    /// Each callback's cache identity.
    pub(crate) callbacks: BTreeMap<String, Value>,
}

#[derive(Debug, Clone, Serialize)]
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
#[derive(Debug, Clone, Serialize, PartialEq)]
pub(crate) struct Calls {
    pub(crate) jobs: usize,
    pub(crate) made: usize,
    pub(crate) cached: usize,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct Cell {
    #[serde(flatten)]
    pub(crate) id: CellId,
    /// False when a job of this cell failed: its scores leave those questions out.
    pub(crate) complete: bool,
    pub(crate) seeds: Vec<SeedScore>,
    pub(crate) micro: Spread,
    #[serde(rename = "macro")]
    pub(crate) macro_: Spread,
    /// 95% bootstrap interval of Micro over goals (all seeds pooled, fixed resampling seed).
    pub(crate) micro_ci95: stats::Interval,
    /// 95% bootstrap interval of Macro over goals.
    pub(crate) macro_ci95: stats::Interval,
    pub(crate) ledger: LedgerSums,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct SeedScore {
    pub(crate) seed: u64,
    #[serde(flatten)]
    pub(crate) score: Score,
}

/// Ledger totals over a cell's memories (all seeds).
#[derive(Debug, Clone, Default, Serialize)]
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
    }
}

/// Mean Micro or Macro of one compressor and ratio under each condition run.
#[derive(Debug, Clone, Default, Serialize)]
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

/// How much seeing its own goal helps a compressor at one ratio.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ConditionRow {
    pub(crate) compressor: String,
    pub(crate) ratio: Ratio,
    pub(crate) micro: ByCondition,
    #[serde(rename = "macro")]
    pub(crate) macro_: ByCondition,
    /// own-goal minus no-goal, Micro and Macro.
    pub(crate) gap_no_goal: Option<Gap>,
    /// own-goal minus cross-goal, Micro and Macro.
    pub(crate) gap_cross_goal: Option<Gap>,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct Gap {
    pub(crate) micro: f64,
    #[serde(rename = "macro")]
    pub(crate) macro_: f64,
}

/// Pivots cells into one row per (compressor, ratio), in first-seen order.
fn by_condition(cells: &[Cell]) -> Vec<ConditionRow> {
    let mut rows: Vec<ConditionRow> = Vec::new();
    for cell in cells {
        let position = rows
            .iter()
            .position(|r| r.compressor == cell.id.compressor && r.ratio == cell.id.ratio)
            .unwrap_or_else(|| {
                rows.push(ConditionRow {
                    compressor: cell.id.compressor.clone(),
                    ratio: cell.id.ratio,
                    micro: ByCondition::default(),
                    macro_: ByCondition::default(),
                    gap_no_goal: None,
                    gap_cross_goal: None,
                });
                rows.len() - 1
            });
        rows[position].micro.set(cell.id.condition, cell.micro.mean);
        rows[position].macro_.set(cell.id.condition, cell.macro_.mean);
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
    rows.sort_by(|a, b| a.compressor.cmp(&b.compressor).then(a.ratio.cmp(&b.ratio)));
    rows
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub(crate) struct Integrity {
    pub(crate) exposure_violations: usize,
    pub(crate) budget_violations: usize,
    pub(crate) padding_tokens: usize,
    pub(crate) count_errors: usize,
}

/// What goes into a report besides the run's outcome.
pub(crate) struct Inputs<'a> {
    pub(crate) name: &'a str,
    pub(crate) description: Option<&'a str>,
    pub(crate) manifest_sha256: &'a str,
    pub(crate) seeds: &'a [u64],
    pub(crate) ratios: &'a [Ratio],
    pub(crate) conditions: &'a [Condition],
    pub(crate) callbacks: BTreeMap<String, Value>,
    pub(crate) dataset: &'a Dataset,
    pub(crate) tokenizer: &'a dyn Tokenizer,
}

pub(crate) fn dataset_sha256(dataset: &Dataset) -> String {
    sha256(serde_json::to_string(dataset).unwrap_or_default())
}

/// Builds the report; deterministic in its inputs.
pub(crate) fn build(inputs: &Inputs, outcome: &Outcome, recount: Recount) -> Report {
    let dataset = inputs.dataset;
    let count_errors = recount.errors(inputs.tokenizer, dataset, &outcome.ledger);
    let budget_violations = outcome.ledger.iter().filter(|r| r.budget_violation).count();
    let padding_tokens = outcome.ledger.iter().map(|r| r.padding_tokens).sum();

    let mut calls = BTreeMap::new();
    let mut usage = BTreeMap::new();
    for role in [Role::Compressor, Role::Reader, Role::Judge] {
        let distinct = outcome.calls.get(&role);
        let made = distinct.map_or(0, |c| c.len());
        let jobs = outcome.jobs.get(&role).copied().unwrap_or(0);
        let failed = outcome
            .failures
            .iter()
            .filter(|f| stage_role(&f.stage) == Some(role))
            .count();
        calls.insert(
            role,
            Calls {
                jobs,
                made,
                cached: jobs.saturating_sub(made + failed),
            },
        );
        let mut sum = Usage::default();
        for usage in distinct.into_iter().flat_map(|c| c.values()) {
            sum.plus(usage);
        }
        usage.insert(role, sum);
    }

    let cells = cells(&outcome.ledger, &outcome.results);
    Report {
        schema: SCHEMA,
        experiment: Experiment {
            name: inputs.name.to_owned(),
            description: inputs.description.map(str::to_owned),
            manifest_sha256: inputs.manifest_sha256.to_owned(),
            gacc_version: env!("CARGO_PKG_VERSION"),
            seeds: inputs.seeds.to_vec(),
            ratios: inputs.ratios.to_vec(),
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
        by_condition: by_condition(&cells),
        cells,
        integrity: Integrity {
            exposure_violations: outcome.exposure_violations,
            budget_violations,
            padding_tokens,
            count_errors,
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
                calls.values().for_each(|usage| sum.plus(usage));
                (name.clone(), sum)
            })
            .collect(),
    }
}

fn stage_role(stage: &str) -> Option<Role> {
    match stage {
        "compress" => Some(Role::Compressor),
        "read" => Some(Role::Reader),
        "judge" => Some(Role::Judge),
        _ => None,
    }
}

/// Per seed, each goal's verdicts, in first-seen order.
type SeedVerdicts = Vec<(u64, Vec<(String, Vec<Option<bool>>)>)>;

/// Groups rows into cells, in the order they first appear (the plan's order).
fn cells(ledger: &[LedgerRow], results: &[ResultRow]) -> Vec<Cell> {
    let mut order: Vec<CellId> = Vec::new();
    // cell -> seed -> goal -> verdicts, each in first-seen order
    let mut verdicts: HashMap<CellId, SeedVerdicts> = HashMap::new();
    for row in results {
        let id = &row.cell;
        let seeds = verdicts.entry(id.clone()).or_insert_with(|| {
            order.push(id.clone());
            Vec::new()
        });
        let position = match seeds.iter().position(|(s, _)| *s == row.seed) {
            Some(position) => position,
            None => {
                seeds.push((row.seed, Vec::new()));
                seeds.len() - 1
            }
        };
        let goals = &mut seeds[position].1;
        let verdict = if row.failure.is_some() { None } else { row.correct };
        match goals.iter_mut().find(|(g, _)| *g == row.goal_id) {
            Some((_, list)) => list.push(verdict),
            None => goals.push((row.goal_id.clone(), vec![verdict])),
        }
    }
    let mut sums: HashMap<CellId, LedgerSums> = HashMap::new();
    for row in ledger {
        sums.entry(row.memory_id.cell.clone()).or_default().add(row);
    }
    order
        .into_iter()
        .map(|id| {
            let mut pooled: Vec<Vec<Option<bool>>> = Vec::new();
            let seeds: Vec<SeedScore> = verdicts
                .remove(&id)
                .unwrap_or_default()
                .into_iter()
                .map(|(seed, goals)| {
                    let goals: Vec<Vec<Option<bool>>> = goals.into_iter().map(|(_, v)| v).collect();
                    let score = metrics::score(&goals);
                    pooled.extend(goals);
                    SeedScore { seed, score }
                })
                .collect();
            let (micro_ci95, macro_ci95) =
                metrics::bootstrap(&pooled, stats::REPORT_RESAMPLES, stats::REPORT_SEED);
            let micro: Vec<f64> = seeds.iter().map(|s| s.score.micro).collect();
            let macro_: Vec<f64> = seeds.iter().map(|s| s.score.macro_).collect();
            let ledger = sums.remove(&id).unwrap_or_default();
            Cell {
                complete: seeds.iter().all(|s| s.score.unscored_questions == 0),
                id,
                micro: stats::spread(&micro),
                macro_: stats::spread(&macro_),
                micro_ci95,
                macro_ci95,
                seeds,
                ledger,
            }
        })
        .collect()
}

/// The independent recount (SPEC §5 `count_errors`): every source and every distinct memory
/// text re-encoded with the tokenizer and hashed, on threads of its own. It starts when the
/// run does and takes each memory as soon as the run hands it over, so at scale it is mostly
/// done by the time the report is built; each ledger row is then checked against it.
pub(crate) struct Recount {
    texts: Option<mpsc::Sender<Arc<str>>>,
    sources: Vec<Arc<str>>,
    workers: Vec<std::thread::JoinHandle<Vec<Counted>>>,
}

/// A text as recounted: its tokens (None if the tokenizer failed) and its SHA-256.
type Counted = (Arc<str>, Option<usize>, String);

/// Re-encodes and hashes texts on every core.
fn count_in_parallel(tokenizer: &dyn Tokenizer, texts: &[Arc<str>]) -> Vec<Counted> {
    crate::parallel::map_in_parallel(texts, |text| {
        let tokens = tokenizer.encode(text).ok().map(|t| t.len());
        (text.clone(), tokens, sha256(&**text))
    })
}

/// A text's identity while its `Arc` is alive: the ledger shares one `Arc` per memory.
fn address(text: &Arc<str>) -> usize {
    Arc::as_ptr(text) as *const u8 as usize
}

impl Recount {
    /// Starts recounting, with the dataset's sources first.
    pub(crate) fn start(tokenizer: Arc<dyn Tokenizer>, dataset: &Dataset) -> Recount {
        let (sender, receiver) = mpsc::channel::<Arc<str>>();
        let receiver = Arc::new(Mutex::new(receiver));
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let workers = (0..threads)
            .map(|_| {
                let (tokenizer, receiver) = (tokenizer.clone(), receiver.clone());
                std::thread::spawn(move || {
                    let mut counted = Vec::new();
                    loop {
                        let next = receiver.lock().unwrap_or_else(|e| e.into_inner()).recv();
                        let Ok(text) = next else { break };
                        let tokens = tokenizer.encode(&text).ok().map(|t| t.len());
                        let sha = sha256(&*text);
                        counted.push((text, tokens, sha));
                    }
                    counted
                })
            })
            .collect();
        let sources: Vec<Arc<str>> = dataset
            .sources
            .iter()
            .map(|s| Arc::from(s.text.as_str()))
            .collect();
        for text in &sources {
            let _ = sender.send(text.clone());
        }
        Recount {
            texts: Some(sender),
            sources,
            workers,
        }
    }

    /// Somewhere to hand memory texts over as they are made (each distinct `Arc` once);
    /// every copy must be dropped before [`Recount::errors`], which waits for them.
    pub(crate) fn feed(&self) -> Option<mpsc::Sender<Arc<str>>> {
        self.texts.clone()
    }

    /// Ledger rows whose counts disagree with the recount: the source re-encoded for `N`, the
    /// budget recomputed, the memory re-encoded and hashed. Memories never handed over are
    /// recounted here, each distinct one once.
    pub(crate) fn errors(
        mut self,
        tokenizer: &dyn Tokenizer,
        dataset: &Dataset,
        ledger: &[LedgerRow],
    ) -> usize {
        drop(self.texts.take());
        // Each entry keeps its text alive, so no other text can take its address meanwhile.
        let mut counted: HashMap<usize, Counted> = self
            .workers
            .into_iter()
            .flat_map(|w| w.join().unwrap_or_default())
            .map(|counted| (address(&counted.0), counted))
            .collect();
        let mut missing = std::collections::HashSet::new();
        let missing: Vec<Arc<str>> = ledger
            .iter()
            .map(|row| &row.memory)
            .chain(&self.sources)
            .filter(|text| !counted.contains_key(&address(text)) && missing.insert(address(text)))
            .cloned()
            .collect();
        for text in count_in_parallel(tokenizer, &missing) {
            counted.insert(address(&text.0), text);
        }
        let count = |text: &Arc<str>| match counted.get(&address(text)) {
            Some((_, tokens, sha)) => (*tokens, sha.as_str()),
            None => (None, ""),
        };
        let source_tokens: HashMap<&str, Option<usize>> = dataset
            .sources
            .iter()
            .zip(&self.sources)
            .map(|(s, text)| (s.id.as_str(), count(text).0))
            .collect();
        ledger
            .iter()
            .filter(|row| {
                let n = source_tokens
                    .get(row.memory_id.source_id.as_str())
                    .copied()
                    .flatten();
                let (memory_tokens, memory_sha256) = count(&row.memory);
                n != Some(row.source_tokens)
                    || row.budget != row.memory_id.cell.ratio.budget(row.source_tokens)
                    || row.retained_tokens > row.budget
                    || row.unused_budget != row.budget - row.retained_tokens.min(row.budget)
                    || Some(row.memory_tokens) != memory_tokens
                    || row.memory_sha256 != memory_sha256
                    || row.padding_tokens != 0
            })
            .count()
    }
}

/// Renders a template over a report (and the run's own record as `run`), with undefined
/// variables as errors that name the template line.
pub(crate) fn render(
    template: &str,
    template_name: &str,
    report: &Value,
    run: &Value,
) -> Result<String, String> {
    let mut env = minijinja::Environment::new();
    env.set_undefined_behavior(minijinja::UndefinedBehavior::Strict);
    if let Ok(syntax) = minijinja::syntax::SyntaxConfig::builder()
        .trim_blocks(true)
        .lstrip_blocks(true)
        .keep_trailing_newline(true)
        .build()
    {
        env.set_syntax(syntax);
    }
    // Absent values (a condition not run) print as a dash rather than failing the template.
    env.add_filter("fixed", |value: Option<f64>, places: Option<usize>| match value {
        Some(value) => format!("{value:.*}", places.unwrap_or(3)),
        None => "—".to_owned(),
    });
    env.add_filter("signed", |value: Option<f64>| match value {
        Some(value) => format!("{value:+.3}"),
        None => "—".to_owned(),
    });
    env.add_filter("percent", |value: f64| format!("{:.1}%", value * 100.0));
    env.add_template(template_name, template)
        .map_err(describe_template_error)?;
    let template = env.get_template(template_name).map_err(describe_template_error)?;
    let mut context = report.clone();
    if let Value::Object(fields) = &mut context {
        fields.insert("run".into(), run.clone());
    }
    let mut text = template
        .render(minijinja::Value::from(minijinja::value::Serde(&context)))
        .map_err(describe_template_error)?;
    if !text.ends_with('\n') {
        text.push('\n');
    }
    Ok(text)
}

fn describe_template_error(error: minijinja::Error) -> String {
    let place = match (error.name(), error.line()) {
        (Some(name), Some(line)) => format!("{name}:{line}: "),
        (Some(name), None) => format!("{name}: "),
        _ => String::new(),
    };
    let detail = error.detail().map(|d| format!(" ({d})")).unwrap_or_default();
    format!("{place}{}{detail}", error.kind())
}

/// Reads a template file, or the compiled-in default when `path` is None.
pub(crate) fn load_template(path: Option<&Path>) -> Result<(String, String), String> {
    match path {
        None => Ok((DEFAULT_TEMPLATE.to_owned(), "report.md.j2".to_owned())),
        Some(path) => std::fs::read_to_string(path)
            .map(|text| (text, path.display().to_string()))
            .map_err(|error| format!("{}: cannot read the template: {error}", path.display())),
    }
}
