//! A run that travels (SPEC §12): one `.tar.gz` holding a run folder, every cache entry its
//! rows rest on, and the SHA-256 of every member.
//!
//! Members, in order: `run/<file>` for each file of the run folder (with `--no-dataset`,
//! `run/dataset.jsonl` is left out and `run/dataset.sha256` holds its SHA-256);
//! `cache/segments/pack.log`, the entries in a cache segment's own line format, and
//! `cache/format`, their key scheme (so an unpacked pack's `cache/` is a cache); and last `SHA256SUMS`, one `<hex>  <member>` line per member
//! (what `sha256sum -c` reads). Nothing gacc writes holds a secret, so neither does a pack.
//!
//! Reading one is hostile input: a member that is not a regular file, a name that leaves the
//! folder, a member not in `SHA256SUMS` or not matching it, is an error naming it, and nothing
//! of a pack that fails is left behind.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, Read, Write};
use std::path::{Component, Path, PathBuf};

use flate2::{Compression, read::GzDecoder, write::GzEncoder};
use sha2::{Digest, Sha256};

use super::cache::{Cache, Kind};
use super::run_folder::{MEMORIES, RESULTS, RunFolder};
use crate::error::{Error, io};

/// The list of members' SHA-256, the pack's last member.
pub(crate) const SUMS: &str = "SHA256SUMS";
/// The cache entries the rows rest on, as one cache segment.
pub(crate) const ENTRIES: &str = "cache/segments/pack.log";
/// The format of the entries' keys (`gacc.cache/2`), as a cache states it.
const CACHE_FORMAT: &str = "cache/format";
/// Where the run folder's files go.
pub(crate) const RUN: &str = "run";
/// The run folder's copy of its dataset, which `--no-dataset` leaves out.
const DATASET: &str = "dataset.jsonl";
/// A member of a pack is at most this large when read back (a hostile pack cannot fill a disk
/// through one member); a run's largest files are far below it.
const MEMBER_LIMIT: u64 = 64 << 30;

/// What `pack` wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Packed {
    pub members: usize,
    pub entries: usize,
    /// Keys named by rows that the cache no longer holds (the pack cannot replay them).
    pub missing: Vec<(String, String)>,
    pub bytes: u64,
}

/// Every `(kind name, key)` the rows of `run` name in their `calls` (an audit judge's,
/// `judges.<name>`, is a judge entry).
pub(crate) fn rested_on(run: &RunFolder) -> Result<BTreeSet<(Kind, String)>, Error> {
    #[derive(serde::Deserialize)]
    struct Calls {
        #[serde(default)]
        calls: BTreeMap<String, String>,
    }
    let mut keys = BTreeSet::new();
    for file in [MEMORIES, RESULTS] {
        let path = run.file(file);
        for (at, line) in run.open_lines(file)?.lines().enumerate() {
            let line = line.map_err(io(&path))?;
            if line.trim().is_empty() {
                continue;
            }
            let row: Calls = serde_json::from_str(&line).map_err(|error| Error::Io {
                path: path.clone(),
                message: format!("line {}: not a row: {error}", at + 1),
            })?;
            for (name, key) in row.calls {
                let kind = call_kind(&name);
                let Some(kind) = kind else {
                    return Err(Error::Io {
                        path: path.clone(),
                        message: format!(
                            "line {}: `calls` names `{name}`, which is no kind of cache entry",
                            at + 1
                        ),
                    });
                };
                keys.insert((kind, key));
            }
        }
    }
    Ok(keys)
}

/// The kind of cache entry a row's call name is: a kind's own name (`reader`, `count`), an
/// audit judge's (`judges.<name>`, a judge call), a panel reader's (`readers.<name>`, a reader
/// call, and `readers.<name>.judge`, its answer's judgement), or an anchor's (`floor.reader`,
/// `ceiling.judge`: the kind after the dot). Callback names hold no dot.
fn call_kind(name: &str) -> Option<Kind> {
    if let Some(panel) = name.strip_prefix("readers.") {
        return Some(if panel.ends_with(".judge") {
            Kind::Judge
        } else {
            Kind::Reader
        });
    }
    if name.starts_with("judges.") {
        return Some(Kind::Judge);
    }
    match name.split_once('.') {
        Some((_, kind)) => Kind::named(kind),
        None => Kind::named(name),
    }
}

/// The entries of `keys` as one cache segment, how many, and those `cache` does not hold.
fn segment_of(keys: &BTreeSet<(Kind, String)>, cache: &Cache) -> (Vec<u8>, usize, Vec<(String, String)>) {
    let mut segment = Vec::new();
    let mut missing = Vec::new();
    let mut entries = 0;
    for (kind, key) in keys {
        match cache.line(*kind, key) {
            Some(line) => {
                segment.extend_from_slice(&line);
                entries += 1;
            }
            None => missing.push((kind.as_str().to_owned(), key.clone())),
        }
    }
    (segment, entries, missing)
}

