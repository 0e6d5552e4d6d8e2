//! Building a dataset (SPEC §16): a writer writes goals and questions, and a question is kept
//! only when it passes the checks in order (evidence, leak, duplicate, ceiling, closed-book);
//! the reads are made only for questions that passed the checks before them.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use crate::common;
use common::mock_api::{self, Behaviour, Format, MockApi};
use common::{Scratch, read_lines};

const HARBOUR: &str = "# The harbour\nThe ferry leaves from pier=3 every morning.\nAdults pay fare=12 euros.\nOn a clear day the sky=blue over the bay.\nHigh water is at tide=06:40.\n";
const LIBRARY: &str = "# The library\nA card for visitors costs card=20 euros.\nDoors open at opening=nine on weekdays.\nAbove the reading room the sky=blue glass dome.\n";

/// A writer that plants, in each goal, after a good question per `field=value` pair of its
/// source (but `sky`), one question of each bad kind: evidence not in the source, a reference
/// its goal gives away, a near-copy of the first question, one the source cannot answer
/// (ceiling) and one any reader answers with no memory (closed-book). It logs each request.
const WRITER: &str = r#"import json, sys
request = json.load(sys.stdin)
with open("writer.log", "a") as log:
    log.write(json.dumps(request) + "\n")
pairs = [w.strip(".").split("=", 1) for w in request["source"].split() if "=" in w]
if request["op"] == "goals":
    print(json.dumps({"goals": ["know what the first field says", "plan a visit, starting from the first field", "a goal more than asked"]}))
    sys.exit()
good = [{"question": f"What is the value of the {f} field in the document?", "reference": v, "evidence": [f"{f}={v}"]} for f, v in pairs if f != "sky"]
first_field, first_value = pairs[0]
planted = [
    {"question": "What is the value of the moon field?", "reference": "cheese", "evidence": ["moon=cheese"]},
    {"question": "Which field does the goal name?", "reference": "first field", "evidence": [f"{first_field}={first_value}"]},
    {"question": f"What is the value of the {first_field} field in the document now?", "reference": first_value, "evidence": [f"{first_field}={first_value}"]},
    {"question": "What is the value of the comet field?", "reference": first_value, "evidence": [f"{first_field}={first_value}"]},
    {"question": "What colour is the sky?", "reference": "blue", "evidence": ["sky=blue"]},
]
print(json.dumps({"questions": good + planted}))
"#;

/// A reader that answers the value of the field its question names, "blue" for the sky even
/// with no memory, and logs each request.
const READER: &str = r#"import json, sys
request = json.load(sys.stdin)
with open("reads.log", "a") as log:
    log.write(json.dumps(request) + "\n")
memory, question = request["memory"], request["question"]
answer = "unknown"
if "sky" in question:
    answer = "blue"
for word in memory.split():
    field, _, value = word.strip(".").partition("=")
    if value and f" {field} " in f" {question} ":
        answer = value
        break
print(json.dumps({"answer": answer}))
"#;

/// What each planted question's position after the good ones is dropped for.
const PLANTED: [&str; 5] = ["evidence", "leak", "duplicate", "ceiling", "closed-book"];

fn project(scratch: &Scratch, extra: &str) {
    scratch.write("docs/harbour.md", HARBOUR);
    scratch.write("docs/library.md", LIBRARY);
    scratch.write("writer.py", WRITER);
    scratch.write("reader.py", READER);
    scratch.write(
        "build.toml",
        &format!(
            r#"[build]
sources = "docs/*.md"
goals_per_source = 2
questions_per_goal = 20
out = "data/built.jsonl"
{extra}
[build.writer]
command = ["python3", "writer.py"]

[build.check]
reader = {{ command = ["python3", "reader.py"], sandbox = false }}
judge = {{ builtin = "normalized" }}
"#
        ),
    );
}

fn log(scratch: &Scratch, name: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(scratch.path(name)).unwrap_or_default();
    text.lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

fn build(scratch: &Scratch, args: &[&str]) -> (i32, String, String) {
    let out = scratch
        .gacc()
        .args(["dataset", "build", "build.toml"])
        .args(args)
        .output()
        .unwrap();
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    (
        out.status.code().unwrap_or(-1),
        text(&out.stdout),
        text(&out.stderr),
    )
}

fn files(scratch: &Scratch) -> BTreeMap<&'static str, Vec<u8>> {
    [
        "data/built.jsonl",
        "data/built.dropped.jsonl",
        "data/built.report.md",
    ]
    .into_iter()
    .map(|name| (name, std::fs::read(scratch.path(name)).unwrap()))
    .collect()
}

