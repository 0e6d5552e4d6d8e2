//! `gacc pack` and `gacc unpack` (SPEC §12): a run as one file, and back.

use std::path::{Path, PathBuf};

use super::Ended;
use crate::error::{Error, io};
use crate::store::cache::Cache;
use crate::store::pack;
use crate::store::run_folder::resolve;

/// What a pack's file name ends with.
const SUFFIX: &str = ".gacc.tar.gz";

/// `gacc pack RUN`: the run folder, the entries of `cache` its rows rest on, and the SHA-256
/// list, in one file; prints its path. A row naming an entry the cache no longer holds stops
/// it (the pack could not replay that row), naming the entry.
pub fn pack(
    runs: &Path,
    run: &Path,
    output: Option<&Path>,
    cache: Option<&Path>,
    dataset: bool,
) -> Result<Ended, Error> {
    let folder = resolve(run, runs)?;
    let cache = &match cache {
        Some(cache) => cache.to_path_buf(),
        None => crate::store::run_folder::cache_of(folder.path())?,
    };
    if !Cache::exists(cache) {
        return Err(Error::Io {
            path: cache.to_path_buf(),
            message: "no cache here: name the run's cache with --cache".into(),
        });
    }
    let out = output.map_or_else(|| default_name(folder.path()), Path::to_path_buf);
    let opened = Cache::open(cache).map_err(io(cache))?;
    let packed = pack::pack(&folder, &opened, &out, dataset)?;
    if let Some((kind, key)) = packed.missing.first() {
        let _ = std::fs::remove_file(&out);
        return Err(Error::Io {
            path: cache.to_path_buf(),
            message: format!(
                "{} entries the rows of {} rest on are not in this cache (the first: {kind} {key}); \
                 is it the run's cache? (--cache)",
                packed.missing.len(),
                folder.path().display()
            ),
        });
    }
    eprintln!(
        "packed {} files and {} cache entries into {} ({} bytes)",
        packed.members - 1,
        packed.entries,
        out.display(),
        packed.bytes
    );
    println!("{}", out.display());
    Ok(Ended::Success)
}

/// `gacc unpack PACK [DIR]`: checks every member and extracts them; prints the folder.
pub fn unpack(file: &Path, dir: Option<&Path>) -> Result<Ended, Error> {
    let into = dir.map_or_else(
        || {
            let name = file
                .file_name()
                .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
            PathBuf::from(
                name.strip_suffix(SUFFIX)
                    .map_or_else(|| format!("{name}.unpacked"), str::to_owned),
            )
        },
        Path::to_path_buf,
    );
    let members = pack::unpack(file, &into)?;
    eprintln!("{members} members checked against {}", pack::SUMS);
    println!("{}", into.display());
    Ok(Ended::Success)
}

/// `<run folder's name>.gacc.tar.gz` in the current folder (`latest` resolved to its run).
fn default_name(run: &Path) -> PathBuf {
    let resolved = run.canonicalize().unwrap_or_else(|_| run.to_path_buf());
    let name = resolved
        .file_name()
        .map_or_else(|| "run".into(), |n| n.to_string_lossy().into_owned());
    PathBuf::from(format!("{name}{SUFFIX}"))
}
