//! `gacc callback check`: every callback of a manifest sent synthetic requests before a paid
//! run, in the sandbox and mode of a run; protocol violations and sandbox denials named.

use crate::common;

use common::{Scratch, landlock_available, python3_on_path};

/// A manifest beside the fixture's dataset with one Python compressor.
fn manifest_with(scratch: &Scratch, script: &str, extra: &str) -> &'static str {
    scratch.write("experiments/callbacks/mine.py", script);
    scratch.write(
        "experiments/mine.toml",
        &format!(
            r#"name = "mine"
seeds = [1]
ratios = [0.5]
[dataset]
path = "data/fixture.jsonl"
[compressors.mine]
command = ["python3", "callbacks/mine.py"]
{extra}
[reader]
builtin = "field-lookup"
[judge]
builtin = "exact"
"#
        ),
    );
    "experiments/mine.toml"
}

/// (exit status, stdout) of `gacc callback check ARGS`.
fn check(scratch: &Scratch, args: &[&str]) -> (i32, String) {
    let output = scratch
        .gacc()
        .arg("callback")
        .arg("check")
        .args(args)
        .output()
        .unwrap();
    let stdout = String::from_utf8(output.stdout).unwrap();
    let stderr = String::from_utf8(output.stderr).unwrap();
    (output.status.code().unwrap_or(-1), format!("{stdout}\n{stderr}"))
}

#[test]
fn the_built_in_fixture_passes_with_every_probe() {
    let scratch = Scratch::new();
    let checked = scratch.json(["callback", "check", "experiments/fixture.toml", "--json"]);
    let callbacks = checked["callbacks"].as_array().unwrap();
    assert!(callbacks.len() >= 3);
    for callback in callbacks {
        assert_eq!(callback["works"], true, "{callback}");
        let asked: Vec<&str> = callback["requests"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["request"].as_str().unwrap())
            .collect();
        // Every role meets non-ASCII text and a 1 MB payload; compressors a null goal and L = 1.
        assert!(asked.contains(&"non-ASCII and emoji text"), "{asked:?}");
        assert!(asked.iter().any(|a| a.starts_with("a 1 MB")), "{asked:?}");
        if callback["role"] == "compressor" {
            assert!(asked.contains(&"no goal (goal = null)") && asked.contains(&"token_budget 1"));
        }
    }
}

#[test]
fn the_python_example_passes() {
    if !python3_on_path() {
        eprintln!("skipped: python3 is not on PATH");
        return;
    }
    let scratch = Scratch::new();
    std::fs::create_dir_all(scratch.path("python")).unwrap();
    std::fs::copy(
        concat!(env!("CARGO_MANIFEST_DIR"), "/python/gacc_callback/__init__.py"),
        scratch.path("python/gacc_callback.py"),
    )
    .unwrap();
    let (status, out) = check(&scratch, &["experiments/python-example.toml"]);
    assert_eq!(status, 0, "{out}");
    assert!(
        out.contains("compressors.goal-sentences (compressor, persistent, sandboxed): works")
            || (!landlock_available() && out.contains("compressors.goal-sentences")),
        "{out}"
    );
    assert!(out.contains("all 3 callbacks work"), "{out}");
}

#[test]
fn a_debug_line_on_stdout_is_named_as_a_protocol_violation() {
    if !python3_on_path() {
        eprintln!("skipped: python3 is not on PATH");
        return;
    }
    let scratch = Scratch::new();
    let noisy = "import json, sys\nrequest = json.loads(sys.stdin.read())\nprint('debug: got a request')\n\
                 print(json.dumps({'memory': request['context'][:40]}))\n";
    let manifest = manifest_with(&scratch, noisy, "");
    let (status, out) = check(&scratch, &[manifest, "mine"]);
    assert_eq!(status, 1, "{out}");
    assert!(
        out.contains("other output came with the response on stdout (`debug: got a request`)"),
        "{out}"
    );
    assert!(out.contains("protocol violation"), "{out}");
    assert!(out.contains("1 of 1 callbacks fail"), "{out}");

    // Persistent: the log line arrives where the reply should.
    let noisy_worker = "import json, sys\nfor line in sys.stdin:\n    request = json.loads(line)\n    \
                        print('debug: got a request')\n    print(json.dumps({'memory': 'm'}), flush=True)\n";
    let manifest = manifest_with(&scratch, noisy_worker, "mode = \"persistent\"");
    let (status, out) = check(&scratch, &[manifest, "mine"]);
    assert_eq!(status, 1, "{out}");
    assert!(out.contains("stdout began `debug: got a request`"), "{out}");
}

#[test]
fn a_persistent_callback_that_reads_stdin_to_its_end_is_told_why_it_hangs() {
    if !python3_on_path() {
        eprintln!("skipped: python3 is not on PATH");
        return;
    }
    let scratch = Scratch::new();
    let oneshot =
        "import json, sys\nrequest = json.loads(sys.stdin.read())\nprint(json.dumps({'memory': 'm'}))\n";
    let manifest = manifest_with(&scratch, oneshot, "mode = \"persistent\"\ntimeout = \"2s\"");
    let (status, out) = check(&scratch, &[manifest, "mine"]);
    assert_eq!(status, 1, "{out}");
    assert!(out.contains("timed out after 2s"), "{out}");
    assert!(out.contains("reads stdin to its end"), "{out}");
    // One timeout is enough: the other probes are not sent to wait as long.
    assert_eq!(
        out.matches("not sent: an earlier request timed out").count(),
        5,
        "{out}"
    );
}