/// gzip's level for packs. On the paper-scale bench run (223 MB of run folder, 1 GB of
/// members with its entries): level 6 (the default) 58 s and 347 MB, level 3 22 s and 363 MB,
/// level 1 12 s and 422 MB. Level 3 costs 5% in size for 2.6 times the speed.
const PACK_LEVEL: Compression = Compression::new(3);

/// The files of a run folder, in name order.
fn run_files(run: &RunFolder) -> Result<Vec<PathBuf>, Error> {
    let mut names: Vec<PathBuf> = std::fs::read_dir(run.path())
        .map_err(io(run.path()))?
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|path| path.is_file())
        .collect();
    names.sort();
    Ok(names)
}

/// Writes the pack of `run` to `out`: its files, the entries of `cache` its rows rest on, and
/// the list of SHA-256. Written beside `out` and renamed, so `out` is whole or absent.
pub(crate) fn pack(run: &RunFolder, cache: &Cache, out: &Path, dataset: bool) -> Result<Packed, Error> {
    let keys = rested_on(run)?;
    if keys.is_empty() {
        return Err(Error::Io {
            path: run.file(RESULTS),
            message: "its rows name no cache entries (`calls`): a run made before rows named them, \
                      or one with no rows, cannot be packed to replay; run its manifest again"
                .into(),
        });
    }
    let (segment, entries, missing) = segment_of(&keys, cache);

    let partial = out.with_extension("partial");
    let file = std::fs::File::create(&partial).map_err(io(&partial))?;
    let mut builder = tar::Builder::new(GzEncoder::new(std::io::BufWriter::new(file), PACK_LEVEL));
    let mut sums = String::new();
    let mut add = |name: &str, bytes: &[u8]| -> std::io::Result<()> {
        let mut header = tar::Header::new_gnu();
        header.set_size(bytes.len() as u64);
        header.set_mode(0o644);
        header.set_entry_type(tar::EntryType::Regular);
        header.set_cksum();
        builder.append_data(&mut header, name, bytes)?;
        sums.push_str(&format!("{}  {name}\n", crate::hash::sha256(bytes)));
        Ok(())
    };
    let mut members = 0;
    for path in run_files(run)? {
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        let bytes = std::fs::read(&path).map_err(io(&path))?;
        if name == DATASET && !dataset {
            let sum = format!("{}  {DATASET}\n", crate::hash::sha256(&bytes));
            add(&format!("{RUN}/dataset.sha256"), sum.as_bytes()).map_err(io(&partial))?;
        } else {
            add(&format!("{RUN}/{name}"), &bytes).map_err(io(&partial))?;
        }
        members += 1;
    }
    add(ENTRIES, &segment).map_err(io(&partial))?;
    // The entries' key scheme: an unpacked pack's `cache/` is a cache of that format.
    add(
        CACHE_FORMAT,
        format!("{}\n", crate::store::cache::FORMAT).as_bytes(),
    )
    .map_err(io(&partial))?;
    members += 2;
    let mut header = tar::Header::new_gnu();
    header.set_size(sums.len() as u64);
    header.set_mode(0o644);
    header.set_cksum();
    builder
        .append_data(&mut header, SUMS, sums.as_bytes())
        .map_err(io(&partial))?;
    let finish =
        |builder: tar::Builder<GzEncoder<std::io::BufWriter<std::fs::File>>>| -> std::io::Result<()> {
            let mut buffered = builder.into_inner()?.finish()?;
            buffered.flush()?;
            buffered
                .into_inner()
                .map_err(std::io::IntoInnerError::into_error)?
                .sync_all()
        };
    finish(builder).map_err(io(&partial))?;
    std::fs::rename(&partial, out).map_err(io(out))?;
    let bytes = std::fs::metadata(out).map_err(io(out))?.len();
    Ok(Packed {
        members,
        entries,
        missing,
        bytes,
    })
}

/// A pack's members as read: each name (checked to stay inside the folder) and its bytes, in
/// order, and its `SHA256SUMS`.
pub(crate) struct Members {
    pub files: Vec<(String, Vec<u8>)>,
    pub sums: String,
}

