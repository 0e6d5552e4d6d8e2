//! What an experiment is made of, read and checked before anything runs (SPEC §1, §2):
//! the manifest, the dataset's records, the tokenizer and the budget arithmetic.

pub mod budget;
pub(crate) mod dataset;
pub(crate) mod dataset_stats;
pub(crate) mod evidence;
pub(crate) mod labels;
pub(crate) mod manifest;
pub(crate) mod models;
pub(crate) mod parquet;
pub(crate) mod records;
pub(crate) mod table;
pub mod tokenizer;

use std::path::Path;

use crate::error::Problem;

/// A data file's text as written, or a problem naming `file`, and for a byte that is not UTF-8
/// its line and column.
pub(crate) fn read_text(path: &Path, file: &str, what: &str) -> Result<String, Problem> {
    let bytes = std::fs::read(path).map_err(|error| Problem {
        place: file.to_owned(),
        message: format!("cannot read the {what}: {error}"),
    })?;
    match std::str::from_utf8(&bytes) {
        Ok(text) => Ok(text.to_owned()),
        Err(error) => {
            let good = &bytes[..error.valid_up_to()];
            let line = good.iter().filter(|b| **b == b'\n').count() + 1;
            let start = good.iter().rposition(|b| *b == b'\n').map_or(0, |at| at + 1);
            // Columns count characters, as an editor shows them.
            let column = String::from_utf8_lossy(&good[start..]).chars().count() + 1;
            Err(Problem {
                place: format!("{file}:{line}:{column}"),
                message: format!(
                    "byte 0x{:02x} is not UTF-8: save the {what} as UTF-8",
                    bytes[error.valid_up_to()]
                ),
            })
        }
    }
}

/// The lines of byte offsets met in order (a CSV reader's records), counted once: CRLF and LF
/// alike, whatever the reader itself counts.
pub(crate) struct Lines<'t> {
    text: &'t [u8],
    at: usize,
    line: usize,
}

impl<'t> Lines<'t> {
    pub(crate) fn new(text: &'t str) -> Lines<'t> {
        Lines {
            text: text.as_bytes(),
            at: 0,
            line: 1,
        }
    }

    /// The line (from 1) of the record that starts at byte `at` (the csv crate puts a CRLF
    /// record's start on the `\n` before it); offsets must not go back.
    pub(crate) fn of(&mut self, at: usize) -> usize {
        let mut end = at.min(self.text.len()).max(self.at);
        while self.text.get(end).is_some_and(|b| *b == b'\n' || *b == b'\r') {
            end += 1;
        }
        self.line += self.text[self.at..end].iter().filter(|b| **b == b'\n').count();
        self.at = end;
        self.line
    }
}
