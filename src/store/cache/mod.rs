//! The call cache (SPEC §4): append-only segment logs with an in-memory index.
//!
//! Each gacc process appends to a segment of its own (`segments/<time>-<pid>.log`), one entry per
//! line: `<key> <kind> <sha256 of payload> <payload JSON>`. An entry is written with a single
//! `write` the moment its call finishes, so a `kill -9` loses nothing that finished; segments are
//! synced to disk in groups a few times a second, which bounds what a power loss can take. A
//! torn or corrupt line (a process killed mid-write, a damaged disk) fails its checksum and is a
//! miss, never a wrong answer. Readers of a cache see every segment that existed when they
//! opened it, so two gacc processes can share one cache safely.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use crate::parallel::Locked;
use serde_json::{Value, json};

mod format;
mod index;
mod kind;
mod lease;
mod scan;
mod stats;
pub(crate) use format::FORMAT;
use index::{load_index, write_index};
pub(crate) use kind::Kind;
use scan::{Sinks, scan, segment_files};
pub(crate) use stats::Stats;

/// How often new entries are synced to disk.
const SYNC_INTERVAL: Duration = Duration::from_millis(200);
const SEGMENTS: &str = "segments";
/// Payloads up to this size found when the cache is opened are kept in memory (answers,
/// verdicts, counts: most entries by number, few bytes), so reading them needs no system
/// call. Each is checked against its SHA-256 once, when its segment is scanned (a sidecar
/// index holds only payloads so checked, under its CRC); larger payloads, read from disk, are
/// checked on every read.
const RESIDENT_PAYLOAD: usize = 1024;
/// At most this much of a cache's payloads is kept in memory; the rest is read from disk.
const RESIDENT_TOTAL: usize = 256 << 20;
/// The segment number of a payload kept in memory (its offset is into `Inner::resident`).
const RESIDENT: usize = usize::MAX;

/// An entry's kind and binary key.
type Slot = (u8, [u8; 32]);
/// Every entry: where its payload lies and the payload's SHA-256.
/// Keys are SHA-256 digests: hashed by their first bytes, not mixed again.
type Index = crate::hash::DigestMap<Slot, (Location, [u8; 32])>;

fn slot(kind: Kind, key: &str) -> Option<Slot> {
    Some((kind.number(), decode_hex(key.as_bytes())?))
}

/// Where an entry's payload lies.
#[derive(Debug, Clone, Copy)]
struct Location {
    segment: usize,
    offset: u64,
    length: usize,
}

/// The entries written to this process's own segment.
struct Writer {
    file: File,
    path: PathBuf,
    length: u64,
    segment: usize,
}

struct Inner {
    root: PathBuf,
    /// Small payloads read when the cache was opened (segments only grow, so they stay true).
    resident: Vec<u8>,
    segments: RwLock<Vec<File>>,
    index: RwLock<Index>,
    writer: Mutex<Option<Writer>>,
    dirty: AtomicBool,
    stop: AtomicBool,
    /// Each segment's path and how far it is indexed, by segment number (this process's own
    /// segment at `u64::MAX`: it is never read back).
    covered: Mutex<Vec<(PathBuf, u64)>>,
    /// Entries found damaged (a payload that fails its checksum) since the cache was opened:
    /// each is a miss, its call made again. (A line cut short by a process killed mid-write is
    /// not counted: that is how a kill ends, not damage.)
    damaged: std::sync::atomic::AtomicUsize,
}

/// A persistent, content-addressed store of successful callback responses (and of other
/// results worth never computing twice, by `kind`).
#[derive(Clone)]
pub(crate) struct Cache {
    inner: Arc<Inner>,
    /// Whether what is put is dropped (`Cache::read_only`).
    read_only: bool,
}

impl std::fmt::Debug for Cache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cache").field("root", &self.inner.root).finish()
    }
}

/// The segments of `layers` then `root`'s own, each folder's in order, once each is found to
/// be of this gacc's format (`root`'s folder is made if new).
fn segment_names(root: &Path, layers: &[PathBuf]) -> std::io::Result<Vec<PathBuf>> {
    format::check(root, true)?;
    let mut names = Vec::new();
    for layer in layers {
        format::check(layer, false)?;
        let mut found = segment_files(&layer.join(SEGMENTS))?;
        found.sort();
        names.extend(found);
    }
    let folder = root.join(SEGMENTS);
    std::fs::create_dir_all(&folder)?;
    let mut own = segment_files(&folder)?;
    own.sort();
    names.extend(own);
    Ok(names)
}

