//! The crate's errors: what stops a command, and the problems found in a manifest or dataset.
//! The binary turns an `Error` into a message and an exit status (SPEC §6).

use std::fmt;
use std::path::{Path, PathBuf};

/// Why a command could not do its work.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A bad manifest, dataset or command line: exit status 2.
    #[error("{0}")]
    Invalid(#[from] Invalid),
    /// The file system refused: names the path.
    #[error("{path}: {message}")]
    Io { path: PathBuf, message: String },
    /// A run named on the command line (`latest`, `-N`, a folder) that is not there.
    #[error("{given}: {message}")]
    NoSuchRun { given: PathBuf, message: String },
    /// A file gacc wrote under another schema than this gacc reads.
    #[error("{path}: expected schema {expected}, found {found}")]
    Schema {
        path: PathBuf,
        expected: String,
        found: String,
    },
    /// A thread of gacc's own (`what`: the writer of a file, the reader of a cache) stopped
    /// before it finished: a bug, named by what it was doing.
    #[error("{what} stopped unexpectedly")]
    Stopped { what: String },
    /// The async runtime or the HTTP client could not be made (the system refused a thread,
    /// a socket or its certificates).
    #[error("cannot start {what}: {message}")]
    Start { what: &'static str, message: String },
    /// Ctrl-C: in-flight calls were killed; finished calls are in the cache.
    #[error("interrupted: every finished call is cached; run `{resume}` again to resume")]
    Interrupted { resume: String },
}

/// Turns an I/O error about `path` into an `Error` that names it.
pub(crate) fn io(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |error| Error::Io {
        path: path.to_path_buf(),
        message: error.to_string(),
    }
}

/// The async runtime could not be made.
pub(crate) fn runtime_error(error: std::io::Error) -> Error {
    Error::Start {
        what: "the async runtime",
        message: error.to_string(),
    }
}

/// One thing wrong with a manifest or dataset, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// File, key, line and column, as precisely as known.
    pub place: String,
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.place, self.message)
    }
}

impl Problem {
    /// Line `line` of `file` that is not the JSON expected (`what`): the place names the line
    /// and column, the message is serde's without its own position, so that lines failing the
    /// same way share a message (and are counted together when many do).
    pub(crate) fn json_line(file: &str, line: usize, what: &str, error: &serde_json::Error) -> Problem {
        let text = error.to_string();
        let suffix = format!(" at line {} column {}", error.line(), error.column());
        Problem {
            place: format!("{file}:{line}:{}", error.column()),
            message: format!("{what}: {}", text.strip_suffix(&suffix).unwrap_or(&text)),
        }
    }
}

/// Every problem found in a manifest and its dataset.
#[derive(Debug, thiserror::Error)]
pub struct Invalid(pub Vec<Problem>);

/// How many problems with the same message are listed; the rest are counted after them (a
/// table whose every row lacks a column, or a file that is not a dataset at all, would
/// otherwise print a line per row).
const LISTED_PER_MESSAGE: usize = 5;

impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let count = self.0.len();
        writeln!(f, "{count} problem{} found:", if count == 1 { "" } else { "s" })?;
        // How often each message was found, and the messages in the order first found.
        let mut seen: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
        let mut order = Vec::new();
        for problem in &self.0 {
            let times = seen.entry(&problem.message).or_insert_with(|| {
                order.push(problem.message.as_str());
                0
            });
            *times += 1;
            if *times <= LISTED_PER_MESSAGE {
                writeln!(f, "  {problem}")?;
            }
        }
        for message in order {
            let times = seen.get(message).copied().unwrap_or_default();
            if times > LISTED_PER_MESSAGE {
                let more = times - LISTED_PER_MESSAGE;
                writeln!(f, "  … and {more} more like this: {message}")?;
            }
        }
        Ok(())
    }
}

impl Invalid {
    pub fn one(place: impl Into<String>, message: impl Into<String>) -> Self {
        Invalid(vec![Problem {
            place: place.into(),
            message: message.into(),
        }])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problem(place: &str, message: &str) -> Problem {
        Problem {
            place: place.into(),
            message: message.into(),
        }
    }

    #[test]
    fn a_message_found_many_times_is_listed_five_times_and_counted() {
        let mut problems: Vec<Problem> = (1..=12)
            .map(|row| {
                problem(
                    &format!("t.jsonl:{row}, column `reference`"),
                    "the row has no such column",
                )
            })
            .collect();
        problems.insert(3, problem("t.jsonl:4, column `goal`", "the cell is empty"));
        let shown = Invalid(problems).to_string();
        let lines: Vec<&str> = shown.lines().collect();
        assert_eq!(lines[0], "13 problems found:");
        assert_eq!(lines.len(), 1 + 5 + 1 + 1, "{shown}");
        assert_eq!(lines[4], "  t.jsonl:4, column `goal`: the cell is empty");
        assert!(lines[6].starts_with("  t.jsonl:5, column `reference`"), "{shown}");
        assert_eq!(lines[7], "  … and 7 more like this: the row has no such column");
    }
}
