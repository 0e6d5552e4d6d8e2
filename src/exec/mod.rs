//! The SPEC's executor (§2 `run.executor`): where and how one call is made. A `Callback`
//! holds the protocol side (retries, redaction, response checks); a `Launcher` makes one
//! attempt: a rule built-in answered in gacc (`in_process`), a process of this machine
//! (`process`), a model endpoint over HTTP (`model`), or a Slurm array task (`slurm`).

pub(crate) mod callback;
pub(crate) mod in_process;
pub(crate) mod model;
pub(crate) mod process;
pub(crate) mod program;
pub(crate) mod sandbox;
pub(crate) mod slurm;

/// Ends everything a run left running (on Ctrl-C): every callback process group, and every
/// Slurm array this gacc submitted.
pub(crate) fn shutdown() {
    process::kill_all();
    slurm::cancel_all();
}