/// Reads every member of the pack at `file`, refusing (naming it) a member that is not a
/// regular file, whose name leaves the folder or comes twice, that is too large, or that
/// follows `SHA256SUMS`, and a pack without that list.
pub(crate) fn read_members(file: &Path) -> Result<Members, Error> {
    let bad = |message: String| Error::Io {
        path: file.to_path_buf(),
        message,
    };
    let opened = std::fs::File::open(file).map_err(io(file))?;
    let mut archive = tar::Archive::new(GzDecoder::new(std::io::BufReader::new(opened)));
    let mut files: Vec<(String, Vec<u8>)> = Vec::new();
    let mut names = BTreeSet::new();
    let mut sums: Option<String> = None;
    for entry in archive
        .entries()
        .map_err(|e| bad(format!("not a gacc pack: {e}")))?
    {
        let mut entry = entry.map_err(|e| bad(format!("a damaged member: {e}")))?;
        let name = entry
            .path()
            .map_err(|e| bad(format!("a member's name: {e}")))?
            .to_string_lossy()
            .into_owned();
        // What the pack names is shown escaped: a name may hold control characters.
        let shown = name.escape_debug().to_string();
        if entry.header().entry_type() != tar::EntryType::Regular {
            return Err(bad(format!("member `{shown}` is not a regular file")));
        }
        if member_path(&name).is_none() {
            return Err(bad(format!("member `{shown}` leaves the pack's folder")));
        }
        if entry.size() > MEMBER_LIMIT {
            return Err(bad(format!(
                "member `{shown}` is {} bytes, past any run's",
                entry.size()
            )));
        }
        if !names.insert(name.clone()) || sums.is_some() {
            return Err(bad(format!("member `{shown}` is given twice or after {SUMS}")));
        }
        let mut bytes = Vec::new();
        (&mut entry)
            .take(MEMBER_LIMIT)
            .read_to_end(&mut bytes)
            .map_err(|e| bad(format!("member `{shown}`: {e}")))?;
        if name == SUMS {
            sums = Some(String::from_utf8(bytes).map_err(|_| bad(format!("{SUMS} is not text")))?);
        } else {
            files.push((name, bytes));
        }
    }
    let sums = sums.ok_or_else(|| bad(format!("no {SUMS}: not a gacc pack, or cut short")))?;
    Ok(Members { files, sums })
}

/// Extracts the pack at `file` into `into` (created; it must not hold a pack already), checking
/// every member against `SHA256SUMS`. Members go to a folder beside `into` first and are moved
/// in place only when all of them checked, so a bad pack leaves nothing.
pub(crate) fn unpack(file: &Path, into: &Path) -> Result<usize, Error> {
    if into.exists() {
        return Err(Error::Io {
            path: into.to_path_buf(),
            message: "is there already: unpack into a new folder".into(),
        });
    }
    let members = read_members(file)?;
    if let Some(first) = disagreements(&members).first() {
        return Err(Error::Io {
            path: file.to_path_buf(),
            message: first.to_string(),
        });
    }
    let staging = staging_folder(into);
    let written = write_members(&members, &staging);
    match written.and_then(|()| std::fs::rename(&staging, into).map_err(io(into))) {
        Ok(()) => Ok(members.files.len()),
        Err(error) => {
            let _ = std::fs::remove_dir_all(&staging);
            Err(error)
        }
    }
}

/// Writes every member, and `SHA256SUMS`, under `folder` (created).
pub(crate) fn write_members(members: &Members, folder: &Path) -> Result<(), Error> {
    std::fs::create_dir_all(folder).map_err(io(folder))?;
    let all = (members.files.iter()).map(|(name, bytes)| (name.as_str(), bytes.as_slice()));
    for (name, bytes) in all.chain([(SUMS, members.sums.as_bytes())]) {
        let target = folder.join(member_path(name).unwrap_or_default());
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent).map_err(io(parent))?;
        }
        std::fs::write(&target, bytes).map_err(io(&target))?;
    }
    Ok(())
}

/// A member that does not follow `SHA256SUMS`: its name, what the list states and what its
/// bytes give ("absent" where there is none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Disagreement {
    pub member: String,
    pub stated: String,
    pub recomputed: String,
}

impl std::fmt::Display for Disagreement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Disagreement {
            member,
            stated,
            recomputed,
        } = self;
        match (stated.as_str(), recomputed.as_str()) {
            (ABSENT, _) => write!(f, "member `{member}` is not in {SUMS}"),
            (_, ABSENT) => write!(f, "{SUMS} lists `{member}`, which the pack does not hold"),
            _ => write!(
                f,
                "member `{member}`: SHA-256 is {recomputed}, {SUMS} states {stated} (the member was changed)"
            ),
        }
    }
}

const ABSENT: &str = "absent";

