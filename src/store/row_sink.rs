//! `memories.jsonl` and `results.jsonl` written as a run goes (inspect_ai's log recorder is
//! the model): the runner hands each memory's rows over as it folds them, in plan order, so
//! the files hold every row finished so far — for a viewer that follows a run, and for a run
//! that crashes or is interrupted, which keeps what it did. The bytes are those of writing
//! the rows at the end.
//!
//! The work is spread so that folding stays cheap (at paper scale, a cached re-run folds
//! 385,000 rows in about two seconds): each memory's task serializes its own rows
//! ([`RowLines::of`]), the fold hands those bytes on without copying them, and a thread per
//! file gathers, hashes and writes them.

use std::fs::File;
use std::io::Write;
use std::path::PathBuf;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::ledger::{CallKeys, LedgerRow, ResultRow};
use super::members::Members;
use super::run_folder::{MEMORIES, RESULTS, RunFolder};
use crate::error::Error;
use crate::files::Hashing;

/// How long a finished row may wait in memory before it is written.
pub(crate) const FLUSH_EVERY: Duration = Duration::from_secs(1);

/// How much a file's thread gathers before it writes.
const CHUNK: usize = 1 << 20;

/// One memory's rows as their files hold them: its ledger line, its questions' lines.
#[derive(Debug, Default)]
pub(crate) struct RowLines {
    memory: Vec<u8>,
    results: Vec<u8>,
    rows: usize,
}

impl RowLines {
    /// The lines of a memory's ledger row (if it was made) and its questions' rows, each with
    /// the cache entries it rests on.
    pub(crate) fn of(ledger: Option<&(LedgerRow, CallKeys)>, results: &[(ResultRow, CallKeys)]) -> RowLines {
        let mut lines = RowLines {
            memory: Vec::new(),
            results: Vec::with_capacity(results.len() * 512),
            rows: results.len(),
        };
        if let Some((row, calls)) = ledger {
            line(&mut lines.memory, row, calls);
        }
        for (row, calls) in results {
            line(&mut lines.results, row, calls);
        }
        lines
    }
}

/// Appends `row` and its `calls` as one JSON line: the bytes `WithCalls` writes (the row's
/// fields, then `calls` when there are any), without serde's flattening, which goes through a
/// map for every field (a row of these types always serializes to an object).
fn line(out: &mut Vec<u8>, row: &impl Serialize, calls: &CallKeys) {
    let start = out.len();
    if serde_json::to_writer(&mut *out, row).is_err() {
        out.truncate(start);
        return;
    }
    if !calls.is_empty() && out.last() == Some(&b'}') {
        out.pop();
        if out.len() > start + 1 {
            out.push(b',');
        }
        out.extend_from_slice(b"\"calls\":");
        if keys(out, calls).is_err() {
            out.truncate(start);
            return;
        }
        out.push(b'}');
    }
    out.push(b'\n');
}

/// Appends `calls` as a JSON object. Keys are hex digests, written as they are (nothing in
/// them needs escaping); a name, or a key that is not hex, goes through serde's escaping.
fn keys(out: &mut Vec<u8>, calls: &CallKeys) -> serde_json::Result<()> {
    out.push(b'{');
    for (at, (name, key)) in calls.iter().enumerate() {
        if at > 0 {
            out.push(b',');
        }
        serde_json::to_writer(&mut *out, name)?;
        out.push(b':');
        if hex(key.as_bytes()) {
            out.push(b'"');
            out.extend_from_slice(key.as_bytes());
            out.push(b'"');
        } else {
            serde_json::to_writer(&mut *out, key)?;
        }
    }
    out.push(b'}');
    Ok(())
}

/// True when `text` is lowercase or uppercase hex digits only. Every byte is looked at (no
/// early exit), which lets the compiler check many at once: a run writes hundreds of
/// thousands of keys.
fn hex(text: &[u8]) -> bool {
    text.iter().fold(true, |plain, b| {
        plain & (b.is_ascii_digit() | matches!(b | 0x20, b'a'..=b'f'))
    })
}

