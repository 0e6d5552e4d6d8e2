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

/// Every problem found in a manifest and its dataset.
#[derive(Debug, thiserror::Error)]
pub struct Invalid(pub Vec<Problem>);

impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let count = self.0.len();
        writeln!(f, "{count} problem{} found:", if count == 1 { "" } else { "s" })?;
        for problem in &self.0 {
            writeln!(f, "  {problem}")?;
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
