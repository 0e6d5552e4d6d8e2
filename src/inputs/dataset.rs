//! The dataset (SPEC §2): sources, their goals, and each goal's held-out questions.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::Problem;
use crate::inputs::evidence;
use crate::inputs::manifest::Loaded;
use crate::inputs::records::{Goal, Question};
use crate::inputs::records::{Source, SourceRecord};
use crate::inputs::table::{self, Columns};

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct Dataset {
    pub sources: Vec<Source>,
}

impl Dataset {
    pub(crate) fn goals(&self) -> impl Iterator<Item = (&Source, &Goal)> {
        self.sources
            .iter()
            .flat_map(|s| s.goals.iter().map(move |g| (s, g)))
    }

    pub(crate) fn question_count(&self) -> usize {
        self.goals().map(|(_, g)| g.questions.len()).sum()
    }
}

/// A record together with where it was written, for messages.
struct Located {
    record: SourceRecord,
    place: String,
    /// The folder a record's `path` is relative to.
    folder: PathBuf,
}

/// Loads the manifest's dataset and checks it, reporting every problem at once.
pub(crate) fn load(loaded: &Loaded) -> Result<Dataset, Vec<Problem>> {
    let spec = &loaded.manifest.dataset;
    let mut problems = Vec::new();
    let records = match (&spec.path, &spec.sources) {
        (Some(path), _) => {
            let columns = spec.columns.clone().unwrap_or_default();
            read_files(&loaded.resolve(path), &columns, &mut problems)
        }
        (None, Some(sources)) => sources
            .iter()
            .enumerate()
            .map(|(i, record)| Located {
                record: record.clone(),
                place: format!("{}: key `dataset.sources[{i}]`", loaded.path.display()),
                folder: loaded.folder.clone(),
            })
            .collect(),
        (None, None) => Vec::new(),
    };
    let dataset = check(records, &mut problems);
    if problems.is_empty() {
        Ok(dataset)
    } else {
        Err(problems)
    }
}

/// Loads a dataset from a file (nested JSON Lines, or a question table in its default
/// columns), a folder of them, or a glob pattern, with no manifest (for `gacc dataset`).
pub(crate) fn load_path(path: &Path) -> Result<Dataset, Vec<Problem>> {
    let mut problems = Vec::new();
    let records = read_files(path, &Columns::default(), &mut problems);
    let dataset = check(records, &mut problems);
    if problems.is_empty() {
        Ok(dataset)
    } else {
        Err(problems)
    }
}

/// Whether the dataset at `path` is a question table (its first file is one, in the default
/// columns), or nested sources.
pub(crate) fn is_table_path(path: &Path) -> bool {
    let first = dataset_files(path)
        .ok()
        .and_then(|files| files.into_iter().next());
    first.is_some_and(|file| table::is_table(&file, &first_line(&file), &Columns::default()))
}

/// The first line of `file` with anything on it (all `is_table` looks at), or "" when it has
/// none or is not text (a Parquet file, which `is_table` knows by its name).
fn first_line(file: &Path) -> String {
    use std::io::BufRead;
    let Ok(opened) = std::fs::File::open(file) else {
        return String::new();
    };
    std::io::BufReader::new(opened)
        .lines()
        .map_while(Result::ok)
        .find(|line| !line.trim().is_empty())
        .unwrap_or_default()
}

/// A dataset as nested JSON Lines: a source per line, its text inline.
pub(crate) fn nested_jsonl(dataset: &Dataset) -> Vec<u8> {
    let mut out = Vec::new();
    for source in &dataset.sources {
        let record = SourceRecord {
            id: source.id.clone(),
            text: Some(source.text.clone()),
            path: None,
            goals: source.goals.clone(),
            tags: source.tags.clone(),
        };
        out.extend(serde_json::to_string(&record).unwrap_or_default().into_bytes());
        out.push(b'\n');
    }
    out
}

/// The files a dataset path names: the file itself, every `*.jsonl`, `*.csv` and `*.parquet` in a folder,
/// or every match of a glob pattern (`data/*.jsonl`, `data/**/*.csv`), in sorted order.
fn dataset_files(path: &Path) -> Result<Vec<PathBuf>, String> {
    let text = path.to_string_lossy();
    let pattern = if path.is_dir() {
        format!("{}/*", glob::Pattern::escape(&text))
    } else if text.contains(['*', '?', '[']) {
        text.into_owned()
    } else {
        return Ok(vec![path.to_path_buf()]);
    };
    let matches =
        glob::glob(&pattern).map_err(|error| format!("`{pattern}` is not a valid pattern: {error}"))?;
    let dataset = |p: &PathBuf| {
        !path.is_dir()
            || p.extension()
                .is_some_and(|e| e == "jsonl" || e == "csv" || e == "parquet")
    };
    let mut files: Vec<PathBuf> = (matches.filter_map(Result::ok))
        .filter(|p| p.is_file() && dataset(p))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(format!(
            "no dataset files match `{}`",
            crate::inputs::manifest::shown(Path::new(&pattern))
        ));
    }
    Ok(files)
}

