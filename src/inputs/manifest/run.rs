//! `[run]`: how an experiment is run, not what it is (its concurrency, cache, spending cap and
//! executor, and the Slurm executor's settings): none of it is in the experiment's identity.

use std::path::PathBuf;
use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::protocol::Timeout;

use super::DEFAULT_RUN_CONCURRENCY;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum ExecutorKind {
    #[default]
    Local,
    Slurm,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RunSpec {
    #[serde(default = "default_run_concurrency")]
    pub concurrency: usize,
    #[serde(default)]
    pub executor: ExecutorKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<PathBuf>,
    /// Settings of the Slurm executor (`executor = "slurm"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurm: Option<SlurmSpec>,
    /// No paid model call starts once what was spent plus the most the calls in flight can
    /// cost would pass this; the run then stops with exit status 3 (SPEC §8).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_cost_usd: Option<f64>,
}

/// `[run.slurm]`: how calls become Slurm array tasks.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct SlurmSpec {
    /// A folder every node sees, where requests, responses and task logs are exchanged
    /// (default `.gacc/slurm`, relative to the current folder like the default cache).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub work_dir: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account: Option<String>,
    /// Each array task's time limit (`sbatch --time`); a task past it ends its calls with a timeout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<Timeout>,
    /// The most tasks in one array (and one `sbatch`).
    #[serde(default = "default_array_limit")]
    pub array_limit: usize,
    /// Calls each array task makes, one after another (a persistent callback is started once
    /// per task and serves them all).
    #[serde(default = "default_calls_per_task")]
    pub calls_per_task: usize,
    /// How long ready calls are gathered before their array is submitted.
    #[serde(default = "default_gather")]
    pub gather: Timeout,
    /// How often job states (`squeue`) and responses are checked.
    #[serde(default = "default_poll")]
    pub poll: Timeout,
    /// More `sbatch` arguments, given as they are (e.g. `["--qos=high"]`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sbatch_args: Vec<String>,
    /// The gacc executable the nodes run (default: this one; it must be on the shared file system).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gacc: Option<PathBuf>,
    /// Resources of the tasks that run each role's calls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compressor: Option<SlurmResources>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reader: Option<SlurmResources>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub judge: Option<SlurmResources>,
}

/// Resources of one role's array tasks.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct SlurmResources {
    /// `--cpus-per-task`
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<u32>,
    /// `--mem`, e.g. `"16G"`
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<String>,
    /// `--gres`, e.g. `"gpu:1"`
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gres: Option<String>,
    /// Overrides `run.slurm.partition` for this role.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<String>,
    /// Overrides `run.slurm.time` for this role.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<Timeout>,
    /// Calls one task makes at once (default 1); a persistent callback then runs that many
    /// workers in the task.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parallel: Option<usize>,
}

pub(super) fn default_array_limit() -> usize {
    1000
}

pub(super) fn default_calls_per_task() -> usize {
    16
}

pub(super) fn default_gather() -> Timeout {
    Timeout(Duration::from_secs(1))
}

pub(super) fn default_poll() -> Timeout {
    Timeout(Duration::from_secs(2))
}

impl Default for SlurmSpec {
    fn default() -> Self {
        SlurmSpec {
            work_dir: None,
            partition: None,
            account: None,
            time: None,
            array_limit: default_array_limit(),
            calls_per_task: default_calls_per_task(),
            gather: default_gather(),
            poll: default_poll(),
            sbatch_args: Vec::new(),
            gacc: None,
            compressor: None,
            reader: None,
            judge: None,
        }
    }
}

pub(super) fn default_run_concurrency() -> usize {
    DEFAULT_RUN_CONCURRENCY
}

impl Default for RunSpec {
    fn default() -> Self {
        RunSpec {
            concurrency: DEFAULT_RUN_CONCURRENCY,
            executor: ExecutorKind::Local,
            cache: None,
            slurm: None,
            max_cost_usd: None,
        }
    }
}
