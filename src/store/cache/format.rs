//! The cache's format: how its keys are made (SPEC §4), named in `<cache>/format`. A cache of
//! another format is refused with the gacc that reads it, never read under keys it was not
//! written with (its calls would be missed, and paid for again, without a word).

use std::io;
use std::path::Path;

use super::{SEGMENTS, scan::segment_files};

/// The key scheme this gacc writes and reads: model calls keyed by the seed their request
/// sends (SPEC §8 "Seeds and identical requests").
pub(crate) const FORMAT: &str = "gacc.cache/2";
const FILE: &str = "format";
/// The gacc that reads a cache written before the format was named (its model calls may be
/// filed under the run seed whatever the request sent).
const READS_UNNAMED: &str = "gacc 0.1.0 at commit 8c6c977 or earlier";
/// The first gacc whose model calls were keyed by the seed their request sends: a cache
/// written by it and later ones only is of this format, unnamed.
const KEYED_BY_SENT_SEED: &str = "commit 26d4e99";

/// Checks the cache at `root` is of this gacc's format; a new, empty cache is marked as such.
/// `writes`: the cache is one gacc writes to (not a read-only layer beneath it).
pub(super) fn check(root: &Path, writes: bool) -> io::Result<()> {
    let path = root.join(FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) if text.trim() == FORMAT => Ok(()),
        Ok(text) => Err(refused(format!(
            "{} names the format `{}`, written by another gacc; this gacc reads {FORMAT} \
             (use the gacc that wrote it, or start a new cache)",
            path.display(),
            text.trim().chars().take(40).collect::<String>()
        ))),
        Err(error) if error.kind() == io::ErrorKind::NotFound => {
            let entries = segment_files(&root.join(SEGMENTS)).is_ok_and(|found| !found.is_empty());
            if entries {
                return Err(refused(format!(
                    "{root} was written by a gacc before the cache's format was named: \
                     {READS_UNNAMED} reads it, this gacc reads {FORMAT}. If every run on it was \
                     made by gacc at {KEYED_BY_SENT_SEED} or later, its keys are of this format \
                     already: mark it with `printf '{FORMAT}\\n' > {root}/format`. Otherwise run \
                     it with that gacc, or move it aside and start a new cache (its model calls \
                     may be filed under keys this gacc does not look up, and would be paid for \
                     again)",
                    root = root.display()
                )));
            }
            if writes {
                // A cache that cannot be marked now is marked by the next run that can.
                let _ =
                    std::fs::create_dir_all(root).and_then(|()| std::fs::write(&path, format!("{FORMAT}\n")));
            }
            Ok(())
        }
        Err(error) => Err(error),
    }
}

fn refused(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_cache_is_marked_and_one_of_another_format_is_refused_naming_the_gacc_that_reads_it() {
        let dir = tempfile::tempdir().unwrap();
        check(dir.path(), true).unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.path().join(FILE)).unwrap(),
            "gacc.cache/2\n"
        );
        check(dir.path(), true).unwrap();
        // Entries without a format file: a cache of the unnamed, earlier format.
        let old = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(old.path().join(SEGMENTS)).unwrap();
        std::fs::write(old.path().join(SEGMENTS).join("1-1.log"), "").unwrap();
        let refused = check(old.path(), true).unwrap_err().to_string();
        assert!(
            refused.contains("commit 8c6c977 or earlier reads it"),
            "{refused}"
        );
        assert!(
            refused.contains("commit 26d4e99 or later") && refused.contains("printf 'gacc.cache/2\\n' >"),
            "{refused}"
        );
        assert!(
            !old.path().join(FILE).exists(),
            "a refused cache is left as it was"
        );
        // A later format.
        std::fs::write(dir.path().join(FILE), "gacc.cache/3\n").unwrap();
        let refused = check(dir.path(), false).unwrap_err().to_string();
        assert!(
            refused.contains("`gacc.cache/3`") && refused.contains("reads gacc.cache/2"),
            "{refused}"
        );
    }
}