fn read_files(path: &Path, columns: &Columns, problems: &mut Vec<Problem>) -> Vec<Located> {
    match dataset_files(path) {
        Ok(files) => files
            .iter()
            .flat_map(|file| read_file(file, columns, problems))
            .collect(),
        Err(message) => {
            problems.push(Problem {
                place: crate::inputs::manifest::shown(path),
                message,
            });
            Vec::new()
        }
    }
}

/// A question table's sources, located in `file`; a table without a question is a problem.
fn table_records(
    sources: Vec<(SourceRecord, String)>,
    file: String,
    folder: PathBuf,
    problems: &mut Vec<Problem>,
) -> Vec<Located> {
    if sources.is_empty() && problems.is_empty() {
        problems.push(Problem {
            place: file,
            message: "the dataset has no questions".into(),
        });
    }
    (sources.into_iter())
        .map(|(record, place)| Located {
            record,
            place,
            folder: folder.clone(),
        })
        .collect()
}

/// One dataset file: a question table, or nested JSON Lines (a source per line).
fn read_file(path: &Path, columns: &Columns, problems: &mut Vec<Problem>) -> Vec<Located> {
    let file = crate::inputs::manifest::shown(path);
    let folder = path.parent().unwrap_or(Path::new(".")).to_path_buf();
    if table::is_parquet(path) {
        let rows = super::parquet::rows(path, &file, columns, problems);
        let sources = table::grouped(rows, &file, table::Numbering::Row, columns, problems);
        return table_records(sources, file, folder, problems);
    }
    let text = match super::read_text(path, &file, "dataset") {
        Ok(text) => text,
        Err(problem) => {
            problems.push(problem);
            return Vec::new();
        }
    };
    if table::is_table(path, &text, columns) {
        let sources = table::read(path, &file, &text, columns, problems);
        return table_records(sources, file, folder, problems);
    }
    let mut records = Vec::new();
    // A byte-order mark, as some editors write one, is not part of the first record.
    let text = text.strip_prefix('\u{feff}').unwrap_or(&text);
    for (index, line) in text.lines().enumerate() {
        let number = index + 1;
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<SourceRecord>(line) {
            Ok(record) => records.push(Located {
                place: format!("{file}:{number} (source `{}`)", record.id),
                record,
                folder: folder.clone(),
            }),
            Err(error) => {
                // The field it failed in, where serde's message does not say (a mistyped value).
                let field = field_of_error(line);
                let what = match &field {
                    Some(field) if !error.to_string().contains(&format!("`{field}`")) => {
                        format!("not a source record: field `{field}`")
                    }
                    _ => "not a source record".to_owned(),
                };
                let mut problem = Problem::json_line(&file, number, &what, &error);
                if let Some(record) = where_in_record(line) {
                    problem.message = format!("{} ({record})", problem.message);
                }
                problems.push(problem);
            }
        }
    }
    if records.is_empty() && problems.is_empty() {
        problems.push(Problem {
            place: file,
            message: "the dataset has no sources".into(),
        });
    }
    records
}

/// The name of the field a record that is not a source record fails in (`evidence`), where
/// that is a field's value rather than the record's shape.
fn field_of_error(line: &str) -> Option<String> {
    let mut reader = serde_json::Deserializer::from_str(line);
    let error = serde_path_to_error::deserialize::<_, SourceRecord>(&mut reader).err()?;
    // The innermost field named (a list's index, as in `evidence[1]`, is inside it).
    error.path().iter().rev().find_map(|segment| match segment {
        serde_path_to_error::Segment::Map { key } => Some(key.clone()),
        _ => None,
    })
}