#[test]
fn a_build_keeps_exactly_the_questions_that_pass_every_check_and_reads_only_those_that_passed_before() {
    if !common::python3_on_path() {
        return;
    }
    let scratch = Scratch::empty();
    project(&scratch, "");

    // 1. A dry run calls nothing and writes nothing, and says what it would call.
    let (status, stdout, stderr) = build(&scratch, &["--dry-run"]);
    assert_eq!(status, 0, "{stderr}");
    assert!(stdout.contains("writer: 6 call(s) to make at most"), "{stdout}");
    assert!(
        stdout.contains("reader: 160 call(s)") && stdout.contains("judge: 160 call(s)"),
        "{stdout}"
    );
    assert!(!scratch.path("writer.log").exists() && !scratch.path("reads.log").exists());
    assert!(
        !scratch.path("data").exists() && !scratch.path(".gacc").exists(),
        "a dry run wrote a file"
    );

    // 2. The build.
    let (status, stdout, stderr) = build(&scratch, &[]);
    assert_eq!(status, 0, "{stderr}");
    assert_eq!(
        stdout.trim(),
        scratch.path("data/built.jsonl").display().to_string()
    );
    assert_eq!(
        log(&scratch, "writer.log").len(),
        6,
        "one goals call per source, one questions call per goal"
    );
    let dataset = read_lines(&scratch.path("data/built.jsonl"));
    let mut kept = BTreeSet::new();
    for source in &dataset {
        let id = source["id"].as_str().unwrap();
        let text = if id == "harbour" { HARBOUR } else { LIBRARY };
        assert_eq!(source["text"], text);
        let goals = source["goals"].as_array().unwrap();
        assert_eq!(goals.len(), 2, "the third goal is past goals_per_source");
        for goal in goals {
            for question in goal["questions"].as_array().unwrap() {
                assert!(
                    question["question"]
                        .as_str()
                        .unwrap()
                        .ends_with("field in the document?"),
                    "{question}"
                );
                kept.insert(question["id"].as_str().unwrap().to_owned());
            }
        }
    }
    // The good questions: harbour has pier, fare, tide (3), library card, opening (2); each
    // goal's planted questions follow them, so their ids are stable past the dropped ones.
    let good = |source: &'static str, n: usize| {
        (1..=2).flat_map(move |g| (1..=n).map(move |q| format!("{source}-g{g}-q{q}")))
    };
    let expected: BTreeSet<String> = good("harbour", 3).chain(good("library", 2)).collect();
    assert_eq!(kept, expected);
    let dropped = read_lines(&scratch.path("data/built.dropped.jsonl"));
    let mut reasons = BTreeMap::new();
    for row in &dropped {
        let id = row["id"].as_str().unwrap();
        let (source, position) = (
            row["source"].as_str().unwrap(),
            id.rsplit("-q").next().unwrap().parse::<usize>().unwrap(),
        );
        let first_planted = if source == "harbour" { 4 } else { 3 };
        assert_eq!(row["reason"], PLANTED[position - first_planted], "{row}");
        *reasons
            .entry(row["reason"].as_str().unwrap().to_owned())
            .or_insert(0) += 1;
        // A read decided it: the reader's answer is kept beside it.
        assert_eq!(
            row.get("answer").is_some(),
            matches!(row["reason"].as_str(), Some("ceiling" | "closed-book")),
            "{row}"
        );
    }
    assert_eq!(
        dropped.len(),
        20,
        "one of each of the 5 kinds in each of the 4 goals"
    );
    assert!(reasons.values().all(|n| *n == 4), "{reasons:?}");

    // Reads only for questions that passed the checks before: the ceiling read (the whole source)
    // for those that passed evidence, leak and duplicate; the closed-book read (no memory) for
    // those that also passed the ceiling.
    let reads = log(&scratch, "reads.log");
    let (mut ceiling, mut closed_book) = (BTreeSet::new(), BTreeSet::new());
    for read in &reads {
        let question = read["question"].as_str().unwrap().to_owned();
        match read["memory"].as_str().unwrap() {
            "" => closed_book.insert(question),
            _ => ceiling.insert(question),
        };
    }
    for question in &ceiling {
        assert!(
            !question.contains("moon") && !question.contains("goal name") && !question.ends_with("now?"),
            "read: {question}"
        );
    }
    assert!(ceiling.iter().any(|q| q.contains("comet")) && ceiling.iter().any(|q| q.contains("sky")));
    assert!(
        closed_book.iter().all(|q| !q.contains("comet")),
        "a question that failed the ceiling was read again"
    );
    assert!(closed_book.iter().any(|q| q.contains("sky")));

    // 3. The report counts kept and dropped per reason, per source; the dataset validates and runs.
    let report = std::fs::read_to_string(scratch.path("data/built.report.md")).unwrap();
    assert!(
        report.contains("10 of 30 questions kept, in 4 of 4 goals, from 2 of 2 sources"),
        "{report}"
    );
    assert!(
        report.contains("| `harbour` | 2 of 2 | 16 | 6 | 2 | 2 | 2 | 2 | 2 |"),
        "{report}"
    );
    assert!(
        report.contains("| `library` | 2 of 2 | 14 | 4 | 2 | 2 | 2 | 2 | 2 |"),
        "{report}"
    );
    assert!(
        report.contains("| **all** | 4 of 4 | 30 | 10 | 4 | 4 | 4 | 4 | 4 |"),
        "{report}"
    );
    scratch.write(
        "run.toml",
        "name = \"built\"\nratios = [0.5]\n[dataset]\npath = \"data/built.jsonl\"\n[compressors.prefix]\nbuiltin = \"prefix\"\n[reader]\ncommand = [\"python3\", \"reader.py\"]\nsandbox = false\n[judge]\nbuiltin = \"normalized\"\n",
    );
    scratch.gacc().args(["validate", "run.toml"]).assert().success();
    let (status, _, stderr) = scratch.run("run.toml", &["-q"]);
    assert_eq!(status, 0, "{stderr}");

    // 4. A second build makes no call and writes the same bytes.
    let before = files(&scratch);
    let (writes, reads) = (
        log(&scratch, "writer.log").len(),
        log(&scratch, "reads.log").len(),
    );
    let (status, _, stderr) = build(&scratch, &[]);
    assert_eq!(status, 0, "{stderr}");
    assert!(stderr.contains("0 call(s) made"), "{stderr}");
    assert_eq!(
        (
            log(&scratch, "writer.log").len(),
            log(&scratch, "reads.log").len()
        ),
        (writes, reads)
    );
    assert_eq!(files(&scratch), before);
    // Its dry run finds every call in the cache.
    let (_, stdout, _) = build(&scratch, &["--dry-run"]);
    assert!(
        stdout.contains("writer: 0 call(s) to make at most, 6 in the cache"),
        "{stdout}"
    );
}

