//! A call made on another machine, as files in a folder both machines see: its request, the
//! task that makes it, and its response, each written whole; the call's name there; and what
//! the other machine needs to start its callback. An engine that runs calls elsewhere hands
//! them over this way (`exec/mod.rs`).

use std::path::{Path, PathBuf};

use serde_json::Value;

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

/// What a task writes for one call: `{"ok": answer}` or `{"error": failure}`, with the tail
/// of the callback's stderr and whether it was a persistent worker's.
#[derive(Serialize, Deserialize)]
struct ResponseFile {
    #[serde(flatten)]
    outcome: Answered,
    #[serde(default)]
    stderr_tail: String,
    #[serde(default)]
    stderr_of_worker: bool,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Answered {
    Ok(Value),
    Error(FailureKind),
}

/// The response file of an attempt.
pub(crate) fn response_file(attempt: &Attempt) -> Vec<u8> {
    let file = ResponseFile {
        outcome: match &attempt.result {
            Ok(response) => Answered::Ok(response.clone()),
            Err(kind) => Answered::Error(kind.clone()),
        },
        stderr_tail: attempt.stderr_tail.clone(),
        stderr_of_worker: attempt.stderr_of_worker,
    };
    serde_json::to_vec(&file).unwrap_or_default()
}

/// Reads a response file back into an attempt; a file that is not one is a failure to report.
pub(crate) fn read_response(bytes: &[u8]) -> Attempt {
    match serde_json::from_slice::<ResponseFile>(bytes) {
        Ok(file) => Attempt {
            result: match file.outcome {
                Answered::Ok(response) => Ok(response),
                Answered::Error(kind) => Err(kind),
            },
            stderr_tail: file.stderr_tail,
            stderr_of_worker: file.stderr_of_worker,
        },
        Err(error) => Attempt {
            result: Err(FailureKind::InvalidJson(format!(
                "the array task's response file is not one: {error}"
            ))),
            stderr_tail: String::new(),
            stderr_of_worker: false,
        },
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
