//! A bad manifest or dataset is refused with exit status 2 and a message naming the place,
//! before any callback runs.

use crate::common;

use common::Scratch;

const MANIFEST: &str = r#"name = "bad"
seeds = [1]
ratios = [0.5]

[dataset]
path = "data.jsonl"

[compressors.lines]
builtin = "goal-line"

[reader]
builtin = "field-lookup"

[judge]
builtin = "exact"
"#;

const GOOD_LINE: &str = r#"{"id": "s1", "text": "alpha: x=1", "goals": [{"id": "g1", "text": "about alpha", "questions": [{"id": "q1", "question": "what is x?", "reference": "1"}]}]}"#;

/// Asserts that `gacc validate` and `gacc run` refuse with status 2, and that stderr
/// contains every expected fragment; returns stderr.
fn refused(scratch: &Scratch, expected: &[&str]) -> String {
    let mut stderr = String::new();
    for command in ["validate", "run"] {
        let output = scratch.gacc().args([command, "bad.toml"]).output().unwrap();
        stderr = String::from_utf8(output.stderr).unwrap();
        assert_eq!(output.status.code(), Some(2), "{command}: {stderr}");
        for fragment in expected {
            assert!(
                stderr.contains(fragment),
                "{command}: expected {fragment:?} in:\n{stderr}"
            );
        }
    }
    assert!(
        !scratch.path(".gacc").exists(),
        "nothing ran, so no cache was made"
    );
    assert!(!scratch.path("runs").exists(), "no run folder was made");
    stderr
}

fn scratch_with(manifest: &str, dataset: &str) -> Scratch {
    let scratch = Scratch::empty();
    scratch.write("bad.toml", manifest);
    scratch.write("data.jsonl", dataset);
    scratch
}

#[test]
fn the_good_manifest_is_valid() {
    assert_valid(&scratch_with(MANIFEST, GOOD_LINE));
}