#[test]
fn keep_closed_book_keeps_what_a_reader_answers_without_a_memory_and_reads_no_empty_memory() {
    if !common::python3_on_path() {
        return;
    }
    let scratch = Scratch::empty();
    project(&scratch, "keep_closed_book = true\n");
    let (status, _, stderr) = build(&scratch, &[]);
    assert_eq!(status, 0, "{stderr}");
    let reads = log(&scratch, "reads.log");
    assert!(
        reads.iter().all(|read| read["memory"] != ""),
        "no closed-book read"
    );
    let dropped = read_lines(&scratch.path("data/built.dropped.jsonl"));
    assert!(dropped.iter().all(|row| row["reason"] != "closed-book"));
    let report = std::fs::read_to_string(scratch.path("data/built.report.md")).unwrap();
    assert!(report.contains("skipped: `keep_closed_book = true`"), "{report}");
    assert!(
        report.contains("| **all** | 4 of 4 | 30 | 14 | 4 | 4 | 4 | 4 | 0 |"),
        "{report}"
    );
}

#[test]
fn a_writer_that_fails_writes_nothing_and_a_build_after_the_fix_resumes_from_the_cache() {
    if !common::python3_on_path() {
        return;
    }
    let scratch = Scratch::empty();
    project(&scratch, "");
    // The library's questions call fails: the harbour's calls are kept.
    let broken = WRITER.replace("good = [", "if request.get(\"goal\") and \"opening=\" in request[\"source\"]:\n    sys.exit(\"the writer broke\")\ngood = [");
    scratch.write("writer.py", &broken);
    let (status, _, stderr) = build(&scratch, &[]);
    assert_eq!(status, 1, "{stderr}");
    assert!(
        stderr.contains("build.writer") && stderr.contains("`library`"),
        "{stderr}"
    );
    assert!(
        stderr.contains("run `gacc dataset build build.toml` again to resume"),
        "{stderr}"
    );
    assert!(
        !scratch.path("data/built.jsonl").exists(),
        "a dataset missing a source was written"
    );
    let harbour_reads = log(&scratch, "reads.log").len();
    scratch.write("writer.py", WRITER);
    std::fs::remove_file(scratch.path("reads.log")).unwrap();
    let (status, _, stderr) = build(&scratch, &[]);
    assert_eq!(status, 0, "{stderr}");
    let again = log(&scratch, "reads.log");
    assert!(
        again
            .iter()
            .all(|read| !read["question"].as_str().unwrap().is_empty())
    );
    assert!(harbour_reads > 0 && !again.is_empty());
    assert!(
        again
            .iter()
            .all(|read| !read["memory"].as_str().unwrap().contains("harbour")),
        "the harbour read again"
    );
}

