//! `gacc trace RUN_DIR`: the tracing log reviewed without jq — the slowest calls, every
//! failure, latency percentiles per callback, cache hits per stage, and one job's whole story.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Serialize;
use serde_json::Value;

use crate::error::Error;
use crate::report::stats::percentile;
use crate::store::run_folder::{RunFolder, TRACE};

/// How many of the slowest calls a review lists.
pub(crate) const SLOWEST: usize = 10;

/// What to look at.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    pub stage: Option<String>,
    pub callback: Option<String>,
    /// A job or cache key, or a prefix of one.
    pub job: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct Review {
    pub events: usize,
    pub slowest: Vec<Call>,
    pub failures: Vec<Value>,
    pub retries: usize,
    pub latency: BTreeMap<String, Latency>,
    pub cache: BTreeMap<String, CacheHits>,
    /// With `--job`: every event of that job, in order.
    pub story: Vec<Value>,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct Call {
    pub callback: String,
    pub duration_ms: f64,
    pub ok: bool,
    pub attempt: u64,
    pub key: Option<String>,
    pub request_bytes: Option<u64>,
}

/// Call latency of one callback, in milliseconds.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub(crate) struct Latency {
    pub calls: usize,
    pub p50: f64,
    pub p95: f64,
    pub max: f64,
}

#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub(crate) struct CacheHits {
    pub jobs: usize,
    pub hits: usize,
    pub rate: f64,
}

fn text(event: &Value, field: &str) -> Option<String> {
    event.get(field).and_then(|v| v.as_str().map(str::to_owned))
}

/// The key a call event belongs to: its own `job` field, or the span it ran in.
fn key_of(event: &Value) -> Option<String> {
    text(event, "job")
        .or_else(|| text(event, "cache_key"))
        .or_else(|| {
            event
                .pointer("/span/key")
                .and_then(Value::as_str)
                .map(str::to_owned)
        })
}

fn matches(event: &Value, filter: &Filter) -> bool {
    let stage_ok = filter
        .stage
        .as_ref()
        .is_none_or(|s| text(event, "stage").is_none_or(|e| &e == s));
    let callback_ok = filter.callback.as_ref().is_none_or(|c| {
        text(event, "callback")
            .or_else(|| text(event, "compressor").map(|n| format!("compressors.{n}")))
            .is_none_or(|e| &e == c)
    });
    stage_ok && callback_ok
}

/// Reviews `trace.jsonl` in a run folder.
pub(crate) fn review(folder: &Path, filter: &Filter) -> Result<Review, Error> {
    let text_of = RunFolder::open(folder).read_text(TRACE)?;
    let events: Vec<Value> = text_of
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect();
    let mut calls: Vec<Call> = Vec::new();
    let mut failures = Vec::new();
    let mut retries = 0;
    let mut cache: BTreeMap<String, CacheHits> = BTreeMap::new();
    let mut story = Vec::new();
    for event in &events {
        if let Some(job) = &filter.job {
            let keys = [key_of(event), text(event, "cache_key"), text(event, "job")];
            if keys.iter().flatten().any(|k| k.starts_with(job.as_str())) {
                story.push(event.clone());
            }
        }
        if !matches(event, filter) {
            continue;
        }
        match event.get("message").and_then(Value::as_str) {
            Some("callback attempt") => calls.push(Call {
                callback: text(event, "callback").unwrap_or_default(),
                duration_ms: event["duration_ms"].as_f64().unwrap_or(0.0),
                ok: event["ok"].as_bool().unwrap_or(false),
                attempt: event["attempt"].as_u64().unwrap_or(1),
                key: key_of(event),
                request_bytes: event["request_bytes"].as_u64(),
            }),
            Some("job failed") => failures.push(event.clone()),
            Some("retrying") => retries += 1,
            Some("job finished") => {
                let stage = text(event, "stage").unwrap_or_default();
                let hits = cache.entry(stage).or_default();
                hits.jobs += 1;
                hits.hits += usize::from(event["cache_hit"].as_bool().unwrap_or(false));
            }
            _ => {}
        }
    }
    for hits in cache.values_mut() {
        hits.rate = if hits.jobs == 0 {
            0.0
        } else {
            hits.hits as f64 / hits.jobs as f64
        };
    }
    let mut by_callback: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for call in &calls {
        by_callback
            .entry(call.callback.clone())
            .or_default()
            .push(call.duration_ms);
    }
    let latency = by_callback
        .into_iter()
        .map(|(name, mut durations)| {
            durations.sort_by(f64::total_cmp);
            let latency = Latency {
                calls: durations.len(),
                p50: percentile(&durations, 0.5),
                p95: percentile(&durations, 0.95),
                max: durations.last().copied().unwrap_or(0.0),
            };
            (name, latency)
        })
        .collect();
    calls.sort_by(|a, b| b.duration_ms.total_cmp(&a.duration_ms));
    calls.truncate(SLOWEST);
    Ok(Review {
        events: events.len(),
        slowest: calls,
        failures,
        retries,
        latency,
        cache,
        story,
    })
}

