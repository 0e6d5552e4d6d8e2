//! What `gacc view` serves from: the runs and packs under one folder, named by their path
//! inside it, and the rows of the runs lately looked at.
//!
//! A name from a request is never joined to a path as it comes: it must be relative, plain
//! (no `..`, no root, no drive), and what it names, with every link followed, must still lie
//! inside the folder and be a run folder or a pack. Anything else is "not found".

use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use crate::error::Error;
use crate::inputs::records::Source;
use crate::report::stored::StoredReport;
use crate::review::diff::{CellLabel, cell_of};
use crate::store::ledger::{LedgerRow, MemoryText, ResultRow};
use crate::store::members::{Counted, count_lines};
use crate::store::pack;
use crate::store::run_folder::{
    DATASET, MEMORIES, MEMORY_TEXTS, REPORT_JSON, RESULTS, RUN, RunFolder, all_runs,
};

/// What a pack's file name ends with.
pub(super) const PACK_SUFFIX: &str = ".gacc.tar.gz";
/// Runs whose rows are kept in memory between requests (a paper-scale run's rows are large).
const KEPT: usize = 3;

/// The folder served and where its packs are unpacked.
pub(super) struct Site {
    /// The folder, with every link followed.
    pub root: PathBuf,
    /// The cache whose `packs/` layer a pack is unpacked into, once.
    pub cache: PathBuf,
    kept: Mutex<Vec<(PathBuf, SystemTime, Arc<Loaded>)>>,
    /// Per row file of a run in flight: how far it was read and the lines found so far.
    counted: Mutex<HashMap<PathBuf, Counted>>,
}

/// A finished run's rows, as its pages read them.
pub(super) struct Loaded {
    pub report: StoredReport,
    pub sources: Vec<Source>,
    pub ledger: Vec<LedgerRow>,
    pub texts: HashMap<String, Arc<str>>,
    pub results: Vec<ResultRow>,
    /// Each cell's rows, as places in `results`, found once.
    pub by_cell: HashMap<CellLabel, Vec<usize>>,
}

/// A run the site lists: its name in links, and its folder.
pub(super) struct Listed {
    pub id: String,
    pub folder: RunFolder,
}

impl Site {
    pub(super) fn new(root: &Path, cache: &Path) -> Result<Site, Error> {
        let root = root.canonicalize().map_err(|error| Error::Io {
            path: root.to_path_buf(),
            message: format!("cannot serve this folder: {error}"),
        })?;
        Ok(Site {
            root,
            cache: cache.to_path_buf(),
            kept: Mutex::new(Vec::new()),
            counted: Mutex::new(HashMap::new()),
        })
    }

    /// Every run folder under the root (as `gacc runs` finds them, and the root itself when it
    /// is one), oldest first.
    pub(super) fn runs(&self) -> Vec<Listed> {
        let mut runs: Vec<RunFolder> = all_runs(&self.root);
        if is_run(&self.root) {
            runs.insert(0, RunFolder::open(&self.root));
        }
        runs.into_iter()
            .filter_map(|folder| {
                let id = folder.path().strip_prefix(&self.root).ok()?.to_str()?.to_owned();
                Some(Listed { id, folder })
            })
            .collect()
    }

    /// Every pack under the root, two folders deep at most, by name.
    pub(super) fn packs(&self) -> Vec<String> {
        let mut found = Vec::new();
        let mut folders = vec![(self.root.clone(), 0)];
        while let Some((folder, depth)) = folders.pop() {
            for entry in std::fs::read_dir(&folder).into_iter().flatten().flatten() {
                let path = entry.path();
                if path.is_symlink() {
                    continue;
                }
                if path.is_dir() && depth < 2 {
                    folders.push((path, depth + 1));
                } else if path.to_string_lossy().ends_with(PACK_SUFFIX)
                    && let Some(id) = path.strip_prefix(&self.root).ok().and_then(Path::to_str)
                {
                    found.push(id.to_owned());
                }
            }
        }
        found.sort();
        found
    }

    /// The run folder a request names: a run folder under the root (`""` is the root), or a
    /// pack under it (its `run/`, unpacked once into the cache). None for anything else.
    pub(super) fn run(&self, id: &str) -> Option<RunFolder> {
        let path = self.inside(id)?;
        if is_run(&path) {
            return Some(RunFolder::open(&path));
        }
        if path.is_file() && id.ends_with(PACK_SUFFIX) {
            let cache = pack::layer_for(&path, &self.cache).ok()?;
            let run = cache.parent()?.join("run");
            return is_run(&run).then(|| RunFolder::open(&run));
        }
        None
    }

    /// `id` joined to the root, if it is a plain relative path that stays inside it.
    fn inside(&self, id: &str) -> Option<PathBuf> {
        let given = Path::new(id);
        let plain = given
            .components()
            .all(|part| matches!(part, Component::Normal(_)));
        if !plain || id.contains('\0') || id.contains('\\') {
            return None;
        }
        let path = self.root.join(given).canonicalize().ok()?;
        path.starts_with(&self.root).then_some(path)
    }

