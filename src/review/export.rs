//! `gacc export RUN`: a run's rows as one table, for pandas, R, DuckDB or a spreadsheet: one
//! row per question (its ids, cell, seed, answer and verdict, and its memory's ledger fields),
//! or with `--memories` one row per memory (its ledger fields and text). CSV (RFC 4180) or
//! JSON Lines, columns in the order of `QUESTION_COLUMNS` / `MEMORY_COLUMNS`.

use std::collections::{BTreeSet, HashMap};
use std::io::Write;

use serde_json::{Map, Value};

use crate::error::Error;
use crate::hash::sha256;
use crate::inputs::records::Source;
use crate::store::ledger::{LedgerRow, MemoryText, ResultRow};
use crate::store::run_folder::{DATASET, MEMORIES, MEMORY_TEXTS, RESULTS, RunFolder};

/// How rows are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Table {
    Csv,
    JsonLines,
}

/// The columns of a question row: the result's fields, then its memory's ledger fields
/// (empty when no memory was made).
pub(crate) const QUESTION_COLUMNS: &[&str] = &[
    "seed",
    "compressor",
    "condition",
    "ratio",
    "budget_tokens",
    "source_id",
    "goal_id",
    "question_id",
    "answer",
    "correct",
    "score",
    "failure",
    "evidence_kept",
    "evidence_basis",
    "floor_correct",
    "ceiling_correct",
    "memory_key",
    "shown_goal_id",
    "source_tokens",
    "budget",
    "generated_tokens",
    "retained_tokens",
    "unused_budget",
    "truncated",
    "memory_tokens",
    "utf8_split",
    "budget_violation",
    "memory_sha256",
    "cached",
];

/// The columns of a memory row: its ledger row (SPEC §5), then the memory's text.
pub(crate) const MEMORY_COLUMNS: &[&str] = &[
    "seed",
    "compressor",
    "condition",
    "ratio",
    "budget_tokens",
    "source_id",
    "goal_id",
    "shown_goal_id",
    "source_tokens",
    "budget",
    "generated_tokens",
    "retained_tokens",
    "unused_budget",
    "truncated",
    "memory_tokens",
    "padding_tokens",
    "utf8_split",
    "truncation",
    "budget_violation",
    "stopped_at_max_tokens",
    "memory_sha256",
    "key",
    "cache_key",
    "cached",
    "ladder_call",
    "nested",
    "memory",
];

/// The rows a run's tables are made of, read from its folder.
pub(crate) struct Rows {
    ledger: Vec<LedgerRow>,
    results: Vec<ResultRow>,
    texts: Vec<MemoryText>,
}

/// Reads what `write` needs (the memory texts only for memory rows).
pub(crate) fn read(folder: &RunFolder, memories: bool) -> Result<Rows, Error> {
    Ok(Rows {
        ledger: folder.read_rows(MEMORIES)?,
        results: if memories {
            Vec::new()
        } else {
            folder.read_rows(RESULTS)?
        },
        texts: if memories {
            folder.read_rows(MEMORY_TEXTS)?
        } else {
            Vec::new()
        },
    })
}

/// The columns of `gacc export --pairs`: report.json's `pairs[]` (SPEC §13), the interval
/// in two columns.
const PAIR_COLUMNS: &[&str] = &[
    "condition",
    "ratio",
    "budget_tokens",
    "a",
    "b",
    "metric",
    "diff",
    "ci95_low",
    "ci95_high",
    "p",
    "p_holm",
    "separated",
    "goals",
    "mde",
];

/// The run's pairs of compressors (its `report.json` `pairs[]`) as a table.
pub(crate) fn write_pairs(folder: &RunFolder, table: Table) -> Result<String, Error> {
    let report = folder.read_json(crate::store::run_folder::REPORT_JSON)?;
    let pairs = report["pairs"].as_array().cloned().unwrap_or_default();
    let rows = pairs.into_iter().map(|pair| {
        let mut fields = match pair {
            Value::Object(fields) => fields,
            _ => Map::new(),
        };
        if let Some(ci) = fields.remove("ci95") {
            fields.insert("ci95_low".into(), ci["low"].clone());
            fields.insert("ci95_high".into(), ci["high"].clone());
        }
        fields
    });
    let mut out = Vec::new();
    write_table(&mut out, table, PAIR_COLUMNS, rows)
        .map_err(crate::error::io(std::path::Path::new("stdout")))?;
    Ok(String::from_utf8_lossy(&out).into_owned())
}

