//! The SPEC's executor (§2 `run.executor`): where and how one call is made. A `Callback`
//! holds the protocol side (retries, redaction, response checks); a `Launcher` makes one
//! attempt: a process of this machine (`process`), or a Slurm array task (`slurm`).

pub(crate) mod callback;
pub(crate) mod model;
pub(crate) mod process;
pub(crate) mod sandbox;
pub(crate) mod slurm;

/// Ends everything a run left running (on Ctrl-C): every callback process group, and every
/// Slurm array this gacc submitted.
pub(crate) fn shutdown() {
    process::kill_all();
    slurm::cancel_all();
}
