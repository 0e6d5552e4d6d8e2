//! The SPEC's executor (§2 `run.executor`): where and how one call is made. A `Callback`
//! holds the protocol side (retries, redaction, response checks); a `Launcher` makes one
//! attempt: a rule built-in answered in gacc (`in_process`), a model endpoint over HTTP
//! (`model`), or a program, started by the run's `Engine` (`engine`): a process of this
//! machine (`process`), or a task of a cluster handed its call as files (`remote`).
//!
//! This file is the engines' registry: an engine that runs calls elsewhere is a folder here,
//! named by the functions below and by nothing else.

use std::path::PathBuf;
use std::sync::Arc;

use crate::inputs::manifest::{ExecutorKind, Loaded};

pub(crate) mod callback;
pub(crate) mod engine;
pub(crate) mod in_process;
pub(crate) mod model;
pub(crate) mod process;
pub(crate) mod program;
pub(crate) mod remote;
pub(crate) mod sandbox;
mod slurm;

/// The engine a manifest's `run.executor` names, ready (its commands checked).
pub(crate) fn engine_of(loaded: &Loaded) -> Result<Arc<dyn engine::Engine>, String> {
    match loaded.manifest.run.executor {
        ExecutorKind::Local => Ok(Arc::new(engine::Here)),
        ExecutorKind::Slurm => slurm::engine(loaded),
    }
}

/// The folders the manifest's engine works in, each with what it is, known before it starts:
/// no sandboxed callback may be granted them (every call's request waits there, the readers'
/// questions among them).
pub(crate) fn engine_folders(loaded: &Loaded) -> Vec<(PathBuf, &'static str)> {
    match loaded.manifest.run.executor {
        ExecutorKind::Local => Vec::new(),
        ExecutorKind::Slurm => vec![(slurm::work_dir(loaded), "the Slurm work folder")],
    }
}

/// `gacc array-task`: makes the calls of one task of an array an engine submitted, on the
/// machine that runs it; the calls made, or why none could be.
pub(crate) fn array_task(array: &std::path::Path, task: Option<usize>) -> Result<usize, String> {
    slurm::task::work(array, task)
}

/// Ends everything a run left running (on Ctrl-C): every callback process group, and every
/// array a cluster engine submitted.
pub(crate) fn shutdown() {
    process::kill_all();
    slurm::cancel_all();
}
