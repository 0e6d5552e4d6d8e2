//! `trace.jsonl`: every tracing event of a run as one JSON object per line. Recording a run
//! must never fail the run, so write errors are ignored. Events go through a buffer (a
//! million-job run writes a million events) that reaches the file at least every
//! `FLUSH_EVERY`, so a crash loses at most that last moment. Every line, here and on the
//! terminal, has the registered secrets taken out (`crate::secrets`). The run's own events are
//! typed ([`TraceEvent`]); other events (warnings, an endpoint's pace) are free text.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::Mutex;

use crate::parallel::Locked;
use tracing_subscriber::fmt::MakeWriter;

pub(crate) mod event;

use event::Level;
pub(crate) use event::TraceEvent;

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

/// What an answer says of itself, for the trace: its usage (tokens, cost) and the meta a model
/// built-in adds (endpoint, served model, finish reason, a cut at `max_tokens`); None when it
/// says nothing.
pub(crate) fn served(response: &serde_json::Value) -> Option<serde_json::Value> {
    let mut said = serde_json::Map::new();
    for (part, fields) in [
        (
            "usage",
            &["input_tokens", "cached_input_tokens", "output_tokens", "cost_usd"][..],
        ),
        (
            "meta",
            &[
                "endpoint",
                "model",
                "finish_reason",
                "cut_at_max_tokens",
                "service_ms",
            ][..],
        ),
    ] {
        for field in fields {
            if let Some(value) = response.get(part).and_then(|p| p.get(*field))
                && (value.is_number() || value.is_string() || value.is_boolean())
            {
                said.insert((*field).to_owned(), value.clone());
            }
        }
    }
    (!said.is_empty()).then_some(serde_json::Value::Object(said))
}

/// The target of notices (`notice`): the terminal filter leaves them out, since `notice`
/// prints them itself.
pub(crate) const NOTICE_TARGET: &str = "gacc::notice";

/// Whether the terminal shows notices (not under `--quiet`).
static NOTICES: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// Whether `notice` prints on the terminal.
pub(crate) fn show_notices(show: bool) {
    NOTICES.store(show, std::sync::atomic::Ordering::Relaxed);
}

/// Something a user should know while a run goes on, that is no error (a server refused a
/// response format, and gacc asks for another): a `warning:` line on the terminal (unless
/// `--quiet`), and a warning in the trace.
pub(crate) fn notice(message: &str) {
    tracing::warn!(target: NOTICE_TARGET, "{message}");
    if NOTICES.load(std::sync::atomic::Ordering::Relaxed) {
        let line = format!("warning: {message}\n");
        let _ = std::io::stderr().lock().write_all(&redacted(line.as_bytes()));
    }
}

/// The target of typed events sent through `tracing`, which only the terminal receives: the
/// trace file gets each one from [`record`].
pub(crate) const EVENT_TARGET: &str = "gacc::event";

/// Records `event`: its line in the trace file, and on the terminal where its filter (`-v`,
/// `RUST_LOG`) lets it through. Written directly, not through the JSON layer: a paper-scale
/// run records most of a million jobs, and formatting each through the layer cost more than a
/// cached job itself.
pub(crate) fn record(event: &TraceEvent) {
    // No trace file (`gacc plan`'s dry run, a replay): nothing to format.
    if TRACE_FILE.locked().is_none() {
        show(event);
        return;
    }
    let timestamp = crate::clock::utc_timestamp_micros(std::time::SystemTime::now());
    let line = event.line(&timestamp);
    let line = redacted(&line);
    if let Some(file) = TRACE_FILE.locked().as_mut() {
        let _ = file.write_all(&line);
    }
    show(event);
}

/// Shows `event` on the terminal only, where its filter lets it through (a job served from the
/// cache, at `-vv`: the trace has no line of it).
pub(crate) fn show(event: &TraceEvent) {
    match event.level() {
        Level::Debug => {
            if tracing::enabled!(target: EVENT_TARGET, tracing::Level::DEBUG) {
                tracing::debug!(target: EVENT_TARGET, "{event}");
            }
        }
        Level::Info => {
            if tracing::enabled!(target: EVENT_TARGET, tracing::Level::INFO) {
                tracing::info!(target: EVENT_TARGET, "{event}");
            }
        }
        Level::Warn => {
            if tracing::enabled!(target: EVENT_TARGET, tracing::Level::WARN) {
                tracing::warn!(target: EVENT_TARGET, "{event}");
            }
        }
    }
}