fn decode_hex(text: &[u8]) -> Option<[u8; 32]> {
    crate::hash::from_hex(text)
}

impl Cache {
    /// True when a cache with segments already exists at `root`.
    pub(crate) fn exists(root: &Path) -> bool {
        root.join(SEGMENTS).is_dir()
    }

    /// Opens (creating) the cache at `root` and indexes every segment in it.
    pub(crate) fn open(root: &Path) -> std::io::Result<Cache> {
        Cache::layered(root, &[])
    }

    /// Opens the cache at `root` with read-only `layers` beneath it (SPEC §12: an unpacked
    /// pack's `cache/`): their entries are found as the root's are; new entries go to `root`.
    pub(crate) fn layered(root: &Path, layers: &[PathBuf]) -> std::io::Result<Cache> {
        let names = segment_names(root, layers)?;
        let mut segments = Vec::new();
        let mut index = Index::default();
        // Reserved at most once for all of it (pages never written are never made).
        let bytes: u64 = names
            .iter()
            .filter_map(|path| std::fs::metadata(path).ok())
            .map(|m| m.len())
            .sum();
        let mut resident = Vec::with_capacity(usize::try_from(bytes).unwrap_or(0).min(RESIDENT_TOTAL));
        let mut covered = Vec::new();
        let mut damaged = Stats::default();
        for path in names {
            let file = File::open(&path)?;
            let segment = segments.len();
            let end = match load_index(&path, &file, segment, &mut index, &mut resident) {
                // Indexed: only what was appended since is read.
                Some(covered) => {
                    let sinks = Sinks {
                        index: &mut index,
                        stats: &mut damaged,
                        resident: Some(&mut resident),
                        records: None,
                    };
                    scan(&file, segment, covered, sinks)?
                }
                None => {
                    let mut records = Vec::new();
                    let unknown_before = damaged.unknown_kind;
                    let sinks = Sinks {
                        index: &mut index,
                        stats: &mut damaged,
                        resident: Some(&mut resident),
                        records: Some(&mut records),
                    };
                    let covered = scan(&file, segment, 0, sinks)?;
                    // An index that cannot be written costs the next open a scan, nothing more.
                    // None is made of a segment holding entries of a kind this gacc does not
                    // know: it would leave them out for the gacc that does.
                    let whole = damaged.unknown_kind == unknown_before;
                    if whole && let Err(error) = write_index(&path, covered, &records) {
                        tracing::debug!(%error, "could not write a cache segment's index");
                    }
                    covered
                }
            };
            segments.push(file);
            covered.push((path, end));
        }
        let inner = Arc::new(Inner {
            root: root.to_path_buf(),
            resident,
            segments: RwLock::new(segments),
            index: RwLock::new(index),
            writer: Mutex::new(None),
            dirty: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            covered: Mutex::new(covered),
            damaged: std::sync::atomic::AtomicUsize::new(damaged.damaged),
        });
        let syncer = Arc::downgrade(&inner);
        std::thread::spawn(move || {
            while let Some(inner) = syncer.upgrade() {
                if inner.stop.load(Ordering::Relaxed) {
                    break;
                }
                inner.sync();
                drop(inner);
                std::thread::sleep(SYNC_INTERVAL);
            }
        });
        Ok(Cache {
            inner,
            read_only: false,
        })
    }

    /// The same cache, but what is put is dropped rather than written: `gacc plan`'s dry run of
    /// the runner reads every answer the cache holds, and its placeholders are never kept.
    pub(crate) fn read_only(self) -> Cache {
        Cache {
            read_only: true,
            ..self
        }
    }

    /// Whether what is put is dropped (`read_only`).
    pub(crate) fn is_read_only(&self) -> bool {
        self.read_only
    }

    /// The stored response for `key` of `kind`, if any; a damaged entry counts as a miss.
    pub(crate) fn get(&self, kind: Kind, key: &str) -> Option<Value> {
        self.get_timed(kind, key).map(|(response, _)| response)
    }

