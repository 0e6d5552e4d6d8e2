//! The events a run records (SPEC §5 `trace.jsonl`), one type for the code that writes them
//! and for `gacc trace` (and a live viewer) that reads them back. A line is the event's
//! fields after its `timestamp` and `level`, its kind in `message`, as the `tracing` JSON
//! layer writes every other event; traces written before this type still read, field for
//! field.

use std::borrow::Cow;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::protocol::Stage;

/// One event of a run. Text is borrowed where it is written (a run writes one per call) and
/// owned where it is read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "message")]
pub(crate) enum TraceEvent<'a> {
    #[serde(rename = "run started")]
    RunStarted {
        manifest: Cow<'a, str>,
        folder: Cow<'a, str>,
    },
    /// One phase of `gacc run` ended (`run.json` keeps their seconds too).
    #[serde(rename = "phase finished")]
    PhaseFinished { phase: Cow<'a, str>, seconds: f64 },
    /// One attempt of one call, whatever it came to.
    #[serde(rename = "callback attempt")]
    CallbackAttempt {
        callback: Cow<'a, str>,
        attempt: u32,
        duration_ms: u64,
        request_bytes: u64,
        ok: bool,
        stderr: Cow<'a, str>,
        /// `"worker"` when `stderr` is what a long-lived worker wrote while it served the call,
        /// which may hold a neighbouring call's lines; absent when it is the call's own (a
        /// oneshot process's stderr, or the log the reply framed).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        stderr_of: Option<Cow<'a, str>>,
        /// What an answer said of itself: its tokens and cost, and for a model call the
        /// endpoint, the served model and why it stopped (`finish_reason`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        served: Option<serde_json::Value>,
        /// Why a failed attempt failed (a model call's names the HTTP status).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<Cow<'a, str>>,
        /// The call's cache key.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        key: Option<Cow<'a, str>>,
    },
    /// An attempt failed in a way worth another: a callback's, or a model endpoint's request
    /// (which names its endpoint, the HTTP status where one came back, and the wait before the
    /// next attempt). One event for both, so that the trace's retries are run.json's.
    #[serde(rename = "retrying")]
    Retrying {
        callback: Cow<'a, str>,
        attempt: u32,
        reason: Cow<'a, str>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        endpoint: Option<Cow<'a, str>>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        status: Option<u16>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        wait_ms: Option<u64>,
    },
    /// A job that made (or waited on) a call finished; a job served from the cache has no
    /// line of its own (its stage's summary counts it).
    #[serde(rename = "job finished")]
    JobFinished {
        job: Cow<'a, str>,
        stage: Stage,
        cache_key: Cow<'a, str>,
        compressor: Cow<'a, str>,
        duration_ms: f64,
        cache_hit: bool,
        skipped: bool,
        failed: bool,
    },
    #[serde(rename = "job failed")]
    JobFailed {
        job: Cow<'a, str>,
        stage: Stage,
        callback: Cow<'a, str>,
        reason: Cow<'a, str>,
        attempts: u32,
        stderr: Cow<'a, str>,
    },
    /// What one stage's jobs came to, those served without a call included.
    #[serde(rename = "stage finished")]
    StageFinished {
        stage: Stage,
        planned: u64,
        finished: u64,
        called: u64,
        cached: u64,
        shared: u64,
        skipped: u64,
        failed: u64,
    },
    #[serde(rename = "run finished")]
    RunFinished { folder: Cow<'a, str>, failures: u64 },
    #[serde(rename = "run interrupted")]
    RunInterrupted { folder: Cow<'a, str> },
    /// Any other event: a warning, an endpoint's pace, a cache error (free text).
    #[serde(other)]
    Other,
}

/// How much an event matters, for the terminal's filter (`-v`, `-vv`, `-vvv`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Level {
    Debug,
    Info,
    Warn,
}

impl Level {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Level::Debug => "DEBUG",
            Level::Info => "INFO",
            Level::Warn => "WARN",
        }
    }
}

impl TraceEvent<'_> {
    pub(crate) fn level(&self) -> Level {
        match self {
            TraceEvent::CallbackAttempt { .. } => Level::Debug,
            TraceEvent::Retrying { .. }
            | TraceEvent::JobFailed { .. }
            | TraceEvent::RunInterrupted { .. } => Level::Warn,
            _ => Level::Info,
        }
    }

    /// The line `trace.jsonl` holds for the event at `timestamp` (with its newline).
    pub(crate) fn line(&self, timestamp: &str) -> Vec<u8> {
        let mut line = Vec::with_capacity(384);
        line.extend_from_slice(b"{\"timestamp\":\"");
        line.extend_from_slice(timestamp.as_bytes());
        line.extend_from_slice(b"\",\"level\":\"");
        line.extend_from_slice(self.level().as_str().as_bytes());
        line.extend_from_slice(b"\",");
        let start = line.len();
        // Serializing a value of this type cannot fail (no map has non-string keys).
        if serde_json::to_writer(&mut line, self).is_ok() && line.get(start) == Some(&b'{') {
            line.remove(start);
        } else {
            line.truncate(start - 1);
            line.push(b'}');
        }
        line.push(b'\n');
        line
    }

    /// The event in a line of `trace.jsonl` already parsed (`Other` for a line of free text
    /// or one this type cannot read).
    pub(crate) fn read(line: &serde_json::Value) -> TraceEvent<'static> {
        TraceEvent::deserialize(line).unwrap_or(TraceEvent::Other)
    }
}

