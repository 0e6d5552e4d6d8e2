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
            engines: BTreeMap::new(),
        }
    }
}
