//! `trace.jsonl`: every tracing event of a run as one JSON object per line. Recording a run
//! must never fail the run, so write errors are ignored. Events go through a buffer (a
//! million-job run writes a million events) that reaches the file at least every
//! `FLUSH_EVERY`, so a crash loses at most that last moment. Every line, here and on the
//! terminal, has the registered secrets taken out (`crate::secrets`).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::Mutex;

use crate::parallel::Locked;
use tracing_subscriber::fmt::MakeWriter;

static TRACE_FILE: Mutex<Option<BufWriter<File>>> = Mutex::new(None);

/// How much of the trace may wait in memory before it is written.
const TRACE_BUFFER: usize = 256 << 10;

/// How long an event may wait in the buffer before it is written to the file.
const FLUSH_EVERY: std::time::Duration = std::time::Duration::from_millis(500);

/// Sends trace events to `path` from now on, creating it; a thread writes the buffer out every
/// `FLUSH_EVERY` while the file is open.
pub(crate) fn open(path: &Path) -> std::io::Result<()> {
    let file = BufWriter::with_capacity(TRACE_BUFFER, File::create(path)?);
    let first = TRACE_FILE.locked().replace(file).is_none();
    if first {
        let _ = std::thread::Builder::new().name("gacc-trace".into()).spawn(|| {
            loop {
                std::thread::sleep(FLUSH_EVERY);
                match TRACE_FILE.locked().as_mut() {
                    Some(file) => {
                        let _ = file.flush();
                    }
                    None => break,
                }
            }
        });
    }
    Ok(())
}

/// Stops writing trace events and flushes what was written.
pub(crate) fn close() {
    if let Some(file) = TRACE_FILE.locked().take()
        && let Ok(file) = file.into_inner()
    {
        let _ = file.sync_all();
    }
}

/// Where an event goes: the open trace file (or nowhere), or standard error. Both are
/// `MakeWriter`s whose events are written whole, their secrets taken out.
#[derive(Clone, Copy, Default)]
pub(crate) enum Sink {
    #[default]
    Trace,
    Terminal,
}

/// The trace file's sink, for the JSON layer.
pub(crate) const TRACE_SINK: Sink = Sink::Trace;
/// The terminal's sink.
pub(crate) const TERMINAL_SINK: Sink = Sink::Terminal;

/// One event's bytes, written whole to its sink when dropped.
pub(crate) struct EventWriter {
    bytes: Vec<u8>,
    sink: Sink,
}

impl Write for EventWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for EventWriter {
    fn drop(&mut self) {
        let line = redacted(&self.bytes);
        match self.sink {
            Sink::Trace => {
                if let Some(file) = TRACE_FILE.locked().as_mut() {
                    let _ = file.write_all(&line);
                }
            }
            Sink::Terminal => {
                let _ = std::io::stderr().lock().write_all(&line);
            }
        }
    }
}

impl<'a> MakeWriter<'a> for Sink {
    type Writer = EventWriter;
    fn make_writer(&'a self) -> Self::Writer {
        EventWriter {
            bytes: Vec::with_capacity(256),
            sink: *self,
        }
    }
}

/// An event's bytes with every registered secret taken out.
fn redacted(bytes: &[u8]) -> std::borrow::Cow<'_, [u8]> {
    use std::borrow::Cow;
    match std::str::from_utf8(bytes).map(crate::secrets::redact) {
        Ok(Cow::Owned(text)) => Cow::Owned(text.into_bytes()),
        Ok(Cow::Borrowed(_)) => Cow::Borrowed(bytes),
        Err(_) => Cow::Owned(
            crate::secrets::redact(&String::from_utf8_lossy(bytes))
                .into_owned()
                .into_bytes(),
        ),
    }
}

/// The target of "job finished" events sent through `tracing`, which only the terminal
/// (`-vv`, `RUST_LOG`) receives: the trace file gets each one from [`job_finished`].
pub(crate) const JOB_TARGET: &str = "gacc::job";

/// One finished job, as the trace records it.
pub(crate) struct JobFinished<'a> {
    pub job: &'a str,
    pub stage: &'a str,
    pub cache_key: &'a str,
    pub compressor: &'a str,
    pub duration_ms: f64,
    pub cache_hit: bool,
    pub skipped: bool,
    pub failed: bool,
}

/// Appends a "job finished" event to the trace, written as the JSON layer writes every other
/// event (same fields, same order, same timestamp format). A paper-scale run finishes most of
/// a million jobs; formatting each through the layer cost more than a cached job itself.
pub(crate) fn job_finished(event: &JobFinished) {
    let mut line = Vec::with_capacity(384);
    line.extend_from_slice(b"{\"timestamp\":\"");
    line.extend_from_slice(crate::clock::utc_timestamp_micros(std::time::SystemTime::now()).as_bytes());
    line.extend_from_slice(b"\",\"level\":\"INFO\",\"message\":\"job finished\"");
    let name = |line: &mut Vec<u8>, name: &str| {
        line.extend_from_slice(b",\"");
        line.extend_from_slice(name.as_bytes());
        line.extend_from_slice(b"\":");
    };
    let text = |line: &mut Vec<u8>, field: &str, value: &str| {
        name(line, field);
        let _ = serde_json::to_writer(&mut *line, value);
    };
    text(&mut line, "job", event.job);
    text(&mut line, "stage", event.stage);
    text(&mut line, "cache_key", event.cache_key);
    text(&mut line, "compressor", event.compressor);
    name(&mut line, "duration_ms");
    let _ = serde_json::to_writer(&mut line, &event.duration_ms);
    for (field, value) in [
        ("cache_hit", event.cache_hit),
        ("skipped", event.skipped),
        ("failed", event.failed),
    ] {
        name(&mut line, field);
        line.extend_from_slice(if value { b"true" } else { b"false" });
    }
    line.extend_from_slice(b"}\n");
    if let Some(file) = TRACE_FILE.locked().as_mut() {
        let _ = file.write_all(&line);
    }
}