    /// The stored response for `key` of `kind`, with the wall time in milliseconds of the call
    /// that made it where the entry records one (`put_timed`).
    pub(crate) fn get_timed(&self, kind: Kind, key: &str) -> Option<(Value, Option<u64>)> {
        let (location, checksum) = *self.read_index().get(&slot(kind, key)?)?;
        let payload = self.payload(location)?;
        // A payload held in memory was checked once, when its segment was scanned (`scan`).
        let checked = location.segment == RESIDENT || intact(&payload, &checksum);
        if !checked {
            self.inner.damaged.fetch_add(1, Ordering::Relaxed);
        }
        checked.then(|| parse_response(&payload))?
    }

    /// The entry for `key` of `kind` as a segment holds it, newline included, if it is intact:
    /// what a pack carries (SPEC §12).
    pub(crate) fn line(&self, kind: Kind, key: &str) -> Option<Vec<u8>> {
        let (location, checksum) = *self.read_index().get(&slot(kind, key)?)?;
        let payload = self.payload(location)?;
        if !intact(&payload, &checksum) {
            return None;
        }
        let mut line = format!("{key} {} {} ", kind.as_str(), crate::hash::hex(&checksum)).into_bytes();
        line.extend_from_slice(&payload);
        line.push(b'\n');
        Some(line)
    }

    /// The payload at `location`: borrowed when it is held in memory, else read from its segment.
    fn payload(&self, location: Location) -> Option<std::borrow::Cow<'_, [u8]>> {
        if location.segment == RESIDENT {
            let start = usize::try_from(location.offset).ok()?;
            let held = (self.inner.resident).get(start..start.checked_add(location.length)?)?;
            return Some(std::borrow::Cow::Borrowed(held));
        }
        let mut payload = vec![0u8; location.length];
        let segments = self.inner.segments.read().unwrap_or_else(|e| e.into_inner());
        segments
            .get(location.segment)?
            .read_exact_at(&mut payload, location.offset)
            .ok()?;
        Some(std::borrow::Cow::Owned(payload))
    }

    /// Where the cache lives.
    pub(crate) fn root(&self) -> &Path {
        &self.inner.root
    }

    /// Entries found damaged since the cache was opened (each a miss: its call made again).
    pub(crate) fn damaged(&self) -> usize {
        self.inner.damaged.load(Ordering::Relaxed)
    }

    pub(crate) fn contains(&self, kind: Kind, key: &str) -> bool {
        slot(kind, key).is_some_and(|slot| self.read_index().contains_key(&slot))
    }

    fn read_index(&self) -> std::sync::RwLockReadGuard<'_, Index> {
        self.inner.index.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Appends an entry with one write; it survives `kill -9` from the moment this returns.
    pub(crate) fn put(
        &self,
        kind: Kind,
        key: &str,
        description: &Value,
        response: &Value,
    ) -> std::io::Result<()> {
        self.put_timed(kind, key, description, response, None)
    }

    /// `put`, recording beside the response the wall time of the call that made it (SPEC §15:
    /// a cached run reports what its memories originally took).
    pub(crate) fn put_timed(
        &self,
        kind: Kind,
        key: &str,
        description: &Value,
        response: &Value,
        wall_ms: Option<u64>,
    ) -> std::io::Result<()> {
        let Some(entry_slot) = slot(kind, key) else {
            return Err(std::io::Error::other(format!("`{key}` is not a cache key")));
        };
        if self.read_only {
            return Ok(());
        }
        let mut payload = json!({"description": description, "response": response});
        if let Some(wall_ms) = wall_ms {
            payload["wall_ms"] = json!(wall_ms);
        }
        let payload = payload.to_string();
        let digest: [u8; 32] = sha2::Digest::finalize(<sha2::Sha256 as sha2::Digest>::new_with_prefix(
            payload.as_bytes(),
        ))
        .into();
        let checksum = crate::hash::hex(&digest);
        let prefix = format!("{key} {} {checksum} ", kind.as_str());
        let mut line = Vec::with_capacity(prefix.len() + payload.len() + 1);
        line.extend_from_slice(prefix.as_bytes());
        line.extend_from_slice(payload.as_bytes());
        line.push(b'\n');
        let location = {
            let mut writer = self.inner.writer.locked();
            if writer.is_none() {
                *writer = Some(self.new_segment()?);
            }
            let Some(open) = writer.as_mut() else {
                return Err(std::io::Error::other("no cache segment"));
            };
            if let Err(error) = open.file.write_all(&line) {
                // Part of the line may be on disk: the segment's length is no longer known, and
                // the next entry starts a segment of its own (its torn line is a miss, no more).
                let path = open.path.clone();
                *writer = None;
                return Err(std::io::Error::new(
                    error.kind(),
                    format!("{}: {error}", path.display()),
                ));
            }
            let writer = open;
            let location = Location {
                segment: writer.segment,
                offset: writer.length + prefix.len() as u64,
                length: payload.len(),
            };
            writer.length += line.len() as u64;
            location
        };
        self.inner.dirty.store(true, Ordering::Relaxed);
        self.inner
            .index
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(entry_slot, (location, digest));
        Ok(())
    }

    /// Starts this process's own segment.
    fn new_segment(&self) -> std::io::Result<Writer> {
        let millis = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or(0);
        let folder = self.inner.root.join(SEGMENTS);
        // Two caches of one process may start segments in the same millisecond: a number
        // of this process's own tells them apart.
        static STARTED: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let (path, file) = loop {
            let number = STARTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let path = folder.join(format!("{millis:015}-{:010}-{number:06}.log", std::process::id()));
            match OpenOptions::new().create_new(true).append(true).open(&path) {
                Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(error) => {
                    return Err(std::io::Error::new(
                        error.kind(),
                        format!("{}: {error}", path.display()),
                    ));
                }
                Ok(file) => break (path, file),
            }
        };
        // The new name is durable once the folder is synced.
        File::open(&folder)?.sync_all()?;
        let reader = File::open(&path)?;
        let mut covered = self.inner.covered.locked();
        let mut segments = self.inner.segments.write().unwrap_or_else(|e| e.into_inner());
        segments.push(reader);
        covered.push((path.clone(), u64::MAX));
        Ok(Writer {
            file,
            path,
            length: 0,
            segment: segments.len() - 1,
        })
    }
}

