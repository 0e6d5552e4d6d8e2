//! Datasets as flat question tables: CSV or JSON Lines, one row per question, grouped into
//! sources and goals; `gacc dataset convert` between the two shapes; every table error named by
//! file, line and column, all at once.

mod common;

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

#[test]
fn the_fixture_as_a_csv_or_json_lines_table_gives_the_same_report_and_ledger() {
    let nested = Scratch::new();
    let expected = fixture_from(&nested, "data/fixture.jsonl", "");
    for table in ["fixture-table.csv", "fixture-table.jsonl"] {
        let scratch = Scratch::new();
        convert(
            &scratch,
            "experiments/data/fixture.jsonl",
            &format!("experiments/data/{table}"),
        );
        let folder = fixture_from(&scratch, &format!("data/{table}"), "");
        let (a, b) = (
            read_json(&expected.join("report.json")),
            read_json(&folder.join("report.json")),
        );
        for key in ["cells", "by_condition", "dataset", "integrity"] {
            assert_eq!(a[key], b[key], "{table}: {key}");
        }
        assert_eq!(
            std::fs::read(expected.join("memories.jsonl")).unwrap(),
            std::fs::read(folder.join("memories.jsonl")).unwrap(),
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
    let read = |path: &str| -> Vec<serde_json::Value> {
        std::fs::read_to_string(scratch.path(path))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    assert_eq!(read("experiments/data/fixture.jsonl"), read("back.jsonl"));
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
    let manifest = std::fs::read_to_string(scratch.path("experiments/fixture.toml"))
        .unwrap()
        .replace("data/fixture.jsonl", "data/bad.csv");
    scratch.write("experiments/bad.toml", &manifest);
    let (status, _, stderr) = scratch.run("experiments/bad.toml", &["-q"]);
    assert_eq!(status, 2, "{stderr}");
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
}