    /// The rows in the row file at `path` (gzip members), reading only the members written
    /// since the last look (the live page asks several times a second; a paper-scale run's
    /// rows are 200 MB). A file that shrank (a new run) is counted again from its start.
    pub(super) fn lines(&self, path: &Path) -> usize {
        let mut counted = self
            .counted
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut from = counted.get(path).copied().unwrap_or_default();
        let Ok(file) = std::fs::File::open(path) else {
            return 0;
        };
        if file.metadata().map_or(0, |m| m.len()) < from.offset {
            from = Counted::default();
        }
        let (whole, growing) = count_lines(file, from);
        counted.insert(path.to_path_buf(), whole);
        whole.lines + growing
    }

    /// The rows of a finished run, read once and kept while its results are unchanged.
    pub(super) fn load(&self, folder: &RunFolder) -> Result<Arc<Loaded>, Error> {
        let path = folder.path().to_path_buf();
        let stamp = std::fs::metadata(folder.file(RESULTS))
            .and_then(|m| m.modified())
            .unwrap_or(SystemTime::UNIX_EPOCH);
        let mut kept = self
            .kept
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((_, _, loaded)) = kept.iter().find(|(p, s, _)| *p == path && *s == stamp) {
            return Ok(loaded.clone());
        }
        let loaded = Arc::new(read(folder)?);
        kept.retain(|(p, _, _)| *p != path);
        kept.push((path, stamp, loaded.clone()));
        if kept.len() > KEPT {
            kept.remove(0);
        }
        Ok(loaded)
    }
}

/// A folder with a run's record or report.
pub(super) fn is_run(path: &Path) -> bool {
    path.is_dir() && (path.join(RUN).is_file() || path.join(REPORT_JSON).is_file())
}

fn read(folder: &RunFolder) -> Result<Loaded, Error> {
    let texts: Vec<MemoryText> = folder.read_rows(MEMORY_TEXTS)?;
    let results: Vec<ResultRow> = folder.read_rows(RESULTS)?;
    let mut by_cell: HashMap<CellLabel, Vec<usize>> = HashMap::new();
    for (at, row) in results.iter().enumerate() {
        by_cell.entry(cell_of(row)).or_default().push(at);
    }
    Ok(Loaded {
        report: StoredReport::of(&folder.read_json(REPORT_JSON)?),
        sources: folder.read_rows(DATASET)?,
        ledger: folder.read_rows(MEMORIES)?,
        texts: texts.into_iter().map(|t| (t.sha256, t.memory)).collect(),
        results,
        by_cell,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_file_is_counted_as_it_grows_and_anew_when_it_shrinks() {
        use crate::store::members::Members;
        use std::io::Write;
        let scratch = tempfile::tempdir().unwrap();
        let site = Site::new(scratch.path(), &scratch.path().join("cache")).unwrap();
        let rows = scratch.path().join("results.jsonl.gz");
        assert_eq!(site.lines(&rows), 0, "no file yet");
        let mut out = Members::new(Vec::new());
        out.write_all(b"{}\n{}\n").unwrap();
        out.flush().unwrap();
        out.write_all(b"{}\n{}\n").unwrap();
        let two_members = out.finish().unwrap();
        // The second member is still being written: its rows so far count, not yet kept.
        std::fs::write(&rows, &two_members[..two_members.len() - 4]).unwrap();
        assert_eq!(site.lines(&rows), 4);
        std::fs::write(&rows, &two_members).unwrap();
        assert_eq!(site.lines(&rows), 4);
        assert_eq!(site.lines(&rows), 4, "nothing new");
        let mut one = Members::new(Vec::new());
        one.write_all(b"{}\n").unwrap();
        std::fs::write(&rows, one.finish().unwrap()).unwrap();
        assert_eq!(site.lines(&rows), 1, "a new file of rows");
    }

    #[test]
    fn only_a_plain_path_inside_the_root_is_found() {
        let scratch = tempfile::tempdir().unwrap();
        let root = scratch.path().join("runs");
        let run = root.join("x").join("2026-01-01T00-00-00Z-abcd1234");
        std::fs::create_dir_all(&run).unwrap();
        std::fs::write(run.join(RUN), "{}").unwrap();
        std::fs::write(scratch.path().join("secret.txt"), "s").unwrap();
        let site = Site::new(&root, &scratch.path().join("cache")).unwrap();
        assert!(site.run("x/2026-01-01T00-00-00Z-abcd1234").is_some());
        for outside in [
            "../secret.txt",
            "x/../../secret.txt",
            "/etc/passwd",
            "x/./2026-01-01T00-00-00Z-abcd1234/../../..",
            "x\\..\\..",
            "x/2026-01-01T00-00-00Z-abcd1234\0",
            "x",
        ] {
            assert!(site.run(outside).is_none(), "{outside:?} was found");
        }
        #[cfg(unix)]
        {
            std::os::unix::fs::symlink(scratch.path(), root.join("out")).unwrap();
            assert!(site.inside("out/secret.txt").is_none(), "a link out was followed");
        }
    }
}