impl Inner {
    fn sync(&self) {
        if self.dirty.swap(false, Ordering::Relaxed) {
            let writer = self.writer.locked();
            if let Some(writer) = writer.as_ref() {
                let _ = writer.file.sync_data();
            }
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.sync();
    }
}

/// True when `payload` has the SHA-256 its entry states.
pub(super) fn intact(payload: &[u8], checksum: &[u8; 32]) -> bool {
    let digest: [u8; 32] =
        sha2::Digest::finalize(<sha2::Sha256 as sha2::Digest>::new_with_prefix(payload)).into();
    digest == *checksum
}

/// An entry's response; only it is needed: the description is skipped, not built.
fn parse_response(payload: &[u8]) -> Option<(Value, Option<u64>)> {
    #[derive(serde::Deserialize)]
    struct Entry {
        response: Value,
        // Read leniently: a wall time that is not a count makes the entry no less an answer.
        #[serde(default)]
        wall_ms: Value,
    }
    serde_json::from_slice::<Entry>(payload)
        .ok()
        .map(|entry| (entry.response, entry.wall_ms.as_u64()))
}

/// Where a payload found at `offset` of a segment is kept (a small one checked already): in
/// memory when it is small and `resident` has room, else where it lies.
fn place(segment: usize, offset: u64, payload: &[u8], resident: Option<&mut Vec<u8>>) -> Location {
    if let Some(resident) = resident
        && payload.len() <= RESIDENT_PAYLOAD
        && resident.len() + payload.len() <= RESIDENT_TOTAL
    {
        let location = Location {
            segment: RESIDENT,
            offset: resident.len() as u64,
            length: payload.len(),
        };
        resident.extend_from_slice(payload);
        return location;
    }
    Location {
        segment,
        offset,
        length: payload.len(),
    }
}

#[cfg(test)]
mod tests {
    use super::index::index_path;
    use super::scan::SCAN_BLOCK;
    use super::*;
    use crate::hash::sha256;

