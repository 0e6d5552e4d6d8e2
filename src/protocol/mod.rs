//! The SPEC's nouns and constants (§1, §3): what every stage speaks of. Imports only leaves.

mod callback_set;
mod cell;
mod ladder;
pub(crate) mod messages;
pub(crate) mod probes;
mod role;
mod values;
pub(crate) mod writer;

pub(crate) use callback_set::CallbackSet;
pub(crate) use cell::{CellId, MemoryId};
pub(crate) use role::{Role, Stage};
pub(crate) use values::{BudgetRule, Condition, Mode, Timeout};
pub use values::{Ratio, TruncationMode};

/// The protocol every request names, and `GACC_PROTOCOL` in every callback's environment.
pub(crate) const PROTOCOL: &str = "gacc/1";
/// A message's `protocol` where a hand-written one leaves it out.
fn default_protocol() -> std::borrow::Cow<'static, str> {
    std::borrow::Cow::Borrowed(PROTOCOL)
}

/// A compressor request's `role` where a hand-written one leaves it out.
fn default_compressor() -> Role {
    Role::Compressor
}

/// The largest response a callback may write to stdout.
pub(crate) const MAX_RESPONSE_BYTES: usize = 64 << 20;
/// How much of a callback's stderr is kept for messages and the trace.
pub(crate) const STDERR_TAIL_BYTES: usize = 8 << 10;
/// The exit status a callback uses to ask for a retry (BSD `EX_TEMPFAIL`).
pub(crate) const EXIT_TEMPFAIL: i32 = 75;
/// The variables a callback inherits, besides those its manifest lists (SPEC §3).
pub(crate) const KEPT_VARIABLES: &[&str] = &["PATH", "HOME", "LANG", "LC_ALL", "TMPDIR"];

/// The process of a callback of `role` (SPEC §3): `line` run in `cwd`, its environment cleared
/// but for `KEPT_VARIABLES`, `passed` (the manifest's `env`), `GACC_PROTOCOL`, `GACC_ROLE` and
/// `GACC_MODE` (`oneshot` or `persistent`, so one script can serve both), `GACC_EXE` (this
/// executable);
/// its three pipes to gacc; its own process group, so a timeout can end all it started.
/// Callback processes and external tokenizers both start this way.
pub(crate) fn callback_command<'a>(
    line: &[std::ffi::OsString],
    cwd: &std::path::Path,
    role: &str,
    mode: Mode,
    passed: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> std::process::Command {
    use std::os::unix::process::CommandExt;
    use std::process::Stdio;
    let mut command = std::process::Command::new(&line[0]);
    command
        .args(&line[1..])
        .current_dir(cwd)
        .env_clear()
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    for name in KEPT_VARIABLES {
        if let Some(value) = std::env::var_os(name) {
            command.env(name, value);
        }
    }
    command.envs(passed);
    command
        .env("GACC_PROTOCOL", PROTOCOL)
        .env("GACC_ROLE", role)
        .env("GACC_MODE", mode.as_str());
    // gacc itself (its sandbox grants it), so a callback can count and cut tokens as gacc does.
    if let Ok(exe) = std::env::current_exe() {
        command.env("GACC_EXE", exe);
    }
    command
}
