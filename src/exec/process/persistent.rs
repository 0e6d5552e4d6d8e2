//! A long-lived callback process (SPEC §3 `persistent`): started once in its own process group,
//! fed a request line and read a reply line at a time, each line read within a size; the group
//! is killed when the process is dropped.

use std::sync::Arc;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout};

use crate::exec::callback::FailureKind;
use crate::exec::program::Program;
use crate::exec::sandbox::Scratch;
use crate::parallel::Locked;
use crate::protocol::Role;

use super::{Stderr, command, kill_group, live_groups, register, spawn_failure};

/// A long-lived persistent callback process: one request per line in, one response per line out.
#[derive(Debug)]
pub(crate) struct PersistentProcess {
    pub(super) stdin: ChildStdin,
    pub(super) stdout: BufReader<ChildStdout>,
    pub(super) stderr: Arc<std::sync::Mutex<Stderr>>,
    /// What `stderr` had written when this worker's last call ended: the next call's stderr
    /// is what follows (for the first, everything since the worker started).
    pub(super) mark: u64,
    /// Last: its process group is killed when the worker goes.
    pub(super) group: Group,
}

/// A worker's process and its group, killed together when dropped; then its scratch folder
/// is removed.
#[derive(Debug)]
pub(super) struct Group {
    pub(super) child: Child,
    pub(super) group: Option<i32>,
    /// Removed after the worker's process group is killed (fields drop after `drop`).
    pub(super) _scratch: Option<Scratch>,
}

impl PersistentProcess {
    pub(super) fn start(program: &Program, role: Role) -> Result<PersistentProcess, FailureKind> {
        let (mut command, scratch) = command(program, role)?;
        let mut child = command.spawn().map_err(|error| spawn_failure(program, error))?;
        let group = child.id().map(|pid| pid as i32);
        if !register(group) {
            return Err(FailureKind::Cancelled);
        }
        let (Some(stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            kill_group(group);
            return Err(FailureKind::Spawn {
                program: program.program().to_owned(),
                error: "no pipes to the child".into(),
            });
        };
        let tail = Arc::new(std::sync::Mutex::new(Stderr::default()));
        let sink = tail.clone();
        tokio::spawn(async move {
            let mut stderr = stderr;
            let mut buffer = vec![0u8; 8 << 10];
            while let Ok(n @ 1..) = stderr.read(&mut buffer).await {
                sink.locked().push(&buffer[..n]);
            }
        });
        Ok(PersistentProcess {
            stdin,
            stdout: BufReader::new(stdout),
            stderr: tail,
            mark: 0,
            group: Group {
                child,
                group,
                _scratch: scratch,
            },
        })
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        kill_group(self.group);
        let _ = self.child.start_kill();
        live_groups().retain(|g| Some(*g) != self.group);
    }
}

/// Reads one line (without its newline), failing on EOF or when it grows past `limit`.
pub(super) async fn read_line_limited(
    reader: &mut BufReader<ChildStdout>,
    limit: usize,
) -> Result<Vec<u8>, FailureKind> {
    let mut line = Vec::new();
    loop {
        let buffer = reader
            .fill_buf()
            .await
            .map_err(|error| FailureKind::WorkerDied(error.to_string()))?;
        if buffer.is_empty() {
            return Err(FailureKind::WorkerDied("its stdout closed".into()));
        }
        let (chunk, done) = match buffer.iter().position(|b| *b == b'\n') {
            Some(end) => (&buffer[..end], Some(end + 1)),
            None => (buffer, None),
        };
        if line.len() + chunk.len() > limit {
            return Err(FailureKind::TooLarge(limit));
        }
        line.extend_from_slice(chunk);
        let consumed = done.unwrap_or(buffer.len());
        reader.consume(consumed);
        if done.is_some() {
            return Ok(line);
        }
    }
}
