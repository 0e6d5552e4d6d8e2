//! A run that travels (SPEC §12): `gacc pack`, `gacc unpack`, `gacc run --from`. A pack made
//! in one folder replays in another with no cache of its own: zero calls, the same
//! report.json byte for byte; a changed manifest calls only what the pack lacks; a changed or
//! hostile member is refused, naming it, and leaves nothing behind.

use crate::common;

use std::io::Read;
use std::path::{Path, PathBuf};

use common::{Scratch, made, read_bytes, read_json};

/// Runs `experiments/<name>.toml` in a scratch folder and packs it; the pack's path.
fn packed(scratch: &Scratch, name: &str) -> (PathBuf, PathBuf) {
    let (status, folder, stderr) = scratch.run(&format!("experiments/{name}.toml"), &["-q"]);
    assert_eq!(status, 0, "{stderr}");
    let pack = scratch.path(&format!("{name}.gacc.tar.gz"));
    let output = scratch
        .gacc()
        .args(["pack", folder.to_str().unwrap(), "-o", pack.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&output.stdout).trim(),
        pack.to_str().unwrap()
    );
    (folder, pack)
}

/// `pack` unpacked in a new scratch folder (no cache, no experiments/); that folder and the
/// packed run's manifest.
fn unpacked_elsewhere(pack: &Path) -> (Scratch, PathBuf) {
    let elsewhere = Scratch::empty();
    let unpacked = elsewhere.path("shared");
    let output = elsewhere
        .gacc()
        .args(["unpack", pack.to_str().unwrap(), unpacked.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    (elsewhere, unpacked.join("run/manifest.toml"))
}

/// The pack's members and their bytes, in order.
fn members(pack: &Path) -> Vec<(String, Vec<u8>)> {
    let file = std::fs::File::open(pack).unwrap();
    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(file));
    archive
        .entries()
        .unwrap()
        .map(|entry| {
            let mut entry = entry.unwrap();
            let name = entry.path().unwrap().to_string_lossy().into_owned();
            let mut bytes = Vec::new();
            entry.read_to_end(&mut bytes).unwrap();
            (name, bytes)
        })
        .collect()
}

/// Writes `members` as a pack (a .tar.gz) at `path`, each as `kind` says.
fn write_pack(path: &Path, members: &[(String, Vec<u8>)], kind: impl Fn(&str) -> tar::EntryType) {
    let file = std::fs::File::create(path).unwrap();
    let mut builder = tar::Builder::new(flate2::write::GzEncoder::new(file, flate2::Compression::fast()));
    for (name, bytes) in members {
        let mut header = tar::Header::new_gnu();
        header.set_size(bytes.len() as u64);
        header.set_mode(0o644);
        header.set_entry_type(kind(name));
        if kind(name) == tar::EntryType::Symlink {
            header.set_size(0);
            header.set_link_name("/etc/passwd").unwrap();
        }
        // The name is written into the header as given (no checks), as a hostile pack would.
        let raw = &mut header.as_old_mut().name;
        raw.fill(0);
        raw[..name.len()].copy_from_slice(name.as_bytes());
        header.set_cksum();
        let body: &[u8] = if kind(name) == tar::EntryType::Symlink {
            &[]
        } else {
            bytes
        };
        builder.append(&header, body).unwrap();
    }
    builder.into_inner().unwrap().finish().unwrap();
}

#[test]
fn a_pack_replays_elsewhere_with_zero_calls_and_the_same_report() {
    for name in ["fixture", "baselines"] {
        let scratch = Scratch::new();
        let (folder, pack) = packed(&scratch, name);
        let listed: Vec<String> = members(&pack).into_iter().map(|(name, _)| name).collect();
        assert!(listed.contains(&"run/report.json".to_owned()), "{listed:?}");
        assert!(
            listed.contains(&"cache/segments/pack.log".to_owned()),
            "{listed:?}"
        );
        assert_eq!(listed.last().map(String::as_str), Some("SHA256SUMS"));

        // Elsewhere: another folder, no cache, no experiments/.
        let (elsewhere, manifest) = unpacked_elsewhere(&pack);
        let from = ["--from", pack.to_str().unwrap()];
        let (status, replay, stderr) = elsewhere.run(manifest.to_str().unwrap(), &from);
        assert_eq!(status, 0, "{name}: {stderr}");
        for role in ["compressor", "reader", "judge"] {
            assert_eq!(made(&replay, role), 0, "{name}: {role} calls on a replay");
        }
        assert_eq!(
            read_bytes(&replay.join("report.json")),
            read_bytes(&folder.join("report.json")),
            "{name}: report.json differs on a replay"
        );

        // One more ratio: only what the pack lacks is called, call by call.
        let report = read_json(&folder.join("report.json"));
        let mut ratios: Vec<f64> = (report["experiment"]["ratios"].as_array().unwrap())
            .iter()
            .map(|r| r.as_f64().unwrap())
            .collect();
        ratios.push(0.37);
        let set = format!("ratios={ratios:?}");
        let (status, more, stderr) = elsewhere.run(
            manifest.to_str().unwrap(),
            &["--from", pack.to_str().unwrap(), "--set", &set],
        );
        assert_eq!(status, 0, "{name}: {stderr}");
        for (role, file) in [
            ("compressor", "memories.jsonl.gz"),
            ("reader", "results.jsonl.gz"),
            ("judge", "results.jsonl.gz"),
        ] {
            let packed = call_keys(&folder.join(file), role);
            let lacking = call_keys(&more.join(file), role).difference(&packed).count() as u64;
            assert!(lacking > 0, "{name}: a new ratio needs new {role} calls");
            assert_eq!(
                made(&more, role),
                lacking,
                "{name}: {role} calls beyond what the pack holds"
            );
        }
    }
}

#[test]
fn a_changed_or_hostile_member_is_refused_by_name_and_leaves_nothing() {
    let scratch = Scratch::new();
    let (_, pack) = packed(&scratch, "fixture");
    let good = members(&pack);
    let regular = |_: &str| tar::EntryType::Regular;
    let refused = |members: &[(String, Vec<u8>)], kind: &dyn Fn(&str) -> tar::EntryType, expected: &str| {
        let bad = scratch.path("bad.gacc.tar.gz");
        write_pack(&bad, members, kind);
        let into = scratch.path("into");
        let output = scratch
            .gacc()
            .args(["unpack", bad.to_str().unwrap(), into.to_str().unwrap()])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains(expected), "expected `{expected}` in: {stderr}");
        assert!(
            !stderr.contains('\u{1b}'),
            "a raw escape reached the terminal: {stderr:?}"
        );
        assert!(!into.exists(), "a refused pack left {}", into.display());
        let left: Vec<_> = std::fs::read_dir(scratch.dir.path())
            .unwrap()
            .filter_map(Result::ok)
            .filter(|e| e.file_name().to_string_lossy().contains("unpacking"))
            .collect();
        assert!(left.is_empty(), "a refused pack left its staging folder");
        // `--from` reads the same way.
        let (status, _, stderr) = scratch.run("experiments/fixture.toml", &["--from", bad.to_str().unwrap()]);
        assert_ne!(status, 0);
        assert!(
            stderr.contains(expected),
            "--from: expected `{expected}` in: {stderr}"
        );
    };

    // A member's bytes changed after packing.
    let mut changed = good.clone();
    let report = changed
        .iter_mut()
        .find(|(name, _)| name == "run/report.json")
        .unwrap();
    report.1 = String::from_utf8(report.1.clone())
        .unwrap()
        .replacen("0.6666", "0.9999", 1)
        .into_bytes();
    refused(&changed, &regular, "member `run/report.json`: SHA-256 is");

    // A member the list does not name, and one the list names that is missing.
    let mut extra = good.clone();
    extra.insert(0, ("run/extra.txt".into(), b"x".to_vec()));
    refused(&extra, &regular, "member `run/extra.txt` is not in SHA256SUMS");
    let missing: Vec<_> = good
        .iter()
        .filter(|(name, _)| name != "run/run.json")
        .cloned()
        .collect();
    refused(&missing, &regular, "SHA256SUMS lists `run/run.json`");

    // Names that leave the folder, and a link.
    for name in ["../escape.txt", "/tmp/absolute.txt", "run/../../escape.txt"] {
        let mut hostile = good.clone();
        hostile.insert(0, (name.into(), b"x".to_vec()));
        refused(&hostile, &regular, "leaves the pack's folder");
        assert!(!scratch.dir.path().parent().unwrap().join("escape.txt").exists());
    }
    // A name with control characters (a terminal escape) is refused and shown escaped.
    let mut painted = good.clone();
    painted.insert(0, ("run/\u{1b}[31mred".into(), b"x".to_vec()));
    refused(
        &painted,
        &regular,
        "member `run/\\u{1b}[31mred` leaves the pack's folder",
    );
    let mut listed = good.clone();
    let sums = &mut listed.last_mut().unwrap().1;
    sums.extend_from_slice(format!("{}  run/\u{1b}[2Jgone\n", "0".repeat(64)).as_bytes());
    refused(&listed, &regular, "SHA256SUMS lists `run/\\u{1b}[2Jgone`");
    let mut linked = good.clone();
    linked.insert(0, ("run/link".into(), Vec::new()));
    let link = |name: &str| {
        if name == "run/link" {
            tar::EntryType::Symlink
        } else {
            tar::EntryType::Regular
        }
    };
    refused(&linked, &link, "member `run/link` is not a regular file");

    // A folder that is there already is left alone.
    std::fs::create_dir_all(scratch.path("there")).unwrap();
    let output = scratch
        .gacc()
        .args(["unpack", pack.to_str().unwrap(), "there"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("there: is there already"));

    // Cut short: no list at the end.
    refused(&good[..good.len() - 1], &regular, "no SHA256SUMS");
    // Not a pack at all.
    let garbage = scratch.write("garbage.gacc.tar.gz", "not gzip");
    let output = scratch
        .gacc()
        .args(["unpack", garbage.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("garbage.gacc.tar.gz"));
}

#[test]
fn a_pack_needs_the_runs_cache_and_says_which_entry_is_missing() {
    let scratch = Scratch::new();
    let (status, folder, stderr) = scratch.run("experiments/fixture.toml", &["-q"]);
    assert_eq!(status, 0, "{stderr}");
    // A cache that exists but holds none of the run's entries.
    std::fs::create_dir_all(scratch.path("other/segments")).unwrap();
    let output = scratch
        .gacc()
        .args([
            "pack",
            folder.to_str().unwrap(),
            "--cache",
            "other",
            "-o",
            "x.gacc.tar.gz",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("are not in this cache"), "{stderr}");
    assert!(!scratch.path("x.gacc.tar.gz").exists());
    // Rows that name no entries (an older gacc's) cannot make a pack that replays.
    let old = scratch.path("old-run");
    std::fs::create_dir_all(&old).unwrap();
    for name in ["results.jsonl", "memories.jsonl"] {
        let gzipped = folder.join(format!("{name}.gz"));
        let text = common::read_text(&gzipped);
        let stripped: String = common::read_lines(&gzipped)
            .into_iter()
            .map(|mut row| {
                row.as_object_mut().unwrap().remove("calls");
                format!("{row}\n")
            })
            .collect();
        assert_ne!(text, stripped);
        std::fs::write(old.join(format!("{name}.gz")), common::gzip(stripped.as_bytes())).unwrap();
    }
    let output = scratch
        .gacc()
        .args(["pack", old.to_str().unwrap(), "-o", "z.gacc.tar.gz"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("its rows name no cache entries"));
    assert!(!scratch.path("z.gacc.tar.gz").exists());

    // With --no-dataset the dataset stays out and its SHA-256 goes in.
    let output = scratch
        .gacc()
        .args([
            "pack",
            folder.to_str().unwrap(),
            "--no-dataset",
            "-o",
            "y.gacc.tar.gz",
        ])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let listed = members(&scratch.path("y.gacc.tar.gz"));
    assert!(listed.iter().all(|(name, _)| name != "run/dataset.jsonl"));
    let (_, sum) = listed
        .iter()
        .find(|(name, _)| name == "run/dataset.sha256")
        .unwrap();
    let dataset = read_bytes(&folder.join("dataset.jsonl"));
    let expected = sha256_hex(&dataset);
    assert_eq!(
        String::from_utf8_lossy(sum),
        format!("{expected}  dataset.jsonl\n")
    );
}

/// The distinct keys of `role`'s calls the rows of `file` name.
fn call_keys(file: &Path, role: &str) -> std::collections::BTreeSet<String> {
    common::read_lines(file)
        .iter()
        .filter_map(|row| Some(row["calls"][role].as_str()?.to_owned()))
        .collect()
}

fn sha256_hex(bytes: &[u8]) -> String {
    let output = std::process::Command::new("sha256sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write;
            child.stdin.take().unwrap().write_all(bytes)?;
            child.wait_with_output()
        })
        .unwrap();
    String::from_utf8_lossy(&output.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_owned()
}

#[test]
fn a_model_runs_pack_replays_with_no_request_to_its_server() {
    use common::mock_api::{Behaviour, Format, KEY, MockApi, llm_manifest};
    let scratch = Scratch::new();
    let api = MockApi::start(Format::OpenAi, Behaviour::default());
    scratch.write(
        "experiments/llm.toml",
        &llm_manifest(&api.url, Format::OpenAi, "", ""),
    );
    let key = [("MOCK_API_KEY", KEY)];
    let (status, folder, stderr) = scratch.run_with_env("experiments/llm.toml", &["-q"], &key);
    assert_eq!(status, 0, "{stderr}");
    let paid = api.requests();
    assert!(paid > 0);
    let pack = scratch.path("llm.gacc.tar.gz");
    let output = scratch
        .gacc()
        .args(["pack", folder.to_str().unwrap(), "-o", pack.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    common::mock_api::assert_no_key(&scratch, &String::from_utf8_lossy(&output.stderr));
    let packed = members(&pack);
    assert!(
        packed
            .iter()
            .all(|(_, bytes)| !String::from_utf8_lossy(bytes).contains(KEY))
    );

    let (elsewhere, manifest) = unpacked_elsewhere(&pack);
    let from = ["--from", pack.to_str().unwrap()];
    // No key on this machine: the pack answers every call, so none is needed.
    let (status, replay, stderr) = elsewhere.run(manifest.to_str().unwrap(), &from);
    assert_eq!(status, 0, "{stderr}");
    assert_eq!(api.requests(), paid, "a replay sent requests to the server");
    for role in ["compressor", "reader", "judge"] {
        assert_eq!(made(&replay, role), 0, "{role} calls on a replay");
    }
    assert_eq!(
        read_bytes(&replay.join("report.json")),
        read_bytes(&folder.join("report.json"))
    );

    // A call the pack lacks needs the key: without it, it fails at once, saying why.
    let more = ["--from", pack.to_str().unwrap(), "--set", "ratios=[0.15, 0.4]"];
    let (status, _, stderr) = elsewhere.run(manifest.to_str().unwrap(), &more);
    assert_eq!(status, 1, "{stderr}");
    let expected = "`api_key_env` names `MOCK_API_KEY`, which is not set: this call is not in the pack";
    assert!(stderr.contains(expected), "expected `{expected}` in:\n{stderr}");
    assert_eq!(api.requests(), paid, "a call without its key reached the server");
    // With the key, it is made.
    let (status, _, stderr) = elsewhere.run_with_env(manifest.to_str().unwrap(), &more, &key);
    assert_eq!(status, 0, "{stderr}");
    assert!(api.requests() > paid);
    let paid = api.requests();

    // A reviewer without the key verifies it: no key is needed where no call may be made.
    let (status, printed) = verify(&elsewhere, &pack, &[]);
    assert_eq!((status, printed.as_str()), (0, "verified\n"));
    assert_eq!(api.requests(), paid, "verify sent requests to the server");
}

/// `members` with `SHA256SUMS` made to match them again (a tamperer who knows the format).
fn resummed(members: &[(String, Vec<u8>)]) -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<_> = members
        .iter()
        .filter(|(name, _)| name != "SHA256SUMS")
        .cloned()
        .collect();
    let sums: String = out
        .iter()
        .map(|(name, bytes)| format!("{}  {name}\n", sha256_hex(bytes)))
        .collect();
    out.push(("SHA256SUMS".into(), sums.into_bytes()));
    out
}

/// `gacc verify` on `target`: (exit status, stdout).
fn verify(scratch: &Scratch, target: &Path, extra: &[&str]) -> (i32, String) {
    let output = scratch
        .gacc()
        .arg("verify")
        .arg(target)
        .args(extra)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    (
        output.status.code().unwrap(),
        stdout + &String::from_utf8_lossy(&output.stderr),
    )
}

#[test]
fn verify_passes_a_true_pack_and_names_each_figure_that_does_not_follow() {
    let scratch = Scratch::new();
    let (folder, pack) = packed(&scratch, "fixture");
    assert_eq!(verify(&scratch, &pack, &[]), (0, "verified\n".to_owned()));
    let (status, printed) = verify(&scratch, &folder, &[]);
    assert_eq!((status, printed.trim()), (0, "verified"));
    let good = members(&pack);
    let edited = |member: &str, edit: &dyn Fn(String) -> String| {
        let mut changed = good.clone();
        let (_, bytes) = changed.iter_mut().find(|(name, _)| name == member).unwrap();
        *bytes = if member.ends_with(".gz") {
            let mut text = String::new();
            std::io::Read::read_to_string(&mut flate2::read::MultiGzDecoder::new(&bytes[..]), &mut text)
                .unwrap();
            common::gzip(edit(text).as_bytes())
        } else {
            edit(String::from_utf8(bytes.clone()).unwrap()).into_bytes()
        };
        assert_ne!(changed, good, "{member}: the edit changed nothing");
        changed
    };
    let refused = |members: Vec<(String, Vec<u8>)>, expected: &[&str]| {
        let bad = scratch.path("tampered.gacc.tar.gz");
        write_pack(&bad, &members, |_| tar::EntryType::Regular);
        let (status, printed) = verify(&scratch, &bad, &[]);
        assert_eq!(status, 1, "{printed}");
        for part in expected {
            assert!(printed.contains(part), "expected `{part}` in:\n{printed}");
        }
    };

    // A result row's verdict flipped: its judge entry says otherwise.
    let flipped = edited("run/results.jsonl.gz", &|text| {
        text.replacen("\"correct\":true", "\"correct\":false", 1)
    });
    refused(
        resummed(&flipped),
        &["results.jsonl.gz line", "correct: stated false, recomputed true"],
    );

    // A Micro in report.json edited.
    let micro = edited("run/report.json", &|text| {
        text.replacen("\"micro\": 0.6666666666666666", "\"micro\": 0.75", 1)
    });
    refused(
        resummed(&micro),
        &["report.json: cells[0].seeds[0].micro: stated 0.75, recomputed 0.6666666666666666"],
    );

    // A ledger L edited.
    let budget = edited("run/memories.jsonl.gz", &|text| {
        text.replacen("\"budget\":11,", "\"budget\":12,", 1)
    });
    refused(
        resummed(&budget),
        &["memories.jsonl.gz line 1: budget: stated 12, recomputed 11"],
    );

    // A memory's text edited in the entries (its checksum made to match): its counts no longer follow.
    let text = edited("cache/segments/pack.log", &|segment| {
        segment
            .lines()
            .map(|line| {
                let fields: Vec<&str> = line.splitn(4, ' ').collect();
                if fields[1] != "text" {
                    return format!("{line}\n");
                }
                let payload =
                    fields[3].replacen("\"memory\":\"", "\"memory\":\"Not what the compressor wrote. ", 1);
                format!(
                    "{} {} {} {payload}\n",
                    fields[0],
                    fields[1],
                    sha256_hex(payload.as_bytes())
                )
            })
            .collect()
    });
    refused(
        resummed(&text),
        &["report.json: integrity.count_errors: stated 0, recomputed 12"],
    );

    // A member's bytes changed (the list left alone).
    refused(micro, &["run/report.json: sha256: stated"]);

    // A dataset that is not the one packed.
    let other = scratch.write(
        "other.jsonl",
        &std::fs::read_to_string(folder.join("dataset.jsonl"))
            .unwrap()
            .replacen("reactor", "turbine", 1),
    );
    let (status, printed) = verify(&scratch, &pack, &["--dataset", other.to_str().unwrap()]);
    assert_eq!(status, 1, "{printed}");
    assert!(
        printed.contains("report.json: dataset.sha256: stated"),
        "{printed}"
    );
}

#[test]
fn rejudge_reports_the_share_a_disagreeing_judge_disagrees_on_and_its_kappa() {
    let scratch = Scratch::new();
    let (folder, pack) = packed(&scratch, "baselines");
    // The run's judge is `contains`; `exact` disagrees wherever a right answer is more than the
    // reference (the extractive reader answers with a whole sentence).
    let (status, printed) = verify(&scratch, &pack, &["--rejudge", "exact", "--fraction", "1"]);
    assert_eq!(status, 0, "{printed}");
    let references: std::collections::HashMap<String, String> =
        common::read_lines(&folder.join("dataset.jsonl"))
            .iter()
            .flat_map(|source| source["goals"].as_array().unwrap().clone())
            .flat_map(|goal| goal["questions"].as_array().unwrap().clone())
            .map(|q| {
                (
                    q["id"].as_str().unwrap().to_owned(),
                    q["reference"].as_str().unwrap().to_owned(),
                )
            })
            .collect();
    let (mut n, mut agree, mut run_yes, mut exact_yes, mut run_only, mut exact_only) =
        (0.0, 0.0, 0.0, 0.0, 0, 0);
    for row in common::read_lines(&folder.join("results.jsonl.gz")) {
        let (Some(run), Some(answer)) = (row["correct"].as_bool(), row["answer"].as_str()) else {
            continue;
        };
        let exact = answer.trim() == references[row["question_id"].as_str().unwrap()].trim();
        n += 1.0;
        agree += f64::from(u8::from(run == exact));
        run_yes += f64::from(u8::from(run));
        exact_yes += f64::from(u8::from(exact));
        run_only += usize::from(run && !exact);
        exact_only += usize::from(exact && !run);
    }
    let observed = agree / n;
    let chance = (run_yes / n) * (exact_yes / n) + (1.0 - run_yes / n) * (1.0 - exact_yes / n);
    // None where either judge gave one verdict throughout (`exact` may find no sentence right).
    let varied = |yes: f64| yes > 0.0 && yes < n;
    let kappa = (varied(run_yes) && varied(exact_yes)).then(|| (observed - chance) / (1.0 - chance));
    assert!(
        observed < 0.9 && run_only > 0,
        "the judges should disagree: {observed}"
    );
    let expected = format!("rejudged by `exact` (1 of answers): {n} compared, agreement ");
    let counts = format!("run's judge right and `exact` not {run_only}, the reverse {exact_only}");
    assert_spot_line(&printed, &expected, (observed, kappa), &counts);
}

/// Whether a spot check's seeded share at `fraction` holds the question `id`: the SHA-256 of
/// `[0, id, ""]` (as JSON), read as a number in [0, 1), below `fraction` (recounted here).
fn in_share(id: &str, fraction: f64) -> bool {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(serde_json::json!([0, id, ""]).to_string().as_bytes());
    let head = u64::from_be_bytes(digest[..8].try_into().unwrap());
    (head as f64 / 2f64.powi(64)) < fraction
}

#[test]
fn reread_reports_how_often_another_readers_verdicts_agree_recounted() {
    let scratch = Scratch::new();
    let (folder, pack) = packed(&scratch, "baselines");
    // The run reads with the extractive reader; `field-lookup` answers from field=value pairs,
    // which the baselines' memories rarely hold: the two disagree on many questions.
    let (status, printed) = verify(
        &scratch,
        &pack,
        &["--reread", "field-lookup", "--fraction", "0.5"],
    );
    assert_eq!(status, 0, "{printed}");
    // The recount: a run of the same manifest read by `field-lookup`, paired with the run's
    // verdicts on the questions in the share.
    let (status, other, stderr) = scratch.run(
        "experiments/baselines.toml",
        &["-q", "--set", "reader={ builtin = \"field-lookup\" }"],
    );
    assert_eq!(status, 0, "{stderr}");
    let theirs = common::verdicts(&other);
    let [mut a, mut b, mut c, mut d] = [0u64; 4];
    for row in common::read_lines(&folder.join("results.jsonl.gz")) {
        if !in_share(row["question_id"].as_str().unwrap(), 0.5) {
            continue;
        }
        let (Some(run), Some(again)) = (
            row["correct"].as_bool(),
            theirs[&common::question_key(&row)].as_bool(),
        ) else {
            continue;
        };
        match (run, again) {
            (true, true) => a += 1,
            (true, false) => b += 1,
            (false, true) => c += 1,
            (false, false) => d += 1,
        }
    }
    let n = a + b + c + d;
    let all = common::read_lines(&folder.join("results.jsonl.gz")).len() as u64;
    assert!(
        n > all / 4 && n < all * 3 / 4,
        "about half the questions: {n} of {all}"
    );
    assert!(b > 0, "the readers should disagree");
    let (a, b, c, d) = (a as f64, b as f64, c as f64, d as f64);
    let observed = (a + d) / n as f64;
    let varied = |yes: f64, no: f64| yes > 0.0 && no > 0.0;
    let kappa = (varied(a + b, c + d) && varied(a + c, b + d))
        .then(|| 2.0 * (a * d - b * c) / ((a + b) * (b + d) + (a + c) * (c + d)));
    let expected = format!("reread by `field-lookup` (0.5 of questions): {n} compared, agreement ");
    let counts = format!("run's reader right and `field-lookup` not {b}, the reverse {c}");
    assert_spot_line(&printed, &expected, (observed, kappa), &counts);
}

#[test]
fn spot_checks_take_the_verifiers_own_callbacks_from_a_file() {
    let scratch = Scratch::new();
    let (_, pack) = packed(&scratch, "fixture");
    // A judge and a reader of the verifier's, named as they like.
    let theirs = scratch.write(
        "mine.toml",
        "[judges.strict]\nbuiltin = \"exact\"\nrevision = \"1\"\n\n[readers.lookup]\nbuiltin = \"field-lookup\"\nrevision = \"1\"\n",
    );
    let callbacks = theirs.to_str().unwrap();
    let (status, printed) = verify(
        &scratch,
        &pack,
        &[
            "--rejudge",
            "strict",
            "--reread",
            "lookup",
            "--callbacks",
            callbacks,
        ],
    );
    assert_eq!(status, 0, "{printed}");
    // The fixture's reader and judge are these very built-ins: full agreement, both ways.
    assert!(
        printed.contains("rejudged by `strict` (1 of answers): 36 compared, agreement 1.000"),
        "{printed}"
    );
    assert!(
        printed.contains("reread by `lookup` (1 of questions): 36 compared, agreement 1.000"),
        "{printed}"
    );
    // A share out of range, and a file that is not TOML, are named.
    let (status, printed) = verify(
        &scratch,
        &pack,
        &[
            "--reread",
            "lookup",
            "--fraction",
            "1.5",
            "--callbacks",
            callbacks,
        ],
    );
    assert_eq!(status, 2, "{printed}");
    assert!(printed.contains("--fraction"), "{printed}");
    let broken = scratch.write("broken.toml", "[judges.strict\n");
    let (status, printed) = verify(
        &scratch,
        &pack,
        &["--rejudge", "strict", "--callbacks", broken.to_str().unwrap()],
    );
    assert_eq!(status, 2, "{printed}");
    assert!(printed.contains("broken.toml"), "{printed}");
}

#[test]
fn a_verifiers_model_judge_rechecks_a_pack_through_its_own_endpoint() {
    use common::mock_api::{Behaviour, Format, KEY, MockApi};
    let scratch = Scratch::new();
    let (_, pack) = packed(&scratch, "fixture");
    let api = MockApi::start(Format::OpenAi, Behaviour::default());
    let theirs = scratch.write(
        "mine.toml",
        &format!(
            "[models.mine]\napi = \"{}\"\nbase_url = \"{}\"\nmodel = \"mock-1\"\napi_key_env = \"MY_KEY\"\n\n\
             [judges.mine]\nbuiltin = \"llm-judge\"\nparams = {{ model = \"mine\" }}\n",
            Format::OpenAi.api(),
            api.url
        ),
    );
    let output = scratch
        .gacc()
        .arg("verify")
        .arg(&pack)
        .args([
            "--rejudge",
            "mine",
            "--fraction",
            "0.5",
            "--callbacks",
            theirs.to_str().unwrap(),
        ])
        .env("MY_KEY", KEY)
        .output()
        .unwrap();
    let printed =
        String::from_utf8_lossy(&output.stdout).into_owned() + &String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{printed}");
    assert!(
        printed.contains("rejudged by `mine` (0.5 of answers): "),
        "{printed}"
    );
    let compared: u64 = printed
        .split("answers): ")
        .nth(1)
        .unwrap()
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        compared > 0 && compared < 36,
        "a share of the 36 answers: {printed}"
    );
    assert_eq!(
        api.requests(),
        compared,
        "one judge request per answer in the share"
    );
    common::mock_api::assert_no_key(&scratch, &printed);
}

/// A spot check's printed line against a recount: it starts `expected` (what was compared),
/// its agreement and kappa (three decimals) match, and it names the `counts` of each way the
/// verdicts differ; the pack still verifies.
fn assert_spot_line(printed: &str, expected: &str, (observed, kappa): (f64, Option<f64>), counts: &str) {
    assert!(printed.contains(expected), "expected `{expected}` in:\n{printed}");
    let figure = |after: &str| -> Option<f64> {
        let rest = &printed[printed.find(after).unwrap() + after.len()..];
        rest.split([',', ' ']).next().unwrap().parse().ok()
    };
    assert!(
        (figure("agreement ").unwrap() - observed).abs() < 5e-4,
        "{observed} in:\n{printed}"
    );
    match (figure("kappa "), kappa) {
        (Some(shown), Some(kappa)) => assert!((shown - kappa).abs() < 5e-4, "{kappa} in:\n{printed}"),
        (None, None) => assert!(printed.contains("kappa n/a"), "{printed}"),
        other => panic!("κ {other:?} in:\n{printed}"),
    }
    assert!(printed.contains(counts), "expected `{counts}` in:\n{printed}");
    assert!(printed.ends_with("verified\n"), "{printed}");
}

#[test]
fn verify_needs_neither_the_payers_variables_nor_the_callbacks_scripts() {
    let scratch = Scratch::new();
    // A command compressor with no revision (its script is hashed into its key) that lists a
    // variable, as `gacc init`'s does.
    scratch.script(
        "experiments/callbacks/keep.sh",
        "#!/bin/sh\nexec @GACC@ callback goal-line\n",
    );
    let manifest = scratch.fixture_with(
        "bare",
        "command = [\"sh\", \"callbacks/keep.sh\"]\nenv = [\"DATA_MODE\"]",
    );
    let (status, folder, stderr) = scratch.run_with_env(
        &manifest,
        &["-q"],
        &[("DATA_MODE", "/data/sets/alphabetical-mode")],
    );
    assert_eq!(status, 0, "{stderr}");
    let pack = scratch.pack_run(&folder, "bare.gacc.tar.gz");
    // The reviewer has neither the variable nor the script.
    std::fs::remove_file(scratch.path("experiments/callbacks/keep.sh")).unwrap();
    assert_eq!(scratch.verify_bare(&folder), (0, "verified\n".to_owned()));
    let elsewhere = Scratch::empty();
    let copied = elsewhere.path("bare.gacc.tar.gz");
    std::fs::copy(&pack, &copied).unwrap();
    assert_eq!(elsewhere.verify_bare(&copied), (0, "verified\n".to_owned()));
}

#[test]
fn verify_and_rejudge_hold_for_a_run_with_a_reader_template_and_audit_judges() {
    use common::mock_api::{Behaviour, Format, KEY, MockApi, llm_manifest};
    let scratch = Scratch::new();
    let api = MockApi::start(Format::OpenAi, Behaviour::default());
    scratch.write(
        "experiments/prompts/read.j2",
        "Memory: {{ memory }}\nQuestion: {{ question }}\n",
    );
    let manifest = llm_manifest(&api.url, Format::OpenAi, "", "")
        .replace(
            "[reader]\nbuiltin = \"llm-reader\"\nparams = { model = \"mock\" }",
            "[reader]\nbuiltin = \"llm-reader\"\nparams = { model = \"mock\" }\ntemplate = \"prompts/read.j2\"",
        )
        .replace("[run]", "[audit]\njudges = [\"contains\", \"token-f1\"]\nfraction = 1.0\n\n[run]");
    assert!(manifest.contains("prompts/read.j2") && manifest.contains("[audit]"));
    scratch.write("experiments/llm.toml", &manifest);
    let key = [("MOCK_API_KEY", KEY)];
    let (status, folder, stderr) = scratch.run_with_env("experiments/llm.toml", &["-q"], &key);
    assert_eq!(status, 0, "{stderr}");
    // The reviewer has no template (nor the key).
    std::fs::remove_dir_all(scratch.path("experiments/prompts")).unwrap();
    let paid = api.requests();
    assert_eq!(scratch.verify_bare(&folder), (0, "verified\n".to_owned()));
    let (status, printed) = verify(&scratch, &folder, &["--rejudge", "contains"]);
    assert_eq!(status, 0, "{printed}");
    assert!(printed.contains("rejudged by `contains`"), "{printed}");
    assert!(printed.contains("verified"), "{printed}");
    assert_eq!(api.requests(), paid, "verify sent requests to the server");
}

#[test]
fn a_run_whose_judge_gave_no_verdict_verifies_with_its_failures_as_recorded() {
    let scratch = Scratch::new();
    // A judge that answers every question but the pressure's, which gets no verdict.
    let manifest = std::fs::read_to_string(scratch.path("experiments/fixture.toml"))
        .unwrap()
        .replace(
            "[judge]\nbuiltin = \"exact\"",
            "[judge]\ncommand = [\"sh\", \"-c\", \"r=$(cat); case \\\"$r\\\" in *pressure*) echo '{}';; *) echo '{\\\"correct\\\": false}';; esac\"]",
        );
    assert!(manifest.contains("pressure"));
    scratch.write("experiments/silent.toml", &manifest);
    let (status, folder, stderr) = scratch.run("experiments/silent.toml", &["-q"]);
    assert_ne!(status, 0, "a failed job makes the run incomplete: {stderr}");
    let report = read_json(&folder.join("report.json"));
    let failures = report["failures"].as_array().unwrap();
    assert!(!failures.is_empty());
    assert_eq!(report["cancelled"], 0);
    for failure in failures {
        let reason = failure["reason"].as_str().unwrap();
        assert!(!reason.contains("fail-fast"), "{reason}");
    }
    let (status, printed) = verify(&scratch, &folder, &[]);
    assert_eq!(status, 0, "{printed}");
    assert!(printed.starts_with("verified\n"), "{printed}");
    assert!(
        printed.contains(&format!("{} job(s) failed in the run", failures.len())),
        "{printed}"
    );
}