/// Writes the question rows (or memory rows) to `out`.
pub(crate) fn write(rows: &Rows, table: Table, memories: bool, out: &mut impl Write) -> std::io::Result<()> {
    if memories {
        let text_of: HashMap<&str, &str> = rows
            .texts
            .iter()
            .map(|t| (t.sha256.as_str(), &*t.memory))
            .collect();
        let lines = rows.ledger.iter().map(|row| {
            let mut fields = as_object(row);
            let text = text_of
                .get(row.memory_sha256.as_str())
                .copied()
                .unwrap_or_default();
            fields.insert("memory".into(), Value::String(text.to_owned()));
            fields
        });
        write_table(out, table, MEMORY_COLUMNS, lines)
    } else {
        let memory_of: HashMap<&str, &LedgerRow> =
            rows.ledger.iter().map(|row| (row.key.as_str(), row)).collect();
        // Each audit judge's verdict is a column of its own, after the fixed ones (SPEC §10).
        let named = |prefix: &str, names: BTreeSet<&String>| -> Vec<String> {
            names.into_iter().map(|name| format!("{prefix}.{name}")).collect()
        };
        // Each panel reader's verdict, too (SPEC §11).
        let audit_columns: Vec<String> = (named(
            "audit",
            rows.results.iter().flat_map(|r| r.audits.keys()).collect(),
        ))
        .into_iter()
        .chain(named(
            "panel",
            rows.results.iter().flat_map(|r| r.panel.keys()).collect(),
        ))
        .collect();
        let columns: Vec<&str> = QUESTION_COLUMNS
            .iter()
            .copied()
            .chain(audit_columns.iter().map(String::as_str))
            .collect();
        let lines = rows.results.iter().map(|result| {
            let mut fields = as_object(result);
            fields.remove("audits");
            fields.remove("panel");
            for (name, verdict) in &result.audits {
                fields.insert(format!("audit.{name}"), Value::from(*verdict));
            }
            for (name, verdict) in &result.panel {
                fields.insert(format!("panel.{name}"), Value::from(*verdict));
            }
            if let Some(memory) = memory_of.get(result.memory_key.as_str()) {
                for (name, value) in as_object(*memory) {
                    fields.entry(name).or_insert(value);
                }
            }
            fields
        });
        write_table(out, table, &columns, lines)
    }
}

/// The columns of `gacc export --for-labelling` (SPEC §10): what `[audit] labels` reads back
/// (`question_id`, `answer`, `correct`, left empty to fill in), and what a person labelling needs.
pub(crate) const LABEL_COLUMNS: &[&str] = &[
    "question_id",
    "answer",
    "correct",
    "source_id",
    "goal_id",
    "question",
    "reference",
];

/// A sample of `count` distinct answers (question id and answer text) of a run, to label by
/// hand: those whose SHA-256 of `[question id, answer]` (as JSON) is lowest, so the same run
/// gives the same sample and a larger count a superset. CSV, in `LABEL_COLUMNS`.
pub(crate) fn write_for_labelling(
    folder: &RunFolder,
    count: usize,
    out: &mut impl Write,
) -> Result<(), Error> {
    let results: Vec<ResultRow> = folder.read_rows(RESULTS)?;
    let mut asked: HashMap<String, (String, String)> = HashMap::new();
    for source in folder.read_rows::<Source>(DATASET)? {
        for goal in source.goals {
            for question in goal.questions {
                asked.insert(question.id, (question.question, question.reference));
            }
        }
    }
    let mut answers: Vec<(String, &ResultRow)> = Vec::new();
    let mut seen = BTreeSet::new();
    for row in &results {
        let Some(answer) = row.answer.as_deref() else {
            continue;
        };
        if seen.insert((row.question_id.as_str(), answer)) {
            let order = sha256(serde_json::json!([row.question_id, answer]).to_string());
            answers.push((order, row));
        }
    }
    answers.sort_by(|a, b| a.0.cmp(&b.0));
    let lines = answers.into_iter().take(count).map(|(_, row)| {
        let (question, reference) = asked.get(&row.question_id).cloned().unwrap_or_default();
        let mut fields = Map::new();
        for (name, value) in [
            ("question_id", row.question_id.clone()),
            ("answer", row.answer.clone().unwrap_or_default()),
            ("correct", String::new()),
            ("source_id", row.source_id.clone()),
            ("goal_id", row.goal_id.clone()),
            ("question", question),
            ("reference", reference),
        ] {
            fields.insert(name.to_owned(), Value::String(value));
        }
        fields
    });
    write_table(out, Table::Csv, LABEL_COLUMNS, lines).map_err(crate::error::io(folder.path()))
}

/// A row's fields as a JSON object.
fn as_object(row: &impl serde::Serialize) -> Map<String, Value> {
    match serde_json::to_value(row) {
        Ok(Value::Object(fields)) => fields,
        _ => Map::new(),
    }
}

