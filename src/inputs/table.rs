//! A dataset as a flat table, one row per question (SQuAD-style tables, Hugging Face exports):
//! CSV with a header row, JSON Lines whose rows have no `goals`, or Parquet (whose rows
//! `inputs/parquet.rs` reads). `[dataset] columns` names the table's columns (by default the
//! names below). Rows are grouped into sources and goals in the order they first appear; every
//! problem names the file, line (a Parquet file's row) and column, all at once.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::Problem;

mod write;
use crate::inputs::records::{Evidence, Goal, Question, SourceRecord};
pub(crate) use write::write;

/// The columns of a question table, by their role.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct Columns {
    pub source_id: String,
    pub text: String,
    pub goal_id: String,
    pub goal: String,
    pub question_id: String,
    pub question: String,
    pub reference: String,
    /// Optional: the question's evidence, one span or a JSON array of spans (SPEC §11).
    pub evidence: String,
    /// Optional: the question's tags, a JSON array or a comma-separated list.
    pub tags: String,
}

impl Default for Columns {
    fn default() -> Self {
        Columns {
            source_id: "source_id".into(),
            text: "text".into(),
            goal_id: "goal_id".into(),
            goal: "goal".into(),
            question_id: "question_id".into(),
            question: "question".into(),
            reference: "reference".into(),
            evidence: "evidence".into(),
            tags: "tags".into(),
        }
    }
}

impl Columns {
    /// (role, column) in the order of a table's columns.
    pub(super) fn named(&self) -> [(&'static str, &str); 7] {
        [
            ("source_id", &self.source_id),
            ("text", &self.text),
            ("goal_id", &self.goal_id),
            ("goal", &self.goal),
            ("question_id", &self.question_id),
            ("question", &self.question),
            ("reference", &self.reference),
        ]
    }

    /// The columns a table may leave out, by their role.
    pub(super) fn optional(&self) -> [(&'static str, &str); 2] {
        [("evidence", &self.evidence), ("tags", &self.tags)]
    }
}

/// An optional cell as a list: a JSON array of strings, or else `split` applied to the text.
fn listed(cell: &str, split: fn(&str) -> Vec<String>) -> Vec<String> {
    match serde_json::from_str::<Vec<String>>(cell.trim()) {
        Ok(list) if cell.trim_start().starts_with('[') => list,
        _ => split(cell),
    }
}

/// Whether a dataset file is Parquet (by its extension), which only a question table can be.
pub(crate) fn is_parquet(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "parquet")
}

/// Whether a dataset file is a question table: CSV, Parquet, or JSON Lines whose first row
/// holds the question column and no `goals`.
pub(crate) fn is_table(path: &Path, text: &str, columns: &Columns) -> bool {
    if path.extension().is_some_and(|e| e == "csv") || is_parquet(path) {
        return true;
    }
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let first = text.lines().find(|line| !line.trim().is_empty());
    let row = first.and_then(|line| serde_json::from_str::<Value>(line).ok());
    row.is_some_and(|row| row.get("goals").is_none() && row.get(&columns.question).is_some())
}

/// One row: its number (a line, or a Parquet row), and its cells by column.
pub(crate) type Row = (usize, HashMap<String, String>);

/// How messages number a table's rows: by line (CSV, JSON Lines) or by row (Parquet).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) enum Numbering {
    #[default]
    Line,
    Row,
}

impl Numbering {
    /// Row `number` of `file`: `data.csv:4`, `data.parquet, row 4`.
    pub(super) fn place(self, file: &str, number: usize) -> String {
        match self {
            Numbering::Line => format!("{file}:{number}"),
            Numbering::Row => format!("{file}, row {number}"),
        }
    }

    fn word(self) -> &'static str {
        match self {
            Numbering::Line => "line",
            Numbering::Row => "row",
        }
    }
}

/// The sources of a CSV or JSON Lines question table (`file` as messages name it); problems go
/// to `problems`.
pub(crate) fn read(
    path: &Path,
    file: &str,
    text: &str,
    columns: &Columns,
    problems: &mut Vec<Problem>,
) -> Vec<(SourceRecord, String)> {
    let csv = path.extension().is_some_and(|e| e == "csv");
    let required: Vec<&str> = columns.named().iter().map(|(_, column)| *column).collect();
    let mut read = Vec::new();
    for row in rows(text, file, csv, &required) {
        match row {
            Ok(row) => read.push(row),
            Err(problem) => problems.push(problem),
        }
    }
    grouped(read, file, Numbering::Line, columns, problems)
}