/// Asserts that `gacc validate` accepts `bad.toml`.
fn assert_valid(scratch: &Scratch) {
    let output = scratch.gacc().args(["validate", "bad.toml"]).output().unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn duplicate_ids_name_both_places() {
    let second = GOOD_LINE.replace("\"s1\"", "\"s2\"").replace("\"g1\"", "\"g2\"");
    let scratch = scratch_with(MANIFEST, &format!("{GOOD_LINE}\n{second}\n"));
    refused(
        &scratch,
        &["data.jsonl:2", "duplicate id `q1`", "first used at data.jsonl:1"],
    );
}

#[test]
fn a_source_without_goals() {
    let scratch = scratch_with(MANIFEST, r#"{"id": "s1", "text": "t", "goals": []}"#);
    refused(
        &scratch,
        &["data.jsonl:1 (source `s1`)", "the source has no goals"],
    );
}

#[test]
fn an_empty_goal() {
    let scratch = scratch_with(MANIFEST, &GOOD_LINE.replace("about alpha", "  "));
    refused(&scratch, &["goal `g1`", "the goal's text is empty"]);
}

#[test]
fn a_goal_without_questions() {
    let line = r#"{"id": "s1", "text": "t", "goals": [{"id": "g1", "text": "about t", "questions": []}]}"#;
    let scratch = scratch_with(MANIFEST, line);
    refused(&scratch, &["goal `g1`", "the goal has no questions"]);
}

#[test]
fn a_ratio_outside_zero_to_one() {
    let scratch = scratch_with(
        &MANIFEST.replace("ratios = [0.5]", "ratios = [0.5, 1.5]"),
        GOOD_LINE,
    );
    refused(
        &scratch,
        &["bad.toml", "line 3, column", "`1.5` is outside 0..=1"],
    );
}

#[test]
fn a_missing_dataset_file() {
    let scratch = Scratch::empty();
    scratch.write("bad.toml", MANIFEST);
    refused(&scratch, &["data.jsonl: cannot read the dataset"]);
}

#[test]
fn a_missing_source_file() {
    let line = GOOD_LINE.replace(r#""text": "alpha: x=1""#, r#""path": "sources/s1.txt""#);
    let scratch = scratch_with(MANIFEST, &line);
    refused(
        &scratch,
        &["source `s1`", "cannot read source file", "sources/s1.txt"],
    );
}

#[test]
fn an_empty_compressor_map() {
    let manifest = MANIFEST.replace("[compressors.lines]\nbuiltin = \"goal-line\"", "[compressors]");
    let scratch = scratch_with(&manifest, GOOD_LINE);
    refused(
        &scratch,
        &["key `compressors`", "expected at least one compressor"],
    );
}

#[test]
fn an_unknown_key_is_an_error_with_its_line() {
    let scratch = scratch_with(
        &MANIFEST.replace("seeds = [1]", "seeds = [1]\nratioz = [0.1]"),
        GOOD_LINE,
    );
    refused(
        &scratch,
        &["bad.toml", "line 3, column 1", "unknown field `ratioz`"],
    );
}

#[test]
fn a_wrong_type_names_the_line_and_the_expected_type() {
    let scratch = scratch_with(&MANIFEST.replace("seeds = [1]", "seeds = \"one\""), GOOD_LINE);
    refused(&scratch, &["line 2, column 9", "expected a sequence"]);
}

#[test]
fn a_broken_dataset_line_names_file_line_and_column() {
    let scratch = scratch_with(MANIFEST, &format!("{GOOD_LINE}\n{{\"id\": \"s2\", \"text\": \n"));
    refused(&scratch, &["data.jsonl:2:", "not a source record"]);
}

#[test]
fn every_problem_is_reported_at_once() {
    let manifest = MANIFEST
        .replace("name = \"bad\"", "name = \"Bad Name\"")
        .replace("[compressors.lines]\nbuiltin = \"goal-line\"", "[compressors]");
    let line = r#"{"id": "s1", "text": "t", "goals": [{"id": "g1", "text": "", "questions": []}]}"#;
    let scratch = scratch_with(&manifest, &format!("{line}\n{line}\n"));
    let stderr = refused(
        &scratch,
        &[
            "key `name`",
            "key `compressors`",
            "the goal's text is empty",
            "the goal has no questions",
            "duplicate id `s1`",
            "duplicate id `g1`",
        ],
    );
    assert!(stderr.contains("problems found"), "{stderr}");
}

#[test]
fn unknown_builtin_and_missing_program() {
    let manifest = MANIFEST
        .replace("builtin = \"goal-line\"", "builtin = \"goal-lines\"")
        .replace("builtin = \"exact\"", "command = [\"./no-such-judge.sh\"]");
    let scratch = scratch_with(&manifest, GOOD_LINE);
    refused(
        &scratch,
        &[
            "key `compressors.lines`",
            "`goal-lines` is not a built-in compressor: expected one of identity, prefix, goal-line, goal-bm25, random-sentences",
            "key `judge`",
            "program `./no-such-judge.sh` not found",
        ],
    );
}

#[test]
fn overrides_are_checked_and_named() {
    let scratch = scratch_with(MANIFEST, GOOD_LINE);
    let output = scratch
        .gacc()
        .args(["validate", "bad.toml", "--set", "run.concurrency=many"])
        .output()
        .unwrap();
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(
        stderr.contains("--set run.concurrency") && stderr.contains("expected usize"),
        "{stderr}"
    );

    let output = scratch
        .gacc()
        .args(["validate", "bad.toml"])
        .env("GACC_RUN__CONCURENCY", "4")
        .output()
        .unwrap();
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(
        stderr.contains("environment variable GACC_RUN__CONCURENCY") && stderr.contains("unknown key"),
        "{stderr}"
    );

    let output = scratch
        .gacc()
        .args(["validate", "bad.toml"])
        .env("GACC_RUN__CONCURRENCY", "3")
        .env("GACC_UNRELATED", "x")
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "a valid override, and GACC_ variables that are not manifest keys, pass"
    );

    let output = scratch
        .gacc()
        .args(["validate", "bad.toml", "--set", "novalue"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(
        String::from_utf8(output.stderr)
            .unwrap()
            .contains("expected key.path=value")
    );
}

#[test]
fn an_unset_secret_variable_is_named() {
    let manifest = MANIFEST.replace(
        "builtin = \"goal-line\"",
        "builtin = \"goal-line\"\nenv = [\"GACC_TEST_SURELY_UNSET_KEY\"]",
    );
    let scratch = scratch_with(&manifest, GOOD_LINE);
    refused(
        &scratch,
        &[
            "key `compressors.lines.env`",
            "`GACC_TEST_SURELY_UNSET_KEY` is listed but not set",
        ],
    );
}

#[test]
fn cross_goal_needs_two_sources() {
    let scratch = scratch_with(
        &MANIFEST.replace("ratios = [0.5]", "ratios = [0.5]\nconditions = [\"cross-goal\"]"),
        GOOD_LINE,
    );
    refused(&scratch, &["key `conditions`", "single source"]);
}

#[test]
fn a_missing_manifest() {
    let scratch = Scratch::empty();
    let output = scratch.gacc().args(["run", "nowhere.toml"]).output().unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(
        String::from_utf8(output.stderr)
            .unwrap()
            .contains("nowhere.toml: cannot read the manifest")
    );
}

#[test]
fn a_value_listed_twice_is_named_by_its_key() {
    for (line, key) in [
        ("seeds = [3, 1, 2, 1]", "seeds"),
        ("ratios = [0.5, 0.25, 0.5]", "ratios"),
        ("budgets = [64, 32, 64]", "budgets"),
        (
            "conditions = [\"no-goal\", \"own-goal\", \"no-goal\"]",
            "conditions",
        ),
    ] {
        let manifest = MANIFEST.replacen("seeds = [1]", &format!("seeds = [1]\n{line}"), 1);
        let manifest = match key {
            "seeds" => manifest.replacen("seeds = [1]\n", "", 1),
            "ratios" => manifest.replacen("ratios = [0.5]\n", "", 1),
            _ => manifest,
        };
        let scratch = scratch_with(&manifest, GOOD_LINE);
        refused(&scratch, &[&format!("`{key}`"), "lists a value twice"]);
    }
    // Distinct values, however many, are not a duplicate.
    let seeds: Vec<String> = (0..20_000).rev().map(|s| s.to_string()).collect();
    let manifest = MANIFEST.replacen("seeds = [1]", &format!("seeds = [{}]", seeds.join(", ")), 1);
    assert_valid(&scratch_with(&manifest, GOOD_LINE));
}

#[test]
fn a_cache_that_cannot_be_opened_is_named_by_its_key() {
    let scratch = scratch_with(
        &format!("{MANIFEST}\n[run]\ncache = \"data.jsonl/cache\"\n"),
        GOOD_LINE,
    );
    let output = scratch.gacc().args(["run", "bad.toml"]).output().unwrap();
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("data.jsonl/cache: cannot open the cache, `[run] cache` in bad.toml"),
        "{stderr}"
    );
    assert!(!scratch.path("runs").exists(), "no run folder was made");
}

#[test]
fn a_misspelt_or_mistyped_builtin_param_is_refused_naming_the_accepted_ones() {
    for (table, expected) in [
        (
            "[compressors.bm25]\nbuiltin = \"goal-bm25\"\nparams = { kl = 2.0 }\n",
            "`params.kl`: `goal-bm25` takes no such param; it takes k1, b",
        ),
        (
            "[compressors.bm25]\nbuiltin = \"goal-bm25\"\nparams = { k1 = \"high\" }\n",
            "`params.k1` must be a number ≥ 0, got \"high\"",
        ),
        (
            "[compressors.first]\nbuiltin = \"prefix\"\nparams = { n = 1 }\n",
            "`params.n`: `prefix` takes no params",
        ),
    ] {
        let manifest = MANIFEST.replacen("[compressors.lines]\nbuiltin = \"goal-line\"\n", table, 1);
        let scratch = scratch_with(&manifest, GOOD_LINE);
        refused(&scratch, &["bad.toml", expected]);
    }
    let manifest = MANIFEST.replacen(
        "[judge]\nbuiltin = \"exact\"\n",
        "[judge]\nbuiltin = \"token-f1\"\nparams = { threshold = 2 }\n",
        1,
    );
    refused(
        &scratch_with(&manifest, GOOD_LINE),
        &[
            "key `judge`",
            "`params.threshold` must be a number from 0 to 1, got 2",
        ],
    );
}

#[test]
fn a_record_that_does_not_read_names_its_source_goal_and_question() {
    let line = GOOD_LINE.replace(
        r#"{"id": "q1", "question": "what is x?", "reference": "1"}"#,
        r#"{"id": "q1", "question": "what is x?", "reference": "1"}, {"id": "q2", "question": "and y?"}"#,
    );
    assert!(line.contains("q2"));
    let scratch = scratch_with(MANIFEST, &line);
    refused(
        &scratch,
        &[
            "data.jsonl:1:",
            "missing field `reference`",
            "in source `s1`, goal `g1`, question `q2`",
        ],
    );
    // Without ids, by number.
    let line = r#"{"id": "s1", "text": "t", "goals": [{"text": "no id", "questions": []}]}"#;
    refused(&scratch_with(MANIFEST, line), &["in source `s1`, goal #1"]);
}

#[test]
fn evidence_that_normalises_to_nothing_or_of_the_wrong_type_is_refused_naming_the_question_and_field() {
    let scratch = Scratch::new();
    let fixture = std::fs::read_to_string(scratch.path("experiments/data/fixture.jsonl")).unwrap();
    let first = "\"reference\": \"451\"";
    assert!(fixture.contains(first));
    for (evidence, expected) in [
        (
            "\"the\"",
            "question `plant-reactor-temperature`: evidence span \"the\" has no words once normalised",
        ),
        (
            "[\"temperature=451\", \"!!!\"]",
            "evidence span \"!!!\" has no words once normalised",
        ),
        (
            "5",
            "field `evidence`: invalid type: integer `5`, expected evidence as a string or a list of strings (in source `plant`, goal `plant-reactor`, question `plant-reactor-temperature`)",
        ),
    ] {
        scratch.write(
            "experiments/data/fixture.jsonl",
            &fixture.replacen(first, &format!("{first}, \"evidence\": {evidence}"), 1),
        );
        let output = scratch
            .gacc()
            .args(["validate", "experiments/fixture.toml"])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{evidence}: {stderr}");
        assert!(
            stderr.contains(expected),
            "{evidence}: expected `{expected}` in:\n{stderr}"
        );
    }
}

#[test]
fn a_command_whose_script_is_missing_is_refused_before_anything_runs() {
    let scratch = Scratch::new();
    let manifest = scratch.fixture_with("typo", "command = [\"python3\", \"callbacks/overlapp.py\"]");
    for command in ["validate", "plan"] {
        let output = scratch.gacc().args([command, &manifest]).output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{command}: {stderr}");
        assert!(
            stderr.contains("key `compressors.goal-line`: script `callbacks/overlapp.py` not found at"),
            "{command}: {stderr}"
        );
        assert!(stderr.contains("experiments/callbacks/overlapp.py"), "{stderr}");
    }
}