#[test]
fn a_bad_build_file_is_named_with_its_key() {
    let scratch = Scratch::empty();
    scratch.write("a/x.md", "one");
    scratch.write("b/x.md", "two");
    scratch.write("out/built.jsonl", "{}");
    let cases = [
        (
            "[build]\nsources = \"*/x.md\"\ngoals_per_source = 1\nquestions_per_goal = 1\nout = \"o.jsonl\"\n[build.writer]\nbuiltin = \"llm-writer\"\nparams = { model = \"none\" }\n[build.check]\nreader = { builtin = \"extractive\" }\njudge = { builtin = \"exact\" }\n",
            &["two sources have the id `x`", "key `build.writer`"][..],
        ),
        (
            "[build]\nsources = \"none/*.md\"\ngoals_per_source = 0\nquestions_per_goal = 1\nout = \"o.jsonl\"\n[build.writer]\nbuiltin = \"exact\"\n[build.check]\nreader = { builtin = \"extractive\" }\njudge = { builtin = \"llm-reader\" }\n",
            &[
                "matches no file",
                "key `build.goals_per_source`",
                "`exact` is not a built-in writer",
                "key `build.check.judge`",
            ][..],
        ),
        (
            "[build]\nsources = \"a/*.md\"\ngoals = 1\n",
            &["unknown field `goals`"][..],
        ),
    ];
    for (text, says) in cases {
        scratch.write("build.toml", text);
        let (status, _, stderr) = build(&scratch, &[]);
        assert_eq!(status, 2, "{stderr}");
        assert!(stderr.contains("build.toml"), "{stderr}");
        for said in says {
            assert!(stderr.contains(said), "{said}: {stderr}");
        }
    }
}

/// A build of one inline source by `llm-writer`, checked by the model reader and judge, all on
/// the mock model at `url`; `run` holds `cap`.
fn llm_build_file(url: &str, cap: &str) -> String {
    let text = "Inspection log of the north plant.\nreactor: temperature=451 pressure=12 status=green\nturbine: speed=3600 operator=marta\n";
    format!(
        r#"[build]
goals_per_source = 2
questions_per_goal = 3
out = "built.jsonl"
sources = [{{ id = "plant", text = {text:?} }}]

[build.writer]
builtin = "llm-writer"
params = {{ model = "mock", temperature = 0.7 }}

[build.check]
reader = {{ builtin = "llm-reader", params = {{ model = "mock" }} }}
judge = {{ builtin = "llm-judge", params = {{ model = "mock" }} }}

[models.mock]
api = "openai-chat"
base_url = "{url}"
model = "mock-1"
api_key_env = "MOCK_API_KEY"
{}

[run]
{cap}
"#,
        mock_api::PRICE
    )
}

/// `gacc dataset build build.toml ARGS` with the mock's key: its status and what it printed.
fn build_on_the_mock(scratch: &Scratch, args: &[&str]) -> (i32, String) {
    let out = (scratch.gacc())
        .env("MOCK_API_KEY", mock_api::KEY)
        .args(["dataset", "build", "build.toml"])
        .args(args)
        .output()
        .unwrap();
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), printed)
}

