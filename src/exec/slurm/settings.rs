//! `[run.slurm]`: the Slurm engine's settings, which the manifest keeps as written (its
//! `run` table holds each engine's own table) and this engine reads and checks.

use std::path::PathBuf;
use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::protocol::Timeout;

/// `[run.slurm]`: how calls become Slurm array tasks.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[schemars(rename = "SlurmSettings")]
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

fn default_array_limit() -> usize {
    1000
}

fn default_calls_per_task() -> usize {
    16
}

fn default_gather() -> Timeout {
    Timeout(Duration::from_secs(1))
}

fn default_poll() -> Timeout {
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

impl SlurmSpec {
    /// The settings a manifest's `[run.slurm]` table gives (the defaults without one), or
    /// every problem with them as (key, message).
    pub(crate) fn read(table: Option<&toml::Value>) -> Result<SlurmSpec, Vec<(String, String)>> {
        let Some(table) = table else {
            return Ok(SlurmSpec::default());
        };
        let spec = SlurmSpec::deserialize(table.clone())
            .map_err(|error| vec![("run.slurm".to_owned(), error.message().trim().to_owned())])?;
        let mut problems = Vec::new();
        if spec.array_limit == 0 {
            problems.push((
                "run.slurm.array_limit".to_owned(),
                "must be at least 1".to_owned(),
            ));
        }
        if spec.calls_per_task == 0 {
            problems.push((
                "run.slurm.calls_per_task".to_owned(),
                "must be at least 1".to_owned(),
            ));
        }
        for (role, resources) in [
            ("compressor", &spec.compressor),
            ("reader", &spec.reader),
            ("judge", &spec.judge),
        ] {
            if resources.as_ref().and_then(|r| r.parallel) == Some(0) {
                problems.push((
                    format!("run.slurm.{role}.parallel"),
                    "must be at least 1".to_owned(),
                ));
            }
        }
        if problems.is_empty() {
            Ok(spec)
        } else {
            Err(problems)
        }
    }
}
