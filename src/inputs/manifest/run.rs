//! `[run]`: how an experiment is run, not what it is (its concurrency, cache, spending cap and
//! executor, and each engine's own settings): none of it is in the experiment's identity.

use std::collections::BTreeMap;
use std::path::PathBuf;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::DEFAULT_RUN_CONCURRENCY;

/// The engine that runs calls on this machine, `run.executor`'s default.
pub(crate) const LOCAL_ENGINE: &str = "local";

/// `[run]`. Every other engine than the local one is known to the engines' registry (`exec/`)
/// only: it checks `executor` and reads the engine's own table, `[run.<engine>]`, which the
/// manifest keeps as written (so that a key this struct does not know lands there, and the
/// registry refuses it unless it names an engine).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct RunSpec {
    #[serde(default = "default_run_concurrency")]
    pub concurrency: usize,
    /// The engine that runs calls: `local` (this machine) or another the registry knows.
    #[serde(default = "default_executor")]
    pub executor: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<PathBuf>,
    /// No paid model call starts once what was spent plus the most the calls in flight can
    /// cost would pass this; the run then stops with exit status 3 (SPEC §8).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_cost_usd: Option<f64>,
    /// Variables whose values are secrets in every callback's and the tokenizer's `env`,
    /// beside those whose names say so.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<String>,
    /// Stop reading goals once the listed pairs are decided (SPEC §13, "Stopping early").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop: Option<StopSpec>,
    /// Each engine's own table, `[run.<engine>]`, as written (the schema gains each engine's
    /// table from the registry).
    #[serde(flatten)]
    #[schemars(skip)]
    pub engines: BTreeMap<String, toml::Value>,
}

fn default_executor() -> String {
    LOCAL_ENGINE.to_owned()
}

pub(super) fn default_run_concurrency() -> usize {
    DEFAULT_RUN_CONCURRENCY
}

impl Default for RunSpec {
    fn default() -> Self {
        RunSpec {
            concurrency: DEFAULT_RUN_CONCURRENCY,
            executor: default_executor(),
            cache: None,
            max_cost_usd: None,
            secrets: Vec::new(),
            stop: None,
            engines: BTreeMap::new(),
        }
    }
}

/// `[run] stop`: goals are read in a seeded order, in batches of `every`; from `min_goals` on,
/// after each batch, the run stops once every listed pair, in every (condition, budget), is
/// separated or within ±`margin`, by an anytime-valid 95% confidence sequence over goals.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct StopSpec {
    pub when: StopWhen,
    /// Pairs of compressor names, `[["a", "b"], …]`.
    pub pairs: Vec<[String; 2]>,
    #[serde(default = "default_min_goals")]
    pub min_goals: usize,
    #[serde(default = "default_every")]
    pub every: usize,
    #[serde(default = "default_margin")]
    pub margin: f64,
}

/// What a stopping rule waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum StopWhen {
    /// Each pair separated (its sequence excludes 0) or within ±margin.
    Separated,
}

fn default_min_goals() -> usize {
    50
}

fn default_every() -> usize {
    25
}

fn default_margin() -> f64 {
    0.01
}

impl StopSpec {
    /// What is wrong with it, given the manifest's compressors.
    pub(crate) fn problems(&self, compressors: impl Fn(&str) -> bool) -> Vec<String> {
        let mut problems = Vec::new();
        if self.pairs.is_empty() {
            problems.push("`pairs` must list at least one pair of compressors".to_owned());
        }
        for [a, b] in &self.pairs {
            for name in [a, b].into_iter().filter(|name| !compressors(name)) {
                problems.push(format!(
                    "`pairs` names `{name}`, which is not a `[compressors.*]` table"
                ));
            }
            if a == b {
                problems.push(format!("`pairs` pairs `{a}` with itself"));
            }
        }
        if self.min_goals == 0 || self.every == 0 {
            problems.push("`min_goals` and `every` must be at least 1".to_owned());
        }
        if !(0.0..1.0).contains(&self.margin) {
            problems.push(format!(
                "`margin` must be from 0 to below 1 (got {})",
                self.margin
            ));
        }
        problems
    }
}
