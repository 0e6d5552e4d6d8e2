//! The Slurm work folder's format: its layout (`calls/`, `arrays/`: see the module above),
//! named `gacc.slurm/2` in its `format` file. One of another format, or of the unnamed one
//! before (its arrays in `batches/`), is refused naming the gacc that reads it.

use std::path::Path;

use super::ARRAYS;

/// The work folder's layout (above), named in its `format` file.
const FORMAT: &str = "gacc.slurm/2";
/// The gacc that reads a work folder written before its format was named.
const READS_UNNAMED: &str = "gacc 0.1.0 at commit 8c6c977 or earlier";

/// Checks the work folder `work` is of this gacc's format; a new or empty one is marked so.
pub(super) fn check(work: &Path) -> Result<(), String> {
    let path = work.join("format");
    match std::fs::read_to_string(&path) {
        Ok(text) if text.trim() == FORMAT => Ok(()),
        Ok(text) => Err(format!(
            "{} names the format `{}`, written by another gacc; this gacc reads {FORMAT} \
             (let its arrays finish with the gacc that wrote it, or use another `work_dir`)",
            path.display(),
            text.trim().chars().take(40).collect::<String>()
        )),
        Err(_) => {
            let used = ["calls", ARRAYS, "batches"].iter().any(|folder| {
                std::fs::read_dir(work.join(folder)).is_ok_and(|mut entries| entries.next().is_some())
            });
            if used {
                return Err(format!(
                    "the Slurm work folder {} was written by a gacc before its format was named: \
                     {READS_UNNAMED} reads it, this gacc reads {FORMAT} (let its arrays finish \
                     with that gacc, or cancel them and move the folder aside)",
                    work.display()
                ));
            }
            std::fs::create_dir_all(work)
                .and_then(|()| std::fs::write(&path, format!("{FORMAT}\n")))
                .map_err(|error| format!("cannot create the work folder {}: {error}", work.display()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_work_folder_of_another_format_is_refused_naming_the_gacc_that_reads_it() {
        let work = tempfile::tempdir().unwrap();
        let work = work.path();
        check(work).unwrap();
        assert_eq!(
            std::fs::read_to_string(work.join("format")).unwrap(),
            "gacc.slurm/2\n"
        );
        check(work).unwrap();
        // Arrays where a gacc before the format put them.
        let old = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(old.path().join("batches/a0")).unwrap();
        let refused = check(old.path()).unwrap_err();
        assert!(
            refused.contains("commit 8c6c977 or earlier reads it"),
            "{refused}"
        );
        assert!(!old.path().join("format").exists());
        std::fs::write(work.join("format"), "gacc.slurm/3").unwrap();
        assert!(check(work).unwrap_err().contains("`gacc.slurm/3`"));
    }
}
