//! External tokenizers: verified with the pinned vectors before any compressor runs.

use crate::common;

use common::{Scratch, made, read_json};

/// The fixture with `[tokenizer]` replaced by an external command.
fn with_tokenizer(scratch: &Scratch, script: &str, settings: &str) -> &'static str {
    scratch.script("experiments/tok.sh", script);
    let manifest = std::fs::read_to_string(scratch.path("experiments/fixture.toml")).unwrap().replace(
        "[tokenizer]\nname = \"cl100k_base\"",
        &format!("[tokenizer]\nname = \"cl100k_base\"\ncommand = [\"./tok.sh\"]\nrevision = \"wrapped\"\n{settings}"),
    );
    scratch.write("experiments/external.toml", &manifest);
    "experiments/external.toml"
}

const WRAPPER: &str = "#!/bin/sh\nexec @GACC@ callback cl100k_base\n";
/// Off by one token on one vector: `rer` becomes 38150 instead of 38149.
const OFF_BY_ONE: &str =
    "#!/bin/sh\n@GACC@ callback cl100k_base | sed -u 's/^{\"tokens\":\\[38149\\]}$/{\"tokens\":[38150]}/'\n";

#[test]
fn a_script_wrapping_the_builtin_passes_verification_in_both_modes() {
    let scratch = Scratch::new();
    let (status, builtin, _) = scratch.run("experiments/fixture.toml", &[]);
    assert_eq!(status, 0);
    for mode in ["oneshot", "persistent"] {
        let manifest = with_tokenizer(&scratch, WRAPPER, &format!("mode = \"{mode}\""));
        let (status, folder, stderr) = scratch.run(manifest, &[]);
        assert_eq!(status, 0, "{mode}: {stderr}");
        let report = read_json(&folder.join("report.json"));
        assert_eq!(report["tokenizer"]["identity_verified"], true, "{mode}");
        assert_eq!(report["tokenizer"]["builtin"], false);
        assert_eq!(report["tokenizer"]["revision"], "wrapped");
        assert_eq!(
            report["cells"],
            read_json(&builtin.join("report.json"))["cells"],
            "{mode}: same results"
        );
    }
}

#[test]
fn cache_keys_bind_the_tokenizer() {
    let scratch = Scratch::new();
    assert_eq!(scratch.run("experiments/fixture.toml", &[]).0, 0);
    let manifest = with_tokenizer(&scratch, WRAPPER, "mode = \"persistent\"");
    let (status, folder, _) = scratch.run(manifest, &[]);
    assert_eq!(status, 0);
    assert_eq!(made(&folder, "compressor"), 12, "another tokenizer, other keys");
    let (status, folder, _) = scratch.run(manifest, &["--set", "tokenizer.revision=\"rewrapped\""]);
    assert_eq!(status, 0);
    assert_eq!(made(&folder, "compressor"), 12, "another revision, other keys");
    let (status, folder, _) = scratch.run(manifest, &["--set", "tokenizer.revision=\"rewrapped\""]);
    assert_eq!(status, 0);
    assert_eq!(made(&folder, "compressor"), 0);
}

#[test]
fn a_tokenizer_off_by_one_token_is_refused_with_the_vector_shown() {
    let scratch = Scratch::new();
    let manifest = with_tokenizer(&scratch, OFF_BY_ONE, "mode = \"persistent\"");
    let output = scratch.gacc().args(["run", manifest]).output().unwrap();
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("encode(\"rer\") gave [38150], expected [38149]"),
        "{stderr}"
    );
    assert!(stderr.contains("allow_unverified = true"), "{stderr}");
    assert!(
        !scratch.path(".gacc/cache/compressor").exists(),
        "no compressor ran"
    );
}

#[test]
fn allow_unverified_runs_and_says_so_loudly() {
    let scratch = Scratch::new();
    let manifest = with_tokenizer(
        &scratch,
        OFF_BY_ONE,
        "mode = \"persistent\"\nallow_unverified = true",
    );
    let (status, folder, stderr) = scratch.run(manifest, &[]);
    assert_eq!(status, 0, "{stderr}");
    let report = read_json(&folder.join("report.json"));
    assert_eq!(report["tokenizer"]["identity_verified"], false);
    assert_eq!(report["tokenizer"]["allow_unverified"], true);
    assert!(
        report["tokenizer"]["first_mismatch"]
            .as_str()
            .unwrap()
            .contains("\"rer\"")
    );
    let markdown = std::fs::read_to_string(folder.join("report.md")).unwrap();
    let warning = markdown
        .lines()
        .find(|l| l.contains("Tokenizer NOT verified"))
        .expect("a warning line");
    assert!(
        warning.contains("allow_unverified = true") && warning.contains("38150"),
        "{warning}"
    );
    assert!(stderr.contains("tokenizer NOT verified"), "{stderr}");
}

#[test]
fn a_tokenizer_that_crashes_is_a_clear_error() {
    let scratch = Scratch::new();
    let manifest = with_tokenizer(&scratch, "#!/bin/sh\necho 'no model here' >&2\nexit 3\n", "");
    let output = scratch.gacc().args(["validate", manifest]).output().unwrap();
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(stderr.contains("key `tokenizer`"), "{stderr}");
    assert!(stderr.contains("ended with exit status: 3"), "{stderr}");
    assert!(stderr.contains("stderr: no model here"), "{stderr}");
}

/// A tokenizer that, like an offline tiktoken, needs `TIKTOKEN_CACHE_DIR` to find its vocabulary.
const NEEDS_ITS_CACHE: &str = "#!/bin/sh\nif [ ! -f \"$TIKTOKEN_CACHE_DIR/cl100k_base.tiktoken\" ]; then echo \"no vocabulary in '$TIKTOKEN_CACHE_DIR'\" >&2; exit 1; fi\nexec @GACC@ callback cl100k_base\n";

#[test]
fn an_external_tokenizer_is_given_the_variables_its_env_lists() {
    let scratch = Scratch::new();
    scratch.write("vocab/cl100k_base.tiktoken", "stand-in\n");
    let vocab = scratch.path("vocab").display().to_string();
    let manifest = with_tokenizer(
        &scratch,
        NEEDS_ITS_CACHE,
        "mode = \"persistent\"\nenv = [\"TIKTOKEN_CACHE_DIR\"]",
    );
    let (status, folder, stderr) = scratch.run_with_env(manifest, &[], &[("TIKTOKEN_CACHE_DIR", &vocab)]);
    assert_eq!(status, 0, "{stderr}");
    let report = read_json(&folder.join("report.json"));
    assert_eq!(report["tokenizer"]["identity_verified"], true);
    // Without `env`, the variable is cleared like any other: the tokenizer cannot verify.
    let manifest = with_tokenizer(&scratch, NEEDS_ITS_CACHE, "mode = \"persistent\"");
    let (status, _, stderr) = scratch.run_with_env(manifest, &[], &[("TIKTOKEN_CACHE_DIR", &vocab)]);
    assert_eq!(status, 2, "{stderr}");
    assert!(stderr.contains("no vocabulary in ''"), "{stderr}");
    // Listed but not set: refused before anything runs, naming the key.
    let manifest = with_tokenizer(&scratch, NEEDS_ITS_CACHE, "env = [\"TIKTOKEN_CACHE_DIR\"]");
    let output = scratch
        .gacc()
        .args(["validate", manifest])
        .env_remove("TIKTOKEN_CACHE_DIR")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("key `tokenizer.env`") && stderr.contains("TIKTOKEN_CACHE_DIR"),
        "{stderr}"
    );
}
