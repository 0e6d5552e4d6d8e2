//! One call per key across processes. A call the cache cannot answer first takes a lease on
//! its key. A process that finds the lease held waits for it, then reads what the holder
//! appended to the cache before calling itself, so two runs started together pay for each call
//! once. The kernel releases a lease when its holder exits or is killed, so a dead holder's
//! lease is taken over at once.
//!
//! On Linux a lease is a one-byte lock on one file, `leases/calls.lock`, at an offset drawn
//! from its kind and key: no file is made or removed per call. (A file made and removed per
//! call cost more than the calls themselves at scale: ext4 serialises both on the folder and
//! searches its inode table past every recently removed file.) Elsewhere a lease is a locked
//! file of its own under `leases/`, removed when released.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{Cache, Kind, SEGMENTS, Sinks, Stats, scan};
use crate::parallel::Locked;

pub(crate) use held::Lease;

const LEASES: &str = "leases";
/// How often a waiting call looks whether the lease it waits on was released.
const POLL: Duration = Duration::from_millis(25);

#[cfg(target_os = "linux")]
mod held {
    use std::fs::{File, OpenOptions};
    use std::os::unix::io::AsRawFd;
    use std::path::Path;

    use sha2::{Digest, Sha256};

    use super::Kind;

    /// The one file every lease locks a byte of.
    const LOCKS: &str = "calls.lock";

    /// A lease on one call's key: a lock of its open file description (`F_OFD_SETLK`), so two
    /// leases on one key exclude each other in one process as across two, and the lock goes
    /// when the file is closed (dropped) or its process dies.
    #[derive(Debug)]
    pub(crate) struct Lease {
        _file: File,
    }

    /// Where the lease on `key` of `kind` lies in the lock file: 62 bits of their SHA-256, so
    /// two keys share a byte (and one waits on the other for nothing) about never.
    pub(super) fn offset(kind: Kind, key: &str) -> i64 {
        let digest = Sha256::new()
            .chain_update(kind.as_str())
            .chain_update([0])
            .chain_update(key)
            .finalize();
        let mut first = [0; 8];
        first.copy_from_slice(&digest[..8]);
        (u64::from_be_bytes(first) >> 2) as i64
    }

    /// The lease on `key` of `kind`, or None while another holds it.
    pub(super) fn take(folder: &Path, kind: Kind, key: &str) -> std::io::Result<Option<Lease>> {
        let path = folder.join(LOCKS);
        let file = match OpenOptions::new().write(true).open(&path) {
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                std::fs::create_dir_all(folder)?;
                let mut options = OpenOptions::new();
                options.write(true).create(true).truncate(false).open(&path)?
            }
            opened => opened?,
        };
        // SAFETY: `flock` is a plain C struct, valid all zero (and `l_pid` must be 0 here).
        let mut lock: libc::flock = unsafe { std::mem::zeroed() };
        lock.l_type = libc::F_WRLCK as libc::c_short;
        lock.l_whence = libc::SEEK_SET as libc::c_short;
        lock.l_start = offset(kind, key);
        lock.l_len = 1;
        // SAFETY: fcntl on a descriptor this File owns, reading the struct above.
        let status = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_SETLK, &lock) };
        if status == 0 {
            return Ok(Some(Lease { _file: file }));
        }
        let error = std::io::Error::last_os_error();
        match error.raw_os_error() {
            Some(libc::EAGAIN | libc::EACCES) => Ok(None),
            _ => Err(error),
        }
    }
}

#[cfg(not(target_os = "linux"))]
mod held {
    use std::fs::{File, OpenOptions};
    use std::os::unix::fs::MetadataExt;
    use std::os::unix::io::AsRawFd;
    use std::path::{Path, PathBuf};

    use super::Kind;

    /// A lease on one call's key, released (and its file removed) when dropped.
    #[derive(Debug)]
    pub(crate) struct Lease {
        path: PathBuf,
        _file: File,
    }

    impl Drop for Lease {
        fn drop(&mut self) {
            // Removed before the lock goes with the file: a waiter that locks the removed
            // file sees that it is no longer the lease and takes the new one.
            let _ = std::fs::remove_file(&self.path);
        }
    }