fn write_table(
    out: &mut impl Write,
    table: Table,
    columns: &[&str],
    rows: impl Iterator<Item = Map<String, Value>>,
) -> std::io::Result<()> {
    match table {
        Table::Csv => {
            // RFC 4180, quoting a field only when it must (a comma, a quote, a line break).
            let mut csv = csv::WriterBuilder::new()
                .quote_style(csv::QuoteStyle::Necessary)
                .terminator(csv::Terminator::Any(b'\n'))
                .from_writer(&mut *out);
            csv.write_record(columns)?;
            for row in rows {
                let cell = |name: &str| csv_text(row.get(name).unwrap_or(&Value::Null));
                csv.write_record(columns.iter().map(|c| cell(c)))?;
            }
            csv.flush()?;
        }
        Table::JsonLines => {
            for row in rows {
                let cell = |name: &str| row.get(name).unwrap_or(&Value::Null);
                let fields: Vec<String> = columns
                    .iter()
                    .map(|c| format!("{}:{}", Value::from(*c), cell(c)))
                    .collect();
                writeln!(out, "{{{}}}", fields.join(","))?;
            }
        }
    }
    out.flush()
}

/// A JSON value as a CSV field's text: null empty, strings as they are, the rest as JSON.
fn csv_text(value: &Value) -> String {
    match value {
        Value::Null => String::new(),
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The keys of a row as written, every optional field present.
    fn keys(row: impl serde::Serialize) -> std::collections::BTreeSet<String> {
        serde_json::to_value(row)
            .unwrap()
            .as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect()
    }

    #[test]
    fn the_columns_are_the_rows_fields() {
        let cell = serde_json::json!({"seed": 1, "compressor": "c", "condition": "own-goal", "ratio": 0.1,
            "source_id": "s", "goal_id": "g"});
        let mut ledger = cell.clone();
        for (key, value) in serde_json::json!({"shown_goal_id": "g", "source_tokens": 10, "budget": 1,
            "generated_tokens": 2, "retained_tokens": 1, "unused_budget": 0, "truncated": true,
            "memory_tokens": 1, "padding_tokens": 0, "utf8_split": false, "truncation": "replace",
            "budget_violation": false, "stopped_at_max_tokens": true, "memory_sha256": "h", "key": "k",
            "cache_key": "ck", "cached": false, "ladder_call": "lc", "nested": true})
        .as_object()
        .unwrap()
        {
            ledger[key] = value.clone();
        }
        let ledger: LedgerRow = serde_json::from_value(ledger).unwrap();
        let mut result = cell;
        for (key, value) in serde_json::json!({"question_id": "q", "memory_key": "k", "answer": "a",
            "correct": true, "score": 1.0, "failure": "f", "rationale": "r", "judge_meta": {},
            "evidence_kept": 0.5, "evidence_basis": "evidence", "floor_correct": false, "ceiling_correct": true})
        .as_object()
        .unwrap()
        {
            result[key] = value.clone();
        }
        let result: ResultRow = serde_json::from_value(result).unwrap();
        let (ledger, result) = (keys(&ledger), keys(&result));
        // A cell's budget is its ratio or its budget_tokens: a row holds one of them.
        let either = ["ratio", "budget_tokens"];
        let memory: Vec<&str> = MEMORY_COLUMNS
            .iter()
            .copied()
            .filter(|c| *c != "memory")
            .collect();
        assert!(ledger.iter().all(|k| memory.contains(&k.as_str())), "{ledger:?}");
        assert!(
            memory.iter().all(|c| ledger.contains(*c) || either.contains(c)),
            "{memory:?}"
        );
        // A question row: every result field but the judge's free text, then its memory's.
        let left_out = ["rationale", "judge_meta", "audits", "panel"];
        assert!(
            result
                .iter()
                .all(|k| QUESTION_COLUMNS.contains(&k.as_str()) || left_out.contains(&k.as_str())),
            "{result:?}"
        );
        assert!(
            QUESTION_COLUMNS
                .iter()
                .all(|c| result.contains(*c) || ledger.contains(*c) || either.contains(c)),
            "{QUESTION_COLUMNS:?}"
        );
    }

    #[test]
    fn fields_are_quoted_only_when_they_must_be() {
        let row = |fields: &[(&str, Value)]| -> Map<String, Value> {
            fields.iter().map(|(k, v)| ((*k).to_owned(), v.clone())).collect()
        };
        let mut out = Vec::new();
        let rows = [
            row(&[("a", "plain".into()), ("b", "a,b".into())]),
            row(&[("a", "say \"hi\"\nnow".into()), ("b", Value::Null)]),
        ];
        write_table(&mut out, Table::Csv, &["a", "b"], rows.into_iter()).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "a,b\nplain,\"a,b\"\n\"say \"\"hi\"\"\nnow\",\n"
        );
        assert_eq!(csv_text(&Value::Null), "");
        assert_eq!(csv_text(&serde_json::json!(0.15)), "0.15");
        assert_eq!(csv_text(&serde_json::json!(true)), "true");
    }
}
