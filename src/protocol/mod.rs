//! The SPEC's nouns and constants (§1, §3): what every stage speaks of. Imports only leaves.

mod cell;
pub(crate) mod messages;
mod role;
mod values;

pub(crate) use cell::{CellId, MemoryId};
pub(crate) use role::{Role, Stage};
pub(crate) use values::{BudgetRule, Condition, Mode, Timeout};
pub use values::{Ratio, TruncationMode};

/// The protocol every request names, and `GACC_PROTOCOL` in every callback's environment.
pub(crate) const PROTOCOL: &str = "gacc/1";
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
/// `GACC_MODE` (`oneshot` or `persistent`, so one script can serve both);
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
    command
}

/// The shortest piece of a secret at either end of a text that is still redacted.
const SECRET_PIECE: usize = 4;

/// `text` with every secret's value replaced by `[redacted:NAME]`; a text that starts with the
/// end of a secret, or ends with its start (a tail cut through it), has that piece redacted too.
pub(crate) fn redact(text: &str, secrets: &[(String, String)]) -> String {
    let mut secrets: Vec<&(String, String)> = secrets.iter().filter(|(_, v)| !v.is_empty()).collect();
    // Longest first, so a secret containing another is replaced whole.
    secrets.sort_by_key(|(_, value)| std::cmp::Reverse(value.len()));
    let mut text = text.to_owned();
    for (name, value) in &secrets {
        if text.contains(value.as_str()) {
            text = text.replace(value.as_str(), &format!("[redacted:{name}]"));
        }
    }
    for (name, value) in &secrets {
        let marker = format!("[redacted:{name}]");
        let cuts = || (1..value.len()).filter(|cut| value.is_char_boundary(*cut));
        if let Some(cut) =
            cuts().find(|cut| value.len() - cut >= SECRET_PIECE && text.starts_with(&value[*cut..]))
        {
            text.replace_range(..value.len() - cut, &marker);
        }
        if let Some(cut) = cuts()
            .rev()
            .find(|cut| *cut >= SECRET_PIECE && text.ends_with(&value[..*cut]))
        {
            let start = text.len() - cut;
            text.replace_range(start.., &marker);
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_redacted_whole_and_in_pieces_at_either_end() {
        let secrets = vec![
            ("KEY".to_owned(), "sk-0123456789".to_owned()),
            ("LONGER".to_owned(), "sk-0123456789-extra".to_owned()),
            ("EMPTY".to_owned(), String::new()),
        ];
        assert_eq!(
            redact("using sk-0123456789 and sk-0123456789-extra", &secrets),
            "using [redacted:KEY] and [redacted:LONGER]"
        );
        // A tail cut through a secret at its start, or a stream that ended inside one.
        assert_eq!(
            redact("456789-extra failed", &secrets),
            "[redacted:LONGER] failed"
        );
        assert_eq!(redact("23456789 failed", &secrets), "[redacted:KEY] failed");
        // Ambiguous pieces are named after the longest secret they may belong to.
        assert_eq!(redact("key was sk-01234", &secrets), "key was [redacted:LONGER]");
        // Pieces shorter than SECRET_PIECE are left alone.
        assert_eq!(redact("789 apples", &secrets), "789 apples");
        assert_eq!(redact("nothing to hide", &secrets), "nothing to hide");
    }
}