    /// The lease on `key` of `kind`, or None while another holds it.
    pub(super) fn take(folder: &Path, kind: Kind, key: &str) -> std::io::Result<Option<Lease>> {
        std::fs::create_dir_all(folder)?;
        let path = folder.join(format!("{}-{key}", kind.as_str()));
        loop {
            let mut options = OpenOptions::new();
            let file = options.create(true).truncate(false).write(true).open(&path)?;
            // SAFETY: flock on a descriptor this File owns; it touches no memory.
            let status = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
            if status != 0 {
                let error = std::io::Error::last_os_error();
                return match error.raw_os_error() {
                    Some(libc::EWOULDBLOCK) => Ok(None),
                    _ => Err(error),
                };
            }
            // Locked a lease file its holder removed on release: take the current one.
            let still_at = match (file.metadata(), std::fs::metadata(&path)) {
                (Ok(held), Ok(named)) => held.dev() == named.dev() && held.ino() == named.ino(),
                _ => false,
            };
            if still_at {
                return Ok(Some(Lease { path, _file: file }));
            }
        }
    }
}

impl Cache {
    /// A lease on `key` of `kind`, once no other holds it; None where leases cannot be taken
    /// (a read-only cache). A caller that gets one reads the cache again (`refresh`, then
    /// `get`) before it calls.
    pub(crate) async fn lease(&self, kind: Kind, key: &str) -> Option<Lease> {
        lease_in(&self.inner.root.join(LEASES), kind, key).await
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

/// The lease on `key` of `kind` among the leases in `folder`, once no other holds it.
async fn lease_in(folder: &Path, kind: Kind, key: &str) -> Option<Lease> {
    loop {
        match held::take(folder, kind, key) {
            Ok(Some(lease)) => return Some(lease),
            Ok(None) => tokio::time::sleep(POLL).await,
            Err(_) => return None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_lease_keeps_its_key_from_a_second_taker_in_the_same_process() {
        let dir = tempfile::tempdir().unwrap();
        let folder = dir.path().join(LEASES);
        let first = held::take(&folder, Kind::Reader, "k1").unwrap();
        assert!(first.is_some());
        assert!(
            held::take(&folder, Kind::Reader, "k1").unwrap().is_none(),
            "taken twice"
        );
        // Another key, or the same key of another kind, is another lease.
        assert!(held::take(&folder, Kind::Reader, "k2").unwrap().is_some());
        assert!(held::take(&folder, Kind::Judge, "k1").unwrap().is_some());
        drop(first);
        assert!(
            held::take(&folder, Kind::Reader, "k1").unwrap().is_some(),
            "not released"
        );
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn leases_make_no_file_per_call() {
        let dir = tempfile::tempdir().unwrap();
        let folder = dir.path().join(LEASES);
        let held: Vec<_> = (0..200)
            .map(|n| held::take(&folder, Kind::Judge, &format!("key {n}")).unwrap())
            .collect();
        assert!(held.iter().all(Option::is_some));
        drop(held);
        let files: Vec<_> = std::fs::read_dir(&folder).unwrap().flatten().collect();
        assert_eq!(files.len(), 1, "{files:?}");
        // Each key its own byte: no two of these share one.
        let offsets: std::collections::BTreeSet<i64> = (0..200)
            .map(|n| held::offset(Kind::Judge, &format!("key {n}")))
            .collect();
        assert_eq!(offsets.len(), 200);
        assert!(offsets.iter().all(|offset| *offset >= 0));
    }

    #[test]
    fn a_waiting_taker_gets_the_lease_once_it_is_released() {
        let dir = tempfile::tempdir().unwrap();
        let folder = dir.path().join(LEASES);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let first = lease_in(&folder, Kind::Compressor, "k").await.unwrap();
            let waiter = tokio::spawn({
                let folder = folder.clone();
                async move { lease_in(&folder, Kind::Compressor, "k").await.is_some() }
            });
            tokio::time::sleep(POLL * 3).await;
            assert!(!waiter.is_finished(), "took a held lease");
            drop(first);
            let taken = tokio::time::timeout(Duration::from_secs(10), waiter).await;
            assert!(matches!(taken, Ok(Ok(true))), "{taken:?}");
        });
    }

    #[test]
    fn no_lease_where_none_can_be_taken() {
        let dir = tempfile::tempdir().unwrap();
        // A file where the leases' folder should be: nothing can be made under it.
        let folder = dir.path().join(LEASES);
        std::fs::write(&folder, "").unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        assert!(runtime.block_on(lease_in(&folder, Kind::Reader, "k")).is_none());
    }
}