/// Every member against its line of `SHA256SUMS`: each listed, each matching, none extra.
pub(crate) fn disagreements(members: &Members) -> Vec<Disagreement> {
    let mut listed = BTreeMap::new();
    let mut found = Vec::new();
    for line in members.sums.lines() {
        match line.split_once("  ") {
            Some((sum, name)) => {
                listed.insert(name.to_owned(), sum.to_owned());
            }
            None => found.push(Disagreement {
                member: SUMS.into(),
                stated: line.escape_debug().to_string(),
                recomputed: "not `<sha256>  <member>`".into(),
            }),
        }
    }
    for (name, bytes) in &members.files {
        let sum = crate::hash::sha256(bytes);
        match listed.remove(name) {
            Some(stated) if stated == sum => {}
            stated => found.push(Disagreement {
                member: name.clone(),
                stated: stated.unwrap_or_else(|| ABSENT.into()),
                recomputed: sum,
            }),
        }
    }
    // The list's own names and sums are anyone's text: shown escaped.
    found.extend(listed.into_iter().map(|(member, stated)| Disagreement {
        member: member.escape_debug().to_string(),
        stated: stated.escape_debug().to_string(),
        recomputed: ABSENT.into(),
    }));
    found
}

/// A member's name as a path inside the pack's folder: relative, plain components only, no
/// control character.
fn member_path(name: &str) -> Option<PathBuf> {
    if name.chars().any(char::is_control) {
        return None;
    }
    let path = Path::new(name);
    let plain = path.components().all(|c| matches!(c, Component::Normal(_)));
    (plain && path.components().next().is_some()).then(|| path.to_path_buf())
}

fn staging_folder(into: &Path) -> PathBuf {
    let name = into
        .file_name()
        .map_or_else(|| "pack".into(), |n| n.to_string_lossy().into_owned());
    into.with_file_name(format!(".{name}.unpacking-{}", std::process::id()))
}

/// The folder `--from FILE` reads a pack from: unpacked once under the cache, by the pack's
/// SHA-256, and read from there on every later run.
pub(crate) fn layer_for(file: &Path, cache_root: &Path) -> Result<PathBuf, Error> {
    let mut hasher = Sha256::new();
    let mut opened = std::fs::File::open(file).map_err(io(file))?;
    let mut block = vec![0u8; 1 << 20];
    loop {
        let read = opened.read(&mut block).map_err(io(file))?;
        if read == 0 {
            break;
        }
        hasher.update(&block[..read]);
    }
    let sum = crate::hash::hex(&hasher.finalize());
    let folder = cache_root.join("packs").join(&sum[..16]);
    if !folder.is_dir() {
        std::fs::create_dir_all(cache_root.join("packs")).map_err(io(cache_root))?;
        // Two runs given one pack at once: one unpacks it, and the other reads what it put.
        if let Err(error) = unpack(file, &folder)
            && !folder.join(SUMS).is_file()
        {
            return Err(error);
        }
    }
    Ok(folder.join("cache"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_member_name_is_plain_and_relative() {
        for inside in ["run/report.json", "SHA256SUMS", "cache/segments/pack.log"] {
            assert!(member_path(inside).is_some(), "{inside}");
        }
        // What gacc never writes is refused, `./` included.
        for outside in [
            "",
            "/etc/passwd",
            "../x",
            "run/../../x",
            "run/..",
            "/",
            "./run/x",
            "run/\u{1b}[31mred",
            "run/a\nb",
        ] {
            assert_eq!(member_path(outside), None, "{outside}");
        }
    }

    #[test]
    fn every_disagreement_with_the_list_is_named_once() {
        let members = |files: &[(&str, &str)], sums: String| Members {
            files: files
                .iter()
                .map(|(n, b)| ((*n).to_owned(), b.as_bytes().to_vec()))
                .collect(),
            sums,
        };
        let sum = |text: &str| crate::hash::sha256(text.as_bytes());
        let good = format!("{}  a\n{}  b\n", sum("x"), sum("y"));
        assert!(disagreements(&members(&[("a", "x"), ("b", "y")], good.clone())).is_empty());

        let found = disagreements(&members(&[("a", "x"), ("b", "changed"), ("c", "z")], good));
        let named: Vec<(&str, &str, &str)> = (found.iter())
            .map(|d| (d.member.as_str(), d.stated.as_str(), d.recomputed.as_str()))
            .collect();
        let (changed, extra) = (sum("changed"), sum("z"));
        assert_eq!(
            named,
            [
                ("b", sum("y").as_str(), changed.as_str()),
                ("c", ABSENT, extra.as_str())
            ]
        );
        assert!(found[1].to_string().contains("member `c` is not in SHA256SUMS"));

        let missing = disagreements(&members(
            &[("a", "x")],
            format!("{}  a\n{}  b\n", sum("x"), sum("y")),
        ));
        assert_eq!(missing.len(), 1);
        assert_eq!(
            missing[0].to_string(),
            "SHA256SUMS lists `b`, which the pack does not hold"
        );

        let garbled = disagreements(&members(&[], "no two spaces\n".into()));
        assert_eq!(garbled.len(), 1);
        assert_eq!(garbled[0].member, SUMS);
    }
}