/// Rows grouped into sources and goals; each empty or missing cell and each conflict a problem.
pub(crate) fn grouped(
    rows: Vec<Row>,
    file: &str,
    numbering: Numbering,
    columns: &Columns,
    problems: &mut Vec<Problem>,
) -> Vec<(SourceRecord, String)> {
    let mut grouped = Grouped {
        numbering,
        ..Grouped::default()
    };
    let at = |line: usize, column: &str, message: String| Problem {
        place: format!("{}, column `{column}`", numbering.place(file, line)),
        message,
    };
    for (line, cells) in rows {
        let mut values = BTreeMap::new();
        for (role, column) in columns.named() {
            let message = match cells.get(column) {
                Some(value) if !value.trim().is_empty() => {
                    values.insert(role, value.clone());
                    continue;
                }
                Some(_) => "the cell is empty",
                None => "the row has no such column",
            };
            problems.push(at(line, column, message.into()));
        }
        for (role, column) in columns.optional() {
            if let Some(value) = cells.get(column).filter(|v| !v.trim().is_empty()) {
                values.insert(role, value.clone());
            }
        }
        if columns.named().iter().all(|(role, _)| values.contains_key(role))
            && let Err((column, message)) = grouped.add(line, &values, file)
        {
            let column = columns
                .named()
                .into_iter()
                .find(|(role, _)| *role == column)
                .map_or(column, |(_, c)| c);
            problems.push(at(line, column, message));
        }
    }
    grouped.sources
}

/// Rows grouped into sources and goals, in the order they first appear, with where each id was
/// first seen.
#[derive(Default)]
struct Grouped {
    numbering: Numbering,
    sources: Vec<(SourceRecord, String)>,
    /// source id → (index, line)
    source_at: HashMap<String, (usize, usize)>,
    /// goal id → (its source's id, line, index among the source's goals)
    goal_at: HashMap<String, (String, usize, usize)>,
    /// question id → line
    question_at: HashMap<String, usize>,
}

impl Grouped {
    /// The index of the row's source: a new one, or the one its id named before (with the
    /// same text, else an error naming the row where it first appeared).
    fn source_of(
        &mut self,
        line: usize,
        values: &BTreeMap<&str, String>,
        file: &str,
    ) -> Result<usize, (&'static str, String)> {
        let source_id = &values["source_id"];
        match self.source_at.get(source_id) {
            Some(&(index, first))
                if self.sources[index].0.text.as_deref() != Some(values["text"].as_str()) =>
            {
                Err((
                    "text",
                    format!(
                        "source `{source_id}` has another text on {} {first}",
                        self.numbering.word()
                    ),
                ))
            }
            Some(&(index, _)) => Ok(index),
            None => {
                self.source_at
                    .insert(source_id.clone(), (self.sources.len(), line));
                let record = SourceRecord {
                    id: source_id.clone(),
                    text: Some(values["text"].clone()),
                    path: None,
                    goals: Vec::new(),
                    tags: Vec::new(),
                };
                self.sources.push((
                    record,
                    format!("{} (source `{source_id}`)", self.numbering.place(file, line)),
                ));
                Ok(self.sources.len() - 1)
            }
        }
    }

    /// One row's values by role; on a conflict, the role of the cell at fault and why.
    fn add(
        &mut self,
        line: usize,
        values: &BTreeMap<&str, String>,
        file: &str,
    ) -> Result<(), (&'static str, String)> {
        let (source_id, goal_id, question_id) =
            (&values["source_id"], &values["goal_id"], &values["question_id"]);
        let source = self.source_of(line, values, file)?;
        let goals = &mut self.sources[source].0.goals;
        let goal = match self.goal_at.get(goal_id) {
            Some((owner, first, _)) if owner != source_id => {
                return Err((
                    "goal_id",
                    format!(
                        "goal `{goal_id}` belongs to source `{owner}` ({} {first})",
                        self.numbering.word()
                    ),
                ));
            }
            Some((_, first, index)) if goals[*index].text != values["goal"] => {
                return Err((
                    "goal",
                    format!(
                        "goal `{goal_id}` has another text on {} {first}",
                        self.numbering.word()
                    ),
                ));
            }
            Some((_, _, index)) => *index,
            None => {
                self.goal_at
                    .insert(goal_id.clone(), (source_id.clone(), line, goals.len()));
                goals.push(Goal {
                    id: goal_id.clone(),
                    text: values["goal"].clone(),
                    questions: Vec::new(),
                    tags: Vec::new(),
                });
                goals.len() - 1
            }
        };
        if let Some(first) = self.question_at.get(question_id) {
            return Err((
                "question_id",
                format!(
                    "question id `{question_id}` is used on {} {first} already",
                    self.numbering.word()
                ),
            ));
        }
        self.question_at.insert(question_id.clone(), line);
        let evidence = values.get("evidence").map(|cell| {
            let mut spans = listed(cell, |cell| vec![cell.to_owned()]);
            match spans.len() {
                1 => Evidence::One(spans.remove(0)),
                _ => Evidence::Many(spans),
            }
        });
        let tags = values.get("tags").map_or_else(Vec::new, |cell| {
            listed(cell, |cell| {
                cell.split(',')
                    .map(|t| t.trim().to_owned())
                    .filter(|t| !t.is_empty())
                    .collect()
            })
        });
        goals[goal].questions.push(Question {
            id: question_id.clone(),
            question: values["question"].clone(),
            reference: values["reference"].clone(),
            evidence,
            tags,
        });
        Ok(())
    }
}

