//! A call made on another machine, as files in a folder both machines see: its request, the
//! task that makes it, and its response, each written whole; the call's name there; and what
//! the other machine needs to start its callback. An engine that runs calls elsewhere hands
//! them over this way (`exec/mod.rs`).

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::exec::callback::{Attempt, Callback, FailureKind};
use serde::{Deserialize, Serialize};

use crate::exec::program::Program;
use crate::protocol::{Role, STDERR_TAIL_BYTES};

/// The files of one call in the work folder.
pub(crate) struct CallFiles {
    pub(crate) request: PathBuf,
    pub(crate) response: PathBuf,
    pub(crate) task: PathBuf,
}

pub(crate) fn call_files(calls: &Path, key: &str) -> CallFiles {
    let folder = calls.join(&key[..2]);
    CallFiles {
        request: folder.join(format!("{key}.request.json")),
        response: folder.join(format!("{key}.response.json")),
        task: folder.join(format!("{key}.task")),
    }
}

/// The last `STDERR_TAIL_BYTES` of a file, or nothing.
pub(crate) fn tail_of(path: &Path) -> String {
    let bytes = std::fs::read(path).unwrap_or_default();
    let start = bytes.len().saturating_sub(STDERR_TAIL_BYTES);
    String::from_utf8_lossy(&bytes[start..]).into_owned()
}

/// What a task writes for one call: the answer, or why there is none.
pub(crate) fn response_file(attempt: &Attempt) -> Value {
    match &attempt.result {
        Ok(response) => {
            json!({"ok": response, "stderr_tail": attempt.stderr_tail, "stderr_of_worker": attempt.stderr_of_worker})
        }
        Err(kind) => {
            json!({"error": kind, "stderr_tail": attempt.stderr_tail, "stderr_of_worker": attempt.stderr_of_worker})
        }
    }
}

/// Reads a response file back into an attempt; a file that is not one is a failure to report.
pub(crate) fn read_response(bytes: &[u8]) -> Attempt {
    let parsed: Option<Value> = serde_json::from_slice(bytes).ok();
    let stderr_tail = parsed
        .as_ref()
        .and_then(|v| v["stderr_tail"].as_str())
        .unwrap_or_default()
        .to_owned();
    let stderr_of_worker = parsed.as_ref().is_some_and(|v| v["stderr_of_worker"] == true);
    let result = match parsed {
        Some(mut value) if value.get("ok").is_some() => Ok(value["ok"].take()),
        Some(mut value) if value.get("error").is_some() => Err(serde_json::from_value(value["error"].take())
            .unwrap_or_else(|error| {
                FailureKind::InvalidJson(format!("an unreadable array-task failure: {error}"))
            })),
        _ => Err(FailureKind::InvalidJson(
            "the array task's response file is not one".into(),
        )),
    };
    Attempt {
        result,
        stderr_tail,
        stderr_of_worker,
    }
}

/// What a task on another machine needs to make a callback's calls on another machine: its name, role
/// and program. Values of passed-through variables are not written: the task inherits them
/// from the environment gacc submits from.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Described {
    pub name: String,
    pub role: Role,
    #[serde(flatten)]
    pub program: Program,
}

pub(crate) fn describe(callback: &Callback, program: &Program) -> Value {
    serde_json::to_value(Described {
        name: callback.name.clone(),
        role: callback.role,
        program: program.clone(),
    })
    .unwrap_or_default()
}

/// A call's name in the work folder: its callback's name and identity, and its request.
pub(crate) fn call_key(callback: &Callback, request: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    let mut hasher = Sha256::new();
    hasher.update(callback.name.as_bytes());
    hasher.update(b"\n");
    hasher.update(callback.identity.to_string().as_bytes());
    hasher.update(b"\n");
    hasher.update(request);
    crate::hash::hex(&hasher.finalize())
}
