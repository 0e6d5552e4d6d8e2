//! The SPEC's executor (§2 `run.executor`): where and how one call is made. A `Callback`
//! holds the protocol side (retries, redaction, response checks); a `Launcher` makes one
//! attempt: a rule built-in answered in gacc (`in_process`), a model endpoint over HTTP
//! (`model`), or a program, started by the run's `Engine` (`engine`): a process of this
//! machine (`process`), or a task of a cluster handed its call as files (`remote`).
//!
//! This file is the engines' registry: an engine that runs calls elsewhere is a folder here,
//! named by its `mod` line and its entry in `ENGINES`, and by nothing else.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::inputs::manifest::{LOCAL_ENGINE, Loaded};

pub(crate) mod callback;
pub(crate) mod engine;
pub(crate) mod in_process;
pub(crate) mod model;
pub(crate) mod process;
pub(crate) mod program;
pub(crate) mod remote;
pub(crate) mod sandbox;
mod slurm;

/// A kind of engine a manifest may name besides the local one: `run.executor = "<name>"`,
/// with its own settings in `[run.<name>]`; `start` makes the running engine.
pub(crate) trait EngineKind: Sync {
    fn name(&self) -> &'static str;
    /// The JSON Schema of its `[run.<name>]` table (`gacc schema manifest`).
    fn settings_schema(&self) -> schemars::Schema;
    /// The problems of its `[run.<name>]` table, as (key, message); a table is checked whether
    /// or not the engine is the one run.
    fn check(&self, table: Option<&toml::Value>) -> Vec<(String, String)>;
    /// The engine ready to run (its settings read, its commands checked).
    fn start(&self, loaded: &Loaded) -> Result<Arc<dyn engine::Engine>, String>;
    /// The folders it works in, each with what it is, known before it starts: no sandboxed
    /// callback may be granted them (every call's request waits there, the readers' questions
    /// among them).
    fn folders(&self, loaded: &Loaded) -> Vec<(PathBuf, &'static str)>;
    /// `gacc array-task`, where the engine hands calls over as arrays of tasks: makes the calls
    /// of one task (`None`: the task the environment names) of the array whose folder is
    /// given; the calls made, or why none could be. None for an engine without arrays.
    fn array_task(&self, _array: &Path, _task: Option<usize>) -> Option<Result<usize, String>> {
        None
    }
    /// Ends everything it left running (on Ctrl-C).
    fn shutdown(&self);
}

const ENGINES: &[&dyn EngineKind] = &[&slurm::Kind];

fn registered(name: &str) -> Option<&'static dyn EngineKind> {
    ENGINES.iter().copied().find(|engine| engine.name() == name)
}

/// The names `run.executor` may take.
pub(crate) fn engine_names() -> Vec<&'static str> {
    std::iter::once(LOCAL_ENGINE)
        .chain(ENGINES.iter().map(|e| e.name()))
        .collect()
}

/// Every registered engine's name and the JSON Schema of its settings table.
pub(crate) fn engine_schemas() -> Vec<(&'static str, schemars::Schema)> {
    ENGINES.iter().map(|e| (e.name(), e.settings_schema())).collect()
}

/// The problems of `run.executor` and of the run's engine tables, as (key, message): an
/// unknown engine, a key of `[run]` that is neither one of its own nor an engine's table, and
/// each table's own problems.
pub(crate) fn engine_problems(loaded: &Loaded) -> Vec<(String, String)> {
    let run = &loaded.manifest.run;
    let mut problems = Vec::new();
    let names = engine_names().join(", ");
    if run.executor != LOCAL_ENGINE && registered(&run.executor).is_none() {
        let message = format!("no engine `{}` (the engines: {names})", run.executor);
        problems.push(("run.executor".to_owned(), message));
    }
    let tables: Vec<String> = ENGINES.iter().map(|e| format!("`[run.{}]`", e.name())).collect();
    for key in run.engines.keys().filter(|key| registered(key).is_none()) {
        let message = format!(
            "unknown key (`[run]` has concurrency, executor, cache, max_cost_usd and the engines' tables {})",
            tables.join(", ")
        );
        problems.push((format!("run.{key}"), message));
    }
    for engine in ENGINES {
        problems.extend(engine.check(run.engines.get(engine.name())));
    }
    problems
}

/// The engine a manifest's `run.executor` names, ready (its commands checked).
pub(crate) fn engine_of(loaded: &Loaded) -> Result<Arc<dyn engine::Engine>, String> {
    let name = &loaded.manifest.run.executor;
    match registered(name) {
        _ if name == LOCAL_ENGINE => Ok(Arc::new(engine::Here)),
        Some(engine) => engine.start(loaded),
        None => Err(format!(
            "no engine `{name}` (the engines: {})",
            engine_names().join(", ")
        )),
    }
}

/// The folders the manifest's engine works in, each with what it is, known before it starts.
pub(crate) fn engine_folders(loaded: &Loaded) -> Vec<(PathBuf, &'static str)> {
    registered(&loaded.manifest.run.executor).map_or_else(Vec::new, |engine| engine.folders(loaded))
}

/// `gacc array-task`: makes the calls of one task of an array an engine submitted, on the
/// machine that runs it; the calls made, or why none could be.
pub(crate) fn array_task(array: &Path, task: Option<usize>) -> Result<usize, String> {
    (ENGINES.iter().find_map(|engine| engine.array_task(array, task)))
        .unwrap_or_else(|| Err("no engine runs arrays of tasks".to_owned()))
}

/// Ends everything a run left running (on Ctrl-C): every callback process group, and whatever
/// each engine submitted.
pub(crate) fn shutdown() {
    process::kill_all();
    for engine in ENGINES {
        engine.shutdown();
    }
}
