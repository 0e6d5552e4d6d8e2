//! Versioned formats: a cache, a run folder or a Slurm work folder written by another gacc is
//! refused with the gacc that reads it, before anything is called; never read half-right.

use crate::common;

use common::Scratch;

#[test]
fn a_cache_of_the_format_before_it_was_named_is_refused_naming_the_gacc_that_reads_it() {
    let scratch = Scratch::new();
    // A cache as an earlier gacc left it: entries, no `format` file.
    let (status, _, stderr) = scratch.run("experiments/fixture.toml", &["-q"]);
    assert_eq!(status, 0, "{stderr}");
    let cache = scratch.path(".gacc/cache");
    assert_eq!(
        std::fs::read_to_string(cache.join("format")).unwrap(),
        "gacc.cache/2\n",
        "a new cache is marked with its format"
    );
    std::fs::remove_file(cache.join("format")).unwrap();
    let (status, _, stderr) = scratch.run("experiments/fixture.toml", &["-q"]);
    assert_eq!(status, 2, "{stderr}");
    assert!(
        stderr.contains("before the cache's format was named")
            && stderr.contains("gacc 0.1.0 at commit 8c6c977 or earlier reads it")
            && stderr.contains("this gacc reads gacc.cache/2")
            && stderr.contains("printf 'gacc.cache/2\\n' >"),
        "{stderr}"
    );
    assert!(
        !cache.join("format").exists(),
        "the refused cache is left as it was"
    );
    // One of a later format, from `gacc plan` as from `gacc run`.
    std::fs::write(cache.join("format"), "gacc.cache/3\n").unwrap();
    let output = scratch
        .gacc()
        .args(["plan", "experiments/fixture.toml"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("`gacc.cache/3`"), "{stderr}");
    // Marked as this gacc's, it runs from the cache with no call.
    std::fs::write(cache.join("format"), "gacc.cache/2\n").unwrap();
    let (status, folder, stderr) = scratch.run("experiments/fixture.toml", &["-q"]);
    assert_eq!(status, 0, "{stderr}");
    assert_eq!(common::made(&folder, "compressor"), 0);
}

#[test]
fn a_run_folder_with_its_rows_held_plain_is_refused_naming_the_gacc_that_reads_it() {
    let scratch = Scratch::new();
    let (status, folder, stderr) = scratch.run("experiments/fixture.toml", &["-q"]);
    assert_eq!(status, 0, "{stderr}");
    // The rows as a gacc before they were gzipped left them.
    for rows in ["results.jsonl", "memories.jsonl"] {
        let gzipped = folder.join(format!("{rows}.gz"));
        std::fs::write(folder.join(rows), common::read_bytes(&gzipped)).unwrap();
        std::fs::remove_file(gzipped).unwrap();
    }
    for command in ["report", "export"] {
        let output = scratch.gacc().arg(command).arg(&folder).output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{command}: {stderr}");
        assert!(
            stderr.contains(
                ".jsonl: held plain, not gzipped: gacc 0.1.0 at commit f503c55 or earlier reads it"
            ),
            "{command}: {stderr}"
        );
    }
}
