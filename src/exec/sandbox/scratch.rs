//! The private scratch folders of sandboxed callbacks: one root per run under the system's
//! temporary folder, a folder per process, stale roots of dead runs removed.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Where the scratch folders of one run go: a private folder under the system's temporary
/// folder, removed when the run ends.
#[derive(Debug)]
pub(super) struct ScratchRoot {
    path: PathBuf,
    next: AtomicU64,
}

/// The prefix of a scratch root's name, followed by the pid of the gacc that made it.
const SCRATCH_PREFIX: &str = "gacc-sandbox-";

impl ScratchRoot {
    pub(super) fn path(&self) -> &Path {
        &self.path
    }

    /// A new private folder (mode 0700) for one process.
    pub(super) fn new_folder(&self) -> std::io::Result<PathBuf> {
        use std::os::unix::fs::DirBuilderExt;
        let number = self.next.fetch_add(1, Ordering::Relaxed);
        let path = self.path.join(number.to_string());
        std::fs::DirBuilder::new().mode(0o700).create(&path)?;
        Ok(path)
    }

    pub(super) fn create() -> std::io::Result<ScratchRoot> {
        use std::os::unix::fs::DirBuilderExt;
        let base = std::env::temp_dir();
        remove_stale_scratch(&base);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let mut attempt = 0u32;
        loop {
            let path = base.join(format!(
                "{SCRATCH_PREFIX}{}-{:08x}",
                std::process::id(),
                nanos.wrapping_add(attempt)
            ));
            match std::fs::DirBuilder::new().mode(0o700).create(&path) {
                Ok(()) => {
                    return Ok(ScratchRoot {
                        path,
                        next: AtomicU64::new(0),
                    });
                }
                Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists && attempt < 100 => {
                    attempt += 1;
                }
                Err(error) => return Err(error),
            }
        }
    }
}

/// Removes the scratch roots of gacc processes that are gone (killed before they could).
fn remove_stale_scratch(base: &Path) {
    let Ok(entries) = std::fs::read_dir(base) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let pid = name
            .to_str()
            .and_then(|n| n.strip_prefix(SCRATCH_PREFIX))
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<i32>().ok());
        // SAFETY: kill(2) with signal 0 only asks whether the process exists.
        if let Some(pid) = pid.filter(|pid| *pid > 0)
            && unsafe { libc::kill(pid, 0) } != 0
            && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
        {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

impl Drop for ScratchRoot {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// A process's private scratch folder, removed with everything in it when dropped.
#[derive(Debug)]
pub(crate) struct Scratch {
    pub path: PathBuf,
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}