/// A server that echoes the key (in a 500, a 429, every reply's model name and the reader's
/// answers) to the writer, reader and judge: no byte of the key is in the build's files or
/// output, and the answers it was taken from say where.
#[test]
fn llm_writer_keeps_an_echoed_key_out_of_the_dataset_the_cache_and_the_terminal() {
    let mock = MockApi::start(
        Format::OpenAi,
        Behaviour {
            echo_key: true,
            ..Behaviour::default()
        },
    );
    let scratch = Scratch::empty();
    scratch.write("build.toml", &llm_build_file(&mock.url, ""));
    let (status, printed) = build_on_the_mock(&scratch, &[]);
    // The reader's answers carry the echoed key, taken out: none matches its reference, so
    // every question fails the ceiling check and no dataset is written.
    assert_eq!(status, 2, "{printed}");
    assert!(printed.contains("no question passed the checks"), "{printed}");
    let counts = mock.counts();
    // The goals call, a questions call per goal, the 500 and the 429 tried again.
    assert!(counts.get(&counts.writer) >= 3, "{printed}");
    mock_api::assert_no_key(&scratch, &printed);
    let dropped = read_lines(&scratch.path("built.dropped.jsonl"));
    let questions: Vec<&Value> = dropped.iter().filter(|row| row.get("id").is_some()).collect();
    assert_eq!(questions.len(), 6, "{dropped:?}");
    for row in questions {
        assert_eq!(row["reason"], "ceiling", "{row}");
        let answer = row["answer"].as_str().unwrap();
        assert!(answer.contains("[redacted:MOCK_API_KEY]"), "{answer}");
    }
    for file in ["built.dropped.jsonl", "built.report.md"] {
        let text = std::fs::read_to_string(scratch.path(file)).unwrap();
        assert!(!text.contains("0123456789abcdef"), "the key is in {file}");
    }
    assert!(!scratch.path("built.jsonl").exists());
}

/// `llm-writer` on the mock model: a reply that holds no JSON is a failed call tried again; the
/// calls are priced, the cap holds, the key is in no file.
#[test]
fn llm_writer_builds_from_a_table_of_sources_on_the_mock_model() {
    let mock = MockApi::start(
        Format::OpenAi,
        Behaviour {
            prose_writer_first: 1,
            ..Behaviour::default()
        },
    );
    let scratch = Scratch::empty();
    let build_file = |cap: &str| llm_build_file(&mock.url, cap);
    let run = |args: &[&str]| build_on_the_mock(&scratch, args);
    scratch.write("build.toml", &build_file("max_cost_usd = 0.0000001"));
    let (status, printed) = run(&["--dry-run"]);
    assert_eq!((status, mock.requests()), (0, 0), "{printed}");
    let most: f64 = printed
        .split("at most $")
        .last()
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(most > 0.0, "{printed}");
    // The cap stops the build before its first call: exit status 3, nothing written.
    let (status, printed) = run(&[]);
    assert_eq!(status, 3, "{printed}");
    assert!(printed.contains("max_cost_usd"), "{printed}");
    assert!(!scratch.path("built.jsonl").exists());

    scratch.write("build.toml", &build_file(""));
    let (status, printed) = run(&[]);
    assert_eq!(status, 0, "{printed}");
    let counts = mock.counts();
    // One goals call, a questions call per goal, and the prose reply tried again.
    assert_eq!(counts.get(&counts.writer), 4);
    let dataset = read_lines(&scratch.path("built.jsonl"));
    let goals = dataset[0]["goals"].as_array().unwrap();
    assert_eq!(goals.len(), 2);
    let questions: Vec<&str> = goals[0]["questions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| q["reference"].as_str().unwrap())
        .collect();
    assert_eq!(
        questions,
        ["451", "12", "green"],
        "the first questions_per_goal of the reply"
    );
    let report = std::fs::read_to_string(scratch.path("built.report.md")).unwrap();
    let writer_usd: f64 = report
        .lines()
        .find(|l| l.starts_with("| writer |"))
        .unwrap()
        .rsplit('|')
        .nth(1)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(writer_usd > 0.0, "{report}");
    mock_api::assert_no_key(&scratch, &printed);
    let requests = mock.requests();
    let (status, printed) = run(&[]);
    assert_eq!((status, mock.requests()), (0, requests), "{printed}");
}