/// The review as text for a terminal.
pub(crate) fn render(review: &Review, filter: &Filter) -> String {
    let mut out = format!("{} events\n", review.events);
    if filter.job.is_some() {
        out.push_str(&format!(
            "\njob {} — {} events\n",
            filter.job.as_deref().unwrap_or(""),
            review.story.len()
        ));
        for event in &review.story {
            let time = text(event, "timestamp").unwrap_or_default();
            let message = text(event, "message").unwrap_or_default();
            let mut fields: Vec<String> = event
                .as_object()
                .into_iter()
                .flatten()
                .filter(|(k, _)| !matches!(k.as_str(), "timestamp" | "message" | "level" | "span" | "spans"))
                .map(|(k, v)| {
                    format!(
                        "{k}={}",
                        v.as_str().map(str::to_owned).unwrap_or_else(|| v.to_string())
                    )
                })
                .collect();
            fields.sort();
            out.push_str(&format!("  {time} {message}: {}\n", fields.join(" ")));
        }
        return out;
    }
    out.push_str("\ncache hits per stage\n");
    for (stage, hits) in &review.cache {
        out.push_str(&format!(
            "  {stage:<10} {:>8} jobs {:>8} hits  {:>5.1}%\n",
            hits.jobs,
            hits.hits,
            100.0 * hits.rate
        ));
    }
    out.push_str("\nlatency per callback (ms)\n");
    for (name, l) in &review.latency {
        out.push_str(&format!(
            "  {name:<28} {:>7} calls  p50 {:>9.1}  p95 {:>9.1}  max {:>9.1}\n",
            l.calls, l.p50, l.p95, l.max
        ));
    }
    out.push_str(&format!("\nslowest {} calls\n", review.slowest.len()));
    for call in &review.slowest {
        out.push_str(&format!(
            "  {:>9.1} ms  {:<28} attempt {} {}  {}\n",
            call.duration_ms,
            call.callback,
            call.attempt,
            if call.ok { "ok    " } else { "FAILED" },
            call.key.as_deref().unwrap_or("")
        ));
    }
    out.push_str(&format!(
        "\nfailures: {} (retries: {})\n",
        review.failures.len(),
        review.retries
    ));
    for failure in &review.failures {
        out.push_str(&format!(
            "  {} {} job {}: {} (attempts {})\n",
            text(failure, "stage").unwrap_or_default(),
            text(failure, "callback").unwrap_or_default(),
            text(failure, "job").unwrap_or_default(),
            text(failure, "reason").unwrap_or_default(),
            failure["attempts"]
        ));
        let stderr = text(failure, "stderr").unwrap_or_default();
        for line in stderr.lines().rev().take(3).collect::<Vec<_>>().into_iter().rev() {
            out.push_str(&format!("      stderr: {line}\n"));
        }
    }
    out
}