#[test]
fn an_answer_without_memory_or_of_the_wrong_type_is_named() {
    if !python3_on_path() {
        eprintln!("skipped: python3 is not on PATH");
        return;
    }
    let scratch = Scratch::new();
    let script = "import json, sys\nrequest = json.loads(sys.stdin.read())\n\
                  print(json.dumps({'summary': 'x'} if request['goal'] else {'memory': 3}))\n";
    let manifest = manifest_with(&scratch, script, "");
    let (status, out) = check(&scratch, &[manifest, "compressors.mine"]);
    assert_eq!(status, 1, "{out}");
    assert!(out.contains("answered without the field `memory`"), "{out}");
    assert!(
        out.contains("answered without `memory` as a string (got a number)"),
        "{out}"
    );
}

#[test]
fn a_file_the_sandbox_denies_is_named_with_the_line_that_grants_it() {
    if !python3_on_path() || !landlock_available() {
        eprintln!("skipped: needs python3 and Landlock");
        return;
    }
    let scratch = Scratch::new();
    let outside = scratch.write("outside/vocabulary.txt", "harbour\n");
    let script = format!(
        "import json, sys\nrequest = json.loads(sys.stdin.read())\nwords = open({:?}).read()\n\
         print(json.dumps({{'memory': words}}))\n",
        outside.display().to_string()
    );
    let manifest = manifest_with(&scratch, &script, "");
    let (status, out) = check(&scratch, &[manifest, "mine"]);
    assert_eq!(status, 1, "{out}");
    assert!(out.contains("PermissionError"), "{out}");
    assert!(out.contains("the same request works unsandboxed"), "{out}");
    let folder = outside.parent().unwrap().display().to_string();
    assert!(out.contains(&format!("sandbox = {{ read = [\"{folder}")), "{out}");

    // With that line the same callback passes.
    let granted = format!("sandbox = {{ read = [\"{folder}\"] }}");
    let manifest = manifest_with(&scratch, &script, &granted);
    let (status, out) = check(&scratch, &[manifest, "mine"]);
    assert_eq!(status, 0, "{out}");
}

#[test]
fn an_unknown_callback_is_refused_with_the_names_there_are() {
    let scratch = Scratch::new();
    let (status, out) = check(&scratch, &["experiments/fixture.toml", "nonesuch"]);
    assert_eq!(status, 2, "{out}");
    assert!(out.contains("no callback is called `nonesuch`"), "{out}");
    assert!(out.contains("reader"), "{out}");
}

#[test]
fn a_judges_verdicts_are_shown_and_one_that_says_correct_to_everything_is_warned_of() {
    let scratch = Scratch::new();
    let (status, out) = check(&scratch, &["experiments/baselines.toml"]);
    assert_eq!(status, 0, "{out}");
    assert!(
        out.contains("verdict: correct") && out.contains("verdict: wrong"),
        "{out}"
    );
    assert!(!out.contains("may not be deciding"), "{out}");
    // A judge that says `{"correct": true}` to anything.
    let manifest = std::fs::read_to_string(scratch.path("experiments/fixture.toml"))
        .unwrap()
        .replace(
            "[judge]\nbuiltin = \"exact\"",
            "[judge]\ncommand = [\"sh\", \"-c\", \"cat > /dev/null; echo '{\\\"correct\\\": true, \\\"rationale\\\": \\\"one sentence\\\"}'\"]",
        );
    scratch.write("experiments/yes.toml", &manifest);
    let (_, out) = check(&scratch, &["experiments/yes.toml"]);
    assert!(out.contains("verdict: correct: one sentence"), "{out}");
    assert!(
        out.contains("warning: it said correct to both a right and a wrong answer: it may not be deciding"),
        "{out}"
    );
}

#[test]
fn a_judges_reason_that_echoes_a_key_is_shown_with_the_key_taken_out() {
    let key = "sk-check-0123456789abcdef-secret";
    let scratch = Scratch::new();
    let manifest = std::fs::read_to_string(scratch.path("experiments/fixture.toml"))
        .unwrap()
        .replace(
            "[judge]\nbuiltin = \"exact\"",
            "[judge]\ncommand = [\"sh\", \"-c\", \"cat > /dev/null; echo \\\"{\\\\\\\"correct\\\\\\\": true, \\\\\\\"rationale\\\\\\\": \\\\\\\"sent with $MY_API_KEY\\\\\\\"}\\\"; echo \\\"stderr $MY_API_KEY\\\" >&2\"]\nenv = [\"MY_API_KEY\"]",
        );
    scratch.write("experiments/echo.toml", &manifest);
    let output = scratch
        .gacc()
        .args(["callback", "check", "experiments/echo.toml"])
        .env("MY_API_KEY", key)
        .output()
        .unwrap();
    let out = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(!out.contains(key), "the key is shown: {out}");
    assert!(
        out.contains("verdict: correct: sent with [redacted:MY_API_KEY]"),
        "{out}"
    );
}
