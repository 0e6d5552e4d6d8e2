//! The run folder (SPEC §5): its place, the name of every file in it, and the one way each is
//! read back. Commands that look at finished runs (`report`, `diff`, `trace`) open it here.

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::error::{Error, io};

pub(crate) const MANIFEST: &str = "manifest.toml";
pub(crate) const DATASET: &str = "dataset.jsonl";
/// The job graph, gzipped (`gacc.plan/2`: every memory job and the questions read from it).
pub(crate) const PLAN: &str = "plan.json.gz";
/// The ledger, as gzip members (`store::members`): whole up to the run's last flush.
pub(crate) const MEMORIES: &str = "memories.jsonl.gz";
/// Each distinct memory's text once, gzipped.
pub(crate) const MEMORY_TEXTS: &str = "memory_texts.jsonl.gz";
/// One row per question, as gzip members, like the ledger.
pub(crate) const RESULTS: &str = "results.jsonl.gz";
/// The last gacc that wrote each gzipped file plain, which reads a folder that holds it so.
const PLAIN_UNTIL: [(&str, &str); 3] = [
    (MEMORY_TEXTS, "8c6c977"),
    (MEMORIES, "f503c55"),
    (RESULTS, "f503c55"),
];
pub(crate) const REPORT_JSON: &str = "report.json";
pub(crate) const REPORT_MD: &str = "report.md";
pub(crate) const REPORT_HTML: &str = "report.html";
pub(crate) const RUN: &str = "run.json";
pub(crate) const TRACE: &str = "trace.jsonl";
/// The link in `runs/<name>/` to the newest run of an experiment.
pub(crate) const LATEST: &str = "latest";

/// One run's folder: `runs/<name>/<UTC time>-<hash8>/`.
#[derive(Debug, Clone)]
pub(crate) struct RunFolder {
    path: PathBuf,
}

impl RunFolder {
    /// A new folder in `runs` for a run that started `at` (a suffix keeps two runs of one
    /// second apart).
    pub(crate) fn create(runs: &Path, at: SystemTime, manifest_sha256: &str) -> Result<RunFolder, Error> {
        std::fs::create_dir_all(runs).map_err(io(runs))?;
        let base = format!(
            "{}-{}",
            crate::clock::utc_timestamp(at, false),
            &manifest_sha256[..8]
        );
        for attempt in 0..1000 {
            let name = if attempt == 0 {
                base.clone()
            } else {
                format!("{base}-{attempt}")
            };
            let path = runs.join(name);
            match std::fs::create_dir(&path) {
                Ok(()) => return Ok(RunFolder { path }),
                Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(error) => return Err(io(&path)(error)),
            }
        }
        Err(Error::Io {
            path: runs.to_path_buf(),
            message: "could not make a new run folder".into(),
        })
    }

