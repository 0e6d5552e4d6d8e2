//! Datasets as flat question tables: CSV, JSON Lines or Parquet, one row per question, grouped
//! into sources and goals; `gacc dataset convert` between the two shapes; every table error named
//! by file, line (a Parquet file's row) and column, all at once.

use crate::common;

use common::{Scratch, read_json};

/// Runs the fixture with its dataset at `path` (in `experiments/data/`), in a scratch folder
/// of its own (a fresh cache); the run folder.
fn fixture_from(scratch: &Scratch, path: &str, columns: &str) -> std::path::PathBuf {
    let manifest = std::fs::read_to_string(scratch.path("experiments/fixture.toml"))
        .unwrap()
        .replace(
            "path = \"data/fixture.jsonl\"",
            &format!("path = \"{path}\"\n{columns}"),
        );
    scratch.write("experiments/table.toml", &manifest);
    let (status, folder, stderr) = scratch.run("experiments/table.toml", &["-q"]);
    assert_eq!(status, 0, "{stderr}");
    folder
}

fn convert(scratch: &Scratch, input: &str, output: &str) {
    let out = scratch
        .gacc()
        .args(["dataset", "convert", input, output])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// A file of `tests/data/parquet/` (written by pyarrow and polars: its `make.py`).
fn parquet(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/parquet")
        .join(name)
}

/// Runs the fixture on the dataset at `path` (in `experiments/`), which must fail: its stderr.
fn fails_on(scratch: &Scratch, path: &str) -> (String, String) {
    let manifest = std::fs::read_to_string(scratch.path("experiments/fixture.toml"))
        .unwrap()
        .replace("data/fixture.jsonl", path);
    scratch.write("experiments/bad.toml", &manifest);
    let (status, _, stderr) = scratch.run("experiments/bad.toml", &["-q"]);
    assert_eq!(status, 2, "{stderr}");
    (manifest, stderr)
}

/// A JSON Lines file's rows.
fn jsonl(scratch: &Scratch, path: &str) -> Vec<serde_json::Value> {
    std::fs::read_to_string(scratch.path(path))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn the_fixture_as_a_csv_json_lines_or_parquet_table_gives_the_same_report_and_ledger() {
    let nested = Scratch::new();
    let expected = fixture_from(&nested, "data/fixture.jsonl", "");
    for table in [
        "fixture-table.csv",
        "fixture-table.jsonl",
        "fixture-table.parquet",
        "fixture-gzip.parquet",
    ] {
        let scratch = Scratch::new();
        match table {
            // pandas' default (snappy), kept in experiments/data as the example.
            "fixture-table.parquet" => {}
            "fixture-gzip.parquet" => {
                std::fs::copy(
                    parquet(table),
                    scratch.path("experiments/data/fixture-gzip.parquet"),
                )
                .unwrap();
            }
            _ => convert(
                &scratch,
                "experiments/data/fixture.jsonl",
                &format!("experiments/data/{table}"),
            ),
        }
        let folder = fixture_from(&scratch, &format!("data/{table}"), "");
        let (a, b) = (
            read_json(&expected.join("report.json")),
            read_json(&folder.join("report.json")),
        );
        for key in ["cells", "by_condition", "dataset", "integrity"] {
            assert_eq!(a[key], b[key], "{table}: {key}");
        }
        assert_eq!(
            common::read_bytes(&expected.join("memories.jsonl.gz")),
            common::read_bytes(&folder.join("memories.jsonl.gz")),
            "{table}: ledger rows"
        );
    }
}

#[test]
fn dataset_convert_round_trips_and_columns_rename_a_table() {
    let scratch = Scratch::new();
    convert(&scratch, "experiments/data/fixture.jsonl", "fixture.csv");
    convert(&scratch, "fixture.csv", "back.jsonl");
    // Nested → table → nested: the same sources, goals and questions.
    assert_eq!(
        jsonl(&scratch, "experiments/data/fixture.jsonl"),
        jsonl(&scratch, "back.jsonl")
    );
    // Table → nested → table: the same bytes.
    convert(&scratch, "back.jsonl", "again.csv");
    assert_eq!(
        std::fs::read(scratch.path("fixture.csv")).unwrap(),
        std::fs::read(scratch.path("again.csv")).unwrap()
    );
    // A table with its own column names, named in `[dataset] columns`.
    let renamed = std::fs::read_to_string(scratch.path("fixture.csv"))
        .unwrap()
        .replacen(
            "source_id,text,goal_id,goal,question_id,question,reference",
            "doc,context,gid,goal_text,id,q,answer",
            1,
        );
    scratch.write("experiments/data/renamed.csv", &renamed);
    let columns = "columns = { source_id = \"doc\", text = \"context\", goal_id = \"gid\", goal = \"goal_text\", question_id = \"id\", question = \"q\", reference = \"answer\" }";
    let folder = fixture_from(&scratch, "data/renamed.csv", columns);
    let report = read_json(&folder.join("report.json"));
    assert!((report["cells"][0]["micro"]["mean"].as_f64().unwrap() - 2.0 / 3.0).abs() < 1e-12);
    // gacc dataset stats and gacc validate read tables too.
    let stats = scratch.json(["dataset", "stats", "fixture.csv", "--json"]);
    assert_eq!(stats["questions"], 12, "{stats}");
    let out = scratch
        .gacc()
        .args(["validate", "experiments/table.toml"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn each_table_error_names_its_file_line_and_column_all_at_once() {
    let scratch = Scratch::new();
    scratch.write(
        "experiments/data/bad.csv",
        "source_id,text,goal_id,goal,question_id,question,reference\n\
         s1,Text one,g1,Goal one,q1,Who?,Ann\n\
         s1,Another text,g1,Goal one,q2,What?,Tea\n\
         s2,Text two,g1,Goal one,q3,Where?,Home\n\
         s1,Text one,g1,Other goal,q4,When?,Noon\n\
         s1,Text one,g1,Goal one,q1,Who again?,Ann\n\
         s1,Text one,g1,Goal one,q5,,Tea\n",
    );
    let (manifest, stderr) = fails_on(&scratch, "data/bad.csv");
    for (place, what) in [
        (
            "bad.csv:3, column `text`",
            "source `s1` has another text on line 2",
        ),
        ("bad.csv:4, column `goal_id`", "goal `g1` belongs to source `s1`"),
        ("bad.csv:5, column `goal`", "goal `g1` has another text on line 2"),
        (
            "bad.csv:6, column `question_id`",
            "question id `q1` is used on line 2 already",
        ),
        ("bad.csv:7, column `question`", "the cell is empty"),
    ] {
        assert!(
            stderr.contains(place) && stderr.contains(what),
            "{place}: {what}\n{stderr}"
        );
    }
    // A missing column is named once, by the header.
    scratch.write(
        "experiments/data/bad.csv",
        "source_id,text,goal_id,goal,question_id,question\ns1,T,g1,G,q1,Q\n",
    );
    let (status, _, stderr) = scratch.run("experiments/bad.toml", &["-q"]);
    assert_eq!(status, 2, "{stderr}");
    assert!(stderr.contains("bad.csv:1, column `reference`"), "{stderr}");
    // JSON Lines rows: the same checks, by line.
    scratch.write(
        "experiments/data/bad.jsonl",
        "{\"source_id\":\"s1\",\"text\":\"T\",\"goal_id\":\"g1\",\"goal\":\"G\",\"question_id\":\"q1\",\"question\":\"Q\",\"reference\":\"R\"}\n\
         {\"source_id\":\"s1\",\"text\":\"T\",\"goal_id\":\"g1\",\"goal\":\"G\",\"question_id\":\"q2\",\"question\":\"Q\"}\n",
    );
    scratch.write(
        "experiments/bad.toml",
        &manifest.replace("data/bad.csv", "data/bad.jsonl"),
    );
    let (status, _, stderr) = scratch.run("experiments/bad.toml", &["-q"]);
    assert_eq!(status, 2, "{stderr}");
    assert!(stderr.contains("bad.jsonl:2, column `reference`"), "{stderr}");
    // A column every row lacks: all counted, five listed, not a line per row.
    let rows: String = (1..=40)
        .map(|i| format!("{{\"source_id\":\"s1\",\"text\":\"T\",\"goal_id\":\"g1\",\"goal\":\"G\",\"question_id\":\"q{i}\",\"question\":\"Q\"}}\n"))
        .collect();
    scratch.write("experiments/data/bad.jsonl", &rows);
    let (status, _, stderr) = scratch.run("experiments/bad.toml", &["-q"]);
    assert_eq!(status, 2, "{stderr}");
    assert!(stderr.contains("40 problems found"), "{stderr}");
    assert!(stderr.contains("bad.jsonl:5, column `reference`"), "{stderr}");
    assert!(!stderr.contains("bad.jsonl:6, column"), "{stderr}");
    assert!(
        stderr.contains("… and 35 more like this: the row has no such column"),
        "{stderr}"
    );
}

#[test]
fn a_parquet_table_reads_its_named_columns_and_says_what_it_cannot_read() {
    let scratch = Scratch::new();
    // Integer ids, and columns the manifest does not name (a struct, a float): not read.
    std::fs::copy(
        parquet("numbered.parquet"),
        scratch.path("experiments/data/numbered.parquet"),
    )
    .unwrap();
    let columns = "columns = { source_id = \"doc\", text = \"context\", goal_id = \"gid\", goal = \"goal_text\", question_id = \"qid\", question = \"q\", reference = \"answer\" }";
    let folder = fixture_from(&scratch, "data/numbered.parquet", columns);
    let report = read_json(&folder.join("report.json"));
    assert_eq!(
        (
            report["dataset"]["sources"].as_u64(),
            report["dataset"]["goals"].as_u64(),
            report["dataset"]["questions"].as_u64()
        ),
        (Some(2), Some(2), Some(3)),
        "{}",
        report["dataset"]
    );
    // Parquet → nested: the integer ids as text.
    convert(
        &scratch,
        "experiments/data/fixture-table.parquet",
        "from-parquet.jsonl",
    );
    assert_eq!(
        jsonl(&scratch, "experiments/data/fixture.jsonl"),
        jsonl(&scratch, "from-parquet.jsonl")
    );

    let manifest = std::fs::read_to_string(scratch.path("experiments/table.toml")).unwrap();
    let fails_with = |manifest: &str, expected: &[&str]| {
        scratch.write("experiments/bad.toml", manifest);
        let (status, _, stderr) = scratch.run("experiments/bad.toml", &["-q"]);
        assert_eq!(status, 2, "{stderr}");
        for text in expected {
            assert!(stderr.contains(text), "{text}\n{stderr}");
        }
    };
    // A named column of lists or structs.
    fails_with(
        &manifest.replace("reference = \"answer\"", "reference = \"answers\""),
        &["numbered.parquet, column `answers`: holds lists or structs, not text"],
    );
    // A named float column: refused at its first row only.
    fails_with(
        &manifest.replace("reference = \"answer\"", "reference = \"score\""),
        &["numbered.parquet, row 1, column `score`: holds `0.5`: gacc reads text and integer columns"],
    );
    // polars' default codec, zstd: refused with how to write a file gacc reads.
    std::fs::copy(
        parquet("fixture-zstd.parquet"),
        scratch.path("experiments/data/zstd.parquet"),
    )
    .unwrap();
    let plain = manifest.replace("data/numbered.parquet", "data/zstd.parquet");
    let plain = plain
        .lines()
        .filter(|l| !l.starts_with("columns = "))
        .collect::<Vec<_>>()
        .join("\n");
    fails_with(
        &plain,
        &[
            "zstd.parquet, row 1",
            "compressed with zstd",
            "compression=\"snappy\"",
        ],
    );
    // Not Parquet at all.
    scratch.write("experiments/data/zstd.parquet", "source_id,text\n");
    fails_with(&plain, &["zstd.parquet: not Parquet"]);
    // convert reads Parquet but does not write it.
    let out = scratch
        .gacc()
        .args([
            "dataset",
            "convert",
            "experiments/data/fixture.jsonl",
            "out.parquet",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("writes CSV or JSON Lines"));
    assert!(!scratch.path("out.parquet").exists());
    // Two roles may name one column: the goal's text as its id.
    let shared = columns.replace("goal_id = \"gid\"", "goal_id = \"goal_text\"");
    let folder = fixture_from(&scratch, "data/numbered.parquet", &shared);
    let report = read_json(&folder.join("report.json"));
    assert_eq!(report["dataset"]["goals"], 2, "{}", report["dataset"]);
}

#[test]
fn each_parquet_table_error_names_its_file_row_and_column_all_at_once() {
    let scratch = Scratch::new();
    std::fs::copy(
        parquet("bad.parquet"),
        scratch.path("experiments/data/bad.parquet"),
    )
    .unwrap();
    let (_, stderr) = fails_on(&scratch, "data/bad.parquet");
    for (place, what) in [
        (
            "bad.parquet, row 2, column `text`",
            "source `s1` has another text on row 1",
        ),
        (
            "bad.parquet, row 3, column `goal_id`",
            "goal `g1` belongs to source `s1` (row 1)",
        ),
        (
            "bad.parquet, row 4, column `goal`",
            "goal `g1` has another text on row 1",
        ),
        (
            "bad.parquet, row 5, column `question_id`",
            "question id `q1` is used on row 1 already",
        ),
        ("bad.parquet, row 6, column `question`", "the cell is empty"),
        ("bad.parquet, row 7, column `reference`", "the cell is empty"),
    ] {
        assert!(
            stderr.contains(&format!("{place}: {what}")),
            "{place}: {what}\n{stderr}"
        );
    }
    // `gacc validate` says the same, and nothing ran.
    let out = scratch
        .gacc()
        .args(["validate", "experiments/bad.toml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("bad.parquet, row 6, column `question`"));
    assert!(!scratch.path("experiments/runs").exists());
}

/// What `validate`, `run` and `dataset convert` each say of the dataset at `path`.
fn refused_everywhere(scratch: &Scratch, path: &str) -> String {
    let (_, stderr) = fails_on(scratch, path);
    for args in [
        vec!["validate".to_owned(), "experiments/bad.toml".to_owned()],
        vec![
            "dataset".to_owned(),
            "convert".to_owned(),
            format!("experiments/{path}"),
            "experiments/out.jsonl".to_owned(),
        ],
    ] {
        let output = scratch.gacc().args(&args).output().unwrap();
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        let said = String::from_utf8_lossy(&output.stderr);
        let first = stderr.lines().nth(1).unwrap_or("").trim();
        assert!(
            said.contains(first),
            "{args:?} says what run says ({first}): {said}"
        );
    }
    stderr
}

#[test]
fn a_table_is_read_as_written_or_refused_naming_file_line_and_column() {
    let scratch = Scratch::new();
    let header = "source_id,text,goal_id,goal,question_id,question,reference";
    let row = |id: &str, reference: &str| format!("s1,Text one,g1,Goal one,{id},Who?,{reference}");
    for (name, text, place, what) in [
        (
            "extra.csv",
            format!("{header}\n{}\n{}\n", row("q1", "Ann"), row("q2", "1,000")),
            "extra.csv:3, column 8",
            "the row has 8 cells, the header 7",
        ),
        (
            "short.csv",
            format!(
                "{header}\n{}\ns1,Text one,g1,Goal one,q2,Who?\n",
                row("q1", "Ann")
            ),
            "short.csv:3, column `reference`",
            "the row has 6 cells, the header 7",
        ),
        (
            "twice.csv",
            format!("{header},question\n{},Why?\n", row("q1", "Ann")),
            "twice.csv:1, column `question`",
            "names `question` twice (columns 6 and 8)",
        ),
        (
            // What spreadsheets write: CRLF, and the empty cell on the fourth line.
            "crlf.csv",
            format!(
                "{header}\r\n{}\r\n{}\r\n{}\r\n",
                row("q1", "Ann"),
                row("q2", "Bo"),
                row("", "Cy")
            ),
            "crlf.csv:4, column `question_id`",
            "the cell is empty",
        ),
        (
            "latin1.csv",
            format!("{header}\n{}\n{}\n", row("q1", "Ann"), row("q2", "Zo\u{1}"))
                .replace('\u{1}', "\u{fffd}"),
            "",
            "",
        ),
    ] {
        if name == "latin1.csv" {
            // A byte that is not UTF-8 (Latin-1's é) on line 3, after 34 characters.
            let mut bytes = text.into_bytes();
            let at = bytes.windows(3).position(|w| w == "\u{fffd}".as_bytes()).unwrap();
            bytes.splice(at..at + 3, [0xe9]);
            std::fs::write(scratch.path(&format!("experiments/data/{name}")), bytes).unwrap();
            let stderr = refused_everywhere(&scratch, &format!("data/{name}"));
            assert!(
                stderr.contains("latin1.csv:3:35: byte 0xe9 is not UTF-8"),
                "{stderr}"
            );
            continue;
        }
        scratch.write(&format!("experiments/data/{name}"), &text);
        let stderr = refused_everywhere(&scratch, &format!("data/{name}"));
        assert!(
            stderr.contains(place) && stderr.contains(what),
            "{place}: {what}\n{stderr}"
        );
    }
    // JSON Lines with a byte-order mark are read as written, nested records and tables alike.
    for (name, from) in [
        ("bom.jsonl", "data/fixture.jsonl"),
        ("bom-table.jsonl", "data/fixture-table.csv"),
    ] {
        let text = match name {
            "bom.jsonl" => std::fs::read_to_string(scratch.path(&format!("experiments/{from}"))).unwrap(),
            _ => {
                convert(
                    &scratch,
                    &format!("experiments/{from}"),
                    "experiments/data/plain.jsonl",
                );
                std::fs::read_to_string(scratch.path("experiments/data/plain.jsonl")).unwrap()
            }
        };
        scratch.write(&format!("experiments/data/{name}"), &format!("\u{feff}{text}"));
        let output = scratch
            .gacc()
            .args([
                "dataset",
                "convert",
                &format!("experiments/data/{name}"),
                "experiments/back.csv",
            ])
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

#[test]
fn a_tables_evidence_and_tags_columns_read_convert_and_check() {
    let scratch = Scratch::new();
    // The fixture with evidence (one span, or a JSON array) and question tags.
    let mut sources = jsonl(&scratch, "experiments/data/fixture.jsonl");
    let text = sources[0]["text"].as_str().unwrap().to_owned();
    let lines: Vec<&str> = text.lines().filter(|l| l.contains('=')).collect();
    let questions = sources[0]["goals"][0]["questions"].as_array_mut().unwrap();
    questions[0]["evidence"] = serde_json::json!(lines[0]);
    questions[0]["tags"] = serde_json::json!(["status", "reactor"]);
    questions[1]["evidence"] = serde_json::json!([lines[0], lines[1]]);
    let nested: Vec<String> = sources.iter().map(|s| s.to_string()).collect();
    scratch.write("evidence.jsonl", &(nested.join("\n") + "\n"));

    // Nested → CSV → nested keeps both; the CSV holds a list as its JSON.
    convert(&scratch, "evidence.jsonl", "evidence.csv");
    let csv = std::fs::read_to_string(scratch.path("evidence.csv")).unwrap();
    assert!(
        csv.lines().next().unwrap().ends_with(",reference,evidence,tags"),
        "{csv}"
    );
    assert!(csv.contains("\"[\"\"status\"\",\"\"reactor\"\"]\""), "{csv}");
    convert(&scratch, "evidence.csv", "back.jsonl");
    assert_eq!(jsonl(&scratch, "evidence.jsonl"), jsonl(&scratch, "back.jsonl"));
    convert(&scratch, "evidence.jsonl", "evidence-table.jsonl");
    convert(&scratch, "evidence-table.jsonl", "back2.jsonl");
    assert_eq!(jsonl(&scratch, "evidence.jsonl"), jsonl(&scratch, "back2.jsonl"));

    // A run on the table: the rows say which questions state evidence.
    std::fs::copy(
        scratch.path("evidence.csv"),
        scratch.path("experiments/data/evidence.csv"),
    )
    .unwrap();
    let folder = fixture_from(&scratch, "data/evidence.csv", "");
    let results = common::read_lines(&folder.join("results.jsonl.gz"));
    let basis = |id: &str| {
        let row = results.iter().find(|r| r["question_id"] == id).unwrap();
        row["evidence_basis"].as_str().unwrap().to_owned()
    };
    let ids: Vec<String> = questions_of(&sources);
    assert_eq!(basis(&ids[0]), "evidence");
    assert_eq!(basis(&ids[1]), "evidence");
    assert_eq!(basis(&ids[2]), "reference");
    let report = read_json(&folder.join("report.json"));
    let status = report["by_tag"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["tag"] == "status")
        .unwrap();
    assert_eq!(status["on"], "question");
    assert_eq!(status["carriers"], 1);

    // A span the source does not hold, in a table: exit 2, the question named.
    let broken = csv.replace(
        &format!("\"[\"\"{}\"\"", lines[0]),
        "\"[\"\"a span from nowhere\"\"",
    );
    assert_ne!(broken, csv, "{csv}");
    scratch.write("experiments/data/broken.csv", &broken);
    let (_, stderr) = fails_on(&scratch, "data/broken.csv");
    assert!(stderr.contains(&format!("question `{}`", ids[1])), "{stderr}");
    assert!(
        stderr.contains("\"a span from nowhere\" is not in the source"),
        "{stderr}"
    );

    // A source's or goal's tags have no column: converting them to a table is refused.
    sources[1]["tags"] = serde_json::json!(["genre"]);
    let nested: Vec<String> = sources.iter().map(|s| s.to_string()).collect();
    scratch.write("tagged.jsonl", &(nested.join("\n") + "\n"));
    let out = scratch
        .gacc()
        .args(["dataset", "convert", "tagged.jsonl", "tagged.csv"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("has tags, which a question table cannot hold"),
        "{stderr}"
    );
}

/// The ids of the first goal's questions.
fn questions_of(sources: &[serde_json::Value]) -> Vec<String> {
    sources[0]["goals"][0]["questions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| q["id"].as_str().unwrap().to_owned())
        .collect()
}