/// `message key=value …`, as the terminal shows an event (fields in name order).
impl fmt::Display for TraceEvent<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Ok(serde_json::Value::Object(fields)) = serde_json::to_value(self) else {
            return Ok(());
        };
        let message = fields.get("message").and_then(|m| m.as_str()).unwrap_or_default();
        f.write_str(message)?;
        for (name, value) in fields.iter().filter(|(name, _)| *name != "message") {
            match value {
                serde_json::Value::String(text) => write!(f, " {name}={text}")?,
                other => write!(f, " {name}={other}")?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One of each kind, with text that needs escaping.
    pub(crate) fn every_event() -> Vec<TraceEvent<'static>> {
        let text = |s: &str| Cow::Owned(s.to_owned());
        vec![
            TraceEvent::RunStarted {
                manifest: text("experiments/x.toml"),
                folder: text("runs/x/20261203T000000Z-abcd1234"),
            },
            TraceEvent::PhaseFinished {
                phase: text("execute jobs"),
                seconds: 1.25,
            },
            TraceEvent::CallbackAttempt {
                callback: text("reader"),
                attempt: 2,
                duration_ms: 15,
                request_bytes: 1024,
                ok: false,
                stderr: text("line \"one\"\nline two\r\n"),
                stderr_of: Some(text("worker")),
                served: Some(serde_json::json!({"model": "m", "output_tokens": 3})),
                reason: Some(text("500: overloaded")),
                key: Some(text("ab12")),
            },
            TraceEvent::Retrying {
                callback: text("compressors.llm"),
                attempt: 1,
                reason: text("timed out after 30 s"),
                endpoint: None,
                status: None,
                wait_ms: None,
            },
            TraceEvent::JobFinished {
                job: text("j1"),
                stage: Stage::Read,
                cache_key: text("k1"),
                compressor: text("llm"),
                duration_ms: 12.5,
                cache_hit: false,
                skipped: false,
                failed: true,
            },
            TraceEvent::JobFailed {
                job: text("j1"),
                stage: Stage::Judge,
                callback: text("judge"),
                reason: text("exited with status 3"),
                attempts: 3,
                stderr: text("GPU out of memory"),
            },
            TraceEvent::StageFinished {
                stage: Stage::Compress,
                planned: 12,
                finished: 12,
                called: 3,
                cached: 8,
                shared: 1,
                skipped: 0,
                failed: 0,
            },
            TraceEvent::RunFinished {
                folder: text("runs/x/y"),
                failures: 0,
            },
            TraceEvent::RunInterrupted {
                folder: text("runs/x/y"),
            },
        ]
    }

    #[test]
    fn every_event_reads_back_as_written() {
        for event in every_event() {
            let line = event.line("2026-12-03T00:00:00.000000Z");
            assert_eq!(line.last(), Some(&b'\n'));
            let value: serde_json::Value = serde_json::from_slice(&line).unwrap();
            assert_eq!(value["timestamp"], "2026-12-03T00:00:00.000000Z");
            assert_eq!(value["level"], event.level().as_str());
            assert_eq!(
                TraceEvent::read(&value),
                event,
                "{}",
                String::from_utf8_lossy(&line)
            );
            // The first fields are the envelope, then the kind, as the JSON layer writes.
            let text = String::from_utf8(line).unwrap();
            assert!(text.starts_with("{\"timestamp\":\"2026-12-03T00:00:00.000000Z\",\"level\":\""));
            assert!(text.contains("\",\"message\":\""), "{text}");
        }
    }

    #[test]
    fn free_text_and_broken_events_read_as_other() {
        for line in [
            r#"{"timestamp":"t","level":"WARN","message":"could not write the cache entry","key":"k"}"#,
            r#"{"message":"job failed","job":"j","stage":"nowhere","callback":"c","reason":"r","attempts":1,"stderr":""}"#,
            r#"{"message":"callback attempt","callback":"c","attempt":-1,"duration_ms":1,"request_bytes":1,"ok":true,"stderr":""}"#,
            r#"{"message":"stage finished","stage":"read"}"#,
            r#"{"no message":1}"#,
            r#"[1,2]"#,
        ] {
            let value: serde_json::Value = serde_json::from_str(line).unwrap();
            assert_eq!(TraceEvent::read(&value), TraceEvent::Other, "{line}");
        }
    }

    #[test]
    fn the_terminal_shows_the_kind_then_the_fields_by_name() {
        let event = TraceEvent::Retrying {
            callback: Cow::Borrowed("reader"),
            attempt: 1,
            reason: Cow::Borrowed("timed out"),
            endpoint: None,
            status: None,
            wait_ms: None,
        };
        assert_eq!(
            event.to_string(),
            "retrying attempt=1 callback=reader reason=timed out"
        );
    }
}