/// Where rows go as they fold.
pub(crate) struct RowSink {
    memories: Appender,
    results: Appender,
    /// When the files were last seen in place (a run folder removed while the run writes
    /// leaves the writes going to files nobody can open).
    seen: Instant,
}

/// What the sink wrote: the SHA-256 of `results.jsonl` and the rows of each file.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Written {
    pub results_sha256: String,
    pub memories: usize,
    pub results: usize,
}

/// One file of rows: each memory's bytes go, as its task serialized them (not copied), to a
/// thread that gathers, hashes and writes them, at most [`FLUSH_EVERY`] after they arrive
/// (and stops at its first error, which `finish` gives back).
struct Appender {
    path: PathBuf,
    rows: usize,
    pieces: Option<mpsc::Sender<Vec<u8>>>,
    writer: Option<JoinHandle<std::io::Result<String>>>,
    /// Why the thread stopped, once it has (a full disk): `finish` gives it back.
    failed: Option<std::io::Error>,
}

/// How often the writer thread looks for bytes while some wait to be written: a handful of
/// wake-ups a second, not one per memory.
const GATHER_EVERY: Duration = Duration::from_millis(25);

/// The writer thread: gathers what arrives in a buffer (written whenever it fills) and
/// flushes it once the oldest bytes in it have waited [`FLUSH_EVERY`]; when the sender is
/// dropped, the file's SHA-256 if `hashed` (`results.jsonl`'s is in the report), else nothing.
fn write_pieces(file: File, hashed: bool, pieces: &mpsc::Receiver<Vec<u8>>) -> std::io::Result<String> {
    // The SHA-256 is of the rows, as a reader decompresses them.
    if hashed {
        let hashing = gather(Hashing::new(Members::new(file)), pieces)?;
        Ok(hashing.digest())
    } else {
        gather(Members::new(file), pieces)?.finish()?;
        Ok(String::new())
    }
}

fn gather<W: Write>(file: W, pieces: &mpsc::Receiver<Vec<u8>>) -> std::io::Result<W> {
    let mut out = std::io::BufWriter::with_capacity(CHUNK, file);
    // When the oldest bytes not yet flushed are due; none wait while it is unset, and the
    // thread sleeps until the next bytes arrive.
    let mut due: Option<Instant> = None;
    loop {
        let piece = match due {
            None => pieces.recv().map_err(|_| mpsc::TryRecvError::Disconnected),
            Some(_) => pieces.try_recv(),
        };
        match (piece, due) {
            (Ok(bytes), _) => {
                out.write_all(&bytes)?;
                due.get_or_insert_with(|| Instant::now() + FLUSH_EVERY);
            }
            (Err(mpsc::TryRecvError::Disconnected), _) => break,
            (Err(mpsc::TryRecvError::Empty), Some(at)) => match at.checked_duration_since(Instant::now()) {
                Some(wait) if !wait.is_zero() => std::thread::sleep(GATHER_EVERY.min(wait)),
                _ => {
                    out.flush()?;
                    due = None;
                }
            },
            (Err(mpsc::TryRecvError::Empty), None) => {}
        }
    }
    // Ends the last member.
    out.flush()?;
    out.into_inner().map_err(|e| e.into_error())
}

impl Appender {
    fn create(path: PathBuf, hashed: bool) -> Result<Appender, Error> {
        let file = File::create(&path).map_err(crate::error::io(&path))?;
        let (pieces, received) = mpsc::channel::<Vec<u8>>();
        let writer = std::thread::Builder::new()
            .name("gacc-rows".into())
            .spawn(move || write_pieces(file, hashed, &received))
            .map_err(crate::error::io(&path))?;
        Ok(Appender {
            path,
            rows: 0,
            pieces: Some(pieces),
            writer: Some(writer),
            failed: None,
        })
    }

