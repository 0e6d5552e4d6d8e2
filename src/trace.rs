//! `trace.jsonl`: every tracing event of a run as one JSON object per line. Recording a run
//! must never fail the run, so write errors are ignored. Events go through a buffer (a
//! million-job run writes a million events); a crash loses at most the buffer's last events.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::Mutex;

use tracing_subscriber::fmt::MakeWriter;

static TRACE_FILE: Mutex<Option<BufWriter<File>>> = Mutex::new(None);

/// How much of the trace may wait in memory before it is written.
const TRACE_BUFFER: usize = 256 << 10;

/// Sends trace events to `path` from now on, creating it.
pub fn open(path: &Path) -> std::io::Result<()> {
    let file = BufWriter::with_capacity(TRACE_BUFFER, File::create(path)?);
    *TRACE_FILE.lock().unwrap_or_else(|e| e.into_inner()) = Some(file);
    Ok(())
}

/// Stops writing trace events and flushes what was written.
pub fn close() {
    if let Some(file) = TRACE_FILE.lock().unwrap_or_else(|e| e.into_inner()).take()
        && let Ok(file) = file.into_inner()
    {
        let _ = file.sync_all();
    }
}

/// A `MakeWriter` for the JSON layer: the open trace file, or nowhere.
#[derive(Clone, Copy, Default)]
pub struct TraceSink;

/// One event's bytes, written to the file whole when dropped.
pub struct EventWriter(Vec<u8>);

impl Write for EventWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for EventWriter {
    fn drop(&mut self) {
        if let Some(file) = TRACE_FILE.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
            let _ = file.write_all(&self.0);
        }
    }
}

impl<'a> MakeWriter<'a> for TraceSink {
    type Writer = EventWriter;
    fn make_writer(&'a self) -> Self::Writer {
        EventWriter(Vec::with_capacity(256))
    }
}