    #[test]
    fn a_call_s_wall_time_is_kept_with_its_entry_and_an_odd_one_costs_only_itself() {
        let dir = tempfile::tempdir().unwrap();
        let key = sha256("timed");
        let cache = Cache::open(dir.path()).unwrap();
        let answer = json!({"memory": "m"});
        cache
            .put_timed(Kind::Compressor, &key, &json!({}), &answer, Some(153))
            .unwrap();
        assert_eq!(
            cache.get_timed(Kind::Compressor, &key),
            Some((answer.clone(), Some(153)))
        );
        assert_eq!(cache.get(Kind::Compressor, &key), Some(answer.clone()));
        // A payload from anyone: a wall time that is not a count is no wall time, and the
        // entry is still the answer (a miss would pay for the call again).
        for odd in ["-5", "\"150\"", "1.5e300", "null", "{}"] {
            let payload = format!(r#"{{"description":{{}},"response":{{"memory":"m"}},"wall_ms":{odd}}}"#);
            assert_eq!(
                parse_response(payload.as_bytes()),
                Some((answer.clone(), None)),
                "{odd}"
            );
        }
        let huge = br#"{"response":{"memory":"m"},"wall_ms":18446744073709551615}"#;
        assert_eq!(parse_response(huge), Some((answer, Some(u64::MAX))));
    }

    #[test]
    fn round_trip_across_processes_of_the_cache() {
        let dir = tempfile::tempdir().unwrap();
        let k = sha256(json!({"x": 1}).to_string());
        let long = json!({"answer": "x".repeat(RESIDENT_PAYLOAD * 2)});
        {
            let cache = Cache::open(dir.path()).unwrap();
            assert_eq!(cache.get(Kind::Reader, &k), None);
            cache
                .put(Kind::Reader, &k, &json!({"x": 1}), &json!({"answer": "a\nb"}))
                .unwrap();
            assert_eq!(cache.get(Kind::Reader, &k), Some(json!({"answer": "a\nb"})));
            assert_eq!(cache.get(Kind::Judge, &k), None, "kinds are separate");
            cache
                .put(Kind::Reader, &sha256(json!(2).to_string()), &json!(2), &long)
                .unwrap();
        }
        let reopened = Cache::open(dir.path()).unwrap();
        assert_eq!(reopened.get(Kind::Reader, &k), Some(json!({"answer": "a\nb"})));
        // A payload too large to be kept in memory is read from its segment.
        assert_eq!(
            reopened.get(Kind::Reader, &sha256(json!(2).to_string())),
            Some(long)
        );
        let stats = Cache::stats(dir.path()).unwrap();
        assert_eq!(stats.entries.get("reader"), Some(&2));
        assert_eq!(stats.torn_lines, 0);
    }

    #[test]
    fn a_read_only_cache_reads_what_is_there_and_keeps_nothing_put() {
        let dir = tempfile::tempdir().unwrap();
        let (kept, dropped) = (sha256("kept"), sha256("dropped"));
        Cache::open(dir.path())
            .unwrap()
            .put(Kind::Reader, &kept, &json!({}), &json!({"answer": "a"}))
            .unwrap();
        let segments = || segment_files(&dir.path().join(SEGMENTS)).unwrap().len();
        let before = segments();
        let cache = Cache::open(dir.path()).unwrap().read_only();
        assert_eq!(cache.get(Kind::Reader, &kept), Some(json!({"answer": "a"})));
        cache
            .put(Kind::Reader, &dropped, &json!({}), &json!({"answer": "b"}))
            .unwrap();
        assert_eq!(cache.get(Kind::Reader, &dropped), None);
        drop(cache);
        assert_eq!(Cache::open(dir.path()).unwrap().get(Kind::Reader, &dropped), None);
        assert_eq!(segments(), before, "a read-only cache opened no segment");
    }

    #[test]
    fn entries_longer_than_a_scan_block_are_indexed_with_those_around_them() {
        let dir = tempfile::tempdir().unwrap();
        let keys: Vec<String> = (0..3).map(|n| sha256(json!(n).to_string())).collect();
        let long = json!({"memory": "y".repeat(SCAN_BLOCK + 17)});
        write_entries(
            dir.path(),
            &[
                ("compressor", &keys[0], json!({"memory": "a"})),
                ("compressor", &keys[1], long.clone()),
                ("compressor", &keys[2], json!({"memory": "c"})),
            ],
        );
        let cache = Cache::open(dir.path()).unwrap();
        assert_eq!(
            cache.get(Kind::Compressor, &keys[0]),
            Some(json!({"memory": "a"}))
        );
        assert_eq!(cache.get(Kind::Compressor, &keys[1]), Some(long));
        assert_eq!(
            cache.get(Kind::Compressor, &keys[2]),
            Some(json!({"memory": "c"}))
        );
        assert_eq!(Cache::stats(dir.path()).unwrap().torn_lines, 0);
    }

    /// Writes entries (kind, key, response) into the cache at `dir`, in one process's segment.
    fn write_entries(dir: &Path, entries: &[(&str, &str, Value)]) {
        let cache = Cache::open(dir).unwrap();
        for (kind, key, response) in entries {
            cache
                .put(Kind::named(kind).unwrap(), key, &json!(key), response)
                .unwrap();
        }
    }

    #[test]
    fn an_entry_of_a_kind_this_gacc_does_not_know_is_left_alone_and_no_index_leaves_it_out() {
        let dir = tempfile::tempdir().unwrap();
        let keys: Vec<String> = (0..2).map(|n| sha256(json!(n).to_string())).collect();
        write_entries(dir.path(), &[("reader", &keys[0], json!({"answer": "zero"}))]);
        let segment = the_segment(dir.path());
        // A later gacc's entry, of a kind named `zebra`.
        let payload = json!({"description": 1, "response": {"stripes": 7}}).to_string();
        let line = format!("{} zebra {} {payload}\n", keys[1], sha256(&payload));
        let mut file = OpenOptions::new().append(true).open(&segment).unwrap();
        file.write_all(line.as_bytes()).unwrap();
        drop(file);
        for _ in 0..2 {
            let cache = Cache::open(dir.path()).unwrap();
            assert_eq!(cache.get(Kind::Reader, &keys[0]), Some(json!({"answer": "zero"})));
            assert!(
                !index_path(&segment).exists(),
                "an index made here would leave the zebra out for the gacc that reads it"
            );
        }
        let stats = Cache::stats(dir.path()).unwrap();
        assert_eq!((stats.unknown_kind, stats.torn_lines, stats.damaged), (1, 0, 0));
        // An index of the version before, which may have left such entries out, is not used.
        let old = dir.path().join("old");
        write_entries(&old, &[("judge", &keys[0], json!({"correct": true}))]);
        let old_segment = the_segment(&old);
        drop(Cache::open(&old).unwrap());
        let mut index = std::fs::read(index_path(&old_segment)).unwrap();
        index[..8].copy_from_slice(b"GACCIDX2");
        let at = index.len() - 4;
        // Its one record moved to a key never written: were the index read, it would be found.
        index[17..49].copy_from_slice(&crate::hash::key_bytes(&keys[1]));
        let crc = crc32fast::hash(&index[..at]).to_le_bytes();
        index[at..].copy_from_slice(&crc);
        std::fs::write(index_path(&old_segment), &index).unwrap();
        let cache = Cache::open(&old).unwrap();
        assert_eq!(
            cache.get(Kind::Judge, &keys[1]),
            None,
            "the old index is not read"
        );
        assert_eq!(cache.get(Kind::Judge, &keys[0]), Some(json!({"correct": true})));
    }

    /// The one segment of a cache folder.
    fn the_segment(dir: &Path) -> PathBuf {
        let mut logs: Vec<PathBuf> = std::fs::read_dir(dir.join(SEGMENTS))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "log"))
            .collect();
        assert_eq!(logs.len(), 1);
        logs.remove(0)
    }

