//! The dataset (SPEC §2): sources, their goals, and each goal's held-out questions.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::hash::sha256;
use crate::manifest::{Loaded, Problem};

/// One source as written: inline text or a path to it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceRecord {
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<PathBuf>,
    #[serde(default)]
    pub goals: Vec<Goal>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Goal {
    pub id: String,
    pub text: String,
    #[serde(default)]
    pub questions: Vec<Question>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Question {
    pub id: String,
    pub question: String,
    pub reference: String,
}

/// A source with its text loaded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Source {
    pub id: String,
    pub text: String,
    pub goals: Vec<Goal>,
}

impl Source {
    pub fn sha256(&self) -> String {
        sha256(&self.text)
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Dataset {
    pub sources: Vec<Source>,
}

impl Dataset {
    pub fn goals(&self) -> impl Iterator<Item = (&Source, &Goal)> {
        self.sources
            .iter()
            .flat_map(|s| s.goals.iter().map(move |g| (s, g)))
    }

    pub fn question_count(&self) -> usize {
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
pub fn load(loaded: &Loaded) -> Result<Dataset, Vec<Problem>> {
    let spec = &loaded.manifest.dataset;
    let mut problems = Vec::new();
    let records = match (&spec.path, &spec.sources) {
        (Some(path), _) => read_jsonl(&loaded.resolve(path), &mut problems),
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

fn read_jsonl(path: &Path, problems: &mut Vec<Problem>) -> Vec<Located> {
    let file = crate::manifest::shown(path);
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(error) => {
            problems.push(Problem {
                place: file,
                message: format!("cannot read the dataset: {error}"),
            });
            return Vec::new();
        }
    };
    let folder = path.parent().unwrap_or(Path::new(".")).to_path_buf();
    let mut records = Vec::new();
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
            Err(error) => problems.push(Problem {
                place: format!("{file}:{number}:{}", error.column()),
                message: format!("not a source record: {error}"),
            }),
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
        let text = match (record.text, &record.path) {
            (Some(text), None) => text,
            (None, Some(path)) => {
                let path = folder.join(path);
                std::fs::read_to_string(&path).unwrap_or_else(|error| {
                    problems.push(Problem {
                        place: place.clone(),
                        message: format!(
                            "cannot read source file {}: {error}",
                            crate::manifest::shown(&path)
                        ),
                    });
                    String::new()
                })
            }
            (Some(_), Some(_)) => {
                problems.push(Problem {
                    place: place.clone(),
                    message: "expected `text` or `path`, not both".into(),
                });
                String::new()
            }
            (None, None) => {
                problems.push(Problem {
                    place: place.clone(),
                    message: "expected `text` or `path`".into(),
                });
                String::new()
            }
        };
        if record.goals.is_empty() {
            problems.push(Problem {
                place: place.clone(),
                message: "the source has no goals".into(),
            });
        }
        for goal in &record.goals {
            let goal_place = format!("{place}, goal `{}`", goal.id);
            unique("goal", &goal.id, &goal_place, problems);
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
            }
        }
        sources.push(Source {
            id: record.id,
            text,
            goals: record.goals,
        });
    }
    Dataset { sources }
}
