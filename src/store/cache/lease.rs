//! One call per key across processes. A call the cache cannot answer first takes a lease on
//! its key (a file in `leases/`, locked with `flock`). A process that finds the lease held
//! waits for it, then reads what the holder appended to the cache before calling itself, so
//! two runs started together pay for each call once. The kernel releases a lock when its
//! holder exits or is killed, so a dead holder's lease is taken over at once; a released
//! lease's file is removed, a dead holder's is left empty for the next.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::MetadataExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{Cache, Kind, SEGMENTS, Sinks, Stats, scan};
use crate::parallel::Locked;

const LEASES: &str = "leases";
/// How often a waiting call looks whether the lease it waits on was released.
const POLL: Duration = Duration::from_millis(25);

/// A lease on one call's key, released (and its file removed) when dropped.
#[derive(Debug)]
pub(crate) struct Lease {
    path: PathBuf,
    _file: File,
}

impl Drop for Lease {
    fn drop(&mut self) {
        // Removed before the lock goes with the file: a waiter that locks the removed file
        // sees that it is no longer the lease and takes the new one.
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Takes `file`'s lock if it is free: true when taken, false when another holds it.
fn locked(file: &File) -> std::io::Result<bool> {
    // SAFETY: flock on a descriptor this File owns; it touches no memory.
    let status = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if status == 0 {
        return Ok(true);
    }
    let error = std::io::Error::last_os_error();
    match error.raw_os_error() {
        Some(libc::EWOULDBLOCK) => Ok(false),
        _ => Err(error),
    }
}

/// Whether `file` is still what `path` names (a lease released meanwhile removed its file).
fn still_at(file: &File, path: &Path) -> bool {
    match (file.metadata(), std::fs::metadata(path)) {
        (Ok(held), Ok(named)) => held.dev() == named.dev() && held.ino() == named.ino(),
        _ => false,
    }
}

impl Cache {
    /// A lease on `key` of `kind`, once no other process holds it; None where leases cannot be
    /// taken (a read-only cache). A caller that gets one reads the cache again (`refresh`,
    /// then `get`) before it calls.
    pub(crate) async fn lease(&self, kind: Kind, key: &str) -> Option<Lease> {
        let folder = self.inner.root.join(LEASES);
        std::fs::create_dir_all(&folder).ok()?;
        let path = folder.join(format!("{}-{key}", kind.as_str()));
        loop {
            let file = OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&path)
                .ok()?;
            match locked(&file) {
                Ok(true) if still_at(&file, &path) => return Some(Lease { path, _file: file }),
                // Locked a lease file its holder removed on release: take the current one.
                Ok(true) => continue,
                Ok(false) => tokio::time::sleep(POLL).await,
                Err(_) => return None,
            }
        }
    }

    /// Indexes what other processes appended to this cache since it was opened or last
    /// refreshed: their segments' new lines, and segments started since.
    pub(crate) fn refresh(&self) {
        let folder = self.inner.root.join(SEGMENTS);
        let Ok(entries) = std::fs::read_dir(&folder) else {
            return;
        };
        let mut paths: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "log"))
            .collect();
        paths.sort();
        let mut covered = self.inner.covered.locked();
        for path in paths {
            let known = covered.iter().position(|(p, _)| *p == path);
            let length = std::fs::metadata(&path).map_or(0, |m| m.len());
            let (segment, from) = match known {
                Some(at) if covered[at].1 < length => (at, covered[at].1),
                Some(_) => continue,
                None => {
                    let Ok(file) = File::open(&path) else { continue };
                    let mut segments = self.inner.segments.write().unwrap_or_else(|e| e.into_inner());
                    segments.push(file);
                    covered.push((path.clone(), 0));
                    (segments.len() - 1, 0)
                }
            };
            let segments = self.inner.segments.read().unwrap_or_else(|e| e.into_inner());
            let Some(file) = segments.get(segment) else {
                continue;
            };
            let mut index = self.inner.index.write().unwrap_or_else(|e| e.into_inner());
            let sinks = Sinks {
                index: &mut index,
                stats: &mut Stats::default(),
                resident: None,
                records: None,
            };
            if let Ok(end) = scan(file, segment, from, sinks) {
                covered[segment].1 = end;
            }
        }
    }
}