    /// Hands `bytes` to the thread; a thread that stopped (its first failed write) has its
    /// error kept.
    fn append(&mut self, bytes: Vec<u8>, rows: usize) {
        self.rows += rows;
        if !bytes.is_empty()
            && let Some(pieces) = &self.pieces
            && pieces.send(bytes).is_err()
            && self.failed.is_none()
        {
            self.failed = Some(
                self.close()
                    .err()
                    .unwrap_or_else(|| std::io::Error::other("the writer stopped")),
            );
        }
    }

    /// Why the file could not be written, once its thread stopped.
    fn failure(&self) -> Option<String> {
        (self.failed.as_ref()).map(|error| format!("could not write {}: {error}", self.path.display()))
    }

    /// Waits for the thread to write what it was given: the SHA-256 of the whole file.
    fn close(&mut self) -> std::io::Result<String> {
        self.pieces = None;
        if let Some(error) = self.failed.take() {
            return Err(error);
        }
        match self.writer.take().map(JoinHandle::join) {
            Some(Ok(written)) => written,
            Some(Err(_)) => Err(std::io::Error::other("the writer stopped unexpectedly")),
            None => Err(std::io::Error::other("already closed")),
        }
    }

    fn finish(mut self) -> Result<(String, usize), Error> {
        let digest = self.close().map_err(crate::error::io(&self.path))?;
        Ok((digest, self.rows))
    }
}

impl Drop for Appender {
    /// A run that stops without finishing (Ctrl-C) still has every row it folded on disk.
    fn drop(&mut self) {
        if self.writer.is_some() {
            let _ = self.close();
        }
    }
}

impl RowSink {
    /// Creates the run folder's `memories.jsonl` and `results.jsonl`, empty.
    pub(crate) fn create(folder: &RunFolder) -> Result<RowSink, Error> {
        Ok(RowSink {
            memories: Appender::create(folder.file(MEMORIES), false)?,
            results: Appender::create(folder.file(RESULTS), true)?,
            seen: Instant::now(),
        })
    }

    /// One memory's rows, as its task wrote them; on disk within [`FLUSH_EVERY`].
    pub(crate) fn memory(&mut self, lines: RowLines) {
        let made = usize::from(!lines.memory.is_empty());
        self.memories.append(lines.memory, made);
        self.results.append(lines.results, lines.rows);
    }

    /// Why a row file could not be written, once one could not (its writer stopped, or the
    /// file was removed: looked for at most once a second).
    pub(crate) fn failure(&mut self) -> Option<String> {
        let failed = self.memories.failure().or_else(|| self.results.failure());
        if failed.is_some() || self.seen.elapsed() < FLUSH_EVERY {
            return failed;
        }
        self.seen = Instant::now();
        [&self.memories.path, &self.results.path]
            .into_iter()
            .find(|path| !path.exists())
            .map(|path| {
                format!(
                    "{} was removed while the run wrote it (its run folder gone?)",
                    path.display()
                )
            })
    }