    #[test]
    fn a_segment_index_is_made_used_and_refused_when_it_cannot_be_trusted() {
        let dir = tempfile::tempdir().unwrap();
        let keys: Vec<String> = (0..4).map(|n| sha256(json!(n).to_string())).collect();
        let long = json!({"memory": "g".repeat(RESIDENT_PAYLOAD * 3)});
        write_entries(
            dir.path(),
            &[
                ("reader", &keys[0], json!({"answer": "zero"})),
                ("compressor", &keys[1], long.clone()),
                ("judge", &keys[2], json!({"correct": true})),
            ],
        );
        let segment = the_segment(dir.path());
        let index = index_path(&segment);
        let all_there = |cache: &Cache| {
            assert_eq!(cache.get(Kind::Compressor, &keys[1]), Some(long.clone()));
            assert_eq!(cache.get(Kind::Judge, &keys[2]), Some(json!({"correct": true})));
        };
        // The first open scans the segment and leaves its index.
        assert!(!index.exists());
        all_there(&Cache::open(dir.path()).unwrap());
        assert!(index.is_file());
        // The next one reads the index: damage to the segment's copy of a small payload does not
        // reach it (the index holds that payload, checked against the same checksum).
        let mut bytes = std::fs::read(&segment).unwrap();
        let answer = bytes.windows(4).position(|w| w == b"zero").unwrap();
        bytes[answer] = b'Z';
        std::fs::write(&segment, &bytes).unwrap();
        let cache = Cache::open(dir.path()).unwrap();
        assert_eq!(cache.get(Kind::Reader, &keys[0]), Some(json!({"answer": "zero"})));
        all_there(&cache);
        // A line appended since the index was made is found (only the tail is scanned).
        let payload = json!({"description": 3, "response": {"answer": "three"}}).to_string();
        let line = format!("{} reader {} {payload}\n", keys[3], sha256(&payload));
        let mut file = OpenOptions::new().append(true).open(&segment).unwrap();
        file.write_all(line.as_bytes()).unwrap();
        drop(file);
        let cache = Cache::open(dir.path()).unwrap();
        assert_eq!(
            cache.get(Kind::Reader, &keys[3]),
            Some(json!({"answer": "three"}))
        );
        all_there(&cache);
        // A damaged index is not used: the segment is scanned, its damage seen, a new index made.
        let mut damaged = std::fs::read(&index).unwrap();
        damaged[20] ^= 1;
        std::fs::write(&index, &damaged).unwrap();
        let cache = Cache::open(dir.path()).unwrap();
        assert_eq!(
            cache.get(Kind::Reader, &keys[0]),
            None,
            "the segment's damaged copy"
        );
        assert_eq!(
            cache.get(Kind::Reader, &keys[3]),
            Some(json!({"answer": "three"}))
        );
        all_there(&cache);
        assert_ne!(std::fs::read(&index).unwrap(), damaged);
        // An index of more than the segment holds, or of another segment, is not used either.
        for make_it_wrong in [0, 1] {
            if make_it_wrong == 0 {
                std::fs::write(&segment, &bytes[..bytes.len() / 2]).unwrap();
            } else {
                std::fs::write(&segment, &bytes).unwrap();
                drop(Cache::open(dir.path()).unwrap());
                // Same length, other bytes where the last entry's payload lies.
                let mut other = bytes.clone();
                let at = other.len() - 10;
                other[at] ^= 1;
                std::fs::write(&segment, &other).unwrap();
            }
            let cache = Cache::open(dir.path()).unwrap();
            assert_eq!(
                cache.get(Kind::Judge, &keys[2]),
                None,
                "case {make_it_wrong}: scanned, not indexed"
            );
        }
    }

