//! A dataset written as a question table (`gacc dataset convert`): a row per question, with
//! `evidence` and `tags` columns when any question has them.

use serde_json::Value;

use super::Columns;
use crate::inputs::records::{Evidence, Source};

/// A dataset as a question table, in `columns`: CSV when `csv`, else JSON Lines.
pub(crate) fn write(sources: &[Source], columns: &Columns, csv: bool) -> Result<Vec<u8>, String> {
    for source in sources {
        let goal = source.goals.iter().find(|g| !g.tags.is_empty());
        if let Some(kind) = (!source.tags.is_empty())
            .then(|| format!("source `{}`", source.id))
            .or_else(|| goal.map(|g| format!("goal `{}`", g.id)))
        {
            return Err(format!(
                "{kind} has tags, which a question table cannot hold (only a question's tags have a column)"
            ));
        }
    }
    let questions = || sources.iter().flat_map(|s| &s.goals).flat_map(|g| &g.questions);
    let evidence = questions().any(|q| q.evidence.is_some());
    let tags = questions().any(|q| !q.tags.is_empty());
    let mut names: Vec<&str> = columns.named().iter().map(|(_, c)| *c).collect();
    names.extend(evidence.then_some(columns.evidence.as_str()));
    names.extend(tags.then_some(columns.tags.as_str()));
    let rows = sources.iter().flat_map(|source| {
        source.goals.iter().flat_map(move |goal| {
            goal.questions.iter().map(move |question| {
                let mut row: Vec<Value> = [
                    source.id.as_str(),
                    source.text.as_str(),
                    goal.id.as_str(),
                    goal.text.as_str(),
                    question.id.as_str(),
                    question.question.as_str(),
                    question.reference.as_str(),
                ]
                .map(Value::from)
                .into();
                if evidence {
                    row.push(match &question.evidence {
                        None => Value::Null,
                        Some(Evidence::One(span)) if !span.trim_start().starts_with('[') => {
                            Value::from(span.as_str())
                        }
                        Some(_) => Value::from(question.spans().0),
                    });
                }
                if tags {
                    row.push(Value::from(question.tags.clone()));
                }
                row
            })
        })
    });
    if csv {
        // A list is written as its JSON; no value is a cell's text.
        let cell = |value: Value| match value {
            Value::String(text) => text,
            Value::Null => String::new(),
            other => other.to_string(),
        };
        let mut writer = csv::Writer::from_writer(Vec::new());
        writer.write_record(&names).map_err(|e| e.to_string())?;
        for row in rows {
            writer
                .write_record(row.into_iter().map(cell))
                .map_err(|e| e.to_string())?;
        }
        writer.into_inner().map_err(|e| e.to_string())
    } else {
        let mut out = Vec::new();
        for row in rows {
            let object: serde_json::Map<String, Value> = (names.iter().zip(row))
                .filter(|(_, value)| !value.is_null())
                .map(|(name, value)| ((*name).to_owned(), value))
                .collect();
            out.extend(Value::Object(object).to_string().into_bytes());
            out.push(b'\n');
        }
        Ok(out)
    }
}