/// Which part of a JSON Lines record that is JSON but not a source record is wrong: its source
/// id, and the first goal and question that do not read (by id, else by number).
fn where_in_record(line: &str) -> Option<String> {
    let value: serde_json::Value = serde_json::from_str(line).ok()?;
    let name = |value: &serde_json::Value, number: usize| match value.get("id").and_then(|i| i.as_str()) {
        Some(id) => format!("`{id}`"),
        None => format!("#{number}"),
    };
    let mut place = format!("in source {}", name(&value, 1));
    let goals = value.get("goals").and_then(|g| g.as_array());
    let wrong = |v: &serde_json::Value, goal: bool| match goal {
        true => serde_json::from_value::<Goal>(v.clone()).is_err(),
        false => serde_json::from_value::<Question>(v.clone()).is_err(),
    };
    if let Some((at, goal)) = goals
        .into_iter()
        .flatten()
        .enumerate()
        .find(|(_, g)| wrong(g, true))
    {
        place.push_str(&format!(", goal {}", name(goal, at + 1)));
        let questions = goal.get("questions").and_then(|q| q.as_array());
        if let Some((at, question)) = questions
            .into_iter()
            .flatten()
            .enumerate()
            .find(|(_, q)| wrong(q, false))
        {
            place.push_str(&format!(", question {}", name(question, at + 1)));
        }
    }
    Some(place)
}

fn check(records: Vec<Located>, problems: &mut Vec<Problem>) -> Dataset {
    let mut seen: HashMap<String, String> = HashMap::new();
    let mut unique = |kind: &str, id: &str, place: &str, problems: &mut Vec<Problem>| {
        if id.trim().is_empty() {
            problems.push(Problem {
                place: place.to_owned(),
                message: format!("{kind} id is empty"),
            });
        } else if let Some(first) = seen.get(id) {
            problems.push(Problem {
                place: place.to_owned(),
                message: format!(
                    "duplicate id `{id}` (first used at {first}); ids are unique across the dataset"
                ),
            });
        } else {
            seen.insert(id.to_owned(), place.to_owned());
        }
    };
    let mut sources = Vec::new();
    for Located {
        record,
        place,
        folder,
    } in records
    {
        unique("source", &record.id, &place, problems);
        evidence::check_tags(&record.tags, &place, problems);
        let text = source_text(record.text, record.path.as_deref(), &folder, &place, problems);
        if record.goals.is_empty() {
            problems.push(Problem {
                place: place.clone(),
                message: "the source has no goals".into(),
            });
        }
        for goal in &record.goals {
            let goal_place = format!("{place}, goal `{}`", goal.id);
            unique("goal", &goal.id, &goal_place, problems);
            evidence::check_tags(&goal.tags, &goal_place, problems);
            if goal.text.trim().is_empty() {
                problems.push(Problem {
                    place: goal_place.clone(),
                    message: "the goal's text is empty".into(),
                });
            }
            if goal.questions.is_empty() {
                problems.push(Problem {
                    place: goal_place.clone(),
                    message: "the goal has no questions".into(),
                });
            }
            for question in &goal.questions {
                let question_place = format!("{goal_place}, question `{}`", question.id);
                unique("question", &question.id, &question_place, problems);
                for (field, value) in [
                    ("question", &question.question),
                    ("reference", &question.reference),
                ] {
                    if value.trim().is_empty() {
                        problems.push(Problem {
                            place: question_place.clone(),
                            message: format!("`{field}` is empty"),
                        });
                    }
                }
                evidence::check_evidence(question, &text, &question_place, problems);
                evidence::check_tags(&question.tags, &question_place, problems);
            }
        }
        sources.push(Source {
            id: record.id,
            text,
            goals: record.goals,
            tags: record.tags,
        });
    }
    Dataset { sources }
}

/// A source's text: given inline, or read from the file it names (relative to the dataset).
fn source_text(
    text: Option<String>,
    path: Option<&Path>,
    folder: &Path,
    place: &str,
    problems: &mut Vec<Problem>,
) -> String {
    match (text, path) {
        (Some(text), None) => text,
        (None, Some(path)) => {
            let path = folder.join(path);
            let file = crate::inputs::manifest::shown(&path);
            super::read_text(&path, &file, "source file").unwrap_or_else(|problem| {
                // `cannot read source file sources/s1.txt: …`, or where a byte is not UTF-8.
                let message = match problem.message.strip_prefix("cannot read the source file: ") {
                    Some(error) => format!("cannot read source file {file}: {error}"),
                    None => format!("{}: {}", problem.place, problem.message),
                };
                problems.push(Problem {
                    place: place.to_owned(),
                    message,
                });
                String::new()
            })
        }
        (Some(_), Some(_)) => {
            problems.push(Problem {
                place: place.to_owned(),
                message: "expected `text` or `path`, not both".into(),
            });
            String::new()
        }
        (None, None) => {
            problems.push(Problem {
                place: place.to_owned(),
                message: "expected `text` or `path`".into(),
            });
            String::new()
        }
    }
}