    #[test]
    fn two_caches_of_one_process_write_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let caches: Vec<Cache> = (0..4).map(|_| Cache::open(dir.path()).unwrap()).collect();
        for (n, cache) in caches.iter().enumerate() {
            let k = sha256(json!(n).to_string());
            cache
                .put(Kind::Reader, &k, &json!(n), &json!({"answer": n}))
                .unwrap();
        }
        let again = Cache::open(dir.path()).unwrap();
        for n in 0..4 {
            assert_eq!(
                again.get(Kind::Reader, &sha256(json!(n).to_string())),
                Some(json!({"answer": n}))
            );
        }
    }

    #[test]
    fn a_torn_or_corrupt_entry_is_a_miss() {
        let dir = tempfile::tempdir().unwrap();
        let (k1, k2) = (sha256(json!(1).to_string()), sha256(json!(2).to_string()));
        {
            let cache = Cache::open(dir.path()).unwrap();
            cache
                .put(Kind::Reader, &k1, &json!(1), &json!({"answer": "one"}))
                .unwrap();
            cache
                .put(Kind::Reader, &k2, &json!(2), &json!({"answer": "two"}))
                .unwrap();
        }
        let segment = std::fs::read_dir(dir.path().join(SEGMENTS))
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .path();
        let mut bytes = std::fs::read(&segment).unwrap();
        // Flip a byte inside the first payload, and cut the second line short.
        let first_payload = bytes.iter().position(|b| *b == b'{').unwrap();
        bytes[first_payload + 5] ^= 1;
        bytes.truncate(bytes.len() - 4);
        std::fs::write(&segment, &bytes).unwrap();
        let cache = Cache::open(dir.path()).unwrap();
        assert_eq!(cache.get(Kind::Reader, &k1), None, "checksum mismatch");
        assert_eq!(cache.get(Kind::Reader, &k2), None, "torn line");
        let stats = Cache::stats(dir.path()).unwrap();
        assert_eq!((stats.torn_lines, stats.damaged), (1, 1));
    }
}