/// A CSV reader over `text` and its header's names (a byte-order mark and spaces around a name
/// dropped), as spreadsheets write them.
pub(crate) fn csv_with_header(text: &str) -> (csv::Reader<&[u8]>, Result<Vec<String>, csv::Error>) {
    let mut reader = csv::ReaderBuilder::new()
        .flexible(true)
        .from_reader(text.as_bytes());
    let header = reader.headers().map(|header| {
        header
            .iter()
            .map(|h| h.trim_start_matches('\u{feff}').trim().to_owned())
            .collect()
    });
    (reader, header)
}

/// A row of a CSV or JSON Lines table as read: its line and cells by column, or what is wrong
/// with it.
pub(crate) type ReadRow = Result<Row, Problem>;

/// The rows of a CSV table (`csv`) or of JSON Lines, read as written or refused: a header that
/// lacks a `required` column or names one twice, a row with more or fewer cells than the
/// header, a line that is not a JSON object, each a problem naming `file`, line and column.
pub(crate) fn rows(text: &str, file: &str, csv: bool, required: &[&str]) -> Vec<ReadRow> {
    if csv {
        csv_rows(text, file, required)
    } else {
        json_rows(text, file)
    }
}

fn csv_rows(text: &str, file: &str, required: &[&str]) -> Vec<ReadRow> {
    let problem = |line: usize, column: Option<&str>, message: String| Problem {
        place: match column {
            Some(column) => format!("{file}:{line}, column `{column}`"),
            None => format!("{file}:{line}"),
        },
        message,
    };
    let (mut reader, header) = csv_with_header(text);
    let header = match header {
        Ok(header) => header,
        Err(error) => return vec![Err(problem(1, None, format!("not CSV: {error}")))],
    };
    let mut refused = Vec::new();
    for (at, name) in header.iter().enumerate() {
        if let Some(first) = header[..at].iter().position(|h| h == name) {
            let message = format!(
                "the header names `{name}` twice (columns {} and {}): which one is meant?",
                first + 1,
                at + 1
            );
            refused.push(Err(problem(1, Some(name), message)));
        }
    }
    // A column the header lacks is one problem, not one per row.
    for column in required.iter().filter(|c| !header.iter().any(|h| h == *c)) {
        let message = format!("the header has no column `{column}`");
        refused.push(Err(problem(1, Some(column), message)));
    }
    if !refused.is_empty() {
        return refused;
    }
    let mut lines = super::Lines::new(text);
    reader
        .records()
        .map(|record| {
            let mut at = |position: Option<&csv::Position>| lines.of(position.map_or(0, |p| p.byte() as usize));
            let record = match record {
                Ok(record) => record,
                Err(error) => return Err(problem(at(error.position()), None, format!("not CSV: {error}"))),
            };
            let line = at(record.position());
            match record.len().cmp(&header.len()) {
                std::cmp::Ordering::Greater => {
                    let column = format!("{}", header.len() + 1);
                    return Err(Problem {
                        place: format!("{file}:{line}, column {column}"),
                        message: format!(
                            "the row has {} cells, the header {}: quote a cell that holds a comma (\"1,000\")",
                            record.len(),
                            header.len()
                        ),
                    });
                }
                std::cmp::Ordering::Less => {
                    let missing = &header[record.len()];
                    let message = format!("the row has {} cells, the header {}", record.len(), header.len());
                    return Err(problem(line, Some(missing), message));
                }
                std::cmp::Ordering::Equal => {}
            }
            let cells = header.iter().cloned().zip(record.iter().map(str::to_owned)).collect();
            Ok((line, cells))
        })
        .collect()
}

fn json_rows(text: &str, file: &str) -> Vec<ReadRow> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut rows = Vec::new();
    for (number, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let line_number = number + 1;
        let row = match serde_json::from_str::<Value>(line) {
            Ok(Value::Object(row)) => row,
            Ok(_) => {
                rows.push(Err(Problem {
                    place: format!("{file}:{line_number}"),
                    message: "expected a JSON object, one row per line".into(),
                }));
                continue;
            }
            Err(error) => {
                rows.push(Err(Problem::json_line(file, line_number, "not JSON", &error)));
                continue;
            }
        };
        let cells = row
            .into_iter()
            .filter_map(|(name, value)| {
                let text = match value {
                    Value::String(text) => text,
                    Value::Null => return None,
                    other => other.to_string(),
                };
                Some((name, text))
            })
            .collect();
        rows.push(Ok((line_number, cells)));
    }
    rows
}