    /// A finished run, given as its folder, a `latest` link, or a file in it (`report.json`).
    pub(crate) fn open(path: &Path) -> RunFolder {
        let path = if path.is_dir() {
            path.to_path_buf()
        } else {
            path.parent().map(Path::to_path_buf).unwrap_or_default()
        };
        RunFolder { path }
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// The path of one of its files.
    pub(crate) fn file(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    /// Writes one of its files whole.
    pub(crate) fn write(&self, name: &str, bytes: &[u8]) -> Result<(), Error> {
        crate::files::write(&self.file(name), bytes)
    }

    /// Writes one of its derived files (`plan.json.gz`, `memory_texts.jsonl.gz`) gzipped, shared
    /// by content with the experiment's other runs (see [`RunFolder::write_shared`]), keyed by
    /// the SHA-256 of its uncompressed content, which it gives back.
    pub(crate) fn write_shared_gzip(
        &self,
        name: &str,
        body: impl Fn(&mut dyn std::io::Write) -> std::io::Result<()>,
    ) -> Result<String, Error> {
        let digest = crate::files::digest_of(|out| body(out)).map_err(io(&self.file(name)))?;
        self.write_shared(name, &digest, |path| crate::files::write_gzip_with(path, &body))?;
        Ok(digest)
    }

    /// Writes one of its files as a hard link to `runs/<name>/.shared/<key>-<name>`, which
    /// `write` makes only when no run of the experiment holds it yet: `key` names the file's
    /// content (the SHA-256 of it, or of everything it is made from). A re-run whose plan,
    /// memories and rows did not change writes none of them again. Where no link can be made
    /// (another file system), the file is written on its own.
    pub(crate) fn write_shared(
        &self,
        name: &str,
        key: &str,
        write: impl Fn(&Path) -> Result<(), Error>,
    ) -> Result<(), Error> {
        let target = self.file(name);
        let Some(shared) = self.path.parent().map(|runs| runs.join(SHARED)) else {
            return write(&target);
        };
        let object = shared.join(format!("{key}-{name}"));
        // Sharing is an economy: any trouble with the shared folder, and the run writes its own.
        let shared_ok =
            object.is_file() || (std::fs::create_dir_all(&shared).is_ok() && write(&object).is_ok());
        if !shared_ok || std::fs::hard_link(&object, &target).is_err() {
            write(&target)?;
        }
        Ok(())
    }

    /// Removes the experiment's shared files that no run folder links to any more (their runs
    /// were deleted): called once a run has linked all of its own, so that none it reuses goes.
    pub(crate) fn forget_unshared(&self) {
        if let Some(runs) = self.path.parent() {
            forget_unshared(&runs.join(SHARED));
        }
    }

    /// One of its files as text.
    pub(crate) fn read_text(&self, name: &str) -> Result<String, Error> {
        let path = self.file(name);
        std::fs::read_to_string(&path).map_err(|error| unreadable(&path, error))
    }

    /// One of its JSON files.
    pub(crate) fn read_json(&self, name: &str) -> Result<Value, Error> {
        let path = self.file(name);
        let text = self.read_text(name)?;
        serde_json::from_str(&text).map_err(|error| Error::Io {
            path,
            message: format!("not JSON: {error}"),
        })
    }

    /// The rows of one of its JSON Lines files; a row that is not one names its line.
    /// A gzipped file (`.gz`) is read through its decompressor; one a run folder of an older
    /// gacc holds plain, without `.gz`, is read as it is.
    pub(crate) fn read_rows<T: DeserializeOwned>(&self, name: &str) -> Result<Vec<T>, Error> {
        let path = self.file(name);
        let reader = self.open_lines(name)?;
        let mut rows = Vec::new();
        for (number, line) in reader.lines().enumerate() {
            let line = line.map_err(|error| unreadable(&path, error))?;
            if line.trim().is_empty() {
                continue;
            }
            rows.push(serde_json::from_str(&line).map_err(|error| Error::Io {
                path: path.clone(),
                message: format!("line {}: {error}", number + 1),
            })?);
        }
        Ok(rows)
    }

    /// One of its files for reading line by line, decompressed if it is gzipped.
    pub(crate) fn open_lines(&self, name: &str) -> Result<Box<dyn BufRead>, Error> {
        let path = self.file(name);
        let plain = name.strip_suffix(".gz").map(|plain| self.file(plain));
        let until = PLAIN_UNTIL.iter().find(|(gzipped, _)| *gzipped == name);
        if let (Some(plain), Some((_, commit))) = (plain, until)
            && !path.exists()
            && plain.exists()
        {
            return Err(Error::Io {
                path: plain,
                message: format!(
                    "held plain, not gzipped: gacc 0.1.0 at commit {commit} or earlier reads it"
                ),
            });
        }
        let file = std::fs::File::open(&path).map_err(|error| unreadable(&path, error))?;
        // Row files are written as members and may end in a cut one (a run stopped); the
        // others are written whole, so a cut one is damage and an error.
        if [MEMORIES, RESULTS].contains(&name) {
            let rows = super::members::reader(file);
            return Ok(Box::new(std::io::BufReader::with_capacity(1 << 20, rows)));
        }
        if name.ends_with(".gz") {
            let decoder = flate2::read::GzDecoder::new(std::io::BufReader::with_capacity(1 << 20, file));
            return Ok(Box::new(std::io::BufReader::with_capacity(1 << 20, decoder)));
        }
        Ok(Box::new(std::io::BufReader::with_capacity(1 << 20, file)))
    }

    /// Points `latest` beside it at it, replacing the link in one step.
    pub(crate) fn point_latest(&self) {
        let (Some(name), Some(runs)) = (self.path.file_name(), self.path.parent()) else {
            return;
        };
        let temp = runs.join(format!(".{LATEST}-{}", std::process::id()));
        let _ = std::fs::remove_file(&temp);
        if std::os::unix::fs::symlink(name, &temp).is_ok()
            && std::fs::rename(&temp, runs.join(LATEST)).is_err()
        {
            let _ = std::fs::remove_file(&temp);
        }
    }
}

/// The folder beside an experiment's runs that holds their shared derived files.
pub(crate) const SHARED: &str = ".shared";

/// Removes shared files no run folder links to any more. One written a moment ago by another
/// gacc, not linked yet, is spared: only files older than a minute go.
fn forget_unshared(shared: &Path) {
    use std::os::unix::fs::MetadataExt;
    for entry in std::fs::read_dir(shared).into_iter().flatten().flatten() {
        let Ok(metadata) = entry.metadata() else {
            continue;
        };
        let old = metadata
            .modified()
            .ok()
            .and_then(|m| m.elapsed().ok())
            .is_some_and(|age| age.as_secs() > 60);
        if metadata.is_file() && metadata.nlink() == 1 && old {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Every run folder under `runs` (`runs/<name>/<time>-<hash8>`), oldest first: by the UTC
/// time its name starts with, then by name.
pub(crate) fn all_runs(runs: &Path) -> Vec<RunFolder> {
    let mut found: Vec<(String, PathBuf)> = Vec::new();
    for experiment in std::fs::read_dir(runs).into_iter().flatten().flatten() {
        let experiment = experiment.path();
        if experiment.is_symlink() || !experiment.is_dir() {
            continue;
        }
        for run in std::fs::read_dir(&experiment).into_iter().flatten().flatten() {
            let path = run.path();
            let name = run.file_name().to_string_lossy().into_owned();
            // A run folder is named `<UTC time>-<hash8>`; `latest` and temporaries are not.
            if path.is_symlink() || !path.is_dir() || !name.starts_with(|c: char| c.is_ascii_digit()) {
                continue;
            }
            let experiment_name = experiment
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned();
            found.push((format!("{name} {experiment_name}"), path));
        }
    }
    found.sort();
    found.into_iter().map(|(_, path)| RunFolder { path }).collect()
}

/// A run as a command line names it: a folder (or a file in one, or a `latest` link) that
/// exists, else `latest` (the newest run under `runs`) or `-N` (the N-th newest: `-1` is
/// `latest`, `-2` the one before).
pub(crate) fn resolve(given: &Path, runs: &Path) -> Result<RunFolder, Error> {
    if given.exists() {
        return Ok(RunFolder::open(given));
    }
    let text = given.to_string_lossy();
    let back = match text.as_ref() {
        "latest" => Some(1),
        other => other
            .strip_prefix('-')
            .and_then(|n| n.parse::<usize>().ok())
            .filter(|n| *n > 0),
    };
    let Some(back) = back else {
        // A label (`gacc run --label`): the newest run that carries it.
        let labelled = (all_runs(runs).into_iter().rev())
            .find(|run| recorded(run.path(), "label").as_deref() == Some(text.as_ref()));
        return labelled.ok_or_else(|| Error::NoSuchRun {
            given: given.to_path_buf(),
            message: "no such run folder (a run is a folder, `latest`, -N for the N-th newest, or a --label)"
                .into(),
        });
    };
    let all = all_runs(runs);
    all.len()
        .checked_sub(back)
        .and_then(|at| all.into_iter().nth(at))
        .ok_or_else(|| Error::NoSuchRun {
            given: runs.to_path_buf(),
            message: format!("`{text}` names a run that does not exist: found none that far back"),
        })
}

fn unreadable(path: &Path, error: std::io::Error) -> Error {
    Error::Io {
        path: path.to_path_buf(),
        message: format!("cannot read: {error} (is this a finished gacc run folder?)"),
    }
}

/// A text field of a run folder's run.json, if it has one.
fn recorded(folder: &Path, field: &str) -> Option<String> {
    let text = std::fs::read_to_string(folder.join(RUN)).ok()?;
    let record: serde_json::Value = serde_json::from_str(&text).ok()?;
    record.get(field)?.as_str().map(str::to_owned)
}

/// The cache a run folder's run.json names: as written where absolute, else in the run's
/// project folder (the one holding `runs/<name>/<run>`); `.gacc/cache` here without a run.json.
pub(crate) fn cache_of(folder: &Path) -> Result<PathBuf, Error> {
    // A folder without a record (copied by hand) uses the default cache here.
    if !folder.join(RUN).is_file() {
        return Ok(PathBuf::from(".gacc/cache"));
    }
    let named = recorded(folder, "cache")
        .filter(|named| !named.is_empty())
        .unwrap_or_else(|| ".gacc/cache".to_owned());
    let named = PathBuf::from(named);
    if named.is_absolute() {
        return Ok(named);
    }
    let absolute = std::fs::canonicalize(folder).unwrap_or_else(|_| folder.to_path_buf());
    let project = absolute.ancestors().nth(3).unwrap_or(Path::new("."));
    Ok(project.join(named))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_read_back_and_a_bad_one_names_its_file_and_line() {
        let runs = std::env::temp_dir().join(format!("gacc-run-folder-{}", std::process::id()));
        let at = SystemTime::UNIX_EPOCH;
        let folder = RunFolder::create(&runs.join("x"), at, "0123456789abcdef").unwrap();
        let again = RunFolder::create(&runs.join("x"), at, "0123456789abcdef").unwrap();
        assert!(folder.path().ends_with("19700101T000000Z-01234567"));
        assert!(again.path().ends_with("19700101T000000Z-01234567-1"));
        let gzipped = |rows: &[u8]| {
            let mut out = super::super::members::Members::new(Vec::new());
            std::io::Write::write_all(&mut out, rows).unwrap();
            out.finish().unwrap()
        };
        folder
            .write(RESULTS, &gzipped(b"{\"a\":1}\n\n{\"a\":2}\n"))
            .unwrap();
        let rows: Vec<Value> = folder.read_rows(RESULTS).unwrap();
        assert_eq!(rows.len(), 2);
        folder
            .write(MEMORIES, &gzipped(b"{\"a\":1}\nnot json\n"))
            .unwrap();
        let error = folder.read_rows::<Value>(MEMORIES).unwrap_err().to_string();
        assert!(error.contains("memories.jsonl.gz: line 2:"), "{error}");
        // Rows held plain: the gacc that wrote them reads them.
        std::fs::write(again.file("memories.jsonl"), b"{\"a\":1}\n").unwrap();
        let error = again.read_rows::<Value>(MEMORIES).unwrap_err().to_string();
        assert!(
            error.contains("memories.jsonl: held plain, not gzipped: gacc 0.1.0 at commit f503c55"),
            "{error}"
        );
        let error = folder.read_json(REPORT_JSON).unwrap_err().to_string();
        assert!(error.contains("report.json: cannot read"), "{error}");
        again.point_latest();
        folder.point_latest();
        let latest = RunFolder::open(&runs.join("x").join(LATEST));
        assert_eq!(latest.read_rows::<Value>(RESULTS).unwrap().len(), 2);
        assert_eq!(
            RunFolder::open(&latest.file(REPORT_JSON)).file(RESULTS),
            latest.file(RESULTS)
        );
        let other = RunFolder::create(
            &runs.join("other"),
            at + std::time::Duration::from_secs(60),
            "fedcba9876543210",
        )
        .unwrap();
        let all: Vec<PathBuf> = all_runs(&runs).iter().map(|r| r.path().to_path_buf()).collect();
        assert_eq!(all, [folder.path(), again.path(), other.path()]);
        assert_eq!(resolve(Path::new("latest"), &runs).unwrap().path(), other.path());
        assert_eq!(resolve(Path::new("-1"), &runs).unwrap().path(), other.path());
        assert_eq!(resolve(Path::new("-3"), &runs).unwrap().path(), folder.path());
        assert!(
            resolve(Path::new("-4"), &runs)
                .unwrap_err()
                .to_string()
                .contains("does not exist")
        );
        assert!(
            resolve(Path::new("nowhere"), &runs)
                .unwrap_err()
                .to_string()
                .contains("no such run folder")
        );
        assert_eq!(resolve(folder.path(), &runs).unwrap().path(), folder.path());
        std::fs::remove_dir_all(&runs).unwrap();
    }
}
