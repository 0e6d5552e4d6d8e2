//! A question table in Parquet (what pandas, pyarrow and Hugging Face write): only the named
//! columns are read, each a text or integer column; a row's place in messages is its number,
//! counting from 1. Uncompressed, snappy- and gzip-compressed files are read (pandas, pyarrow,
//! DuckDB and Spark write snappy by default); another codec (polars writes zstd) is refused,
//! saying how to write a file gacc reads.

use std::path::Path;

use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::record::Field;
use parquet::schema::types::{Type, TypePtr};

use super::table::{Columns, Numbering, Row};
use crate::error::Problem;

/// The rows of the Parquet file at `path` (`file` as messages name it), their named columns as
/// text; problems go to `problems`. A file that makes the reader panic (it should not: 300
/// truncated and corrupted copies of the fixture did not) is a problem too, not a crash.
pub(crate) fn rows(path: &Path, file: &str, columns: &Columns, problems: &mut Vec<Problem>) -> Vec<Row> {
    let read = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut found = Vec::new();
        let rows = read_rows(path, file, columns, &mut found);
        (rows, found)
    }));
    match read {
        Ok((rows, found)) => {
            problems.extend(found);
            rows
        }
        Err(_) => {
            problems.push(Problem {
                place: file.to_owned(),
                message: "the Parquet reader failed on this file (is it damaged?): write it again, or as CSV"
                    .into(),
            });
            Vec::new()
        }
    }
}

/// One pass over the row groups, each column read beside the others.
fn read_rows(path: &Path, file: &str, columns: &Columns, problems: &mut Vec<Problem>) -> Vec<Row> {
    let whole = |message: String| Problem {
        place: file.to_owned(),
        message,
    };
    let reader = match std::fs::File::open(path)
        .map_err(|error| format!("cannot read the dataset: {error}"))
        .and_then(|f| SerializedFileReader::new(f).map_err(|error| format!("not Parquet: {error}")))
    {
        Ok(reader) => reader,
        Err(message) => {
            problems.push(whole(message));
            return Vec::new();
        }
    };
    // Only the named columns are decoded: a table may hold others gacc cannot read (lists,
    // structs), and need not pay for them.
    let schema = reader.metadata().file_metadata().schema_descr().root_schema();
    let mut kept = Vec::new();
    let before = problems.len();
    for (_, column) in columns.named() {
        match schema.get_fields().iter().find(|f| f.name() == column) {
            // Two roles may share a column (`goal_id = "goal"`): it is read once.
            Some(_) if kept.iter().any(|k: &TypePtr| k.name() == column) => {}
            Some(field) if field.is_primitive() => kept.push(field.clone()),
            Some(_) => problems.push(whole_column(file, column, "holds lists or structs, not text")),
            None => problems.push(whole_column(
                file,
                column,
                &format!("the table has no column `{column}` (name it in `[dataset] columns`)"),
            )),
        }
    }
    if problems.len() > before {
        return Vec::new();
    }
    for (_, column) in columns.optional() {
        let field = schema.get_fields().iter().find(|f| f.name() == column);
        if let Some(field) = field.filter(|f| f.is_primitive())
            && !kept.iter().any(|k: &TypePtr| k.name() == column)
        {
            kept.push(field.clone());
        }
    }
    let projection = match Type::group_type_builder(schema.name()).with_fields(kept).build() {
        Ok(projection) => projection,
        Err(error) => {
            problems.push(whole(format!("cannot read its columns: {error}")));
            return Vec::new();
        }
    };
    let iter = match reader.get_row_iter(Some(projection)) {
        Ok(iter) => iter,
        Err(error) => {
            problems.push(whole(format!("cannot read its rows: {}", explained(&error))));
            return Vec::new();
        }
    };
    let mut rows = Vec::new();
    // A column of another type is reported at its first row only.
    let mut refused = std::collections::HashSet::new();
    for (index, row) in iter.enumerate() {
        let number = index + 1;
        let row = match row {
            Ok(row) => row,
            Err(error) => {
                problems.push(Problem {
                    place: Numbering::Row.place(file, number),
                    message: format!("cannot read the row: {}", explained(&error)),
                });
                break;
            }
        };
        let mut cells = std::collections::HashMap::new();
        for (name, field) in row.get_column_iter() {
            match text(field) {
                Some(value) => {
                    cells.insert(name.clone(), value);
                }
                None if refused.insert(name.clone()) => problems.push(Problem {
                    place: format!("{}, column `{name}`", Numbering::Row.place(file, number)),
                    message: format!(
                        "holds `{field}`: gacc reads text and integer columns (this is the column's first such row)"
                    ),
                }),
                None => {}
            }
        }
        rows.push((number, cells));
    }
    rows
}

/// A reader's error, and for a codec gacc is built without, what to do instead.
fn explained(error: &parquet::errors::ParquetError) -> String {
    let text = error.to_string();
    match text.split("Disabled feature at compile time: ").nth(1) {
        Some(codec) => format!(
            "the file is compressed with {codec}, which gacc does not read: write it uncompressed or with snappy or gzip (pandas: `to_parquet(path, compression=\"snappy\")`; polars: `write_parquet(path, compression=\"snappy\")`), or as CSV"
        ),
        None => text,
    }
}

fn whole_column(file: &str, column: &str, message: &str) -> Problem {
    Problem {
        place: format!("{file}, column `{column}`"),
        message: message.to_owned(),
    }
}

/// A cell as text: a string, an integer or a boolean as written; null as an empty cell (which
/// the table reader then reports); None for what a question table cannot hold.
fn text(field: &Field) -> Option<String> {
    Some(match field {
        Field::Null => String::new(),
        Field::Str(text) => text.clone(),
        Field::Bytes(bytes) => std::str::from_utf8(bytes.data()).ok()?.to_owned(),
        Field::Bool(_)
        | Field::Byte(_)
        | Field::Short(_)
        | Field::Int(_)
        | Field::Long(_)
        | Field::UByte(_)
        | Field::UShort(_)
        | Field::UInt(_)
        | Field::ULong(_) => field.to_string(),
        _ => return None,
    })
}
