//! The other side of the Slurm launcher: `gacc array-task ARRAY`, run by each array task on a
//! node. It rebuilds the array's callback from its description (secrets come from the task's
//! environment, never from a file), makes the task's calls, and writes each response whole.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use serde_json::Value;
use tokio::sync::Semaphore;

use crate::exec::callback::{Attempt, Callback, FailureKind};
use crate::exec::process::ProcessLauncher;
use crate::exec::remote::{Described, call_files, response_file};
use crate::files::write_durably;

/// An array's description, in its folder.
pub(super) const DESCRIPTION: &str = "array.json";

/// What `array.json` holds: the callback to run (as `remote::describe` writes it), the work
/// folder's `calls/`, and how many calls one task makes at once.
#[derive(serde::Serialize, serde::Deserialize)]
pub(super) struct ArrayDescription {
    pub callback: Value,
    pub calls: PathBuf,
    pub parallel: usize,
}

/// Where Slurm tells an array task its index.
const TASK_VARIABLE: &str = "SLURM_ARRAY_TASK_ID";

/// `gacc array-task ARRAY_DIR`: makes the calls of one array task (its index from `--task` or
/// `SLURM_ARRAY_TASK_ID`) and writes each response whole.
pub(crate) fn work(array: &Path, task: Option<usize>) -> Result<usize, String> {
    let index = match task {
        Some(index) => index,
        None => std::env::var(TASK_VARIABLE)
            .ok()
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| format!("no --task and no {TASK_VARIABLE} in the environment"))?,
    };
    let path = array.join(DESCRIPTION);
    let description: ArrayDescription = std::fs::read(&path)
        .map_err(|error| format!("cannot read {}: {error}", path.display()))
        .and_then(|bytes| {
            serde_json::from_slice(&bytes)
                .map_err(|error| format!("{} is not an array's description: {error}", path.display()))
        })?;
    let calls = description.calls;
    let callback = rebuild(&description.callback)?;
    let list = array.join("tasks").join(index.to_string());
    let keys =
        std::fs::read_to_string(&list).map_err(|error| format!("cannot read {}: {error}", list.display()))?;
    let parallel = description.parallel.max(1);
    let runtime =
        crate::parallel::runtime(Some(parallel.min(8))).map_err(|error| format!("cannot start: {error}"))?;
    let callback = Arc::new(callback);
    let keys: Vec<String> = keys
        .lines()
        .map(str::trim)
        .filter(|k| k.len() == 64)
        .map(str::to_owned)
        .collect();
    runtime.block_on(async {
        let slots = Arc::new(Semaphore::new(parallel));
        let mut running = tokio::task::JoinSet::new();
        for key in keys {
            let (callback, calls_dir, slots) = (callback.clone(), calls.clone(), slots.clone());
            running.spawn(async move {
                let _slot = slots.acquire_owned().await;
                make_call(&callback, &calls_dir, &key).await
            });
        }
        let mut made = 0;
        while let Some(done) = running.join_next().await {
            match done {
                Ok(Ok(true)) => made += 1,
                Ok(Ok(false)) => {}
                Ok(Err(message)) => return Err(message),
                Err(error) => return Err(format!("a call stopped: {error}")),
            }
        }
        Ok(made)
    })
}

/// Makes one call of a task unless it was answered already (Slurm may run a task again);
/// true when it was made.
async fn make_call(callback: &Callback, calls: &Path, key: &str) -> Result<bool, String> {
    let files = call_files(calls, key);
    if files.response.exists() {
        return Ok(false);
    }
    let started = Instant::now();
    let attempt = match std::fs::read(&files.request) {
        Ok(request) => callback.launcher.attempt(callback, key, &request).await,
        Err(error) => Attempt {
            result: Err(FailureKind::Spawn {
                program: "gacc array-task".into(),
                error: format!("cannot read {}: {error}", files.request.display()),
            }),
            stderr_tail: String::new(),
            stderr_of_worker: false,
        },
    };
    // A callback stopped by SIGTERM is most likely ending with its task (`scancel`, a node
    // going down, the time limit), and this process with it: whether its response is written
    // first is a race. None is written, so the call is settled by the task's state as Slurm
    // tells it (CANCELLED, TIMEOUT, NODE_FAIL …), the same way every time.
    if matches!(attempt.result, Err(FailureKind::Signal(libc::SIGTERM))) {
        eprintln!(
            "gacc array-task: {} {key}: stopped by SIGTERM; the task's state settles it",
            callback.name
        );
        return Ok(false);
    }
    let outcome = match &attempt.result {
        Ok(_) => "answered".to_owned(),
        Err(kind) => format!("failed: {kind}"),
    };
    eprintln!(
        "gacc array-task: {} {key}: {outcome} in {:.2?}",
        callback.name,
        started.elapsed()
    );
    write_durably(&files.response, &response_file(&attempt))
        .map_err(|error| format!("cannot write {}: {error}", files.response.display()))?;
    Ok(true)
}

/// The callback an array describes, with this machine's environment.
fn rebuild(description: &Value) -> Result<Callback, String> {
    let described: Described = serde_json::from_value(description.clone())
        .map_err(|error| format!("the array's callback is not one: {error}"))?;
    if described.program.argv.is_empty() {
        return Err("the array's callback has no command".into());
    }
    crate::secrets::register_all(&described.program.passed_secrets());
    let mut callback = Callback::new(
        described.name,
        described.role,
        Arc::new(ProcessLauncher::new(described.program)),
    );
    callback.limit = Arc::new(Semaphore::new(usize::MAX >> 4));
    Ok(callback)
}