    /// Writes what waits and closes both files; a file removed while it was written (its run
    /// folder gone) is an error, not rows that went nowhere.
    pub(crate) fn finish(self) -> Result<Written, Error> {
        if let Some(gone) = [&self.memories.path, &self.results.path]
            .into_iter()
            .find(|p| !p.exists())
        {
            return Err(Error::Io {
                path: gone.clone(),
                message: "was removed while the run wrote it (its run folder gone?); every finished call is cached: run the same command again".into(),
            });
        }
        let RowSink {
            memories, results, ..
        } = self;
        let (_, memories) = memories.finish()?;
        let (results_sha256, results) = results.finish()?;
        Ok(Written {
            results_sha256,
            memories,
            results,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_is_asciis_hex_digit_for_every_byte() {
        for byte in 0..=u8::MAX {
            assert_eq!(hex(&[byte]), byte.is_ascii_hexdigit(), "byte {byte}");
            assert_eq!(hex(&[b'a', byte, b'0']), byte.is_ascii_hexdigit(), "byte {byte}");
        }
        assert!(hex(b""));
    }

    /// A row's line is what serializing it with its calls flattened in writes, byte for byte:
    /// with calls and without, a row with a flattened part of its own, a real result row.
    /// A row as `memories.jsonl` and `results.jsonl` hold it: its fields, then `calls`, the
    /// cache entries it rests on, by serde's flattening (the sink writes the same bytes
    /// without it: `line`).
    #[derive(Debug, Serialize)]
    struct WithCalls<'a, T> {
        #[serde(flatten)]
        row: &'a T,
        #[serde(skip_serializing_if = "CallKeys::is_empty")]
        calls: &'a CallKeys,
    }

    #[test]
    fn a_row_with_its_calls_is_the_flattened_rows_bytes() {
        #[derive(Serialize)]
        struct Part {
            seed: u64,
            name: &'static str,
        }
        #[derive(Serialize)]
        struct Row {
            first: Option<f64>,
            #[serde(flatten)]
            part: Part,
            text: &'static str,
        }
        let result: ResultRow = serde_json::from_value(serde_json::json!({
            "seed": 42, "compressor": "c", "condition": "own-goal", "ratio": 0.15,
            "source_id": "s", "goal_id": "g", "question_id": "q", "memory_key": "m",
            "answer": "say \"hi\"\n", "correct": true
        }))
        .unwrap();
        let mut calls = CallKeys::new();
        let empty = CallKeys::new();
        calls.insert("reader", "ab".repeat(32));
        calls.insert("judges.strict".to_owned(), "cd".repeat(32));
        // Names and keys that need escaping go through serde's; a name given twice, once.
        let mut odd = calls.clone();
        odd.insert("judges.\"q\"\n".to_owned(), "not hex \"\u{7}".to_owned());
        odd.insert("reader", "ef".repeat(32));
        assert_eq!(odd.iter().count(), 3);
        assert_eq!(
            odd.iter().map(|(name, _)| name).collect::<Vec<_>>(),
            ["judges.\"q\"\n", "judges.strict", "reader"]
        );
        let row = Row {
            first: None,
            part: Part {
                seed: 7,
                name: "n,\"",
            },
            text: "é",
        };
        /// The sink's line of `row` and what `WithCalls` writes.
        fn both<T: Serialize>(row: &T, calls: &CallKeys) -> (String, String) {
            let mut out = Vec::new();
            line(&mut out, row, calls);
            let mut expected = serde_json::to_vec(&WithCalls { row, calls }).unwrap();
            expected.push(b'\n');
            (
                String::from_utf8(out).unwrap(),
                String::from_utf8(expected).unwrap(),
            )
        }
        for keys in [&calls, &odd, &empty] {
            let (written, expected) = both(&row, keys);
            assert_eq!(written, expected);
            let (written, expected) = both(&result, keys);
            assert_eq!(written, expected);
        }
    }

    /// What the sink writes is what writing the rows at the end writes, hash included.
    #[test]
    fn rows_appended_in_pieces_are_the_rows_written_whole() {
        let dir = std::env::temp_dir().join(format!("gacc-row-sink-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let folder = RunFolder::open(&dir);
        let mut sink = RowSink::create(&folder).unwrap();
        let mut whole = Vec::new();
        for n in 0..3000 {
            let text = format!("{{\"n\":{n},\"pad\":\"{}\"}}\n", "x".repeat(n % 700));
            let lines = RowLines {
                memory: text.clone().into_bytes(),
                results: text.repeat(2).into_bytes(),
                rows: 2,
            };
            whole.extend_from_slice(text.repeat(2).as_bytes());
            sink.memory(lines);
            if n % 1000 == 0 {
                std::thread::sleep(FLUSH_EVERY / 10);
            }
        }
        let written = sink.finish().unwrap();
        assert_eq!((written.memories, written.results), (3000, 6000));
        let mut read = Vec::new();
        std::io::Read::read_to_end(&mut folder.open_lines(RESULTS).unwrap(), &mut read).unwrap();
        assert_eq!(read, whole);
        assert!(std::fs::metadata(dir.join(RESULTS)).unwrap().len() < whole.len() as u64 / 4);
        assert_eq!(
            written.results_sha256,
            crate::hash::sha256(String::from_utf8(whole).unwrap())
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
