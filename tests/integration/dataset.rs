//! Datasets: JSON Lines files, folders and globs of them, sources by path, and their stats.

use crate::common;

use common::{Scratch, read_json};

#[test]
fn the_bundled_dataset_has_the_promised_size() {
    let scratch = Scratch::new();
    let stats = scratch.json([
        "dataset",
        "stats",
        "experiments/data/baselines/baselines.jsonl",
        "--json",
    ]);
    assert_eq!(
        (
            stats["sources"].as_u64(),
            stats["goals"].as_u64(),
            stats["questions"].as_u64()
        ),
        (Some(6), Some(18), Some(54))
    );
    assert!(stats["tokens"]["min"].as_u64().unwrap() >= 500);
    assert!(stats["tokens"]["max"].as_u64().unwrap() <= 3000);
    let text = scratch
        .gacc()
        .args(["dataset", "stats", "experiments/baselines.toml"])
        .output()
        .unwrap();
    let text = String::from_utf8(text.stdout).unwrap();
    assert!(text.contains("6 sources, 18 goals, 54 questions"), "{text}");
    assert!(text.contains("tokens per source"), "{text}");
}

#[test]
fn a_dataset_path_may_be_a_glob_or_a_folder() {
    let scratch = Scratch::new();
    let fixture = std::fs::read_to_string(scratch.path("experiments/data/fixture.jsonl")).unwrap();
    let mut lines = fixture.lines();
    scratch.write("experiments/split/a.jsonl", lines.next().unwrap());
    scratch.write("experiments/split/b.jsonl", lines.next().unwrap());
    let manifest = std::fs::read_to_string(scratch.path("experiments/fixture.toml")).unwrap();
    let (status, whole, _) = scratch.run("experiments/fixture.toml", &[]);
    assert_eq!(status, 0);
    for path in ["split/*.jsonl", "split"] {
        scratch.write(
            "experiments/split.toml",
            &manifest.replace("data/fixture.jsonl", path),
        );
        let (status, folder, stderr) = scratch.run("experiments/split.toml", &[]);
        assert_eq!(status, 0, "{path}: {stderr}");
        let report = read_json(&folder.join("report.json"));
        assert_eq!(
            report["dataset"],
            read_json(&whole.join("report.json"))["dataset"],
            "{path}"
        );
        assert_eq!(
            report["cells"],
            read_json(&whole.join("report.json"))["cells"],
            "{path}"
        );
    }
    scratch.write(
        "experiments/split.toml",
        &manifest.replace("data/fixture.jsonl", "nowhere/*.jsonl"),
    );
    let output = scratch
        .gacc()
        .args(["validate", "experiments/split.toml"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(
        String::from_utf8(output.stderr)
            .unwrap()
            .contains("no dataset files match")
    );
}

#[test]
fn inline_sources_with_paths_relative_to_the_manifest() {
    let scratch = Scratch::empty();
    scratch.write("texts/s1.txt", "alpha: x=1 y=2\n");
    scratch.write(
        "inline.toml",
        r#"name = "inline"
ratios = [1]

[[dataset.sources]]
id = "s1"
path = "texts/s1.txt"
goals = [{ id = "g1", text = "about alpha", questions = [{ id = "q1", question = "what is x?", reference = "1" }] }]

[compressors.lines]
builtin = "goal-line"

[reader]
builtin = "field-lookup"

[judge]
builtin = "exact"
"#,
    );
    let (status, folder, stderr) = scratch.run("inline.toml", &[]);
    assert_eq!(status, 0, "{stderr}");
    assert_eq!(
        read_json(&folder.join("report.json"))["cells"][0]["micro"]["mean"],
        1.0
    );
}
